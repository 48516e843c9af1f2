/**
 * The engine core's invariants under random calls: whatever the sequence of add / abort / step, the block accounting
 * holds (free + used == kvBlocks, holder counts match the sequences holding each block, no held block in the free
 * queue), the scheduler keeps its limits (seats, token budget), every sequence ends when steps continue, and the same
 * calls give the same results.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createInspectableEngineCore, type EngineInspector } from '../src/sim/engine/core.js';
import type { EngineConfig, EngineCore, StepResult } from '../src/sim/engine/types.js';

interface AddOp {
  readonly kind: 'add';
  readonly prefix: number;
  readonly shared: number;
  readonly tail: number;
  readonly out: number;
  readonly salt: boolean;
}
type Op =
  | AddOp
  | { readonly kind: 'abort'; readonly pick: number }
  | { readonly kind: 'step' };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    arbitrary: fc.record({
      kind: fc.constant('add' as const),
      // Prompts drawn from 3 shared prefixes so prefix hits, duplicates and evictions all happen.
      prefix: fc.integer({ min: 0, max: 2 }),
      shared: fc.integer({ min: 0, max: 12 }),
      tail: fc.integer({ min: 0, max: 10 }),
      out: fc.integer({ min: 1, max: 8 }),
      salt: fc.boolean(),
    }),
    weight: 3,
  },
  { arbitrary: fc.record({ kind: fc.constant('abort' as const), pick: fc.nat() }), weight: 1 },
  { arbitrary: fc.constant({ kind: 'step' as const }), weight: 4 },
);

const configArb: fc.Arbitrary<EngineConfig> = fc.record({
  blockSize: fc.integer({ min: 1, max: 4 }),
  kvBlocks: fc.integer({ min: 8, max: 24 }),
  maxNumSeqs: fc.integer({ min: 1, max: 5 }),
  maxNumBatchedTokens: fc.integer({ min: 1, max: 16 }),
  enablePrefixCaching: fc.boolean(),
  cost: fc.constant({ baseMs: 1, prefillTokenMs: 0.5, decodeSeqMs: 0.25 }),
});

function prompt(op: AddOp, n: number): number[] {
  const tokens: number[] = [];
  for (let i = 0; i < op.shared; i++) tokens.push(op.prefix * 1000 + i);
  for (let i = 0; i < op.tail; i++) tokens.push(100000 + n * 100 + i);
  if (tokens.length === 0) tokens.push(7);
  return tokens;
}

function checkInvariants(core: EngineCore, inspect: EngineInspector, config: EngineConfig): void {
  const snap = core.snapshot();
  const free = inspect.freeOrder();
  expect(free.length).toBe(snap.freeBlocks);
  expect(snap.freeBlocks + inspect.usedBlocks()).toBe(config.kvBlocks);
  const refs = inspect.refCounts();
  for (const id of free) expect(refs[id]).toBe(0);
  expect(refs.filter((r) => r === 0).length).toBe(snap.freeBlocks);
  expect(snap.running).toBeLessThanOrEqual(config.maxNumSeqs);
  expect(snap.kvUsage).toBeCloseTo(1 - snap.freeBlocks / config.kvBlocks, 12);
  expect(snap.cachedBlocks).toBeLessThanOrEqual(config.kvBlocks);
  expect(snap.prefixHits).toBeLessThanOrEqual(snap.prefixQueries);
  if (!config.enablePrefixCaching) expect(snap.cachedBlocks + snap.prefixQueries).toBe(0);
}

interface Run {
  readonly results: Array<StepResult | null>;
  readonly ended: Set<string>;
  readonly added: string[];
}

/** Apply the ops, checking invariants after each, then step until no work is left (bounded). */
function run(config: EngineConfig, ops: readonly Op[]): Run {
  const { core, inspect } = createInspectableEngineCore(config);
  const results: Array<StepResult | null> = [];
  const added: string[] = [];
  const ended = new Set<string>();
  const live: string[] = [];
  const onStep = (r: StepResult | null): void => {
    results.push(r);
    if (r === null) return;
    expect(r.prefillTokens + r.decodeSeqs).toBeLessThanOrEqual(config.maxNumBatchedTokens);
    if (r.prefillTokens + r.decodeSeqs > 0) expect(r.durationMs).toBeGreaterThan(0);
    for (const id of r.finished) {
      ended.add(id);
      live.splice(live.indexOf(id), 1);
    }
  };
  ops.forEach((op, n) => {
    if (op.kind === 'add') {
      const id = `s${n}`;
      const salt = op.salt ? { cacheSalt: `t${op.prefix}` } : {};
      const spec = { id, promptTokenIds: prompt(op, n), outputTokens: op.out, ...salt };
      const need = Math.ceil((spec.promptTokenIds.length + op.out - 1) / config.blockSize);
      if (need > config.kvBlocks) {
        expect(() => core.add(spec)).toThrow();
        return;
      }
      core.add(spec);
      added.push(id);
      live.push(id);
    } else if (op.kind === 'abort') {
      const id = live[op.pick % Math.max(live.length, 1)];
      if (id !== undefined) {
        core.abort(id);
        ended.add(id);
        live.splice(live.indexOf(id), 1);
      }
    } else {
      onStep(core.step());
    }
    checkInvariants(core, inspect, config);
  });
  // Every sequence ends: a bound of the total tokens any sequence could need, times a generous factor for recompute.
  let bound = 10000;
  while (core.hasWork() && bound-- > 0) {
    onStep(core.step());
    checkInvariants(core, inspect, config);
  }
  expect(core.hasWork()).toBe(false);
  const snap = core.snapshot();
  expect(snap.freeBlocks).toBe(config.kvBlocks);
  expect(snap.running + snap.waiting).toBe(0);
  return { results, ended, added };
}

describe('engine core invariants', () => {
  it('keeps the block accounting and the scheduler limits, and ends every sequence', () => {
    fc.assert(
      fc.property(configArb, fc.array(opArb, { maxLength: 60 }), (config, ops) => {
        const { ended, added } = run(config, ops);
        for (const id of added) expect(ended.has(id)).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it('is deterministic: the same calls give the same steps', () => {
    fc.assert(
      fc.property(configArb, fc.array(opArb, { maxLength: 40 }), (config, ops) => {
        expect(run(config, ops).results).toEqual(run(config, ops).results);
      }),
      { numRuns: 100 },
    );
  });
});
