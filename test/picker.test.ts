/** pickUpstream (src/proxy/picker.ts): power of two choices by weight and in-flight count, avoiding upstreams already tried. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { pickUpstream, type Candidate } from '../src/proxy/picker.js';
import { mulberry32 } from './fixtures/sse-fixtures.js';

const NONE: ReadonlySet<string> = new Set();

/** A random that replays `values` in order, so a test decides which candidates are drawn. */
function scripted(...values: number[]): () => number {
  let i = 0;
  return () => {
    const value = values[i++];
    if (value === undefined) throw new Error('scripted random ran out');
    return value;
  };
}

function candidate(name: string, weight: number, inflight: number): Candidate {
  return { name, weight, inflight };
}

function countPicks(candidates: readonly Candidate[], avoid: ReadonlySet<string>, picks: number, seed: number): Map<string, number> {
  const random = mulberry32(seed);
  const counts = new Map<string, number>();
  for (let i = 0; i < picks; i++) {
    const name = pickUpstream(candidates, avoid, random)?.name ?? 'none';
    counts.set(name, (counts.get(name) ?? 0) + 1);
  }
  return counts;
}

describe('pickUpstream', () => {
  it('returns undefined for no candidates and the only one for one, even when avoided', () => {
    const only = candidate('a', 1, 10);
    expect(pickUpstream([], NONE, scripted())).toBeUndefined();
    expect(pickUpstream([], new Set(['a']), scripted())).toBeUndefined();
    expect(pickUpstream([only], NONE, scripted())).toBe(only);
    expect(pickUpstream([only], new Set(['a']), scripted())).toBe(only);
  });

  it('keeps the less loaded of the two drawn, by (inflight + 1) / weight', () => {
    const busy = candidate('busy', 1, 5);
    const idle = candidate('idle', 1, 0);
    // 0 then 0: first drawn is index 0, second is the first of the others (index 1).
    expect(pickUpstream([busy, idle], NONE, scripted(0, 0))).toBe(idle);
    expect(pickUpstream([idle, busy], NONE, scripted(0, 0))).toBe(idle);
    // Weight scales capacity: 3 inflight on weight 4 is load 1, 1 inflight on weight 1 is load 2.
    const big = candidate('big', 4, 3);
    const small = candidate('small', 1, 1);
    expect(pickUpstream([small, big], NONE, scripted(0.1, 0.1))).toBe(big);
  });

  it('keeps the first drawn on a tie', () => {
    const a = candidate('a', 2, 1);
    const b = candidate('b', 1, 0); // (1+1)/2 = (0+1)/1
    expect(pickUpstream([a, b], NONE, scripted(0.99, 0))).toBe(b);
    expect(pickUpstream([a, b], NONE, scripted(0, 0))).toBe(a);
  });

  it('draws two distinct candidates, also when random returns exactly 1', () => {
    const a = candidate('a', 1, 0);
    const b = candidate('b', 1, 8);
    const c = candidate('c', 1, 9);
    // 1 → last index, c (clamped); the second draw, 1 among the two others, is b. Never the same twice.
    expect(pickUpstream([a, b, c], NONE, scripted(1, 1))).toBe(b);
    expect(pickUpstream([a, b, c], NONE, scripted(0, 0))).toBe(a);
  });

  it('with equal inflight and two candidates, weight 3 beats weight 1 every time', () => {
    const counts = countPicks([candidate('light', 1, 4), candidate('heavy', 3, 4)], NONE, 10_000, 1);
    expect(counts.get('heavy')).toBe(10_000);
  });

  it('with equal inflight among four, the heavy one wins whenever drawn: half of 10k picks', () => {
    const pool = [candidate('a', 1, 0), candidate('b', 1, 0), candidate('c', 1, 0), candidate('heavy', 3, 0)];
    const counts = countPicks(pool, NONE, 10_000, 2);
    // Drawn in a pair with probability 2/4; the three light ones share the rest (1/6 each).
    expect(counts.get('heavy')).toBeGreaterThan(4_700);
    expect(counts.get('heavy')).toBeLessThan(5_300);
    for (const name of ['a', 'b', 'c']) {
      expect(counts.get(name)).toBeGreaterThan(1_450);
      expect(counts.get(name)).toBeLessThan(1_900);
    }
  });

  it('under load, traffic follows weight: weight 3 serves about three times weight 1', () => {
    // Closed loop: each pick adds a request; each step every request finishes with the same probability.
    const random = mulberry32(3);
    const pool = [
      { name: 'light', weight: 1, inflight: 0 },
      { name: 'heavy', weight: 3, inflight: 0 },
    ];
    const served = new Map<string, number>();
    for (let step = 0; step < 10_000; step++) {
      for (let k = 0; k < 4; k++) {
        const picked = pickUpstream(pool, NONE, random);
        if (picked === undefined) throw new Error('no pick');
        picked.inflight++;
        served.set(picked.name, (served.get(picked.name) ?? 0) + 1);
      }
      for (const upstream of pool) {
        let finished = 0;
        for (let r = 0; r < upstream.inflight; r++) if (random() < 0.1) finished++;
        upstream.inflight -= finished;
      }
    }
    const ratio = (served.get('heavy') ?? 0) / (served.get('light') ?? 1);
    expect(ratio).toBeGreaterThan(2.5);
    expect(ratio).toBeLessThan(3.5);
  });

  it('never picks an avoided candidate while another is given', () => {
    const pool = [candidate('failed', 10, 0), candidate('b', 1, 3), candidate('c', 1, 5)];
    const counts = countPicks(pool, new Set(['failed']), 1_000, 4);
    expect(counts.get('failed')).toBeUndefined();
    expect(counts.get('b')).toBeGreaterThan(counts.get('c') ?? 0);
    // Every candidate avoided: pick among all of them rather than none. The least loaded, 'failed', wins whenever
    // it is drawn, in 2 of 3 pairs.
    const all = countPicks(pool, new Set(['failed', 'b', 'c']), 3_000, 5);
    expect(all.get('none')).toBeUndefined();
    expect(all.get('failed')).toBeGreaterThan(1_850);
    expect(all.get('failed')).toBeLessThan(2_150);
    // A name that is not a candidate changes nothing: same seed, same picks.
    expect(countPicks(pool, new Set(['elsewhere']), 3_000, 5)).toEqual(all);
  });

  it('property: picks a usable candidate, never the unique most loaded', () => {
    const arbitraryPool = fc.uniqueArray(
      fc.record({ name: fc.constantFrom('a', 'b', 'c', 'd', 'e', 'f'), weight: fc.integer({ min: 1, max: 5 }), inflight: fc.nat(20) }),
      { selector: (c) => c.name, minLength: 1, maxLength: 6 },
    );
    fc.assert(
      fc.property(arbitraryPool, fc.subarray(['a', 'b', 'c']), fc.integer(), (pool, avoided, seed) => {
        const avoid = new Set(avoided);
        const picked = pickUpstream(pool, avoid, mulberry32(seed));
        if (picked === undefined) throw new Error('no pick from a non-empty pool');
        expect(pool).toContain(picked);
        const usable = pool.some((c) => !avoid.has(c.name)) ? pool.filter((c) => !avoid.has(c.name)) : pool;
        expect(usable).toContain(picked);
        const load = (c: Candidate): number => (c.inflight + 1) / c.weight;
        const loads = usable.map(load);
        const max = Math.max(...loads);
        if (usable.length >= 2 && loads.filter((l) => l === max).length === 1) expect(load(picked)).toBeLessThan(max);
      }),
    );
  });
});
