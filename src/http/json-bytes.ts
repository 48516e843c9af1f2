/**
 * Reading JSON bytes without parsing them: the nesting depth of a body (checked before JSON.parse) and where a
 * top-level member's value lies (so one member can be replaced while every other byte stays the client's). Neither
 * validates: both run on bodies that JSON.parse accepts, or is about to judge.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const COMMA = 0x2c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;

/**
 * Does any array or object in these bytes nest deeper than `maxDepth`? Counts brackets outside strings; it does
 * not validate (JSON.parse does, after), so an unbalanced body only has to be rejected by one of the two.
 */
export function exceedsDepth(raw: Buffer, maxDepth: number): boolean {
  let depth = 0;
  const length = raw.length;
  for (let i = 0; i < length; i++) {
    const c = raw[i];
    if (c === QUOTE) {
      i = skipString(raw, i) - 1;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > maxDepth) return true;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--;
    }
  }
  return false;
}

function skipSpace(raw: Buffer, i: number): number {
  while (i < raw.length && (raw[i] === 0x20 || raw[i] === 0x0a || raw[i] === 0x0d || raw[i] === 0x09)) i++;
  return i;
}

/** At an opening quote: the index just past the closing one. */
function skipString(raw: Buffer, i: number): number {
  for (i++; i < raw.length; i++) {
    const c = raw[i];
    if (c === BACKSLASH) i++;
    else if (c === QUOTE) return i + 1;
  }
  return raw.length;
}

/** At the first byte of a value: the index just past it. */
function skipValue(raw: Buffer, i: number): number {
  const first = raw[i];
  if (first === QUOTE) return skipString(raw, i);
  if (first === OPEN_BRACE || first === OPEN_BRACKET) {
    let depth = 0;
    for (; i < raw.length; i++) {
      const c = raw[i];
      if (c === QUOTE) i = skipString(raw, i) - 1;
      else if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
      else if ((c === CLOSE_BRACE || c === CLOSE_BRACKET) && --depth === 0) return i + 1;
    }
    return raw.length;
  }
  while (i < raw.length && raw[i] !== COMMA && raw[i] !== CLOSE_BRACE && raw[i] !== 0x20 && raw[i] !== 0x0a && raw[i] !== 0x0d && raw[i] !== 0x09) i++;
  return i;
}

/**
 * The byte span of the value of the top-level member `key` in `raw`, a JSON object that JSON.parse accepted. With
 * duplicate keys it is the last one, the one JSON.parse (and the upstream's parser) keeps. Keys are compared
 * decoded, so an escaped spelling of the name is found too.
 */
export function memberValueSpan(raw: Buffer, key: string): { start: number; end: number } | undefined {
  let i = skipSpace(raw, 0);
  if (raw[i] !== OPEN_BRACE) return undefined;
  let found: { start: number; end: number } | undefined;
  i = skipSpace(raw, i + 1);
  while (i < raw.length && raw[i] === QUOTE) {
    const keyEnd = skipString(raw, i);
    const name: unknown = JSON.parse(raw.toString('utf8', i, keyEnd));
    i = skipSpace(raw, keyEnd);
    if (raw[i] !== COLON) return undefined;
    const start = skipSpace(raw, i + 1);
    const end = skipValue(raw, start);
    if (name === key) found = { start, end };
    i = skipSpace(raw, end);
    if (raw[i] !== COMMA) break;
    i = skipSpace(raw, i + 1);
  }
  return found;
}
