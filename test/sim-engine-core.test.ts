/**
 * The simulated vLLM engine's pure core (src/sim/engine/core.ts), by hand-computed cases: every expected value below is
 * worked out from vLLM's rules (docs/simulator-engine.md), step by step in the comments.
 */
import { describe, expect, it } from 'vitest';
import { extendBlockHashes, generatedTokenId, hashString } from '../src/sim/engine/block-hash.js';
import { createEngineCore, createInspectableEngineCore } from '../src/sim/engine/core.js';
import type { EngineConfig, StepResult } from '../src/sim/engine/types.js';

/** Integer costs so durations compare exactly: 10 ms a step, 2 ms a prefill token, 3 ms a decoding sequence. */
const COST = { baseMs: 10, prefillTokenMs: 2, decodeSeqMs: 3 };

function config(over: Partial<EngineConfig> = {}): EngineConfig {
  return {
    blockSize: 4,
    kvBlocks: 16,
    maxNumSeqs: 8,
    maxNumBatchedTokens: 64,
    enablePrefixCaching: true,
    cost: COST,
    ...over,
  };
}

function range(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + i);
}

function hashesOf(tokens: readonly number[], blockSize: number, salt?: string): number[] {
  const out: number[] = [];
  const tokenAt = (p: number): number => tokens[p] as number;
  extendBlockHashes(out, tokenAt, tokens.length, blockSize, salt === undefined ? undefined : hashString(salt));
  return out;
}

function mustStep(core: { step(): StepResult | null }): StepResult {
  const r = core.step();
  if (r === null) throw new Error('expected a step');
  return r;
}

describe('block hashes', () => {
  it('gives the same chain for the same tokens and salt, one 53-bit hash per full block', () => {
    const a = hashesOf(range(1, 12), 4, 's');
    const b = hashesOf(range(1, 12), 4, 's');
    expect(a).toEqual(b);
    expect(a).toHaveLength(3);
    for (const h of a) expect(Number.isSafeInteger(h) && h >= 0).toBe(true);
    expect(new Set(a).size).toBe(3);
  });

  it('changes every later hash when an earlier block differs, and no earlier one', () => {
    const base = hashesOf(range(1, 12), 4);
    const first = hashesOf([99, ...range(2, 11)], 4);
    for (let i = 0; i < 3; i++) expect(first[i]).not.toBe(base[i]);
    const second = range(1, 12);
    second[5] = 99;
    const changed = hashesOf(second, 4);
    expect(changed[0]).toBe(base[0]);
    expect(changed[1]).not.toBe(base[1]);
    expect(changed[2]).not.toBe(base[2]);
  });

  it('folds the salt into the first block, and so changes every hash', () => {
    const plain = hashesOf(range(1, 8), 4);
    const salted = hashesOf(range(1, 8), 4, 'tenant-a');
    const other = hashesOf(range(1, 8), 4, 'tenant-b');
    for (let i = 0; i < 2; i++) {
      expect(salted[i]).not.toBe(plain[i]);
      expect(salted[i]).not.toBe(other[i]);
    }
  });

  it('does not hash a partial last block', () => {
    expect(hashesOf(range(1, 10), 4)).toHaveLength(2);
    expect(hashesOf(range(1, 3), 4)).toHaveLength(0);
    // A chain only grows: extending with more known tokens hashes the newly full block alone, the earlier ones kept.
    const grown = hashesOf(range(1, 10), 4);
    const tokens = range(1, 12);
    extendBlockHashes(grown, (p) => tokens[p] as number, 12, 4, undefined);
    expect(grown).toEqual(hashesOf(tokens, 4));
  });

  it('derives generated token ids from the sequence and position alone', () => {
    const k = hashString('seq-1');
    expect(generatedTokenId(k, 7)).toBe(generatedTokenId(hashString('seq-1'), 7));
    expect(generatedTokenId(k, 7)).not.toBe(generatedTokenId(k, 8));
    expect(generatedTokenId(k, 7)).not.toBe(generatedTokenId(hashString('seq-2'), 7));
  });
});

