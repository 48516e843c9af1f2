/**
 * The `cache_aware` pick: send a request to the upstream most likely to hold its prompt prefix in vLLM's prefix
 * cache, unless that upstream is overloaded. Pure: the caller passes the eligible candidates (healthy, not ejected),
 * the prefix index's match, and the randomness. The rules, in order (docs/routing.md):
 *
 * 0. One candidate → it (`single`).
 * 1. Bounded load ("consistent hashing with bounded loads", Mirrokni, Thorup, Zadimoghaddam): with L_i the load
 *    count of candidate i, T = Σ L_i and W = Σ weight_i, candidate i may take the request only if
 *    L_i + 1 ≤ ⌈c · (T + 1) · weight_i / W⌉, c = `boundedLoad`. At least one candidate always qualifies (summing the
 *    opposite over all i gives T ≥ c(T + 1) > T), and no rule below ever picks one that does not.
 * 2. Session affinity: a `sessionKey` picks by weighted rendezvous hashing among the candidates within the bound
 *    (`session`), so a conversation stays put without any state, and moves only when its upstream leaves or fills.
 * 3. Prefix: the best match (≥ `minMatchBlocks`) wins if its candidate is within the bound and the pool is not
 *    imbalanced (SGLang's cache_aware: imbalanced when max − min load > `balanceAbsThreshold` and
 *    max > `balanceRelThreshold` × min, load per unit of weight) → `prefix`; tied best matches are drawn at random.
 * 4. Otherwise a weighted score over the candidates within the bound (llm-d's scorers, 3:2:2, plus in-flight):
 *    prefix × matched/requestBlocks + queue × min-max(waiting/weight) + kv × (1 − kvUsage)
 *    + inflight × min-max((inflight+1)/weight), each term in [0, 1], higher is better. Reason `bounded_load` when
 *    rule 3's winner was skipped for the bound, `stale_signals` when some candidate lacked engine signals so the
 *    queue term (and the signal part of the load) was left out for all, else `load`.
 * Ties are always drawn by `random`, never by position (llm-d-router #2515: bursts to one pod).
 *
 * Load count L_i: the gateway's own in flight, plus, with engine signals for every candidate, the engine's queue
 * (`waiting`, which counts every client's overflow); not `running`, which includes this gateway's own requests and,
 * scraped up to a second ago, finished ones (see loadCount). When any candidate lacks signals, inflight alone for
 * all: mixing both kinds would compare a pod's queue with another's share from this gateway.
 *
 * Runs per request: a handful of O(n) passes over the candidates, no arrays, one result object.
 */
import { hash53 } from '../util/hash53.js';

import type { PickReason } from '../telemetry/labels.js';

/** Why a pick chose its upstream: a closed set (a metric label) of telemetry/labels.ts. */
export { PICK_REASONS, type PickReason } from '../telemetry/labels.js';

/** Structurally a src/proxy/picker.ts Candidate plus the engine's scraped signals (null or absent: unknown or stale). */
export interface RoutingCandidate {
  readonly name: string;
  readonly weight: number;
  /** Requests this gateway has in flight to the upstream. */
  readonly inflight: number;
  /** vllm:num_requests_waiting. */
  readonly waiting?: number | null | undefined;
  /** vllm:num_requests_running. */
  readonly running?: number | null | undefined;
  /** vllm:kv_cache_usage_perc, as a fraction in [0, 1]. */
  readonly kvUsage?: number | null | undefined;
}

/** What the request brings: its prefix key's length and the index's match, and maybe a session. */
export interface RequestMatch {
  /** Full blocks in the request's prefix key (normalises the prefix term). */
  readonly requestBlocks: number;
  /** Matched leading blocks per upstream name (PrefixIndex.match); absent: 0. */
  readonly matched: ReadonlyMap<string, number>;
  /** A client's session or conversation id: rendezvous affinity (rule 2). */
  readonly sessionKey?: string | undefined;
  /**
   * The prefix's own key (e.g. its first block): several upstreams holding the same longest match are chosen among by
   * rendezvous on it, so a prefix that spilled once keeps coming back to one holder instead of being split at random
   * between them (each then caching it, and evicting other prefixes for it). Absent: a random draw.
   */
  readonly tieKey?: string | undefined;
  /**
   * With a `sessionKey` that places a new prefix (not a client's session): each candidate's prefix blocks in the index.
   * The two highest rendezvous candidates are compared and the emptier one takes the prefix (two choices): every worker
   * and replica computes the same pair, so a prefix lands on at most two engines, and engines fill evenly rather than as
   * one hash happens to fall (12 prefixes over 4 engines by one hash put 5 or 6 on one of them).
   */
  readonly occupancy?: ReadonlyMap<string, number> | undefined;
}

