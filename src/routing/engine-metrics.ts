/**
 * What a vLLM server says about its own load, read from its `GET /metrics` (Prometheus text format 0.0.4). Pure: text
 * in, a few numbers out, no registry built.
 *
 * The body comes from an engine the gateway does not control, so the scan is bounded: one pass over the text, lines
 * whose metric name is not one of the few read here are skipped after their name, and a line or a name with more
 * than the limits allow is ignored and counted rather than read (docs/routing.md, "Engine signals").
 */

import type { ParseFailure } from '../telemetry/labels.js';

/** Why a body gave no signals: a closed set (a metric label's values) of telemetry/labels.ts. */
export { PARSE_FAILURES, type ParseFailure } from '../telemetry/labels.js';

/** Which name KV usage was read from: vLLM renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc` (v0.10-ish). */
export type KvMetric = 'kv_cache_usage_perc' | 'gpu_cache_usage_perc';

export interface EngineLoad {
  /** Requests queued in the engine(s), summed over series (one per model name × data-parallel engine). */
  readonly waiting: number;
  /** Requests in the running batch(es), summed over series. */
  readonly running: number;
  /** Fraction of KV cache blocks in use, 0–1: the fullest engine's (max over series). */
  readonly kvUsage: number;
  readonly kvMetric: KvMetric;
  /** `process_start_time_seconds` (the latest, if several): a change means the server restarted. */
  readonly startTime?: number;
  /** `vllm:prefix_cache_queries_total`, summed: tokens looked up in the prefix cache since start. */
  readonly prefixQueries?: number;
  /** `vllm:prefix_cache_hits_total`, summed: tokens found there. */
  readonly prefixHits?: number;
  /**
   * KV cache capacity in tokens from `vllm:cache_config_info` (`num_gpu_blocks` × `block_size`): the smallest engine's
   * when several series are exposed (data-parallel engines each cache on their own, so a prefix fits in one of them).
   * Absent when the series is missing, says `None` (before KV profiling), or is out of range.
   */
  readonly kvCapacityTokens?: number;
}

/** Lines left unread because of the limits (a body can be ok and still have some). */
export interface IgnoredLines {
  /** Lines longer than `maxLineChars`, of any metric. */
  readonly longLines: number;
  /** Series of a read metric past `maxSeriesPerName`. */
  readonly extraSeries: number;
}

export type ParseResult =
  | { readonly ok: true; readonly signals: EngineLoad; readonly ignored: IgnoredLines }
  | { readonly ok: false; readonly reason: ParseFailure; readonly ignored: IgnoredLines };

export interface ParseLimits {
  /** A longer body is refused whole (`too_large`); the reader's own byte limit normally stops it first. */
  readonly maxBodyChars: number;
  /** A longer line is skipped unread. vLLM's longest (`cache_config_info`, a LoRA list) are a few hundred. */
  readonly maxLineChars: number;
  /** Series of one name read at most; vLLM has one per served model name × engine. */
  readonly maxSeriesPerName: number;
}

export const DEFAULT_PARSE_LIMITS: ParseLimits = { maxBodyChars: 8 * 1024 * 1024, maxLineChars: 64 * 1024, maxSeriesPerName: 1024 };

/**
 * KV usage a hair above 1 is float noise in `used / total`; clamped. Anything more is refused, not rescaled: vLLM
 * documents the gauge as a fraction 0–1 (1 = 100 %), and a "percentage" reading of 1.5 would pass for 1.5 %.
 */
const KV_EPSILON = 1e-6;

