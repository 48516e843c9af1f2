/**
 * The prefix index (src/routing/prefix-index.ts): longest run from the start per upstream, LRU eviction within
 * maxEntries, forget(), per-upstream capacity, and memory that stays bounded under any workload.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PrefixIndex } from '../src/routing/prefix-index.js';

const range = (from: number, to: number): number[] => Array.from({ length: to - from }, (_, i) => from + i);
const entries = (m: Map<string, number>): Array<[string, number]> => [...m].sort(([a], [b]) => a.localeCompare(b));

describe('PrefixIndex', () => {
  it('matches the longest run from the start, per upstream', () => {
    const index = new PrefixIndex();
    index.record('a', [1, 2, 3, 4]);
    index.record('b', [1, 2, 9]);
    index.record('c', [2, 3, 4]); // holds later blocks but not the first: no hit, as in vLLM
    expect(entries(index.match([1, 2, 3, 4, 5]))).toEqual([['a', 4], ['b', 2]]);
    expect(entries(index.match([1, 2, 9, 4]))).toEqual([['a', 2], ['b', 3]]);
    expect(entries(index.match([7, 1, 2]))).toEqual([]);
    expect(entries(index.match([]))).toEqual([]);
    expect(index.size).toBe(4 + 3 + 3);
    // A longer prompt sharing a prefix extends the entry, not duplicates it.
    index.record('b', [1, 2, 9, 10]);
    expect(index.sizeOf('b')).toBe(4);
    expect(index.match([1, 2, 9, 10]).get('b')).toBe(4);
  });

  it('fills a given map instead of allocating one', () => {
    const index = new PrefixIndex();
    index.record('a', [1, 2]);
    const into = new Map<string, number>();
    expect(index.match([1, 2], into)).toBe(into);
    expect(into.get('a')).toBe(2);
  });

  it('evicts the least recently recorded entry at maxEntries, leading blocks last', () => {
    const index = new PrefixIndex({ maxEntries: 6 });
    index.record('a', [1, 2, 3]);
    index.record('b', [11, 12, 13]);
    expect(index.size).toBe(6);
    // Recording a again makes its blocks the most recent; then a new prompt on b pushes out b's oldest: its tail.
    index.record('a', [1, 2, 3]);
    index.record('b', [21]);
    expect(index.size).toBe(6);
    expect(index.match([11, 12, 13]).get('b')).toBe(2); // 13, the tail, went first
    index.record('c', [31, 32]);
    expect(index.match([11, 12, 13]).get('b')).toBeUndefined(); // two more out: b's 12, then 11, older than a's
    expect(index.sizeOf('b')).toBe(1);
    expect(index.match([21]).get('b')).toBe(1);
    expect(index.match([1, 2, 3]).get('a')).toBe(3);
    expect(index.match([31, 32]).get('c')).toBe(2);
    expect(index.size).toBe(6);
  });

  it('a prompt longer than the index keeps its start', () => {
    const index = new PrefixIndex({ maxEntries: 10 });
    index.record('a', range(0, 100));
    expect(index.size).toBe(10);
    expect(index.match(range(0, 100)).get('a')).toBe(10);
  });

  it('forget() drops every entry of an upstream and nothing else', () => {
    const index = new PrefixIndex();
    index.record('a', [1, 2, 3]);
    index.record('b', [1, 2]);
    index.forget('a');
    index.forget('nobody');
    expect(index.size).toBe(2);
    expect(entries(index.match([1, 2, 3]))).toEqual([['b', 2]]);
    index.record('a', [1]);
    expect(entries(index.match([1, 2, 3]))).toEqual([['a', 1], ['b', 2]]);
  });

  it('a per-upstream capacity keeps its most recent blocks', () => {
    const index = new PrefixIndex();
    index.record('a', range(0, 10));
    index.setCapacity('a', 4);
    expect(index.sizeOf('a')).toBe(4);
    expect(index.match(range(0, 10)).get('a')).toBe(4); // blocks 0–3: the leading ones are the most recent
    index.record('a', range(100, 103));
    expect(index.sizeOf('a')).toBe(4);
    expect(index.match([100, 101, 102]).get('a')).toBe(3);
    expect(index.size).toBe(4);
    index.setCapacity('a', null);
    index.record('a', range(0, 10));
    expect(index.sizeOf('a')).toBe(13); // block 0 was still held
  });

  it('stays within maxEntries, its count exact, under a random workload', () => {
    const op = fc.oneof(
      fc.record({ kind: fc.constant('record' as const), upstream: fc.constantFrom('a', 'b', 'c', 'd'), start: fc.integer({ min: 0, max: 40 }), length: fc.integer({ min: 0, max: 30 }) }),
      fc.record({ kind: fc.constant('forget' as const), upstream: fc.constantFrom('a', 'b', 'c', 'd') }),
      fc.record({ kind: fc.constant('capacity' as const), upstream: fc.constantFrom('a', 'b', 'c', 'd'), blocks: fc.option(fc.integer({ min: 0, max: 20 })) }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 50 }), fc.array(op, { maxLength: 200 }), (maxEntries, ops) => {
        const index = new PrefixIndex({ maxEntries });
        const caps = new Map<string, number>();
        for (const o of ops) {
          if (o.kind === 'record') index.record(o.upstream, range(o.start, o.start + o.length));
          else if (o.kind === 'forget') index.forget(o.upstream);
          else {
            index.setCapacity(o.upstream, o.blocks);
            if (o.blocks === null) caps.delete(o.upstream);
            else caps.set(o.upstream, o.blocks);
          }
          expect(index.size).toBeLessThanOrEqual(maxEntries);
          let sum = 0;
          for (const u of ['a', 'b', 'c', 'd']) {
            sum += index.sizeOf(u);
            expect(index.sizeOf(u)).toBeLessThanOrEqual(caps.get(u) ?? Infinity);
          }
          expect(sum).toBe(index.size);
        }
        // Whatever was evicted, the last prompt recorded on an upstream is still matched from its start if it fits.
        const last = ops.at(-1);
        if (last?.kind === 'record' && last.length > 0 && last.length <= Math.min(maxEntries, caps.get(last.upstream) ?? Infinity)) {
          expect(index.match(range(last.start, last.start + last.length)).get(last.upstream)).toBe(last.length);
        }
      }),
      { numRuns: 300 },
    );
  });

  it('holds 200 000 entries by default and no more', () => {
    const index = new PrefixIndex();
    for (let p = 0; p < 1000; p++) index.record(`u${p % 4}`, range(p * 256, p * 256 + 256));
    expect(index.size).toBe(200_000);
  });
});