export interface ScoreWeights {
  readonly prefix: number;
  readonly queue: number;
  readonly kv: number;
  readonly inflight: number;
}

export interface CacheAwareOptions {
  /** c of the bounded-load rule; default 1.5. Below 1 is taken as 1 (no candidate could ever qualify otherwise). */
  readonly boundedLoad?: number;
  /** Fewer matched blocks than this is no prefix win; default 1. */
  readonly minMatchBlocks?: number;
  /** Imbalanced needs max − min load (requests per unit of weight) above this; default 8. */
  readonly balanceAbsThreshold?: number;
  /** …and max load above this × min load; default 1.5. */
  readonly balanceRelThreshold?: number;
  /** Rule 4's weights; default prefix 3, queue 2, kv 2, inflight 1. */
  readonly weights?: Partial<ScoreWeights>;
}

export interface CacheAwarePick<T> {
  readonly candidate: T;
  readonly reason: PickReason;
  /** The chosen upstream's matched blocks: what the index predicts vLLM will find cached. */
  readonly predictedCachedBlocks: number;
}

export const CACHE_AWARE_DEFAULTS = {
  boundedLoad: 1.5,
  minMatchBlocks: 1,
  balanceAbsThreshold: 8,
  balanceRelThreshold: 1.5,
  weights: { prefix: 3, queue: 2, kv: 2, inflight: 1 },
} as const;

/** Predicted cached prompt tokens for `blocks` matched blocks; vLLM's default block is 16 tokens. */
export function predictedCachedTokens(blocks: number, tokensPerBlock = 16): number {
  return Math.max(0, blocks) * tokensPerBlock;
}

const EPSILON = 1e-9;

/** Per-pick facts shared by the passes (one object per pick). */
interface Pool {
  /** Every candidate has waiting and running. */
  readonly signals: boolean;
  /** Every candidate has kvUsage. */
  readonly kv: boolean;
  /** Some weight is usable; if none is, all count as 1. */
  readonly anyWeight: boolean;
  /** Σ L_i and Σ weight over candidates with weight. */
  total: number;
  weightSum: number;
  c: number;
}

/**
 * The `cache_aware` choice among `candidates` (see the rules above); undefined when there are none.
 * @param random returns a float in [0, 1), like `Math.random`.
 * @example
 * const pick = pickCacheAware(eligible, { requestBlocks: key.blocks.length, matched: index.match(key.blocks) }, {}, Math.random);
 */
