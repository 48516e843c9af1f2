/**
 * The KV block pool, after vLLM's BlockPool (vllm/v1/core/block_pool.py) and FreeKVCacheBlockQueue
 * (vllm/v1/core/kv_cache_utils.py): a fixed set of blocks, a doubly linked free queue in eviction order (head evicted
 * first) threaded through the blocks themselves, and a map from block hash to the cached block. Every operation is O(1)
 * per block; nothing here allocates after construction except the caller's block lists.
 */

export interface KVBlock {
  readonly id: number;
  /** Holders of the block: running sequences using it. 0 means it sits in the free queue (an eviction candidate). */
  refCnt: number;
  /** The hash of the full block's prefix once cached; null for a fresh or evicted block. */
  hash: number | null;
  /** Intrusive links of the free queue (FreeKVCacheBlockQueue's prev_free_block / next_free_block). */
  prevFree: KVBlock | null;
  nextFree: KVBlock | null;
  /** In the free queue: distinguishes the head/tail with null links from a block not in the queue. */
  inFree: boolean;
  /** Intrusive links among blocks cached under the same hash (vLLM's BlockHashToBlockMap keeps duplicates too). */
  prevSame: KVBlock | null;
  nextSame: KVBlock | null;
}

export interface BlockPool {
  readonly numBlocks: number;
  numFree(): number;
  /** Blocks holding a hash (in use or free): what a prefix can still hit. */
  numCached(): number;
  /** vLLM's get_cached_block: the first block cached under the hash, or undefined. */
  getCached(hash: number): KVBlock | undefined;
  /** vLLM's get_new_blocks: n blocks from the free queue's head, each evicted from the cache if it held a hash. */
  getNewBlocks(n: number, into: KVBlock[]): void;
  /** vLLM's touch: a hit block gains a holder, leaving the free queue if it was there. */
  touch(block: KVBlock): void;
  /** vLLM's free_blocks, given blocks in eviction order (first evicted first). */
  freeBlocks(ordered: readonly KVBlock[], reverse: boolean): void;
  /** vLLM's cache_full_blocks for one block: record its hash so later prefixes can hit it. */
  cacheBlock(block: KVBlock, hash: number): void;
  /** The free queue from head to tail (tests and invariants only: O(free)). */
  freeOrder(): number[];
  /** Holder counts by block id (tests and invariants only: O(blocks)). */
  refCounts(): number[];
}

export function createBlockPool(numBlocks: number, enableCaching: boolean): BlockPool {
  const blocks: KVBlock[] = [];
  for (let id = 0; id < numBlocks; id++) {
    blocks.push({
      id,
      refCnt: 0,
      hash: null,
      prevFree: null,
      nextFree: null,
      inFree: false,
      prevSame: null,
      nextSame: null,
    });
  }
  const cached = new Map<number, KVBlock>();
  let head: KVBlock | null = null;
  let tail: KVBlock | null = null;
  let free = 0;
  let numCachedBlocks = 0;

  function unlinkFree(b: KVBlock): void {
    if (b.prevFree) b.prevFree.nextFree = b.nextFree;
    else head = b.nextFree;
    if (b.nextFree) b.nextFree.prevFree = b.prevFree;
    else tail = b.prevFree;
    b.prevFree = b.nextFree = null;
    b.inFree = false;
    free--;
  }
  function appendFree(b: KVBlock): void {
    b.prevFree = tail;
    b.nextFree = null;
    if (tail) tail.nextFree = b;
    else head = b;
    tail = b;
    b.inFree = true;
    free++;
  }
  /** Put `b` before `before` (null: at the tail) — prepend_n keeps its list's order at the head. */
  function insertFreeBefore(b: KVBlock, before: KVBlock | null): void {
    if (before === null) {
      appendFree(b);
      return;
    }
    b.nextFree = before;
    b.prevFree = before.prevFree;
    if (before.prevFree) before.prevFree.nextFree = b;
    else head = b;
    before.prevFree = b;
    b.inFree = true;
    free++;
  }

  /** vLLM's _maybe_evict_cached_block: drop the block's hash (it is about to hold other tokens). */
  function evict(b: KVBlock): void {
    const h = b.hash;
    if (h === null) return;
    if (cached.get(h) === b) {
      if (b.nextSame) cached.set(h, b.nextSame);
      else cached.delete(h);
    }
    if (b.prevSame) b.prevSame.nextSame = b.nextSame;
    if (b.nextSame) b.nextSame.prevSame = b.prevSame;
    b.prevSame = b.nextSame = null;
    b.hash = null;
    numCachedBlocks--;
  }

  for (const b of blocks) appendFree(b);

  return {
    numBlocks,
    numFree: () => free,
    numCached: () => numCachedBlocks,
    getCached: (hash) => cached.get(hash),
    getNewBlocks(n, into) {
      if (n > free) throw new Error(`cannot get ${n} free blocks from the pool (${free} free)`);
      for (let i = 0; i < n; i++) {
        const b = head as KVBlock;
        unlinkFree(b);
        if (enableCaching) evict(b);
        b.refCnt = 1;
        into.push(b);
      }
    },
    touch(b) {
      if (b.refCnt === 0) unlinkFree(b);
      b.refCnt++;
    },
    freeBlocks(ordered, reverse) {
      // As free_blocks: every holder count drops first; then the fresh blocks (no hash) that reached 0 go to the head in
      // their order (prepend_n), used first, and the cached ones to the tail in their order (append_n), kept longest.
      const n = ordered.length;
      const at = (k: number): KVBlock => ordered[reverse ? n - 1 - k : k] as KVBlock;
      const oldHead = head;
      for (let k = 0; k < n; k++) {
        const b = at(k);
        b.refCnt--;
        if (b.refCnt === 0 && b.hash === null) insertFreeBefore(b, oldHead);
      }
      for (let k = 0; k < n; k++) {
        const b = at(k);
        if (b.refCnt === 0 && b.hash !== null && !b.inFree) appendFree(b);
      }
    },
    cacheBlock(b, hash) {
      // Duplicates stay (BlockHashToBlockMap.insert): the first cached block keeps answering lookups.
      const first = cached.get(hash);
      b.hash = hash;
      numCachedBlocks++;
      if (first === undefined) {
        cached.set(hash, b);
        return;
      }
      let last = first;
      while (last.nextSame) last = last.nextSame;
      last.nextSame = b;
      b.prevSame = last;
    },
    freeOrder() {
      const ids: number[] = [];
      for (let b = head; b; b = b.nextFree) ids.push(b.id);
      return ids;
    },
    refCounts: () => blocks.map((b) => b.refCnt),
  };
}
