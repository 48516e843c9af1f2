/**
 * Chained hashes of full KV blocks, as vLLM's hash_block_tokens builds them (vllm/v1/core/kv_cache_utils.py): the hash
 * of block i covers the hash of block i - 1, the block's token ids and the block's extra keys, so equal hashes mean an
 * equal prefix up to and including that block. The first block's parent is a fixed seed (vLLM's NONE_HASH); the cache
 * salt is an extra key of the first block only (generate_block_hash_extra_keys adds it when start_token_idx == 0), and
 * since every later hash covers the first, a salt separates the whole chain.
 *
 * vLLM hashes with sha256 (or a builtin hash); here a cyrb53-style hash of two 32-bit lanes gives 53 bits, exact in a
 * JS number and usable as a Map key without allocation. Collision bound: for n distinct blocks whose hashes are taken
 * as uniform over 2^53 values, P(any two collide) <= n(n-1)/2 / 2^53 ≈ n² / 2^54 — about 5.6e-5 for a million distinct
 * blocks, far beyond what a simulated run caches. A collision would only give a false prefix hit (a wrong cachedTokens
 * count), never corrupt the pool's accounting.
 */

import { finish53 as finish, hash53, MUL1, MUL2, SEED1, SEED2 } from '../../util/hash53.js';

const TWO_POW_32 = 4294967296;

/** The first block's parent: a fixed seed where vLLM draws NONE_HASH at random per process (fixed here for determinism). */
export const NONE_HASH = 0x1b873593 * 0x100000 + 0x85ebca6b;

/** Token ids are 32-bit words in the hash (vocabularies are far below 2^31). */
export type TokenAt = (position: number) => number;

/** The low and high lanes of a 53-bit hash (the high lane holds 21 bits). */
function lo(h: number): number {
  return h % TWO_POW_32 | 0;
}
function hi(h: number): number {
  return Math.floor(h / TWO_POW_32) | 0;
}

/** A string (the cache salt, a sequence id) as a 53-bit key. */
export const hashString = (s: string): number => hash53(s);

/**
 * The hash of the block of tokens [start, start + blockSize) given its parent's hash. `saltKey` is folded in only by
 * the caller's choice (the first block), with a marker word so a salted chain never equals an unsalted one by layout.
 */
export function hashBlock(parent: number, tokenAt: TokenAt, start: number, blockSize: number, saltKey?: number): number {
  let h1 = SEED1 ^ lo(parent);
  let h2 = SEED2 ^ hi(parent);
  h1 = Math.imul(h1 ^ hi(parent), MUL1);
  h2 = Math.imul(h2 ^ lo(parent), MUL2);
  for (let p = start; p < start + blockSize; p++) {
    const t = tokenAt(p) | 0;
    h1 = Math.imul(h1 ^ t, MUL1);
    h2 = Math.imul(h2 ^ t, MUL2);
  }
  if (saltKey !== undefined) {
    for (const w of [0x5a17, lo(saltKey), hi(saltKey)]) {
      h1 = Math.imul(h1 ^ w, MUL1);
      h2 = Math.imul(h2 ^ w, MUL2);
    }
  }
  return finish(h1, h2);
}

/**
 * Extend `hashes` (the chain so far) with the hashes of every block that is full within `numTokens` tokens: each block
 * is hashed once, when it fills, as vLLM's Request extends block_hashes on creation and on each appended output token.
 */
export function extendBlockHashes(
  hashes: number[],
  tokenAt: TokenAt,
  numTokens: number,
  blockSize: number,
  saltKey: number | undefined,
): void {
  const full = Math.floor(numTokens / blockSize);
  for (let i = hashes.length; i < full; i++) {
    const parent = i === 0 ? NONE_HASH : (hashes[i - 1] as number);
    hashes.push(hashBlock(parent, tokenAt, i * blockSize, blockSize, i === 0 ? saltKey : undefined));
  }
}

/**
 * A generated token's id, deterministic per sequence and position: derived from the sequence id's key, so generated
 * blocks only ever hit for the same sequence (its own recompute after preemption), never for another sequence that
 * happens to share the prompt (a real model could generate the same text; the simulator does not pretend to know).
 */
export function generatedTokenId(seqKey: number, position: number): number {
  const h1 = Math.imul(lo(seqKey) ^ position, MUL1);
  const h2 = Math.imul(hi(seqKey) ^ position, MUL2);
  return finish(h1, h2) % 0x7fffffff;
}
