/**
 * What a run was: the header of the JSON and HTML reports. A report read weeks later, or set against another by
 * `waybill load compare` (load/compare.ts), must say what was run without the shell history: the target, when, the
 * duration asked and the duration taken (and why they differ), the load shape, the workload, the seed, Waybill's
 * version and the flags as given. Pure: the shell passes in the clock reading, the version and the results.
 */
import type { Fleet } from './fleet.js';
import type { Range, Workload } from './workload.js';

/** A run's length as asked (`--requests`, `--duration`; null when not given). */
export interface Asked {
  readonly requests: number | null;
  readonly durationS: number | null;
  readonly warmup: number;
}

/** What the run took, and the sentence that says why it is not what was asked. */
export interface Taken {
  readonly durationS: number;
  readonly requests: number;
  /** What stopped the sending: the request count reached, or the duration window closed. */
  readonly stoppedBy: 'requests' | 'duration';
  /** Seconds from the start to the moment the sending stopped (the window's end, or the last request sent). */
  readonly windowS: number;
  /** Requests that had not ended at that moment: the run waits for them, so it takes longer than its window. */
  readonly stillRunning: number;
  readonly explanation: string;
}

export type LoadShape = { readonly mode: 'closed'; readonly concurrency: number } | { readonly mode: 'open'; readonly ratePerS: number };

export interface RunHeader {
  /** Base URL, with any user:password in it redacted. */
  readonly target: string;
  readonly model: string;
  /** ISO 8601, UTC: the zero of every request's `started_ms`. */
  readonly startedAt: string;
  readonly load: LoadShape;
  readonly asked: Asked;
  readonly taken: Taken;
  /** The effective workload, by its `--workload` YAML keys (flags and file merged, defaults filled in). */
  readonly workload: Record<string, unknown>;
  readonly seed: number;
  readonly simulator: boolean;
  readonly reconcile: boolean;
  readonly timeoutS: number;
  readonly waybill: { readonly version: string; readonly revision: string };
  /** The flags as given (secrets redacted): `waybill load` followed by these reruns the same workload. */
  readonly argv: readonly string[];
}

