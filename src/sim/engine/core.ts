/**
 * The simulated vLLM v1 engine's pure core: vLLM's Scheduler.schedule (vllm/v1/core/sched/scheduler.py, FCFS policy,
 * chunked prefill on) over a prefix cache of full KV blocks (block-pool.ts, kv-manager.ts, block-hash.ts), with the
 * model's forward pass replaced by a linear cost model. One step() is schedule + _update_after_schedule +
 * update_from_output. Pure and deterministic; docs/simulator-engine.md cites the source of every rule.
 */
import { extendBlockHashes, generatedTokenId, hashString } from './block-hash.js';
import { createBlockPool, type BlockPool } from './block-pool.js';
import { allocateSlots, findLongestCacheHit, freeSequence, NO_HIT, type CacheHit, type KVSequence } from './kv-manager.js';
import type { EngineConfig, EngineCore, EngineSnapshot, SequenceSpec, StepCost, StepResult } from './types.js';

interface Sequence extends KVSequence {
  readonly id: string;
  readonly prompt: readonly number[];
  readonly outputTokens: number;
  readonly saltKey: number | undefined;
  /** Seeds the generated token ids (block-hash.ts generatedTokenId). */
  readonly seqKey: number;
  readonly tokenAt: (position: number) => number;
  generated: number;
  preemptions: number;
  state: 'waiting' | 'running';
  /** Intrusive links of the waiting queue. */
  prevWaiting: Sequence | null;
  nextWaiting: Sequence | null;
}

/** The step's duration: one linear model we choose (vLLM has no such formula; its step time is the GPU's). */
export function stepDurationMs(cost: StepCost, prefillTokens: number, decodeSeqs: number): number {
  return cost.baseMs + cost.prefillTokenMs * prefillTokens + cost.decodeSeqMs * decodeSeqs;
}

/** The peak slots a sequence ever needs: its last sampled token is never computed, so prompt + output - 1. */
export function peakBlocks(promptTokens: number, outputTokens: number, blockSize: number): number {
  return Math.ceil((promptTokens + outputTokens - 1) / blockSize);
}

function validateConfig(c: EngineConfig): void {
  const positive: Array<[string, number]> = [
    ['blockSize', c.blockSize],
    ['kvBlocks', c.kvBlocks],
    ['maxNumSeqs', c.maxNumSeqs],
    ['maxNumBatchedTokens', c.maxNumBatchedTokens],
  ];
  for (const [name, v] of positive) {
    if (!Number.isInteger(v) || v < 1) throw new Error(`engine ${name} must be a positive integer, got ${v}`);
  }
}

function makeSequence(spec: SequenceSpec, blockSize: number, enablePrefixCaching: boolean): Sequence {
  const prompt = spec.promptTokenIds;
  const seqKey = hashString(spec.id);
  const tokenAt = (p: number): number => (p < prompt.length ? (prompt[p] as number) : generatedTokenId(seqKey, p));
  const saltKey = spec.cacheSalt === undefined ? undefined : hashString(spec.cacheSalt);
  const seq: Sequence = {
    id: spec.id,
    prompt,
    outputTokens: spec.outputTokens,
    saltKey,
    seqKey,
    tokenAt,
    numTokens: prompt.length,
    numComputed: 0,
    blockHashes: [],
    blocks: [],
    numCachedBlocks: -1,
    generated: 0,
    preemptions: 0,
    state: 'waiting',
    prevWaiting: null,
    nextWaiting: null,
  };
  // vLLM hashes a request's full prompt blocks when the Request is created (and not at all with caching off).
  if (enablePrefixCaching) extendBlockHashes(seq.blockHashes, tokenAt, seq.numTokens, blockSize, saltKey);
  return seq;
}

/** The waiting queue: FIFO, with preempted sequences put back at the head, and O(1) removal for abort. */
class WaitingQueue {
  head: Sequence | null = null;
  tail: Sequence | null = null;
  size = 0;
  pushBack(s: Sequence): void {
    s.prevWaiting = this.tail;
    s.nextWaiting = null;
    if (this.tail) this.tail.nextWaiting = s;
    else this.head = s;
    this.tail = s;
    this.size++;
  }
  pushFront(s: Sequence): void {
    s.nextWaiting = this.head;
    s.prevWaiting = null;
    if (this.head) this.head.prevWaiting = s;
    else this.tail = s;
    this.head = s;
    this.size++;
  }
  remove(s: Sequence): void {
    if (s.prevWaiting) s.prevWaiting.nextWaiting = s.nextWaiting;
    else this.head = s.nextWaiting;
    if (s.nextWaiting) s.nextWaiting.prevWaiting = s.prevWaiting;
    else this.tail = s.prevWaiting;
    s.prevWaiting = s.nextWaiting = null;
    this.size--;
  }
}

