/**
 * An approximate picture of each upstream's prefix cache in one pool: which prefix blocks (src/routing/prefix-key.ts)
 * the gateway sent to which upstream, most recently used last. Approximate, as llm-d's approximate prefix scorer:
 * it records what was *sent*, not what the engine kept (the engine evicts on its own, under its own KV pressure), it
 * is this gateway replica's view only, and it is lost on restart. The guess can be checked against the hit vLLM
 * reports (`usage.prompt_tokens_details.cached_tokens`).
 *
 * One index per pool. Memory is bounded: at most `maxEntries` (block, upstream) entries in all, the least recently
 * recorded evicted first; optionally at most a capacity per upstream (its KV cache's blocks, when known).
 * Every call is O(blocks × upstreams) and allocates nothing but what it returns (and the slab, as it first fills).
 */

export interface PrefixIndexOptions {
  /** (block, upstream) entries kept in all, across the pool's upstreams; default 200 000 (≈ 10 MB: a 24-byte slab slot and a Map entry each). */
  readonly maxEntries?: number;
}

const DEFAULT_MAX_ENTRIES = 200_000;
const NONE = -1;

/** One upstream's blocks: a lookup by block, and its own recency list through the slab (head = least recent). */
interface Held {
  readonly slots: Map<number, number>;
  head: number;
  tail: number;
}

export class PrefixIndex {
  /**
   * Why a slab and linked lists rather than Maps re-inserted on touch: V8's Map leaves a hole per deleted entry and an
   * iterator starts at the first slot, so evicting "the first entry" over and over skips ever more holes until the
   * next rehash — 47 µs an eviction at 200 000 entries, measured. Here an eviction is O(upstreams).
   *
   * Slot i: its block hash, recency stamp, and neighbours in its upstream's list; free slots chain through `next`.
   */
  private block = new Float64Array(0);
  private stamp = new Float64Array(0);
  private prev = new Int32Array(0);
  private next = new Int32Array(0);
  private free = NONE;
  private used = 0;

  private readonly upstreams = new Map<string, Held>();
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
    return this.upstreams.get(upstream)?.slots.size ?? 0;
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
      held = { slots: new Map(), head: NONE, tail: NONE };
      this.upstreams.set(upstream, held);
    }
    const capacity = this.capacities.get(upstream) ?? Infinity;
    // A prompt longer than the whole index (or the upstream's capacity) keeps its start only. Room is made before
    // each insertion, and what is evicted is never one of this prompt's blocks: they are the most recent.
    const limit = Math.min(blocks.length, this.maxEntries, capacity);
    for (let i = limit - 1; i >= 0; i--) {
      const block = blocks[i] as number;
      let slot = held.slots.get(block);
      if (slot !== undefined) {
        this.unlink(held, slot);
      } else {
        if (held.slots.size >= capacity) this.evictHead(held);
        if (this.entries >= this.maxEntries) this.evictOldest();
        slot = this.allocate();
        this.block[slot] = block;
        held.slots.set(block, slot);
        this.entries++;
      }
      this.stamp[slot] = ++this.clock;
      this.append(held, slot);
    }
  }

  /**
   * Per upstream, the longest run of `blocks` from the start that it holds (what vLLM's prefix cache would hit if it
   * kept what it was sent); upstreams matching nothing are left out. A read: it does not count as use.
   */
  match(blocks: readonly number[], into: Map<string, number> = new Map()): Map<string, number> {
    if (blocks.length === 0) return into;
    for (const [upstream, held] of this.upstreams) {
      let run = 0;
      while (run < blocks.length && held.slots.has(blocks[run] as number)) run++;
      if (run > 0) into.set(upstream, run);
    }
    return into;
  }

  /** Everything recorded for `upstream` is gone: its engine restarted, or it was ejected or removed. */
  forget(upstream: string): void {
    const held = this.upstreams.get(upstream);
    if (held === undefined) return;
    for (let slot = held.head; slot !== NONE; ) {
      const after = this.next[slot] as number;
      this.release(slot);
      slot = after;
    }
    this.entries -= held.slots.size;
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
    if (held !== undefined) while (held.slots.size > blocks) this.evictHead(held);
  }

  /** Evicts the pool's least recently recorded entry: the oldest head over the upstreams (O(upstreams)). */
  private evictOldest(): void {
    let oldest: Held | undefined;
    let oldestStamp = Infinity;
    for (const held of this.upstreams.values()) {
      if (held.head === NONE) continue;
      const stamp = this.stamp[held.head] as number;
      if (stamp < oldestStamp) {
        oldestStamp = stamp;
        oldest = held;
      }
    }
    if (oldest !== undefined) this.evictHead(oldest);
  }

  private evictHead(held: Held): void {
    const slot = held.head;
    if (slot === NONE) return;
    this.unlink(held, slot);
    held.slots.delete(this.block[slot] as number);
    this.release(slot);
    this.entries--;
  }

  private unlink(held: Held, slot: number): void {
    const before = this.prev[slot] as number;
    const after = this.next[slot] as number;
    if (before === NONE) held.head = after;
    else this.next[before] = after;
    if (after === NONE) held.tail = before;
    else this.prev[after] = before;
  }

  private append(held: Held, slot: number): void {
    this.prev[slot] = held.tail;
    this.next[slot] = NONE;
    if (held.tail === NONE) held.head = slot;
    else this.next[held.tail] = slot;
    held.tail = slot;
  }

  private allocate(): number {
    if (this.free !== NONE) {
      const slot = this.free;
      this.free = this.next[slot] as number;
      return slot;
    }
    if (this.used === this.block.length) this.grow();
    return this.used++;
  }

  private release(slot: number): void {
    this.next[slot] = this.free;
    this.free = slot;
  }

  /** Doubles the slab (up to maxEntries): an index that stays small costs little. */
  private grow(): void {
    const size = Math.min(this.maxEntries, Math.max(1024, this.block.length * 2));
    const copy = <A extends Float64Array | Int32Array>(from: A, to: A): A => {
      to.set(from);
      return to;
    };
    this.block = copy(this.block, new Float64Array(size));
    this.stamp = copy(this.stamp, new Float64Array(size));
    this.prev = copy(this.prev, new Int32Array(size));
    this.next = copy(this.next, new Int32Array(size));
  }
}