export function pickCacheAware<T extends RoutingCandidate>(
  candidates: readonly T[],
  match: RequestMatch,
  options: CacheAwareOptions,
  random: () => number,
): CacheAwarePick<T> | undefined {
  const n = candidates.length;
  const first = candidates[0];
  if (first === undefined) return undefined;
  if (n === 1) return { candidate: first, reason: 'single', predictedCachedBlocks: matchedOf(match, first) };

  let withSignals = 0;
  let withKv = 0;
  let anyWeight = false;
  for (const x of candidates) {
    if (known(x.waiting) && known(x.running)) withSignals++;
    if (known(x.kvUsage)) withKv++;
    if (usableWeight(x.weight)) anyWeight = true;
  }
  const pool: Pool = { signals: withSignals === n, kv: withKv === n, anyWeight, total: 0, weightSum: 0, c: Math.max(1, finiteOr(options.boundedLoad, CACHE_AWARE_DEFAULTS.boundedLoad)) };
  for (const x of candidates) {
    const w = weightOf(x, pool);
    if (w === 0) continue;
    pool.total += loadCount(x, pool);
    pool.weightSum += w;
  }
  // Imbalance is judged over the candidates within the bound: one the bound already excludes (an engine with a long
  // queue of other clients' requests) must not switch prefix affinity off for all the others.
  let minLoad = Infinity;
  let maxLoad = 0;
  for (const x of candidates) {
    const w = weightOf(x, pool);
    if (w === 0 || !withinBound(x, pool)) continue;
    const load = (loadCount(x, pool) + 1) / w;
    if (load < minLoad) minLoad = load;
    if (load > maxLoad) maxLoad = load;
  }

  // Rule 2: session affinity.
  const session = match.sessionKey;
  if (session !== undefined && session !== '') {
    const chosen = match.occupancy === undefined ? rendezvous(candidates, session, pool) : twoChoices(candidates, session, pool, match.occupancy);
    if (chosen !== undefined) return { candidate: chosen, reason: 'session', predictedCachedBlocks: matchedOf(match, chosen) };
  }

  // Rule 3: the longest prefix, if its holder is within the bound and the pool is balanced.
  let bestAll = 0;
  let bestWithin = 0;
  for (const x of candidates) {
    if (weightOf(x, pool) === 0) continue;
    const m = matchedOf(match, x);
    if (m > bestAll) bestAll = m;
    if (m > bestWithin && withinBound(x, pool)) bestWithin = m;
  }
  const minMatch = finiteOr(options.minMatchBlocks, CACHE_AWARE_DEFAULTS.minMatchBlocks);
  const prefixWins = bestAll > 0 && bestAll >= minMatch;
  const abs = finiteOr(options.balanceAbsThreshold, CACHE_AWARE_DEFAULTS.balanceAbsThreshold);
  const rel = finiteOr(options.balanceRelThreshold, CACHE_AWARE_DEFAULTS.balanceRelThreshold);
  const imbalanced = maxLoad - minLoad > abs && maxLoad > rel * minLoad;
  if (prefixWins && bestWithin === bestAll && !imbalanced) {
    const holds = (x: T) => weightOf(x, pool) > 0 && withinBound(x, pool) && matchedOf(match, x) === bestAll;
    const tieKey = match.tieKey;
    const chosen = tieKey === undefined || tieKey === '' ? drawTied(candidates, random, holds) : rendezvousAmong(candidates, tieKey, pool, holds);
    if (chosen !== undefined) return { candidate: chosen, reason: 'prefix', predictedCachedBlocks: bestAll };
  }

  // Rule 4: the weighted score over the candidates within the bound.
  const weights = options.weights;
  const wPrefix = finiteOr(weights?.prefix, CACHE_AWARE_DEFAULTS.weights.prefix);
  const wQueue = pool.signals ? finiteOr(weights?.queue, CACHE_AWARE_DEFAULTS.weights.queue) : 0;
  const wKv = pool.kv ? finiteOr(weights?.kv, CACHE_AWARE_DEFAULTS.weights.kv) : 0;
  const wInflight = finiteOr(weights?.inflight, CACHE_AWARE_DEFAULTS.weights.inflight);
  let qMin = Infinity;
  let qMax = -Infinity;
  let iMin = Infinity;
  let iMax = -Infinity;
  for (const x of candidates) {
    const w = weightOf(x, pool);
    if (w === 0 || !withinBound(x, pool)) continue;
    const q = nonNegative(x.waiting) / w;
    const l = (nonNegative(x.inflight) + 1) / w;
    if (q < qMin) qMin = q;
    if (q > qMax) qMax = q;
    if (l < iMin) iMin = l;
    if (l > iMax) iMax = l;
  }
  const prefixDenominator = Math.max(nonNegative(match.requestBlocks), bestAll);
  const score = (x: T): number => {
    const w = weightOf(x, pool);
    let s = 0;
    if (prefixDenominator > 0) s += (wPrefix * matchedOf(match, x)) / prefixDenominator;
    if (wQueue !== 0) s += wQueue * spread(nonNegative(x.waiting) / w, qMin, qMax);
    if (wKv !== 0) s += wKv * (1 - Math.min(1, nonNegative(x.kvUsage)));
    s += wInflight * spread((nonNegative(x.inflight) + 1) / w, iMin, iMax);
    return s;
  };
  let best = -Infinity;
  for (const x of candidates) {
    if (weightOf(x, pool) === 0 || !withinBound(x, pool)) continue;
    const s = score(x);
    if (s > best) best = s;
  }
  const chosen = drawTied(candidates, random, (x) => weightOf(x, pool) > 0 && withinBound(x, pool) && score(x) >= best - EPSILON) ?? first;
  const reason: PickReason = prefixWins && bestWithin < bestAll ? 'bounded_load' : withSignals > 0 && withSignals < n ? 'stale_signals' : 'load';
  return { candidate: chosen, reason, predictedCachedBlocks: matchedOf(match, chosen) };
}

