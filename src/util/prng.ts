/**
 * Seeded randomness for the simulator. Not cryptographic: it only has to make jitter, interleaving and
 * fault draws repeatable for a given seed.
 */

/** A function returning a float in [0, 1). */
export type Random = () => number;

/** mulberry32: four integer ops per draw, which matters at hundreds of streams on two cores. */
export function createRandom(seed: number): Random {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * An independent seed for sub-stream `stream` of `seed` (murmur3 finaliser), so each request's jitter and
 * interleaving depend on its sequence number only, not on how other requests consumed draws.
 */
export function deriveSeed(seed: number, stream: number): number {
  let z = (seed ^ Math.imul(stream + 1, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

/** An integer uniform in [low, highExclusive); `low` when the range is empty. */
export function randomInt(random: Random, low: number, highExclusive: number): number {
  if (highExclusive <= low) return low;
  return low + Math.floor(random() * (highExclusive - low));
}

/** `ms` scaled by a factor uniform in [1 - jitter, 1 + jitter]. */
export function jittered(random: Random, ms: number, jitter: number): number {
  if (jitter === 0 || ms === 0) return ms;
  return Math.max(0, ms * (1 + jitter * (2 * random() - 1)));
}
