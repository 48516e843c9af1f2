/**
 * Load-aware upstream choice: power of two choices (Mitzenmacher), the balancer Envoy calls LEAST_REQUEST.
 * Pure: the caller passes the eligible candidates and the randomness.
 */

export interface Candidate {
  readonly name: string;
  readonly weight: number;
  readonly inflight: number;
}

/**
 * Power of two choices: draw two distinct candidates at random (uniformly, by `random`), keep the one with the lower
 * load (inflight + 1) / weight; on a tie keep the first drawn. Candidates whose name is in `avoid` (the upstreams a
 * retried request was already sent to) are used only when no other candidate is given. One candidate → it. None → undefined.
 *
 * Two random draws rather than a scan for the least loaded: every gateway instance sees the same inflight counts only
 * approximately, and a full scan sends every new request to the same momentary minimum (herding); two draws keep
 * almost all of the benefit without it.
 *
 * Runs per request, so it builds no arrays: with `avoid` in play the usable candidates are found by counting, at
 * O(n) per draw, which is cheaper than allocating for the pool sizes a gateway has.
 *
 * @param random returns a float in [0, 1), like `Math.random`.
 * @example
 * const upstream = pickUpstream(eligible, new Set(triedNames), Math.random);
 */
export function pickUpstream<T extends Candidate>(
  candidates: readonly T[],
  avoid: ReadonlySet<string>,
  random: () => number,
): T | undefined {
  let usable = candidates.length;
  if (avoid.size > 0) {
    usable = 0;
    for (const candidate of candidates) if (!avoid.has(candidate.name)) usable++;
  }
  // Only avoided upstreams left: retrying on one that already failed still beats not retrying.
  const filtering = usable > 0 && usable < candidates.length;
  const count = filtering ? usable : candidates.length;
  if (count <= 1) return candidates.length === 0 ? undefined : nth(candidates, avoid, filtering, 0);

  const i = drawIndex(random, count);
  let j = drawIndex(random, count - 1);
  if (j >= i) j++; // a uniform draw among the other count - 1: distinct without rejection sampling
  const first = nth(candidates, avoid, filtering, i);
  const second = nth(candidates, avoid, filtering, j);
  if (first === undefined || second === undefined) return first ?? second;
  return isLessLoaded(second, first) ? second : first;
}

/** The k-th candidate, counting only those not avoided when `filtering`. */
function nth<T extends Candidate>(candidates: readonly T[], avoid: ReadonlySet<string>, filtering: boolean, k: number): T | undefined {
  if (!filtering) return candidates[k];
  let seen = 0;
  for (const candidate of candidates) {
    if (avoid.has(candidate.name)) continue;
    if (seen === k) return candidate;
    seen++;
  }
  return undefined;
}

function drawIndex(random: () => number, n: number): number {
  // Clamped because an injected random may return exactly 1.
  return Math.min(n - 1, Math.floor(random() * n));
}

/**
 * (a.inflight + 1) / a.weight < (b.inflight + 1) / b.weight, cross-multiplied so a weight of 0 means "infinitely
 * loaded" instead of a division by zero.
 */
function isLessLoaded(a: Candidate, b: Candidate): boolean {
  return (a.inflight + 1) * b.weight < (b.inflight + 1) * a.weight;
}
