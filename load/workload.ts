/**
 * The workload: what each request of a run is, drawn from a seed so a run can be repeated exactly. Pure.
 */
import { FAULT_KINDS, type FaultKind } from '../src/sim/faults.js';

/** A fixed value or an inclusive uniform integer range: `64`, `32-512`. */
export interface Range {
  readonly min: number;
  readonly max: number;
}

export interface Workload {
  readonly model: string | undefined;
  readonly promptTokens: Range;
  readonly outputTokens: Range;
  /** Share of requests that stream. */
  readonly streamShare: number;
  /** Share of requests to /v1/chat/completions (the rest: /v1/completions). */
  readonly chatShare: number;
  readonly n: Range;
  /** Share of requests that ask for stream_options.include_usage. */
  readonly usageShare: number;
  /** Share of requests the client abandons, and of those, the share abandoned after the first token. */
  readonly cancelShare: number;
  readonly cancelAfterFirstTokenShare: number;
  /** Share of requests that carry a simulator fault, and the kinds drawn from (uniformly). */
  readonly faultShare: number;
  readonly faultKinds: readonly FaultKind[];
  /** Requests whose simulator timing is stretched past the SLO thresholds (modifiers, not faults). */
  readonly slowShare: number;
}



/**
 * Faults drawn for non-stream requests. The simulator ignores the stream-only kinds there, and answers the error
 * kinds with an HTTP error instead of an error event; leaving those to streams keeps "an injected error fault is one
 * error event" exact for reconciliation.
 */
const NON_STREAM_FAULTS: ReadonlySet<FaultKind> = new Set(['status', 'reset_after', 'reset_before_response', 'stall_after']);

export type CancelPlan =
  /** Abort after this many milliseconds; with a simulator target the first token is held back past it. */
  | { readonly phase: 'before_first_token'; readonly afterMs: number }
  /** Abort on receiving this many output-bearing events; with a simulator target the stream stalls after them. */
  | { readonly phase: 'streaming'; readonly afterEvents: number };

export interface PlannedRequest {
  readonly index: number;
  readonly route: 'chat_completions' | 'completions';
  readonly stream: boolean;
  readonly n: number;
  readonly promptTokens: number;
  readonly maxTokens: number;
  readonly includeUsage: boolean;
  /** The x-sim-fault header value, when any (a fault and/or timing modifiers). */
  readonly simHeader: string | undefined;
  /** The fault kind, when the request carries one. */
  readonly fault: FaultKind | undefined;
  readonly cancel: CancelPlan | undefined;
  readonly slow: 'ttft' | 'tpot' | undefined;
}

/** The workload's draws use the simulator's seeded PRNG: the same seed gives the same run. */
export { createRandom as seededRandom } from '../src/util/prng.js';
export { FAULT_KINDS, type FaultKind };

export function parseRange(text: string): Range | undefined {
  const match = /^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$/.exec(text);
  if (!match) return undefined;
  const min = Number(match[1]);
  const max = match[2] === undefined ? min : Number(match[2]);
  return max >= min ? { min, max } : undefined;
}

function draw(random: () => number, range: Range): number {
  return range.min + Math.floor(random() * (range.max - range.min + 1));
}

/** Timing of the stretched requests, far enough from usual thresholds that client and gateway clocks agree. */
export const SLOW_TTFT_MS = 3000;
export const SLOW_ITL_MS = 120;
/** First token held back for a before-first-token cancellation (abort happens well before). */
const CANCEL_HOLD_MS = 5000;

/**
 * Plans request `index`. Faults, cancellations and slow timing never combine on one request, so what the client
 * observes has one cause. `simulator` says the target is the simulator (faults and modifiers only reach it there).
 */
export function planRequest(workload: Workload, random: () => number, index: number, simulator: boolean): PlannedRequest {
  const route = random() < workload.chatShare ? 'chat_completions' : 'completions';
  const stream = random() < workload.streamShare;
  const n = draw(random, workload.n);
  const promptTokens = draw(random, workload.promptTokens);
  const maxTokens = Math.max(1, draw(random, workload.outputTokens));
  const includeUsage = stream && random() < workload.usageShare;
  const roll = random();
  let fault: FaultKind | undefined;
  let cancel: CancelPlan | undefined;
  let slow: 'ttft' | 'tpot' | undefined;
  const modifiers: string[] = [`tokens=${maxTokens}`];
  if (roll < workload.cancelShare && stream) {
    if (random() < workload.cancelAfterFirstTokenShare && maxTokens >= 4) {
      const afterEvents = 1 + Math.floor(random() * Math.floor(maxTokens / 2));
      cancel = { phase: 'streaming', afterEvents };
      // The simulator stops after exactly those events, so the stream cannot finish before the client's abort
      // reaches the gateway however late a busy client reads them (the 100,000-request soak showed it can).
      modifiers.push(`stall_after=${afterEvents}`);
    } else {
      cancel = { phase: 'before_first_token', afterMs: 10 + Math.floor(random() * 190) };
      modifiers.push(`ttft_ms=${CANCEL_HOLD_MS}`);
    }
  } else if (roll < workload.cancelShare + workload.faultShare && simulator) {
    const kinds = stream ? workload.faultKinds : workload.faultKinds.filter((kind) => NON_STREAM_FAULTS.has(kind));
    fault = kinds[Math.floor(random() * kinds.length)];
    if (fault !== undefined) modifiers.push(faultDirective(fault, maxTokens, random));
  } else if (roll < workload.cancelShare + workload.faultShare + workload.slowShare && simulator && stream) {
    slow = random() < 0.5 ? 'ttft' : 'tpot';
    modifiers.push(slow === 'ttft' ? `ttft_ms=${SLOW_TTFT_MS}` : `itl_ms=${SLOW_ITL_MS}`);
  }
  return {
    index,
    route,
    stream,
    n,
    promptTokens,
    maxTokens,
    includeUsage,
    simHeader: simulator ? modifiers.join('; ') : undefined,
    fault,
    cancel,
    slow,
  };
}

const STATUSES = [400, 429, 500, 503];

/** The simulator directive for a fault; positions fall inside the answer (before its last token). */
function faultDirective(kind: FaultKind, tokens: number, random: () => number): string {
  const at = 1 + Math.floor(random() * Math.max(1, tokens - 1));
  switch (kind) {
    case 'status':
      return `status=${STATUSES[Math.floor(random() * STATUSES.length)] ?? 503}`;
    case 'error_before_output':
      return 'error_before_output=400';
    case 'error_after':
      return `error_after=${at}`;
    case 'reset_after':
      return `reset_after=${at}`;
    case 'reset_before_response':
      return 'reset_before_response';
    case 'stall_after':
      return `stall_after=${at}`;
    case 'end_after':
      return `end_after=${at}`;
    case 'no_done':
      return 'no_done';
    case 'drop_finish':
      return 'drop_finish';
    case 'malformed_after':
      return `malformed_after=${at}`;
    case 'oversized_after':
      return `oversized_after=${at}`;
    case 'data_after_done':
      return 'data_after_done';
  }
}

/** A prompt of about `tokens` tokens for the simulator's estimate (4 characters a token) and for real tokenizers. */
export function promptText(tokens: number, index: number): string {
  const words = ['alpha', 'bravo', 'delta', 'gamma', 'kilo', 'lima', 'oscar', 'tango'];
  let text = `request ${index}:`;
  while (text.length < tokens * 4) text += ` ${words[text.length % words.length] ?? 'x'}`;
  return text.slice(0, Math.max(4, tokens * 4));
}