describe('prefix cache hits', () => {
  it('hits the longest run of cached full blocks: 9 shared tokens of a 10-token prompt hit 8', () => {
    const core = createEngineCore(config());
    core.add({ id: 'a', promptTokenIds: range(1, 9), outputTokens: 1 });
    // a: 9 prompt tokens, 3 blocks, the first two full and cached at scheduling; its first token ends it.
    const r1 = mustStep(core);
    expect(r1.admitted).toEqual([{ id: 'a', cachedTokens: 0, resumed: false }]);
    expect(r1.finished).toEqual(['a']);
    core.add({ id: 'b', promptTokenIds: [...range(1, 9), 100], outputTokens: 1 });
    const r2 = mustStep(core);
    // Block 2 (tokens 9, 100, ...) was never full in a: the hit stops at 8.
    expect(r2.admitted).toEqual([{ id: 'b', cachedTokens: 8, resumed: false }]);
    expect(r2.prefillTokens).toBe(2);
    expect(r2.durationMs).toBe(10 + 2 * 2);
    expect(core.snapshot()).toMatchObject({ prefixQueries: 9 + 10, prefixHits: 8 });
  });

  it('computes at least one token: a fully cached prompt recomputes its last block', () => {
    const core = createEngineCore(config());
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 1 });
    mustStep(core);
    // The same 8 tokens: the hit is capped at num_tokens - 1 = 7, so one block (4 tokens), and 4 are recomputed.
    core.add({ id: 'b', promptTokenIds: range(1, 8), outputTokens: 1 });
    const r = mustStep(core);
    expect(r.admitted).toEqual([{ id: 'b', cachedTokens: 4, resumed: false }]);
    expect(r.prefillTokens).toBe(4);
    // 9 tokens with both full blocks cached: the cap of 8 allows both, one token is computed.
    core.add({ id: 'c', promptTokenIds: range(1, 9), outputTokens: 1 });
    // c: a's two full blocks are within its cap of 8.
    expect(mustStep(core).admitted).toEqual([{ id: 'c', cachedTokens: 8, resumed: false }]);
    core.add({ id: 'd', promptTokenIds: range(1, 9), outputTokens: 1 });
    const r4 = mustStep(core);
    expect(r4.admitted).toEqual([{ id: 'd', cachedTokens: 8, resumed: false }]);
    expect(r4.prefillTokens).toBe(1);
    expect(core.snapshot()).toMatchObject({ prefixQueries: 8 + 8 + 9 + 9, prefixHits: 4 + 8 + 8 });
  });

  it('keeps salted prefixes apart', () => {
    const core = createEngineCore(config());
    core.add({ id: 'a', promptTokenIds: range(1, 9), outputTokens: 1, cacheSalt: 'x' });
    mustStep(core);
    core.add({ id: 'b', promptTokenIds: range(1, 9), outputTokens: 1, cacheSalt: 'y' });
    expect(mustStep(core).admitted[0]?.cachedTokens).toBe(0);
    core.add({ id: 'c', promptTokenIds: range(1, 9), outputTokens: 1, cacheSalt: 'x' });
    expect(mustStep(core).admitted[0]?.cachedTokens).toBe(8);
  });

  it('counts nothing and caches nothing with prefix caching off', () => {
    const core = createEngineCore(config({ enablePrefixCaching: false }));
    core.add({ id: 'a', promptTokenIds: range(1, 9), outputTokens: 1 });
    mustStep(core);
    core.add({ id: 'b', promptTokenIds: range(1, 9), outputTokens: 1 });
    const r = mustStep(core);
    expect(r.admitted[0]?.cachedTokens).toBe(0);
    expect(r.prefillTokens).toBe(9);
    expect(core.snapshot()).toMatchObject({ prefixQueries: 0, prefixHits: 0, cachedBlocks: 0, freeBlocks: 16 });
  });
});

