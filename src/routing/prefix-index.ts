/**
 * An approximate picture of each upstream's prefix cache in one pool: which prefix blocks (src/routing/prefix-key.ts)
 * the gateway sent to which upstream, most recently used last. Approximate, as llm-d's approximate prefix scorer:
 * it records what was *sent*, not what the engine kept (the engine evicts on its own, under its own KV pressure), it
 * is this gateway replica's view only, and it is lost on restart. The guess can be checked against the hit vLLM
 * reports (`usage.prompt_tokens_details.cached_tokens`).
 *
 * One index per pool. Memory is bounded: at most `maxEntries` (block, upstream) entries in all, the least recently
 * recorded evicted first; optionally at most a capacity per upstream (its KV cache's blocks, when known).
 * Every call is O(blocks × upstreams) Map operations and allocates nothing but what it returns.
 */

export interface PrefixIndexOptions {
  /** (block, upstream) entries kept in all, across the pool's upstreams; default 200 000 (≈ 20 MB). */
  readonly maxEntries?: number;
}

const DEFAULT_MAX_ENTRIES = 200_000;

export class PrefixIndex {
  /**
   * Per upstream: block hash → recency stamp, in Map insertion order = least recently recorded first (a touch is a
   * delete and re-insert). Per upstream rather than one map of sets, so forget() is O(1) and a pool of any size works.
   */
  private readonly upstreams = new Map<string, Map<number, number>>();
  private readonly capacities = new Map<string, number>();
  private readonly maxEntries: number;
  private entries = 0;
  private clock = 0;

  constructor(options: PrefixIndexOptions = {}) {
    const max = options.maxEntries;
    this.maxEntries = max !== undefined && Number.isInteger(max) && max > 0 ? max : DEFAULT_MAX_ENTRIES;
  }

  /** (block, upstream) entries held now. */
  get size(): number {
    return this.entries;
  }

  /** Blocks held for `upstream`. */
  sizeOf(upstream: string): number {
    return this.upstreams.get(upstream)?.size ?? 0;
  }

  /**
   * `upstream` was sent a prompt with these blocks. Touched last block first, so that the leading blocks, shared
   * by the most requests and needed by every longer match (a match is a run from the start), are the most recent
   * and evicted last — vLLM frees a sequence's blocks tail first for the same reason.
   */
  record(upstream: string, blocks: readonly number[]): void {
    if (blocks.length === 0) return;
    let held = this.upstreams.get(upstream);
    if (held === undefined) {
      held = new Map();
      this.upstreams.set(upstream, held);
    }
    const capacity = this.capacities.get(upstream);
    // A prompt longer than the whole index (or the upstream's capacity) keeps its start only.
    const limit = Math.min(blocks.length, this.maxEntries, capacity ?? Infinity);
    for (let i = limit - 1; i >= 0; i--) {
      const block = blocks[i] as number;
      if (held.delete(block)) this.entries--;
      held.set(block, ++this.clock);
      this.entries++;
    }
    if (capacity !== undefined) while (held.size > capacity) this.evictFirst(held);
    while (this.entries > this.maxEntries) this.evictOldest();
  }

  /**
   * Per upstream, the longest run of `blocks` from the start that it holds (what vLLM's prefix cache would hit if it
   * kept what it was sent); upstreams matching nothing are left out. A read: it does not count as use.
   */
  match(blocks: readonly number[], into: Map<string, number> = new Map()): Map<string, number> {
    if (blocks.length === 0) return into;
    for (const [upstream, held] of this.upstreams) {
      let run = 0;
      while (run < blocks.length && held.has(blocks[run] as number)) run++;
      if (run > 0) into.set(upstream, run);
    }
    return into;
  }

  /** Everything recorded for `upstream` is gone: its engine restarted, or it was ejected or removed. */
  forget(upstream: string): void {
    const held = this.upstreams.get(upstream);
    if (held === undefined) return;
    this.entries -= held.size;
    this.upstreams.delete(upstream);
  }

  /**
   * At most `blocks` entries for `upstream` (its engine's KV capacity in blocks, e.g. from vLLM's
   * `cache_config_info` num_gpu_blocks); null: no limit of its own. Applies at once.
   */
  setCapacity(upstream: string, blocks: number | null): void {
    if (blocks === null || !Number.isInteger(blocks) || blocks < 0) {
      this.capacities.delete(upstream);
      return;
    }
    this.capacities.set(upstream, blocks);
    const held = this.upstreams.get(upstream);
    if (held !== undefined) while (held.size > blocks) this.evictFirst(held);
  }

  private evictFirst(held: Map<number, number>): void {
    for (const block of held.keys()) {
      held.delete(block);
      this.entries--;
      return;
    }
  }

  /** Evicts the pool's least recently recorded entry: the oldest first entry over the upstreams (O(upstreams)). */
  private evictOldest(): void {
    let oldest: Map<number, number> | undefined;
    let oldestStamp = Infinity;
    for (const held of this.upstreams.values()) {
      for (const stamp of held.values()) {
        if (stamp < oldestStamp) {
          oldestStamp = stamp;
          oldest = held;
        }
        break;
      }
    }
    if (oldest === undefined) {
      this.entries = 0; // unreachable while the count is right; never loop forever if it is not
      return;
    }
    this.evictFirst(oldest);
  }
}