/** Whether candidate `x` may take one more request under the bound (rule 1). */
function withinBound(x: RoutingCandidate, pool: Pool): boolean {
  const w = weightOf(x, pool);
  if (w === 0 || pool.weightSum === 0) return false;
  // The epsilon absorbs float error in c·(T+1)·w/W when it is an integer in exact arithmetic.
  return loadCount(x, pool) + 1 <= Math.ceil((pool.c * (pool.total + 1) * w) / pool.weightSum - EPSILON);
}

/** (max − v)/(max − min): 1 for the least loaded, 0 for the most; 1 for all when they are equal. */
function spread(v: number, min: number, max: number): number {
  return max - min > EPSILON ? (max - v) / (max - min) : 1;
}

/** A uniformly random candidate among those `tied` accepts: count, draw one index, find it (no array). */
function drawTied<T>(candidates: readonly T[], random: () => number, tied: (x: T) => boolean): T | undefined {
  let count = 0;
  for (const x of candidates) if (tied(x)) count++;
  if (count === 0) return undefined;
  let k = count === 1 ? 0 : Math.min(count - 1, Math.floor(random() * count));
  for (const x of candidates) {
    if (!tied(x)) continue;
    if (k === 0) return x;
    k--;
  }
  return undefined;
}

/**
 * Weighted rendezvous (highest random weight) hashing: each candidate within the bound scores
 * weight / −ln(u), u uniform in (0, 1) from hash(session, name); the highest wins. A candidate leaving moves only
 * the sessions it held.
 */
function rendezvous<T extends RoutingCandidate>(candidates: readonly T[], session: string, pool: Pool): T | undefined {
  return rendezvousAmong(candidates, session, pool, (x) => withinBound(x, pool));
}

/** Of the two highest rendezvous candidates within the bound, the one with fewer blocks in `occupancy` (the first on a tie). */
function twoChoices<T extends RoutingCandidate>(candidates: readonly T[], key: string, pool: Pool, occupancy: ReadonlyMap<string, number>): T | undefined {
  let first: T | undefined;
  let second: T | undefined;
  let firstScore = -Infinity;
  let secondScore = -Infinity;
  for (const x of candidates) {
    if (!withinBound(x, pool)) continue;
    const u = (hash53(key, x.name) + 0.5) / 2 ** 53;
    const score = weightOf(x, pool) / -Math.log(u);
    if (score > firstScore) {
      second = first;
      secondScore = firstScore;
      first = x;
      firstScore = score;
    } else if (score > secondScore) {
      second = x;
      secondScore = score;
    }
  }
  if (first === undefined || second === undefined) return first;
  return (occupancy.get(second.name) ?? 0) < (occupancy.get(first.name) ?? 0) ? second : first;
}

/** Weighted rendezvous over the candidates `eligible` accepts. */
function rendezvousAmong<T extends RoutingCandidate>(candidates: readonly T[], session: string, pool: Pool, eligible: (x: T) => boolean): T | undefined {
  let best: T | undefined;
  let bestScore = -Infinity;
  for (const x of candidates) {
    if (!eligible(x)) continue;
    const u = (hash53(session, x.name) + 0.5) / 2 ** 53;
    const s = weightOf(x, pool) / -Math.log(u);
    if (s > bestScore) {
      bestScore = s;
      best = x;
    }
  }
  return best;
}


/** L_i of rule 1 (see the module comment). */
/**
 * The load the bound counts: this gateway's own in flight (exact and current), plus, when every candidate has engine
 * signals, the engine's own queue (`waiting`: requests past its seats or KV, whoever sent them). Not `running`: it
 * includes this gateway's own requests, and a scrape up to a second old still shows ones already finished, so a
 * sequential conversation would read as load on the very engine that holds its prefix.
 */
function loadCount(x: RoutingCandidate, pool: Pool): number {
  const own = nonNegative(x.inflight);
  return pool.signals ? own + nonNegative(x.waiting) : own;
}

/** A weight of 0, negative or not finite never takes a request while another can, as in the picker. */
function weightOf(x: RoutingCandidate, pool: Pool): number {
  if (!pool.anyWeight) return 1;
  return usableWeight(x.weight) ? x.weight : 0;
}

function usableWeight(w: number): boolean {
  return Number.isFinite(w) && w > 0;
}

function matchedOf(match: RequestMatch, x: RoutingCandidate): number {
  return nonNegative(match.matched.get(x.name));
}

function known(v: number | null | undefined): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}

function nonNegative(v: number | null | undefined): number {
  return known(v) && v > 0 ? v : 0;
}

function finiteOr(v: number | undefined, fallback: number): number {
  return v !== undefined && Number.isFinite(v) ? v : fallback;
}
