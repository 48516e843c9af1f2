/**
 * Retry-After (RFC 9110 §10.2.3): `Retry-After = HTTP-date / delay-seconds`. Pure: "now" comes from the caller.
 */

/**
 * RFC 9111 §1.2.2 caps delta-seconds at 2^31 rather than let a long string overflow; the same bound suits
 * delay-seconds, whose grammar (1*DIGIT) is the same.
 */
const MAX_DELAY_SECONDS = 2 ** 31;

const DAY = '(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)';
const DAY_LONG = '(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)';
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const MONTH = `(?<month>${MONTHS.join('|')})`;
const TIME = '(?<hour>\\d{2}):(?<minute>\\d{2}):(?<second>\\d{2})';
// RFC 9110 §5.6.7: recipients MUST accept all three formats; HTTP-date is case-sensitive.
const IMF_FIXDATE = new RegExp(`^${DAY}, (?<day>\\d{2}) ${MONTH} (?<year>\\d{4}) ${TIME} GMT$`);
const RFC850_DATE = new RegExp(`^${DAY_LONG}, (?<day>\\d{2})-${MONTH}-(?<yy>\\d{2}) ${TIME} GMT$`);
const ASCTIME_DATE = new RegExp(`^${DAY} ${MONTH} (?<day>[ \\d]\\d) ${TIME} (?<year>\\d{4})$`);

/**
 * Parses an HTTP Retry-After value (delay-seconds or an HTTP-date, RFC 9110 §10.2.3) into milliseconds from
 * `nowEpochMs`; undefined when absent or invalid; never negative (a date in the past means "now": 0).
 * Repeated fields count only when every copy agrees: Retry-After is a singleton field.
 *
 * @example
 * parseRetryAfter('120', Date.now());                             // 120_000
 * parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', Date.now());   // 0: already past
 */
export function parseRetryAfter(value: string | string[] | undefined, nowEpochMs: number): number | undefined {
  const text = singleValue(value);
  if (text === undefined) return undefined;
  if (/^\d+$/.test(text)) return Math.min(Number(text), MAX_DELAY_SECONDS) * 1000;
  const at = parseHttpDate(text, nowEpochMs);
  return at === undefined ? undefined : Math.max(0, at - nowEpochMs);
}

function singleValue(value: string | string[] | undefined): string | undefined {
  if (value === undefined) return undefined;
  const values = typeof value === 'string' ? [value] : value;
  const first = values[0]?.trim();
  if (first === undefined || first === '' || values.some((v) => v.trim() !== first)) return undefined;
  return first;
}

/** Epoch milliseconds of an HTTP-date in any of its three formats. */
function parseHttpDate(text: string, nowEpochMs: number): number | undefined {
  const fields = (IMF_FIXDATE.exec(text) ?? RFC850_DATE.exec(text) ?? ASCTIME_DATE.exec(text))?.groups;
  if (fields === undefined) return undefined;
  const year = fields.yy === undefined ? Number(fields.year) : expandYear(Number(fields.yy), nowEpochMs);
  const month = MONTHS.indexOf(fields.month ?? '');
  const day = Number(fields.day?.trim());
  const [hour, minute, second] = [Number(fields.hour), Number(fields.minute), Number(fields.second)];
  // 60 is a leap second (RFC 5322 §3.3 allows it); the Date arithmetic carries it into the next minute.
  if (month < 0 || hour > 23 || minute > 59 || second > 60) return undefined;
  const date = new Date(0);
  // setUTCFullYear, not Date.UTC, which reads years 0–99 as 1900–1999.
  date.setUTCFullYear(year, month, day);
  // 31 Feb would roll into March: such a date is invalid, not a different day.
  if (day < 1 || date.getUTCDate() !== day) return undefined;
  date.setUTCHours(hour, minute, second);
  return date.getTime();
}

/**
 * RFC 9110 §5.6.7: a two-digit year that appears to be more than 50 years in the future is the most recent past
 * year with the same last two digits.
 */
function expandYear(twoDigits: number, nowEpochMs: number): number {
  const nowYear = new Date(nowEpochMs).getUTCFullYear();
  const year = nowYear - (nowYear % 100) + twoDigits;
  return year > nowYear + 50 ? year - 100 : year;
}