const [WAITING, RUNNING, KV, GPU_KV, QUERIES, HITS, START, CACHE_CONFIG] = [0, 1, 2, 3, 4, 5, 6, 7] as const;
const SLOTS = 8;
/** Bounds on what `vllm:cache_config_info` may say: beyond them the capacity is ignored (a lie or a unit mistake). */
const MAX_GPU_BLOCKS = 1e9;
const MAX_BLOCK_SIZE = 4096;
const GPU_BLOCKS_LABEL = /[{,\s]num_gpu_blocks="(\d{1,10})"/;
const BLOCK_SIZE_LABEL = /[{,\s]block_size="(\d{1,10})"/;
/** The metrics read, and the slot each fills. */
const WANTED = new Map<string, number>([
  ['vllm:num_requests_waiting', WAITING],
  ['vllm:num_requests_running', RUNNING],
  ['vllm:kv_cache_usage_perc', KV],
  ['vllm:gpu_cache_usage_perc', GPU_KV],
  ['vllm:prefix_cache_queries_total', QUERIES],
  ['vllm:prefix_cache_hits_total', HITS],
  ['process_start_time_seconds', START],
  ['vllm:cache_config_info', CACHE_CONFIG],
]);

/** Sums, maxima and whether each slot saw a bad value, folded line by line. */
interface Tally {
  readonly series: number[];
  readonly sum: number[];
  readonly max: number[];
  readonly min: number[];
  readonly bad: boolean[];
  /** A line of the slot's metric did not parse. */
  readonly malformed: boolean[];
}

const SPACE = 0x20;
const TAB = 0x09;
const CR = 0x0d;
const HASH = 0x23;
const BRACE_OPEN = 0x7b;
const BRACE_CLOSE = 0x7d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/** Go's ParseFloat as the Prometheus text parser uses it, without hex floats: decimal, exponent, Inf, NaN. */
const FLOAT = /^[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)$/i;
/** A sample timestamp: integer milliseconds. */
const TIMESTAMP = /^-?\d+$/;

/** Parses a sample value; undefined when it is not a number at all (NaN and ±Inf are numbers here). */
export function parseSampleValue(token: string): number | undefined {
  if (!FLOAT.test(token)) return undefined;
  const lower = token.toLowerCase();
  if (lower.endsWith('nan')) return Number.NaN;
  if (lower.endsWith('inf') || lower.endsWith('infinity')) return lower.startsWith('-') ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
  return Number(token);
}

function isBlank(code: number): boolean {
  return code === SPACE || code === TAB;
}

/**
 * Index just past the `}` closing a label set that opens at `open`, or -1 when it is unterminated on the line. Only
 * quotes and their escapes matter for where it ends: `}`, `,` and `\"` inside a quoted value are part of the value.
 */
function labelsEnd(text: string, open: number, end: number): number {
  let quoted = false;
  for (let i = open + 1; i < end; i++) {
    const code = text.charCodeAt(i);
    if (quoted) {
      if (code === BACKSLASH) i++;
      else if (code === QUOTE) quoted = false;
    } else if (code === QUOTE) quoted = true;
    else if (code === BRACE_CLOSE) return i + 1;
  }
  return -1;
}

/**
 * The value of the sample line `text[from, end)` after its name and labels: the value token, then optionally a
 * timestamp, then optionally an OpenMetrics exemplar (`# {…} v`). Undefined when the rest is something else.
 */
function sampleValue(text: string, from: number, end: number): number | undefined {
  const rest = text.slice(from, end).trim();
  if (rest === '') return undefined;
  const tokens = rest.split(/[ \t]+/);
  const value = parseSampleValue(tokens[0] ?? '');
  if (value === undefined) return undefined;
  let next = 1;
  if (tokens[next] !== undefined && TIMESTAMP.test(tokens[next] ?? '')) next++;
  if (tokens[next] !== undefined && !(tokens[next] ?? '').startsWith('#')) return undefined;
  return value;
}

/** Whether a value is usable for a slot: finite and not negative (`-0` is 0); KV usage also at most 1. */
function isValid(slot: number, value: number): boolean {
  if (!Number.isFinite(value) || value < 0) return false;
  return (slot !== KV && slot !== GPU_KV) || value <= 1 + KV_EPSILON;
}

/**
 * Reads the load signals out of a `/metrics` body.
 *
 * @example
 * const result = parseEngineMetrics(body);
 * if (result.ok) picker.observe(upstream, result.signals.waiting, result.signals.kvUsage);
 * else metrics.signalFailed(upstream, result.reason);
 */
export function parseEngineMetrics(text: string, limits: ParseLimits = DEFAULT_PARSE_LIMITS): ParseResult {
  let longLines = 0;
  let extraSeries = 0;
  const ignored = (): IgnoredLines => ({ longLines, extraSeries });
  if (text.length > limits.maxBodyChars) return { ok: false, reason: 'too_large', ignored: ignored() };
  const tally: Tally = {
    series: new Array<number>(SLOTS).fill(0),
    sum: new Array<number>(SLOTS).fill(0),
    max: new Array<number>(SLOTS).fill(Number.NEGATIVE_INFINITY),
    min: new Array<number>(SLOTS).fill(Number.POSITIVE_INFINITY),
    bad: new Array<boolean>(SLOTS).fill(false),
    malformed: new Array<boolean>(SLOTS).fill(false),
  };
  let start = 0;
  // One pass: indexOf finds each line end, and a line is read no further than its name unless it is wanted.
  while (start < text.length) {
    let end = text.indexOf('\n', start);
    if (end === -1) end = text.length;
    const next = end + 1;
    if (end > start && text.charCodeAt(end - 1) === CR) end--;
    if (end - start > limits.maxLineChars) {
      longLines++;
      start = next;
      continue;
    }
    let i = start;
    while (i < end && isBlank(text.charCodeAt(i))) i++;
    if (i === end || text.charCodeAt(i) === HASH) {
      start = next;
      continue;
    }
    let nameEnd = i;
    while (nameEnd < end) {
      const code = text.charCodeAt(nameEnd);
      if (code === BRACE_OPEN || isBlank(code)) break;
      nameEnd++;
    }
    const slot = WANTED.get(text.slice(i, nameEnd));
    if (slot === undefined) {
      start = next;
      continue;
    }
    let valueStart = nameEnd;
    if (valueStart < end && text.charCodeAt(valueStart) === BRACE_OPEN) valueStart = labelsEnd(text, valueStart, end);
    // The info gauge's value is 1; what it says is in its labels: the capacity in tokens, or NaN when unusable.
    const value = valueStart === -1 ? undefined : slot === CACHE_CONFIG ? capacityTokens(text, nameEnd, valueStart) : sampleValue(text, valueStart, end);
    if (value === undefined) tally.malformed[slot] = true;
    else if ((tally.series[slot] ?? 0) >= limits.maxSeriesPerName) extraSeries++;
    else fold(tally, slot, value);
    start = next;
  }
  return settle(tally, ignored());
}

/**
 * `num_gpu_blocks` × `block_size` from a `vllm:cache_config_info` label set `text[open, close)`; NaN when either is
 * missing, `None`, not an integer, or out of range (counted as an invalid line, so the capacity is left unknown).
 */
function capacityTokens(text: string, open: number, close: number): number {
  const labels = text.slice(open, close);
  const blocks = integerLabel(labels, GPU_BLOCKS_LABEL, MAX_GPU_BLOCKS);
  const size = integerLabel(labels, BLOCK_SIZE_LABEL, MAX_BLOCK_SIZE);
  return blocks === undefined || size === undefined ? Number.NaN : blocks * size;
}

/** A label's value as a positive integer up to `max`; undefined otherwise. Values of these labels need no escapes. */
function integerLabel(labels: string, label: RegExp, max: number): number | undefined {
  const match = label.exec(labels);
  if (match === null) return undefined;
  const value = Number(match[1]);
  return value >= 1 && value <= max ? value : undefined;
}

function fold(tally: Tally, slot: number, value: number): void {
  tally.series[slot] = (tally.series[slot] ?? 0) + 1;
  if (slot === CACHE_CONFIG) {
    // Smallest engine's capacity; one unusable series makes it unknown (bad), as any other optional slot.
    if (Number.isNaN(value)) tally.bad[slot] = true;
    else tally.min[slot] = Math.min(tally.min[slot] ?? Infinity, value);
    return;
  }
  if (!isValid(slot, value)) {
    tally.bad[slot] = true;
    return;
  }
  // `-0` is a valid zero, but would survive Math.max and print as -0 downstream.
  const zeroed = value === 0 ? 0 : value;
  tally.sum[slot] = (tally.sum[slot] ?? 0) + zeroed;
  tally.max[slot] = Math.max(tally.max[slot] ?? Number.NEGATIVE_INFINITY, zeroed);
}

/**
 * An optional slot's folded value, or undefined when absent or when any of its lines was invalid or malformed: a
 * sum missing one engine's counter would look like a counter reset.
 */
function optional(tally: Tally, slot: number, of: 'sum' | 'max' | 'min'): number | undefined {
  if ((tally.series[slot] ?? 0) === 0 || tally.bad[slot] === true || tally.malformed[slot] === true) return undefined;
  return tally[of][slot];
}

/** Failure order: a malformed line of a required metric, then a missing one, then an invalid value. */
function settle(tally: Tally, ignored: IgnoredLines): ParseResult {
  const has = (slot: number) => (tally.series[slot] ?? 0) > 0 || tally.malformed[slot] === true;
  // The new name wins whenever it is exposed at all, even with a bad value: a server exposing both is mid-rename
  // and the old one is the deprecated copy.
  const kvSlot = has(KV) ? KV : GPU_KV;
  const required = [WAITING, RUNNING, kvSlot];
  if (required.some((slot) => tally.malformed[slot] === true)) return { ok: false, reason: 'malformed', ignored };
  if (!required.every(has)) return { ok: false, reason: 'missing', ignored };
  if (required.some((slot) => tally.bad[slot] === true)) return { ok: false, reason: 'invalid', ignored };
  const startTime = optional(tally, START, 'max');
  const prefixQueries = optional(tally, QUERIES, 'sum');
  const prefixHits = optional(tally, HITS, 'sum');
  const kvCapacityTokens = optional(tally, CACHE_CONFIG, 'min');
  const signals: EngineLoad = {
    waiting: tally.sum[WAITING] ?? 0,
    running: tally.sum[RUNNING] ?? 0,
    kvUsage: Math.min(1, tally.max[kvSlot] ?? 0),
    kvMetric: kvSlot === KV ? 'kv_cache_usage_perc' : 'gpu_cache_usage_perc',
    ...(startTime === undefined ? {} : { startTime }),
    ...(prefixQueries === undefined ? {} : { prefixQueries }),
    ...(prefixHits === undefined ? {} : { prefixHits }),
    ...(kvCapacityTokens === undefined ? {} : { kvCapacityTokens }),
  };
  return { ok: true, signals, ignored };
}
