/**
 * The cache_aware pick (src/routing/score.ts): for random candidates, loads, signals, matches and seeds it stays
 * within the bounded-load rule, only ever returns a candidate it was given, is a function of its seed, spreads ties,
 * names a reason from the closed set, and without engine signals for every candidate uses in-flight counts only.
 * Then the rules by value.
 */
import { createRandom } from '../src/util/prng.js';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PICK_REASONS, pickCacheAware, predictedCachedTokens, type RequestMatch, type RoutingCandidate } from '../src/routing/score.js';

/** A seeded [0, 1) source (the simulator's mulberry32), so a pick can be replayed. */
const seeded = (seed: number): (() => number) => createRandom(seed);

const signal = fc.option(fc.integer({ min: 0, max: 200 }), { nil: null });
const candidate = (name: string): fc.Arbitrary<RoutingCandidate> =>
  fc.record({
    name: fc.constant(name),
    weight: fc.oneof({ weight: 9, arbitrary: fc.integer({ min: 1, max: 4 }) }, { weight: 1, arbitrary: fc.constant(0) }),
    inflight: fc.integer({ min: 0, max: 100 }),
    waiting: signal,
    running: signal,
    kvUsage: fc.option(fc.double({ min: 0, max: 1, noNaN: true }), { nil: null }),
  });
const pool = fc.integer({ min: 1, max: 8 }).chain((n) => fc.tuple(...Array.from({ length: n }, (_, i) => candidate(`u${i}`))));
const matches = (names: readonly string[]): fc.Arbitrary<RequestMatch> =>
  fc.record({
    requestBlocks: fc.integer({ min: 0, max: 64 }),
    matched: fc.array(fc.tuple(fc.constantFrom(...names), fc.integer({ min: 0, max: 64 })), { maxLength: names.length }).map((e) => new Map(e)),
    sessionKey: fc.option(fc.string({ maxLength: 8 }), { nil: undefined }),
  });
const scenario = pool.chain((candidates) => fc.tuple(fc.constant(candidates), matches(candidates.map((c) => c.name)), fc.integer(), fc.double({ min: 1, max: 3, noNaN: true })));

/** The oracle for rule 1, written out again from its definition. */
function withinBound(candidates: readonly RoutingCandidate[], x: RoutingCandidate, c: number): boolean {
  const signals = candidates.every((y) => y.waiting != null && y.running != null);
  // The bound's load: the gateway's own in flight plus, with everyone's signals, the engine's queue (not running).
  const count = (y: RoutingCandidate): number => (signals ? y.inflight + (y.waiting ?? 0) : y.inflight);
  const any = candidates.some((y) => y.weight > 0);
  const weight = (y: RoutingCandidate): number => (any ? y.weight : 1);
  const live = candidates.filter((y) => weight(y) > 0);
  const total = live.reduce((s, y) => s + count(y), 0);
  const weights = live.reduce((s, y) => s + weight(y), 0);
  return weight(x) > 0 && count(x) + 1 <= Math.ceil((c * (total + 1) * weight(x)) / weights - 1e-9);
}