/** `1.2 s`, `10 s`, `350 ms`: seconds with one decimal, milliseconds under a second (a short test run waits ms). */
export function formatDuration(ms: number): string {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${Number((ms / 1000).toFixed(1))} s`;
}

const requestsText = (n: number) => `${n} request${n === 1 ? '' : 's'}`;

/** The moment a request started and how long it took, in ms since the run started (load/client.ts). */
export interface Timed {
  readonly startedAt: number;
  readonly e2eMs: number;
}

/**
 * Measures the run's sending window from its results, and says why the duration taken differs from the one asked.
 * The window ends when the duration asked is up, or at the last request sent once the count asked was reached; the
 * runner then waits for every request still running, so a `--duration 10s` run whose streams stall for 30 s takes
 * 40 s, and the report must say so rather than leave a reader to guess.
 */
export function measureTaken(results: readonly Timed[], asked: Asked, takenMs: number): Taken {
  const countReached = asked.requests !== null && results.length >= asked.requests;
  const stoppedBy = countReached || asked.durationS === null ? 'requests' : 'duration';
  let lastStart = 0;
  for (const r of results) if (r.startedAt > lastStart) lastStart = r.startedAt;
  const windowMs = stoppedBy === 'duration' ? (asked.durationS ?? 0) * 1000 : lastStart;
  // The last request sent is itself still running at the window's end (its end is after its start).
  const stillRunning = results.filter((r) => r.startedAt + r.e2eMs > windowMs || (stoppedBy === 'requests' && r.startedAt === windowMs)).length;
  const explanation = explainTaken({ asked, takenMs, stoppedBy, windowMs, stillRunning, sent: results.length });
  return { durationS: takenMs / 1000, requests: results.length, stoppedBy, windowS: windowMs / 1000, stillRunning, explanation };
}

interface TakenFacts {
  readonly asked: Asked;
  readonly takenMs: number;
  readonly stoppedBy: 'requests' | 'duration';
  readonly windowMs: number;
  readonly stillRunning: number;
  readonly sent: number;
}

/** One sentence: the duration taken against the one asked, and what the difference was spent on. */
export function explainTaken(facts: TakenFacts): string {
  const { asked, takenMs, stoppedBy, windowMs, stillRunning, sent } = facts;
  const took = formatDuration(takenMs);
  const askedMs = asked.durationS === null ? undefined : asked.durationS * 1000;
  const lead = askedMs === undefined ? `no duration asked; took ${took}` : `took ${took}, asked ${formatDuration(askedMs)}`;
  if (sent === 0) return `${lead}: no request was sent`;
  const waited = Math.max(0, takenMs - windowMs);
  const wait = stillRunning === 0 ? 'none was still in flight' : `then waited ${formatDuration(waited)} for ${stillRunning} in-flight ${stillRunning === 1 ? 'request' : 'requests'}`;
  if (stoppedBy === 'duration') {
    if (stillRunning === 0) return `${lead}: no request was in flight when the ${formatDuration(windowMs)} window closed`;
    return `${lead}: waited ${formatDuration(waited)} for ${stillRunning} in-flight ${stillRunning === 1 ? 'request' : 'requests'} after the ${formatDuration(windowMs)} window`;
  }
  const early = askedMs === undefined ? '' : `, before the ${formatDuration(askedMs)} window closed`;
  return `${lead}: the ${requestsText(asked.requests ?? sent)} asked were sent by ${formatDuration(windowMs)}${early}, ${wait}`;
}

const rangeText = (r: Range) => (r.min === r.max ? String(r.min) : `${r.min}-${r.max}`);

/** The workload as its YAML keys say it (docs/load.md "Workload"), so a reader can paste it into a file. */
export function workloadKeys(workload: Workload, model: string): Record<string, unknown> {
  return {
    model,
    prompt_tokens: rangeText(workload.promptTokens),
    output_tokens: rangeText(workload.outputTokens),
    stream_share: workload.streamShare,
    route_shares: Object.fromEntries(workload.routeShares.filter(([, share]) => share > 0)),
    n: rangeText(workload.n),
    usage_share: workload.usageShare,
    cancel_share: workload.cancelShare,
    cancel_after_first_token_share: workload.cancelAfterFirstTokenShare,
    fault_share: workload.faultShare,
    fault_kinds: workload.faultShare > 0 ? [...workload.faultKinds] : [],
    slow_share: workload.slowShare,
    ...(workload.fleet === undefined ? {} : fleetKeys(workload.fleet)),
  };
}

/** A fleet workload's keys (`fleet` and its own), present only on a fleet run so older headers compare unchanged. */
function fleetKeys(fleet: Fleet): Record<string, unknown> {
  const common = { fleet: fleet.kind, prefix_tokens: fleet.prefixTokens, question_tokens: fleet.questionTokens };
  if (fleet.kind === 'shared-prefix') {
    return {
      ...common,
      groups: fleet.groups,
      popularity: fleet.popularity,
      ...(fleet.popularity === 'zipf' ? { zipf_s: fleet.zipfS } : {}),
      ...(fleet.prefixSeed !== undefined ? { prefix_seed: fleet.prefixSeed } : {}),
    };
  }
  return {
    ...common,
    sessions: fleet.sessions,
    turns: rangeText(fleet.turns),
    think_time_ms: fleet.thinkTimeMs,
    think_time_dist: fleet.thinkTimeDist,
    ...(fleet.sessionHeader === undefined ? {} : { session_header: fleet.sessionHeader }),
  };
}

const SECRET_FLAGS = new Set(['--api-key']);
const URL_USERINFO = /^([a-z][a-z0-9+.-]*:\/\/)[^/@\s]+@/i;

/** A URL without its user:password. */
export function redactUrl(url: string): string {
  // Anything up to the last '@' before the host is userinfo (a password may itself hold '@'); the query may carry a
  // token: both go. Not a URL: only the userinfo pattern, wherever it is.
  try {
    const parsed = new URL(url);
    if (parsed.username === '' && parsed.password === '' && parsed.search === '') return url;
    const auth = parsed.username !== '' || parsed.password !== '' ? '<redacted>@' : '';
    const path = parsed.pathname === '/' && !/^[a-z][a-z0-9+.-]*:\/\/[^/]*\/(?:[?#]|$)/i.test(url) ? '' : parsed.pathname;
    return `${parsed.protocol}//${auth}${parsed.host}${path}${parsed.search === '' ? '' : '?<redacted>'}`;
  } catch {
    return url.replace(URL_USERINFO, '$1<redacted>@');
  }
}