interface Counters {
  prefixQueries: number;
  prefixHits: number;
  preemptions: number;
}

/** A view into an engine's KV state for tests and invariant checks (O(KV size): never on a hot path). */
export interface EngineInspector {
  /** Free queue block ids, head (evicted first) to tail. */
  freeOrder(): number[];
  /** Block ids a live sequence holds, in token order; [] when it holds none or is unknown. */
  blockIds(id: string): number[];
  /** Holder counts by block id. */
  refCounts(): number[];
  /** Blocks held by live sequences, counted once each. */
  usedBlocks(): number;
}

export function createEngineCore(config: EngineConfig): EngineCore {
  return createInspectableEngineCore(config).core;
}

export function createInspectableEngineCore(config: EngineConfig): { core: EngineCore; inspect: EngineInspector } {
  validateConfig(config);
  const { blockSize, kvBlocks, maxNumSeqs, maxNumBatchedTokens, enablePrefixCaching } = config;

  let pool: BlockPool = createBlockPool(kvBlocks, enablePrefixCaching);
  let live = new Map<string, Sequence>();
  let running: Sequence[] = [];
  let waiting = new WaitingQueue();
  let counters: Counters = { prefixQueries: 0, prefixHits: 0, preemptions: 0 };

  /** _preempt_request: free the blocks, forget the computed tokens, back to the waiting queue's head. */
  function preempt(s: Sequence): void {
    freeSequence(pool, s);
    s.numComputed = 0;
    s.preemptions++;
    s.state = 'waiting';
    waiting.pushFront(s);
    counters.preemptions++;
  }

  /** get_computed_blocks: nothing is looked up with prefix caching off. */
  function lookUp(s: Sequence): CacheHit {
    return enablePrefixCaching ? findLongestCacheHit(pool, s, blockSize) : NO_HIT;
  }

  /**
   * PrefixCacheStats.record, once per admission: queries are the sequence's num_tokens, hits the hit's tokens. A
   * resumed (preempted) sequence's lookup goes to the preempted_* fields, which vLLM keeps out of its counters; with
   * prefix caching off nothing is counted. vLLM used to record in get_computed_blocks, so a head that failed to get
   * blocks was counted again on every retry (issue #43736); since PR #48860 it records after allocate_slots succeeds.
   */
  function countLookUp(s: Sequence, hit: CacheHit): void {
    if (!enablePrefixCaching || s.preemptions > 0) return;
    counters.prefixQueries += s.numTokens;
    counters.prefixHits += hit.tokens;
  }

  /** Sample one token: the sequence's new token is known, its newly full block hashed (Request.append_output_token_ids). */
  function appendToken(s: Sequence): void {
    s.generated++;
    s.numTokens++;
    if (enablePrefixCaching) extendBlockHashes(s.blockHashes, s.tokenAt, s.numTokens, blockSize, s.saltKey);
  }

  function schedule(): {
    scheduled: Array<[Sequence, number]>;
    admitted: StepResult['admitted'];
    preempted: string[];
    admittedSet: Set<Sequence>;
  } {
    const scheduled: Array<[Sequence, number]> = [];
    const admitted: Array<{ id: string; cachedTokens: number; resumed: boolean }> = [];
    const admittedSet = new Set<Sequence>();
    const preempted: string[] = [];
    let budget = maxNumBatchedTokens;

    // First the running sequences, in order: each wants all its unknown-KV tokens (a prefill chunk or one decode
    // token), capped by the budget; when blocks run out, the newest running sequence is preempted, until this one fits
    // or is itself the one preempted.
    let i = 0;
    while (i < running.length && budget > 0) {
      const s = running[i] as Sequence;
      const numNew = Math.min(s.numTokens - s.numComputed, budget);
      let fits = false;
      for (;;) {
        if (allocateSlots(pool, s, numNew, NO_HIT, blockSize, enablePrefixCaching)) {
          fits = true;
          break;
        }
        const victim = running.pop() as Sequence;
        preempt(victim);
        preempted.push(victim.id);
        if (victim === s) break;
      }
      if (!fits) break;
      scheduled.push([s, numNew]);
      budget -= numNew;
      i++;
    }

    // Then the waiting queue, FIFO, only in a step that preempted nothing, while seats and budget remain; the head that
    // cannot get its blocks stays at the head and ends the admissions.
    if (preempted.length === 0) {
      while (waiting.head !== null && budget > 0 && running.length < maxNumSeqs) {
        const s = waiting.head;
        const hit = lookUp(s);
        // num_tokens, not the prompt: a resumed sequence recomputes its generated tokens too.
        const numNew = Math.min(s.numTokens - hit.tokens, budget);
        if (!allocateSlots(pool, s, numNew, hit, blockSize, enablePrefixCaching)) break;
        countLookUp(s, hit);
        waiting.remove(s);
        running.push(s);
        s.state = 'running';
        s.numComputed = hit.tokens;
        scheduled.push([s, numNew]);
        budget -= numNew;
        admitted.push({ id: s.id, cachedTokens: hit.tokens, resumed: s.preemptions > 0 });
        admittedSet.add(s);
      }
    }
    return { scheduled, admitted, preempted, admittedSet };
  }

  function step(): StepResult | null {
    if (running.length === 0 && waiting.size === 0) return null;
    const { scheduled, admitted, preempted, admittedSet } = schedule();
    if (scheduled.length === 0 && preempted.length === 0) return null;

    let prefillTokens = 0;
    let decodeSeqs = 0;
    const tokens: Array<{ id: string; generated: number }> = [];
    const finished: string[] = [];
    for (const [s, n] of scheduled) {
      // A decode: a running sequence past its prefill computing the one token it sampled last step. Everything else —
      // prompt chunks, a resumed sequence's recompute of prompt and generated tokens — is prefill.
      const isDecode = s.generated > 0 && n === 1 && s.numTokens - s.numComputed === 1 && !admittedSet.has(s);
      if (isDecode) decodeSeqs++;
      else prefillTokens += n;
      // _update_after_schedule, then update_from_output: a token is sampled only once every known token is computed.
      s.numComputed += n;
      if (s.numComputed < s.numTokens) continue;
      appendToken(s);
      tokens.push({ id: s.id, generated: s.generated });
      if (s.generated >= s.outputTokens) finished.push(s.id);
    }
    if (finished.length > 0) {
      for (const id of finished) {
        const s = live.get(id) as Sequence;
        freeSequence(pool, s);
        live.delete(id);
      }
      running = running.filter((s) => live.has(s.id) && s.state === 'running');
    }
    const durationMs = scheduled.length === 0 ? 0 : stepDurationMs(config.cost, prefillTokens, decodeSeqs);
    return { durationMs, prefillTokens, decodeSeqs, admitted, tokens, finished, preempted };
  }

  const inspect: EngineInspector = {
    freeOrder: () => pool.freeOrder(),
    blockIds: (id) => live.get(id)?.blocks.map((b) => b.id) ?? [],
    refCounts: () => pool.refCounts(),
    usedBlocks() {
      const used = new Set<number>();
      for (const s of live.values()) for (const b of s.blocks) used.add(b.id);
      return used.size;
    },
  };

  const core: EngineCore = {
    add(spec) {
      if (live.has(spec.id)) throw new Error(`sequence ${spec.id} is already in the engine`);
      if (spec.promptTokenIds.length < 1) throw new Error(`sequence ${spec.id} has an empty prompt`);
      if (!Number.isInteger(spec.outputTokens) || spec.outputTokens < 1) {
        throw new Error(`sequence ${spec.id} must generate at least one token, got ${spec.outputTokens}`);
      }
      const need = peakBlocks(spec.promptTokenIds.length, spec.outputTokens, blockSize);
      if (need > kvBlocks) {
        throw new Error(`sequence ${spec.id} needs ${need} KV blocks (prompt + output), the engine holds ${kvBlocks}`);
      }
      const s = makeSequence(spec, blockSize, enablePrefixCaching);
      live.set(s.id, s);
      waiting.pushBack(s);
    },
    abort(id) {
      const s = live.get(id);
      if (s === undefined) return;
      live.delete(id);
      if (s.state === 'waiting') waiting.remove(s);
      else running.splice(running.indexOf(s), 1);
      freeSequence(pool, s);
    },
    hasWork: () => running.length > 0 || waiting.size > 0,
    step,
    snapshot(): EngineSnapshot {
      const free = pool.numFree();
      return {
        running: running.length,
        waiting: waiting.size,
        // get_usage: 1 - free / total, over the usable blocks (vLLM subtracts its null block from num_gpu_blocks).
        kvUsage: 1 - free / kvBlocks,
        freeBlocks: free,
        cachedBlocks: pool.numCached(),
        prefixQueries: counters.prefixQueries,
        prefixHits: counters.prefixHits,
        preemptions: counters.preemptions,
      };
    },
    reset() {
      pool = createBlockPool(kvBlocks, enablePrefixCaching);
      live = new Map();
      running = [];
      waiting = new WaitingQueue();
      counters = { prefixQueries: 0, prefixHits: 0, preemptions: 0 };
    },
  };
  return { core, inspect };
}