describe('pickCacheAware: properties', () => {
  it('stays within the bound, returns a given candidate, names a closed reason', () => {
    fc.assert(
      fc.property(scenario, ([candidates, match, seed, c]) => {
        const pick = pickCacheAware(candidates, match, { boundedLoad: c }, seeded(seed));
        expect(pick).toBeDefined();
        if (pick === undefined) return;
        expect(candidates).toContain(pick.candidate);
        expect(PICK_REASONS).toContain(pick.reason);
        expect(pick.predictedCachedBlocks).toBe(match.matched.get(pick.candidate.name) ?? 0);
        if (candidates.length === 1) {
          expect(pick.reason).toBe('single');
          return;
        }
        // Someone is always within the bound, so the pick must be.
        expect(candidates.some((x) => withinBound(candidates, x, c))).toBe(true);
        expect(withinBound(candidates, pick.candidate, c)).toBe(true);
        // A prefix win is the best match among the candidates that can take requests at all (weight > 0).
        const live = candidates.some((x) => x.weight > 0) ? candidates.filter((x) => x.weight > 0) : candidates;
        if (pick.reason === 'prefix') expect(pick.predictedCachedBlocks).toBe(Math.max(...live.map((x) => match.matched.get(x.name) ?? 0)));
      }),
      { numRuns: 2000 },
    );
  });

  it('is a function of its seed', () => {
    fc.assert(
      fc.property(scenario, ([candidates, match, seed]) => {
        const a = pickCacheAware(candidates, match, {}, seeded(seed));
        const b = pickCacheAware(candidates, match, {}, seeded(seed));
        expect(b?.candidate.name).toBe(a?.candidate.name);
        expect(b?.reason).toBe(a?.reason);
      }),
    );
  });

  it('without signals for every candidate, the others’ signals change nothing (in-flight only)', () => {
    fc.assert(
      fc.property(scenario, fc.array(signal, { minLength: 16, maxLength: 16 }), ([candidates, match, seed], noise) => {
        if (candidates.every((x) => x.waiting != null && x.running != null)) return;
        const renoised = candidates.map((x, i) => ({ ...x, waiting: x.waiting == null ? x.waiting : noise[i], running: x.running == null ? x.running : noise[i + 8] }));
        const stripped = candidates.map((x) => ({ name: x.name, weight: x.weight, inflight: x.inflight, kvUsage: x.kvUsage }));
        const a = pickCacheAware(candidates, match, {}, seeded(seed));
        for (const other of [renoised, stripped] as ReadonlyArray<readonly RoutingCandidate[]>) {
          const b = pickCacheAware(other, match, {}, seeded(seed));
          expect(b?.candidate.name).toBe(a?.candidate.name);
          // Stripping every signal leaves no stale candidate: the same choice, called load instead.
          if (a?.reason !== 'stale_signals') expect(b?.reason).toBe(a?.reason);
        }
      }),
    );
  });

  it('spreads ties over every tied candidate (never by position)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 6 }), fc.integer({ min: 0, max: 20 }), fc.integer({ min: 0, max: 3 }), (n, inflight, matched) => {
        const candidates = Array.from({ length: n }, (_, i) => ({ name: `u${i}`, weight: 1, inflight }));
        const match = { requestBlocks: 8, matched: new Map(candidates.map((x) => [x.name, matched])) };
        const seen = new Set<string>();
        for (let seed = 0; seed < 60 * n; seed++) seen.add(pickCacheAware(candidates, match, {}, seeded(seed))?.candidate.name ?? '');
        expect(seen.size).toBe(n);
      }),
      { numRuns: 50 },
    );
  });
});

