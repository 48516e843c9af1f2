/**
 * cyrb53: two 32-bit multiply-xor lanes avalanched into one 53-bit number — exact in a JS number, so a Map key without
 * allocation. Not cryptographic. Shared by the simulator's block hashes (src/sim/engine/block-hash.ts) and the
 * router's rendezvous (src/routing/score.ts).
 */

/** The lanes' seeds and multipliers. */
export const SEED1 = 0xdeadbeef;
export const SEED2 = 0x41c6ce57;
export const MUL1 = 2654435761;
export const MUL2 = 1597334677;

/** A code unit no UTF-16 string holds: what separates the parts of a multi-part key. */
const SEPARATOR = 0x10000;

/** The final avalanche of the two lanes into one 53-bit number. */
export function finish53(h1: number, h2: number): number {
  let a = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  a ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  let b = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  b ^= Math.imul(a ^ (a >>> 13), 3266489909);
  return 4294967296 * (2097151 & b) + (a >>> 0);
}

/** The 53-bit hash of `parts`, in order, each after the first preceded by a separator outside UTF-16. */
export function hash53(...parts: readonly string[]): number {
  let h1 = SEED1;
  let h2 = SEED2;
  parts.forEach((part, i) => {
    if (i > 0) {
      h1 = Math.imul(h1 ^ SEPARATOR, MUL1);
      h2 = Math.imul(h2 ^ SEPARATOR, MUL2);
    }
    for (let c = 0; c < part.length; c++) {
      const unit = part.charCodeAt(c);
      h1 = Math.imul(h1 ^ unit, MUL1);
      h2 = Math.imul(h2 ^ unit, MUL2);
    }
  });
  return finish53(h1, h2);
}