describe('block pool', () => {
  it('frees a finished sequence tail first: cached blocks to the tail in reverse, a partial block to the head', () => {
    const { core, inspect } = createInspectableEngineCore(config({ kvBlocks: 6 }));
    core.add({ id: 'a', promptTokenIds: range(1, 10), outputTokens: 1 });
    const r = mustStep(core);
    expect(r.finished).toEqual(['a']);
    // a held blocks 0, 1, 2 (the head of the fresh queue 0..5); 0 and 1 full and cached, 2 partial. Freed in reverse:
    // 2 (no hash) goes before the head, then 1, 0 after the tail.
    expect(inspect.freeOrder()).toEqual([2, 3, 4, 5, 1, 0]);
    expect(core.snapshot()).toMatchObject({ freeBlocks: 6, cachedBlocks: 2, kvUsage: 0 });
  });

  it('evicts the least recently freed blocks first, a sequence tail blocks before its head', () => {
    const { core, inspect } = createInspectableEngineCore(config({ kvBlocks: 6 }));
    core.add({ id: 'a', promptTokenIds: range(1, 12), outputTokens: 1 });
    mustStep(core);
    // a: blocks 0, 1, 2, all full and cached; freed in reverse to the tail.
    expect(inspect.freeOrder()).toEqual([3, 4, 5, 2, 1, 0]);
    core.add({ id: 'b', promptTokenIds: range(101, 12), outputTokens: 1 });
    mustStep(core);
    // b took 3, 4, 5 and freed them after a's.
    expect(inspect.freeOrder()).toEqual([2, 1, 0, 5, 4, 3]);
    expect(core.snapshot().cachedBlocks).toBe(6);
    core.add({ id: 'c', promptTokenIds: range(201, 7), outputTokens: 2 });
    mustStep(core);
    // c needs 2 blocks: it takes a's tail blocks 2 and 1, evicting their hashes; a's first block survives.
    expect(inspect.blockIds('c')).toEqual([2, 1]);
    expect(core.snapshot().cachedBlocks).toBe(6 - 2 + 1);
    core.add({ id: 'd', promptTokenIds: range(1, 12), outputTokens: 1 });
    const r = mustStep(core);
    expect(r.admitted).toEqual([{ id: 'd', cachedTokens: 4, resumed: false }]);
  });

  it('never evicts a block a running sequence holds, even one it only hit', () => {
    const { core, inspect } = createInspectableEngineCore(config({ kvBlocks: 4 }));
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 1 });
    mustStep(core);
    // a's blocks 0 and 1 cached and free: queue [2, 3, 1, 0].
    expect(inspect.freeOrder()).toEqual([2, 3, 1, 0]);
    core.add({ id: 'b', promptTokenIds: [...range(1, 4), ...range(50, 5)], outputTokens: 5 });
    const r = mustStep(core);
    // b hits block 0 (touched: out of the free queue, one holder) and takes 2 and 3 for its other 5 tokens.
    expect(r.admitted).toEqual([{ id: 'b', cachedTokens: 4, resumed: false }]);
    expect(inspect.blockIds('b')).toEqual([0, 2, 3]);
    expect(inspect.freeOrder()).toEqual([1]);
    expect(inspect.refCounts()).toEqual([1, 0, 1, 1]);
    core.add({ id: 'c', promptTokenIds: range(300, 4), outputTokens: 2 });
    const r2 = mustStep(core);
    // c takes the one free block, 1; block 0, cached and held by b, is not a candidate.
    expect(r2.admitted.map((x) => x.id)).toEqual(['c']);
    expect(inspect.blockIds('c')).toEqual([1]);
    expect(inspect.blockIds('b')).toEqual([0, 2, 3]);
    expect(core.snapshot()).toMatchObject({ freeBlocks: 0, kvUsage: 1 });
  });

  it('keeps duplicate blocks cached: a block computed twice in one step still hits after one copy is evicted', () => {
    const { core, inspect } = createInspectableEngineCore(config({ kvBlocks: 8 }));
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 1 });
    core.add({ id: 'b', promptTokenIds: range(1, 8), outputTokens: 1 });
    // Step 1: a takes blocks 0 and 1 and caches both at scheduling; b, scheduled after it in the same step, hits a's
    // block 0 (capped at 7 tokens: one block) and computes its second block into block 2, a duplicate of block 1.
    const r1 = mustStep(core);
    expect(r1.admitted).toEqual([
      { id: 'a', cachedTokens: 0, resumed: false },
      { id: 'b', cachedTokens: 4, resumed: false },
    ]);
    expect(r1.prefillTokens).toBe(8 + 4);
    // a frees 1 (to the tail) and 0 (still held by b); b frees 2, then 0.
    expect(inspect.freeOrder()).toEqual([3, 4, 5, 6, 7, 1, 2, 0]);
    expect(core.snapshot().cachedBlocks).toBe(3);
    // d takes 6 blocks, the sixth being block 1: its copy of the hash is evicted, block 2's remains.
    core.add({ id: 'd', promptTokenIds: range(500, 24), outputTokens: 1 });
    mustStep(core);
    core.add({ id: 'e', promptTokenIds: range(1, 9), outputTokens: 2 });
    const r3 = mustStep(core);
    expect(r3.admitted).toEqual([{ id: 'e', cachedTokens: 8, resumed: false }]);
    expect(inspect.blockIds('e').slice(0, 2)).toEqual([0, 2]);
  });

  it('reports kv usage as used over total blocks', () => {
    const core = createEngineCore(config({ kvBlocks: 8 }));
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 4 });
    mustStep(core);
    expect(core.snapshot()).toMatchObject({ freeBlocks: 6, kvUsage: 0.25, running: 1, waiting: 0 });
  });
});