describe('pickCacheAware: rules by value', () => {
  const idle = (name: string, inflight = 0, extra: Partial<RoutingCandidate> = {}): RoutingCandidate => ({ name, weight: 1, inflight, ...extra });
  const m = (requestBlocks: number, entries: Array<[string, number]>, sessionKey?: string): RequestMatch => ({ requestBlocks, matched: new Map(entries), ...(sessionKey !== undefined && { sessionKey }) });
  const always = (): number => 0.99;

  it('none → undefined; one → single', () => {
    expect(pickCacheAware([], m(0, []), {}, Math.random)).toBeUndefined();
    expect(pickCacheAware([idle('a', 50)], m(4, [['a', 2]]), {}, Math.random)).toEqual({ candidate: idle('a', 50), reason: 'single', predictedCachedBlocks: 2 });
  });

  it('the longest prefix wins when its holder is within the bound', () => {
    const pick = pickCacheAware([idle('a', 3), idle('b', 2), idle('c', 2)], m(10, [['a', 8], ['b', 3]]), {}, always);
    expect(pick).toMatchObject({ candidate: { name: 'a' }, reason: 'prefix', predictedCachedBlocks: 8 });
    expect(predictedCachedTokens(8)).toBe(128);
  });

  it('minMatchBlocks: a short match is no prefix win', () => {
    const pick = pickCacheAware([idle('a', 1), idle('b', 0)], m(10, [['a', 1]]), { minMatchBlocks: 2 }, always);
    expect(pick).toMatchObject({ candidate: { name: 'b' }, reason: 'load' });
  });

  it('an overloaded prefix holder is skipped: bounded_load', () => {
    // T = 12, c = 1.5 (the default): a holds 10, may take a request only if 11 ≤ ⌈1.5 · 13 / 3⌉ = 7.
    const pick = pickCacheAware([idle('a', 10), idle('b', 1), idle('c', 1)], m(10, [['a', 8], ['b', 2]]), {}, always);
    expect(pick).toMatchObject({ reason: 'bounded_load' });
    expect(pick?.candidate.name).not.toBe('a');
    // b's 2 blocks outweigh c's nothing at the same load.
    expect(pick?.candidate.name).toBe('b');
  });

  it('small counts are not over the bound: one request more is fine', () => {
    // ⌈1.5 · 2 / 2⌉ = 2: a with 1 in flight may take a second (the ceiling is what keeps affinity at low load).
    expect(pickCacheAware([idle('a', 1), idle('b', 0)], m(4, [['a', 4]]), {}, always)).toMatchObject({ candidate: { name: 'a' }, reason: 'prefix' });
  });

  it('an imbalanced pool is scored, not prefix-routed', () => {
    // Within a generous bound, but max − min = 20 > 8 and 21 > 1.5 × 1.
    const candidates = [idle('a', 20), idle('b', 0)];
    const pick = pickCacheAware(candidates, m(10, [['a', 2]]), { boundedLoad: 3 }, always);
    expect(pick).toMatchObject({ candidate: { name: 'b' }, reason: 'load' });
    // The same spread under the thresholds stays with the prefix.
    expect(pickCacheAware(candidates, m(10, [['a', 2]]), { boundedLoad: 3, balanceAbsThreshold: 32 }, always)).toMatchObject({ candidate: { name: 'a' }, reason: 'prefix' });
  });

  it('engine signals: the queue and KV use count when every candidate has them', () => {
    const a = idle('a', 2, { waiting: 30, running: 8, kvUsage: 0.95 });
    const b = idle('b', 2, { waiting: 0, running: 8, kvUsage: 0.2 });
    expect(pickCacheAware([a, b], m(0, []), { boundedLoad: 3 }, always)).toMatchObject({ candidate: { name: 'b' }, reason: 'load' });
    // With a's queue the engine's load is 38 against b's 8: a is over the bound even for its prefix.
    expect(pickCacheAware([a, b], m(10, [['a', 9]]), {}, always)).toMatchObject({ candidate: { name: 'b' }, reason: 'bounded_load' });
    // One candidate's signals missing: in-flight only, said so.
    const stale = pickCacheAware([a, idle('b', 2, { waiting: null, running: null, kvUsage: null })], m(0, []), {}, seeded(1));
    expect(stale?.reason).toBe('stale_signals');
  });

  it('weight: a heavier upstream takes proportionally more', () => {
    const big = { name: 'big', weight: 3, inflight: 5 };
    const small = { name: 'small', weight: 1, inflight: 2 };
    // Per unit of weight big is at 2, small at 3.
    expect(pickCacheAware([big, small], m(0, []), {}, always)?.candidate.name).toBe('big');
    // A weight of 0 never takes a request while another can.
    expect(pickCacheAware([{ name: 'z', weight: 0, inflight: 0 }, small], m(4, [['z', 4]]), {}, always)?.candidate.name).toBe('small');
  });

  it('session: the same key stays on one upstream, keys spread, and the bound still holds', () => {
    const candidates = [idle('a', 1), idle('b', 1), idle('c', 1), idle('d', 1)];
    const home = pickCacheAware(candidates, m(0, [], 'conv-42'), {}, Math.random);
    expect(home?.reason).toBe('session');
    for (let i = 0; i < 20; i++) expect(pickCacheAware(candidates, m(0, [], 'conv-42'), {}, Math.random)?.candidate.name).toBe(home?.candidate.name);
    const homes = new Set(Array.from({ length: 200 }, (_, i) => pickCacheAware(candidates, m(0, [], `conv-${i}`), {}, Math.random)?.candidate.name));
    expect(homes.size).toBe(4);
    // Its home overloaded, the session goes elsewhere; a removed candidate moves only its own sessions.
    const loaded = candidates.map((x) => (x.name === home?.candidate.name ? { ...x, inflight: 40 } : x));
    expect(pickCacheAware(loaded, m(0, [], 'conv-42'), {}, Math.random)?.candidate.name).not.toBe(home?.candidate.name);
    for (let i = 0; i < 200; i++) {
      const before = pickCacheAware(candidates, m(0, [], `conv-${i}`), {}, Math.random)?.candidate.name;
      const after = pickCacheAware(candidates.filter((x) => x.name !== 'd'), m(0, [], `conv-${i}`), {}, Math.random)?.candidate.name;
      if (before !== 'd') expect(after).toBe(before);
    }
  });

  it('several holders of the longest match: the same one for the same prefix key, whatever the seed', () => {
    const holders = [idle('a'), idle('b'), idle('c'), idle('d')];
    const match = (tieKey: string): RequestMatch => ({ requestBlocks: 8, matched: new Map([['a', 8], ['b', 8], ['c', 8]]), tieKey });
    const chosen = new Set(Array.from({ length: 50 }, (_, seed) => pickCacheAware(holders, match('prefix:42'), {}, seeded(seed))?.candidate.name));
    expect(chosen.size).toBe(1);
    expect(['a', 'b', 'c']).toContain([...chosen][0]);
    // Other prefixes spread over the holders (rendezvous, not a fixed favourite).
    const byKey = new Set(Array.from({ length: 60 }, (_, k) => pickCacheAware(holders, match(`prefix:${k}`), {}, seeded(1))?.candidate.name));
    expect(byKey).toEqual(new Set(['a', 'b', 'c']));
  });

  it('places a new prefix on the emptier of its two rendezvous candidates, never a third', () => {
    const four = [idle('a'), idle('b'), idle('c'), idle('d')];
    const place = (key: string, occupancy: Array<[string, number]>) =>
      pickCacheAware(four, { requestBlocks: 8, matched: new Map(), sessionKey: key, occupancy: new Map(occupancy) }, {}, seeded(1))?.candidate.name;
    for (let k = 0; k < 40; k++) {
      const key = `prefix:${k}`;
      const top = place(key, []) ?? '';
      // Fill the first choice: the prefix goes to one other candidate, always the same one (its second choice).
      const second = place(key, [[top, 1000]]) ?? '';
      expect(second).not.toBe(top);
      // Fill both: it stays with the emptier of those two, never a third.
      expect(place(key, [[top, 1000], [second, 2000]])).toBe(top);
      expect(place(key, [[top, 2000], [second, 1000]])).toBe(second);
    }
  });

  it('an upstream the bound excludes does not make the pool imbalanced for the others', () => {
    // d's engine queue (other clients' requests) puts it far over the bound; a, b, c are balanced and a holds the prefix.
    const withSignals = (name: string, waiting: number) => idle(name, 0, { waiting, running: 0, kvUsage: 0.1 });
    const pick = pickCacheAware([withSignals('a', 0), withSignals('b', 0), withSignals('c', 0), withSignals('d', 60)], m(8, [['a', 8]]), {}, seeded(3));
    expect(pick).toMatchObject({ candidate: { name: 'a' }, reason: 'prefix', predictedCachedBlocks: 8 });
  });

  it('the reasons are a closed set', () => {
    expect([...PICK_REASONS]).toEqual(['prefix', 'load', 'bounded_load', 'stale_signals', 'session', 'single']);
  });
});
