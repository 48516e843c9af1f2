/**
 * The workload: what each request of a run is, drawn from a seed so a run can be repeated exactly. Pure.
 */
import { FAULT_KINDS, type FaultKind } from '../src/sim/faults.js';
import type { ChatMessage, Fleet, FleetTag } from './fleet.js';

/** A fixed value or an inclusive uniform integer range: `64`, `32-512`. */
export interface Range {
  readonly min: number;
  readonly max: number;
}

/**
 * The routes the load tool sends, by their `route` label (docs/metrics.md): two generation routes with choices,
 * two with protocols of their own (named SSE events, one answer), and three of vLLM's non-generation routes (one
 * JSON answer, never streamed).
 */
export const LOAD_ROUTES = ['chat_completions', 'completions', 'responses', 'messages', 'embeddings', 'rerank', 'tokenize'] as const;
export type LoadRoute = (typeof LOAD_ROUTES)[number];

/** Short names `--route-mix` also takes. */
const ROUTE_ALIASES: Readonly<Record<string, LoadRoute>> = { chat: 'chat_completions' };

/** Routes that can stream; the others are always sent with `stream` absent. */
export const STREAMING_ROUTES: ReadonlySet<LoadRoute> = new Set(['chat_completions', 'completions', 'responses', 'messages']);

/** The share of requests per route, in LOAD_ROUTES order (a route left out has none); they sum to 1. */
export type RouteShares = ReadonlyArray<readonly [LoadRoute, number]>;

/** `chat_share` as a route mix: chat completions, the rest legacy completions (the mix before there was one). */
export function chatShareMix(chatShare: number): RouteShares {
  return [
    ['chat_completions', chatShare],
    ['completions', 1 - chatShare],
  ];
}

/**
 * Reads a route mix: `chat=0.6,responses=0.2,embeddings=0.2` (a flag) or a mapping of the same (a YAML key). Every
 * share in [0, 1], every route known, and they must sum to 1 (within 1e-6). Returns the problems otherwise.
 */
export function parseRouteMix(input: unknown): RouteShares | { problems: string[] } {
  const problems: string[] = [];
  let entries: Array<[string, unknown]>;
  if (typeof input === 'string') {
    entries = input
      .split(',')
      .map((part) => part.trim())
      .filter((part) => part !== '')
      .map((part) => {
        const eq = part.indexOf('=');
        return eq === -1 ? [part, undefined] : [part.slice(0, eq).trim(), part.slice(eq + 1).trim()];
      });
  } else if (input !== null && typeof input === 'object' && !Array.isArray(input)) {
    entries = Object.entries(input);
  } else {
    return { problems: ['must be route=share pairs (e.g. chat=0.6,responses=0.2,embeddings=0.2) or a mapping'] };
  }
  const shares = new Map<LoadRoute, number>();
  for (const [name, raw] of entries) {
    const route = ROUTE_ALIASES[name] ?? (LOAD_ROUTES as readonly string[]).find((r) => r === name);
    const value = typeof raw === 'number' ? raw : typeof raw === 'string' && raw !== '' ? Number(raw) : Number.NaN;
    if (route === undefined) problems.push(`unknown route "${name}" (one of chat, ${LOAD_ROUTES.join(', ')})`);
    else if (shares.has(route as LoadRoute)) problems.push(`route "${name}" given twice`);
    else if (!(value >= 0 && value <= 1)) problems.push(`"${name}": "${String(raw)}" is not a share between 0 and 1`);
    else shares.set(route as LoadRoute, value);
  }
  if (problems.length > 0) return { problems };
  const total = [...shares.values()].reduce((a, b) => a + b, 0);
  if (Math.abs(total - 1) > 1e-6) return { problems: [`the shares sum to ${Number(total.toFixed(6))}, not 1`] };
  return LOAD_ROUTES.filter((route) => shares.has(route)).map((route) => [route, shares.get(route) ?? 0] as const);
}

/** The route a uniform draw in [0, 1) falls on: cumulative shares in order; the last route with a share takes the rest. */
function pickRoute(shares: RouteShares, roll: number): LoadRoute {
  let cumulative = 0;
  let last: LoadRoute = 'chat_completions';
  for (const [route, share] of shares) {
    if (share <= 0) continue;
    cumulative += share;
    last = route;
    if (roll < cumulative) return route;
  }
  return last;
}

export interface Workload {
  readonly model: string | undefined;
  readonly promptTokens: Range;
  readonly outputTokens: Range;
  /** Share of requests that stream (on the routes that can). */
  readonly streamShare: number;
  /** Share of requests per route (`route_shares`, or `chat_share` as chat vs legacy completions). */
  readonly routeShares: RouteShares;
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
  /** A fleet workload (load/fleet.ts) instead of independent requests: shared prefixes or multi-turn sessions. */
  readonly fleet?: Fleet;
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
  readonly route: LoadRoute;
  readonly stream: boolean;
  /** Choices asked for (`n`): chat and legacy completions only; 1 on the routes with one answer, 0 on the others. */
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
  /** A fleet request's chat messages (otherwise one user message of promptText). */
  readonly messages?: readonly ChatMessage[];
  /** A fleet request's group, or session and turn. */
  readonly fleet?: FleetTag;
  /** Headers of its own (a fleet session's id). */
  readonly headers?: Readonly<Record<string, string>>;
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

/** Answers a request on `route` expects: Responses and Messages one, the non-generation routes none (no choices). */
export function choicesOf(route: LoadRoute): number {
  return route === 'responses' || route === 'messages' ? 1 : 0;
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
  // The draws are taken in the same order on every route, so a workload of chat and legacy completions only (a
  // `chat_share`) plans exactly what it planned before there was a route mix.
  const route = pickRoute(workload.routeShares, random());
  const stream = random() < workload.streamShare && STREAMING_ROUTES.has(route);
  const drawnN = draw(random, workload.n);
  const n = route === 'chat_completions' || route === 'completions' ? drawnN : choicesOf(route);
  const promptTokens = draw(random, workload.promptTokens);
  const maxTokens = Math.max(1, draw(random, workload.outputTokens));
  // Responses and Messages always report usage; only chat and legacy completions ask for it on a stream.
  const includeUsage = stream && random() < workload.usageShare && (route === 'chat_completions' || route === 'completions');
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