describe('scheduler', () => {
  it('preempts the newest running sequence when KV runs out; it resumes later with a hit on its surviving blocks', () => {
    const { core, inspect } = createInspectableEngineCore(config({ kvBlocks: 4 }));
    core.add({ id: 'a', promptTokenIds: range(1, 4), outputTokens: 6 });
    core.add({ id: 'b', promptTokenIds: range(11, 4), outputTokens: 6 });
    // Step 1: a takes block 0, b block 1 (both full, cached); each samples its first token.
    const r1 = mustStep(core);
    expect(r1.prefillTokens).toBe(8);
    expect(r1.durationMs).toBe(10 + 2 * 8);
    expect(r1.tokens).toEqual([
      { id: 'a', generated: 1 },
      { id: 'b', generated: 1 },
    ]);
    // Step 2: token 5 of each needs a second block: a takes 2, b takes 3; the pool is full.
    const r2 = mustStep(core);
    expect(r2.decodeSeqs).toBe(2);
    expect(r2.durationMs).toBe(10 + 3 * 2);
    expect(core.snapshot().freeBlocks).toBe(0);
    // Steps 3-5 fit in the two blocks each (tokens 6, 7, 8); after step 5 each has generated 5 and knows 9 tokens.
    for (let s = 3; s <= 5; s++) expect(mustStep(core).preempted).toEqual([]);
    // Step 6: a's token 9 needs a third block, none free: b (the newest) is preempted, its blocks freed in reverse
    // (3, then 1, both cached, to the tail); a takes block 3, evicting b's second block, and generates its last token.
    const r6 = mustStep(core);
    expect(r6.preempted).toEqual(['b']);
    expect(r6.finished).toEqual(['a']);
    expect(r6.decodeSeqs).toBe(1);
    expect(core.snapshot()).toMatchObject({ preemptions: 1, running: 0, waiting: 1 });
    // a freed 3 (partial: to the head), then 2 and 0 (cached) to the tail: [3, 1, 2, 0].
    expect(inspect.freeOrder()).toEqual([3, 1, 2, 0]);
    // Step 7: b resumes with 4 + 5 = 9 known tokens: its first block (1) survived, its second was evicted: hit 4, and
    // the other 5 (prompt and generated alike) are recomputed; its sixth token ends it.
    const r7 = mustStep(core);
    expect(r7.admitted).toEqual([{ id: 'b', cachedTokens: 4, resumed: true }]);
    expect(r7.prefillTokens).toBe(5);
    expect(r7.tokens).toEqual([{ id: 'b', generated: 6 }]);
    expect(r7.finished).toEqual(['b']);
    expect(core.hasWork()).toBe(false);
    expect(core.step()).toBeNull();
    // Queries count first lookups only: a resumed sequence's lookup is vLLM's preempted_queries, not its counter.
    expect(core.snapshot()).toMatchObject({ prefixQueries: 8, prefixHits: 0, preemptions: 1 });
  });

  it('preempts the sequence itself when it is the newest running, and admits nothing in that step', () => {
    const core = createEngineCore(config({ kvBlocks: 3 }));
    core.add({ id: 'a', promptTokenIds: range(1, 4), outputTokens: 5 });
    core.add({ id: 'b', promptTokenIds: range(11, 4), outputTokens: 2 });
    core.add({ id: 'c', promptTokenIds: [500], outputTokens: 1 });
    // Step 1: a takes block 0, b block 1, c block 2 and finishes (its block is freed, partial: to the head).
    expect(mustStep(core).finished).toEqual(['c']);
    // Step 2: a's fifth token takes block 2; b's needs one too, none is free: b, the newest, preempts itself.
    const r2 = mustStep(core);
    expect(r2.preempted).toEqual(['b']);
    expect(r2.tokens).toEqual([{ id: 'a', generated: 2 }]);
    expect(r2.admitted).toEqual([]);
    // Steps 3-5: b (5 known tokens) would hit its block 1, but that block is free and touching it takes it out of the
    // free queue: it needs 2 blocks where 1 is free, so it waits while a decodes to its fifth token.
    const later = [mustStep(core), mustStep(core), mustStep(core)];
    expect(later.map((r) => r.admitted.length)).toEqual([0, 0, 0]);
    expect(later[2]?.finished).toEqual(['a']);
    // Step 6: b resumes with its first block hit, recomputes its one generated token, and samples its last.
    const r6 = mustStep(core);
    expect(r6.admitted).toEqual([{ id: 'b', cachedTokens: 4, resumed: true }]);
    expect(r6.prefillTokens).toBe(1);
    expect(r6.finished).toEqual(['b']);
    expect(core.snapshot()).toMatchObject({ preemptions: 1, prefixQueries: 9, prefixHits: 0 });
  });

  it('resumes a preempted sequence with a hit on its own cached generated block', () => {
    const core = createEngineCore(config({ blockSize: 2, kvBlocks: 5 }));
    core.add({ id: 'x', promptTokenIds: [1, 2], outputTokens: 5 });
    core.add({ id: 'a', promptTokenIds: [11, 12], outputTokens: 4 });
    // Steps 1-3: x holds blocks 0 and 2, a holds 1 and 3; after step 3 each knows 5 tokens and its second block
    // (generated tokens 1 and 2) is full and cached. Block 4 is the only free one.
    for (let s = 1; s <= 3; s++) mustStep(core);
    // Step 4: x takes block 4 for its fifth token; a needs a third block, none is free: a preempts itself. Its blocks
    // (3, then 1, both cached) go to the tail.
    const r4 = mustStep(core);
    expect(r4.preempted).toEqual(['a']);
    expect(r4.tokens).toEqual([{ id: 'x', generated: 4 }]);
    // Step 5: a's hit (blocks 1 and 3, both free) needs 2 blocks touched and 1 new: 3 > 2 free, it waits; x finishes.
    const r5 = mustStep(core);
    expect(r5.admitted).toEqual([]);
    expect(r5.finished).toEqual(['x']);
    // Step 6: a (5 known tokens) hits its prompt block and its generated block: 4 tokens; it recomputes the fifth
    // (generated token 3) and samples its fourth and last.
    const r6 = mustStep(core);
    expect(r6.admitted).toEqual([{ id: 'a', cachedTokens: 4, resumed: true }]);
    expect(r6.prefillTokens).toBe(1);
    expect(r6.finished).toEqual(['a']);
    expect(core.snapshot()).toMatchObject({ prefixQueries: 4, prefixHits: 0, preemptions: 1 });
  });

  it('admits no more than max_num_seqs: the rest wait', () => {
    const core = createEngineCore(config({ maxNumSeqs: 2 }));
    for (const id of ['a', 'b', 'c']) core.add({ id, promptTokenIds: range(id.charCodeAt(0) * 10, 4), outputTokens: 3 });
    const r = mustStep(core);
    expect(r.admitted.map((x) => x.id)).toEqual(['a', 'b']);
    expect(core.snapshot()).toMatchObject({ running: 2, waiting: 1 });
  });

  it('splits a long prefill over the token budget: 8, 8, 4, the first token in step 3', () => {
    const core = createEngineCore(config({ maxNumBatchedTokens: 8 }));
    core.add({ id: 'a', promptTokenIds: range(1, 20), outputTokens: 2 });
    const steps = [mustStep(core), mustStep(core), mustStep(core), mustStep(core)];
    expect(steps.map((s) => s.prefillTokens)).toEqual([8, 8, 4, 0]);
    expect(steps.map((s) => s.decodeSeqs)).toEqual([0, 0, 0, 1]);
    expect(steps.map((s) => s.tokens)).toEqual([[], [], [{ id: 'a', generated: 1 }], [{ id: 'a', generated: 2 }]]);
    expect(steps.map((s) => s.durationMs)).toEqual([10 + 16, 10 + 16, 10 + 8, 10 + 3]);
    expect(steps.map((s) => s.admitted.length)).toEqual([1, 0, 0, 0]);
    expect(steps[3]?.finished).toEqual(['a']);
  });

  it('spends the budget on running sequences first: a decode takes one token of it', () => {
    const core = createEngineCore(config({ maxNumBatchedTokens: 8 }));
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 3 });
    mustStep(core);
    core.add({ id: 'b', promptTokenIds: range(100, 12), outputTokens: 1 });
    const r = mustStep(core);
    // a decodes 1 token; b gets the 7 left of its 12.
    expect(r.decodeSeqs).toBe(1);
    expect(r.prefillTokens).toBe(7);
    expect(r.tokens).toEqual([{ id: 'a', generated: 2 }]);
    const r3 = mustStep(core);
    expect(r3.decodeSeqs).toBe(1);
    expect(r3.prefillTokens).toBe(5);
    expect(r3.finished).toEqual(['a', 'b']);
  });

  it('keeps a head that cannot get blocks waiting, and counts its lookup once, when it is admitted', () => {
    const core = createEngineCore(config({ kvBlocks: 4 }));
    core.add({ id: 'a', promptTokenIds: range(1, 12), outputTokens: 3 });
    core.add({ id: 'b', promptTokenIds: range(100, 8), outputTokens: 1 });
    // Step 1: a takes 3 blocks; b needs 2, finds 1: it waits. Step 2: a takes the last one. Step 3: a finishes, but b
    // was looked up before a's blocks were freed. Step 4: b runs. b was looked up 4 times and is counted once (vLLM
    // counted every lookup until PR #48860).
    const admitted: string[][] = [];
    while (core.hasWork()) admitted.push(mustStep(core).admitted.map((x) => x.id));
    expect(admitted).toEqual([['a'], [], [], ['b']]);
    expect(core.snapshot()).toMatchObject({ prefixQueries: 12 + 8, prefixHits: 0 });
  });
});

