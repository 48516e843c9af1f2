/**
 * The per-sequence side of vLLM's KV cache manager for one full-attention group: KVCacheManager.get_computed_blocks,
 * allocate_slots and free (vllm/v1/core/kv_cache_manager.py) over FullAttentionManager (find_longest_cache_hit,
 * get_num_blocks_to_allocate, allocate_new_computed_blocks, cache_blocks, free in
 * vllm/v1/core/single_type_kv_cache_manager.py).
 */
import type { BlockPool, KVBlock } from './block-pool.js';

/** What the KV manager needs of a sequence (vLLM's Request and req_to_blocks / num_cached_block entries). */
export interface KVSequence {
  /** Tokens known: prompt plus generated (vLLM's num_tokens). */
  numTokens: number;
  /** Tokens whose KV is computed or being computed this step (vLLM's num_computed_tokens). */
  numComputed: number;
  /** The chain of hashes of every full block of known tokens (vLLM's block_hashes). */
  readonly blockHashes: number[];
  /** The blocks held, in token order (req_to_blocks). */
  blocks: KVBlock[];
  /** Leading blocks whose hash is recorded (num_cached_block); -1 while the sequence holds no allocation. */
  numCachedBlocks: number;
}

export interface CacheHit {
  readonly blocks: KVBlock[];
  readonly tokens: number;
}

/** No hit; shared, never mutated (allocateSlots copies a hit's blocks). */
export const NO_HIT: CacheHit = { blocks: [], tokens: 0 };

/**
 * get_computed_blocks + find_longest_cache_hit: the longest run of cached full blocks from the start, capped at
 * num_tokens - 1 so at least one token is computed (its logits are needed to sample), and block-aligned: a prompt that
 * hits entirely recomputes its whole last block.
 */
export function findLongestCacheHit(pool: BlockPool, seq: KVSequence, blockSize: number): CacheHit {
  const maxBlocks = Math.min(Math.floor((seq.numTokens - 1) / blockSize), seq.blockHashes.length);
  let blocks: KVBlock[] | null = null;
  for (let i = 0; i < maxBlocks; i++) {
    const b = pool.getCached(seq.blockHashes[i] as number);
    // A chain: once a block misses, no later block can be cached under this prefix.
    if (b === undefined) break;
    (blocks ??= []).push(b);
  }
  return blocks === null ? NO_HIT : { blocks, tokens: blocks.length * blockSize };
}

/**
 * allocate_slots: give the sequence slots for `numNew` more tokens after its computed ones and the hit. False (and
 * nothing changed) when the free queue is too short — counting hit blocks that sit in the free queue, since touching
 * them takes them out of it (get_num_blocks_to_allocate). On success, record the hashes of the blocks that are full
 * once this step's tokens are in (cache_blocks: vLLM caches at scheduling time, capped at num_tokens).
 */
export function allocateSlots(
  pool: BlockPool,
  seq: KVSequence,
  numNew: number,
  hit: CacheHit,
  blockSize: number,
  enableCaching: boolean,
): boolean {
  const numLocalComputed = seq.numComputed + hit.tokens;
  const required = Math.ceil((numLocalComputed + numNew) / blockSize);
  const allocated = seq.numCachedBlocks >= 0;
  let toAllocate: number;
  if (allocated) {
    toAllocate = Math.max(required - seq.blocks.length, 0);
  } else {
    let evictableHits = 0;
    for (const b of hit.blocks) if (b.refCnt === 0) evictableHits++;
    toAllocate = Math.max(required - hit.blocks.length, 0) + evictableHits;
  }
  if (toAllocate > pool.numFree()) return false;

  if (!allocated) {
    for (const b of hit.blocks) pool.touch(b);
    seq.blocks = hit.blocks.length > 0 ? hit.blocks.slice() : [];
    seq.numCachedBlocks = hit.blocks.length;
  }
  const more = required - seq.blocks.length;
  if (more > 0) pool.getNewBlocks(more, seq.blocks);
  if (enableCaching) cacheFullBlocks(pool, seq, Math.min(numLocalComputed + numNew, seq.numTokens), blockSize);
  return true;
}

/** cache_blocks / cache_full_blocks: hash the blocks that fill within `numTokens`, each once. */
function cacheFullBlocks(pool: BlockPool, seq: KVSequence, numTokens: number, blockSize: number): void {
  const full = Math.floor(numTokens / blockSize);
  for (let i = seq.numCachedBlocks; i < full; i++) {
    const b = seq.blocks[i] as KVBlock;
    if (b.hash === null) pool.cacheBlock(b, seq.blockHashes[i] as number);
  }
  if (full > seq.numCachedBlocks) seq.numCachedBlocks = full;
}

/** free: release the blocks in reverse, so a freed sequence's tail blocks are evicted before its head blocks. */
export function freeSequence(pool: BlockPool, seq: KVSequence): void {
  pool.freeBlocks(seq.blocks, true);
  seq.blocks = [];
  seq.numCachedBlocks = -1;
}