/**
 * The flags as given, fit to keep in a report that gets shared: an API key's value and a URL's user:password are
 * replaced (the rest is what reruns the workload).
 */
export function redactArgs(argv: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? '';
    const eq = arg.indexOf('=');
    if (SECRET_FLAGS.has(arg) && i + 1 < argv.length) {
      out.push(arg, '<redacted>');
      i++;
    } else if (eq > 0 && SECRET_FLAGS.has(arg.slice(0, eq))) out.push(`${arg.slice(0, eq)}=<redacted>`);
    else if (eq > 0 && arg.startsWith('--')) out.push(`${arg.slice(0, eq)}=${redactUrl(arg.slice(eq + 1))}`);
    else out.push(redactUrl(arg));
  }
  return out;
}

const loadText = (load: LoadShape) => (load.mode === 'closed' ? `closed loop, concurrency ${load.concurrency}` : `open loop, Poisson arrivals at ${load.ratePerS} req/s`);

const askedText = (asked: Asked) =>
  [
    asked.requests === null ? undefined : requestsText(asked.requests),
    asked.durationS === null ? undefined : formatDuration(asked.durationS * 1000),
    asked.warmup > 0 ? `after a warm-up of ${requestsText(asked.warmup)}` : undefined,
  ]
    .filter((part) => part !== undefined)
    .join(', ');

const valueText = (value: unknown): string =>
  Array.isArray(value)
    ? value.length === 0 ? '—' : value.join(', ')
    : value !== null && typeof value === 'object'
      ? Object.entries(value).map(([k, v]) => `${k}=${String(v)}`).join(', ')
      : String(value);

/** The header as label/value rows: the HTML report's "What was run" table. */
export function headerRows(header: RunHeader): Array<readonly [string, string]> {
  return [
    ['target', header.target],
    ['model', header.model],
    ['started', header.startedAt],
    ['asked', askedText(header.asked)],
    ['taken', `${header.taken.requests} requests in ${formatDuration(header.taken.durationS * 1000)}`],
    ['why', header.taken.explanation],
    ['load', loadText(header.load)],
    ...Object.entries(header.workload).map(([key, value]) => [`workload ${key}`, valueText(value)] as const),
    ['seed', String(header.seed)],
    ['simulator', header.simulator ? 'yes (faults, slow requests and race-free cancellations apply)' : 'no'],
    ['reconcile', header.reconcile ? 'yes' : 'no'],
    ['request timeout', formatDuration(header.timeoutS * 1000)],
    ['waybill', `${header.waybill.version}${header.waybill.revision === 'unknown' ? '' : ` (revision ${header.waybill.revision})`}`],
    ['flags', header.argv.join(' ')],
  ];
}

/** One line for a table's title: target, start, load, length. */
export function headerLine(header: RunHeader): string {
  return `${header.target}  ${header.startedAt}  ${loadText(header.load)}  ${askedText(header.asked)}  waybill ${header.waybill.version}`;
}