describe('add, abort, reset', () => {
  it('refuses a duplicate id, an empty prompt and a sequence the KV can never hold', () => {
    const core = createEngineCore(config({ kvBlocks: 4 }));
    core.add({ id: 'a', promptTokenIds: [1], outputTokens: 1 });
    expect(() => core.add({ id: 'a', promptTokenIds: [1], outputTokens: 1 })).toThrow(/already/);
    expect(() => core.add({ id: 'e', promptTokenIds: [], outputTokens: 1 })).toThrow(/empty/);
    // 16 prompt tokens and 1 output: 16 slots, 4 blocks: fits. 2 outputs: 17 slots, 5 blocks: never fits.
    core.add({ id: 'fits', promptTokenIds: range(1, 16), outputTokens: 1 });
    expect(() => core.add({ id: 'big', promptTokenIds: range(1, 16), outputTokens: 2 })).toThrow(/needs 5 KV blocks/);
  });

  it('frees an aborted sequence blocks wherever it is, and ignores unknown ids', () => {
    const core = createEngineCore(config({ kvBlocks: 8, maxNumSeqs: 1 }));
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 5 });
    core.add({ id: 'b', promptTokenIds: range(20, 8), outputTokens: 5 });
    mustStep(core);
    expect(core.snapshot()).toMatchObject({ running: 1, waiting: 1, freeBlocks: 6 });
    core.abort('b');
    core.abort('nobody');
    expect(core.snapshot()).toMatchObject({ running: 1, waiting: 0 });
    core.abort('a');
    expect(core.snapshot()).toMatchObject({ running: 0, waiting: 0, freeBlocks: 8, cachedBlocks: 2 });
    expect(core.hasWork()).toBe(false);
    expect(core.step()).toBeNull();
    // The id is free again.
    core.add({ id: 'a', promptTokenIds: range(1, 8), outputTokens: 1 });
    expect(mustStep(core).admitted).toEqual([{ id: 'a', cachedTokens: 4, resumed: false }]);
  });

  it('resets to a fresh engine: no sequences, an empty cache, zero counters', () => {
    const core = createEngineCore(config({ kvBlocks: 4 }));
    core.add({ id: 'a', promptTokenIds: range(1, 4), outputTokens: 6 });
    core.add({ id: 'b', promptTokenIds: range(11, 4), outputTokens: 6 });
    for (let i = 0; i < 6; i++) mustStep(core);
    expect(core.snapshot().preemptions).toBe(1);
    core.reset();
    expect(core.snapshot()).toEqual({
      running: 0,
      waiting: 0,
      kvUsage: 0,
      freeBlocks: 4,
      cachedBlocks: 0,
      prefixQueries: 0,
      prefixHits: 0,
      preemptions: 0,
    });
    expect(core.hasWork()).toBe(false);
    core.add({ id: 'b', promptTokenIds: range(11, 8), outputTokens: 1 });
    expect(mustStep(core).admitted).toEqual([{ id: 'b', cachedTokens: 0, resumed: false }]);
  });

  it('rejects a config that is not positive integers', () => {
    expect(() => createEngineCore(config({ blockSize: 0 }))).toThrow(/blockSize/);
    expect(() => createEngineCore(config({ maxNumBatchedTokens: 1.5 }))).toThrow(/maxNumBatchedTokens/);
  });
});
