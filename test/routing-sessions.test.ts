/**
 * Session idle gaps (src/routing/sessions.ts): gaps by value against an injected clock, the class boundaries, TTL
 * expiry, LRU eviction, hostile keys, and properties checked against a naive model.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  GAP_BUCKETS_SECONDS,
  GAP_CLASS_BOUNDS_MS,
  GAP_CLASSES,
  KEY_MAX_CHARS,
  SessionGaps,
  gapClassOf,
  storedKey,
} from '../src/routing/sessions.js';

const S = 1000;
const MIN = 60 * S;

describe('SessionGaps gaps', () => {
  it('a new session is first; the next start reads the gap from the last completion', () => {
    const g = new SessionGaps();
    expect(g.start('a', 0)).toEqual({ gapMs: null, gapClass: 'first' });
    g.complete('a', 4_000);
    expect(g.start('a', 6_500)).toEqual({ gapMs: 2_500, gapClass: '0-10s' });
    g.complete('a', 10_000);
    expect(g.start('a', 10_000 + 2 * MIN)).toEqual({ gapMs: 2 * MIN, gapClass: '1m-5m' });
  });

  it('sessions are independent', () => {
    const g = new SessionGaps();
    g.complete('a', 1_000);
    g.complete('b', 5_000);
    expect(g.start('a', 21_000)).toEqual({ gapMs: 20_000, gapClass: '10s-1m' });
    expect(g.start('b', 21_000)).toEqual({ gapMs: 16_000, gapClass: '10s-1m' });
    expect(g.start('c', 21_000).gapClass).toBe('first');
  });

  it('a start does not move the measuring point: concurrent starts read the same completion', () => {
    const g = new SessionGaps();
    g.complete('a', 1_000);
    expect(g.start('a', 3_000).gapMs).toBe(2_000);
    // The first request is still in flight; a second one of the same session starts.
    expect(g.start('a', 4_000).gapMs).toBe(3_000);
  });

  it('a session in flight with no completion yet reads first for every concurrent start', () => {
    const g = new SessionGaps();
    expect(g.start('a', 0).gapClass).toBe('first');
    expect(g.start('a', 500).gapClass).toBe('first');
    expect(g.size).toBe(0);
    g.complete('a', 900);
    expect(g.start('a', 1_000).gapMs).toBe(100);
  });

  it('overlapping requests: the completion reported last is the one measured from', () => {
    const g = new SessionGaps();
    g.complete('a', 5_000); // the later-started request finished first
    g.complete('a', 7_000);
    expect(g.start('a', 8_000).gapMs).toBe(1_000);
  });

  it('a clock that went backwards reads a gap of 0, not a negative one', () => {
    const g = new SessionGaps();
    g.complete('a', 10_000);
    expect(g.start('a', 9_000)).toEqual({ gapMs: 0, gapClass: '0-10s' });
  });
});

describe('gapClassOf', () => {
  it('bounds are inclusive upper bounds, like a Prometheus le bucket', () => {
    const cases: Array<[number, string]> = [
      [0, '0-10s'],
      [10 * S, '0-10s'],
      [10 * S + 1, '10s-1m'],
      [MIN, '10s-1m'],
      [MIN + 1, '1m-5m'],
      [5 * MIN, '1m-5m'],
      [5 * MIN + 1, '5m-30m'],
      [30 * MIN, '5m-30m'],
      [30 * MIN + 1, '30m+'],
      [Number.MAX_SAFE_INTEGER, '30m+'],
      [Infinity, '30m+'],
    ];
    for (const [ms, cls] of cases) expect([ms, gapClassOf(ms)]).toEqual([ms, cls]);
  });

  it('a negative or NaN gap is the first class', () => {
    expect(gapClassOf(-1)).toBe('0-10s');
    expect(gapClassOf(Number.NaN)).toBe('0-10s');
  });

  it('the classes are one more than the bounds; every bound is a histogram bucket so the histogram re-aggregates', () => {
    expect(GAP_CLASSES.length).toBe(GAP_CLASS_BOUNDS_MS.length + 1);
    for (const bound of GAP_CLASS_BOUNDS_MS) expect(GAP_BUCKETS_SECONDS).toContain(bound / 1000);
    expect([...GAP_BUCKETS_SECONDS].sort((x, y) => x - y)).toEqual(GAP_BUCKETS_SECONDS);
    expect(new Set(GAP_BUCKETS_SECONDS).size).toBe(GAP_BUCKETS_SECONDS.length);
  });
});

describe('SessionGaps TTL', () => {
  it('a gap of exactly ttlMs is kept; one ms more reads first and drops the entry', () => {
    const g = new SessionGaps({ ttlMs: 30 * MIN });
    g.complete('a', 0);
    expect(g.start('a', 30 * MIN)).toEqual({ gapMs: 30 * MIN, gapClass: '5m-30m' });
    g.complete('b', 0);
    expect(g.start('b', 30 * MIN + 1)).toEqual({ gapMs: null, gapClass: 'first' });
    expect(g.start('b', 30 * MIN + 2).gapClass).toBe('first');
  });

  it('the 30m+ class is reachable with a longer TTL', () => {
    const g = new SessionGaps({ ttlMs: 2 * 60 * MIN });
    g.complete('a', 0);
    expect(g.start('a', 45 * MIN)).toEqual({ gapMs: 45 * MIN, gapClass: '30m+' });
  });

  it('expired entries read as absent at once, and are dropped from the least recent end every 64 calls', () => {
    const g = new SessionGaps({ ttlMs: 1_000 });
    g.complete('a', 0);
    g.complete('b', 0);
    g.complete('c', 5_000); // call 3
    expect(g.size).toBe(3); // not swept yet: a sweep runs every 64th call, not on every one
    for (let call = 4; call < 64; call++) expect(g.start('c', 5_000).gapMs).toBe(0);
    expect(g.size).toBe(3);
    g.start('c', 5_000); // call 64: the sweep drops a and b, the stale ones at the least recent end
    expect(g.size).toBe(1);
    expect(g.start('a', 5_001).gapClass).toBe('first');
  });

  it('a full tracker forgets its least recent 1 % at once (one walk for many evictions)', () => {
    const g = new SessionGaps({ maxSessions: 200 });
    for (let i = 0; i < 200; i++) g.complete(`s${i}`, i);
    g.complete('new', 1_000);
    expect(g.size).toBe(199); // s0 and s1 gone, `new` in
    expect(g.start('s0', 1_001).gapClass).toBe('first');
    expect(g.start('s1', 1_001).gapClass).toBe('first');
    expect(g.start('s2', 1_001).gapMs).toBe(999);
  });

  it('rejects options that cannot work', () => {
    expect(() => new SessionGaps({ maxSessions: 0 })).toThrow(RangeError);
    expect(() => new SessionGaps({ maxSessions: 1.5 })).toThrow(RangeError);
    expect(() => new SessionGaps({ ttlMs: 0 })).toThrow(RangeError);
    expect(() => new SessionGaps({ ttlMs: Number.NaN })).toThrow(RangeError);
  });
});

describe('SessionGaps LRU', () => {
  it('at maxSessions the least recently used session is forgotten', () => {
    const g = new SessionGaps({ maxSessions: 3 });
    g.complete('a', 1);
    g.complete('b', 2);
    g.complete('c', 3);
    g.complete('d', 4); // a is the least recent: gone
    expect(g.size).toBe(3);
    expect(g.start('a', 10).gapClass).toBe('first');
    expect(g.start('b', 10).gapMs).toBe(8);
  });

  it('a start makes a session recent', () => {
    const g = new SessionGaps({ maxSessions: 3 });
    g.complete('a', 1);
    g.complete('b', 2);
    g.complete('c', 3);
    expect(g.start('a', 5).gapMs).toBe(4); // a is now the most recent; b the least
    g.complete('d', 6);
    expect(g.start('b', 7).gapClass).toBe('first');
    expect(g.start('a', 7).gapMs).toBe(6);
    expect(g.start('c', 7).gapMs).toBe(4);
    expect(g.start('d', 7).gapMs).toBe(1);
  });

  it('completing a remembered session does not evict another', () => {
    const g = new SessionGaps({ maxSessions: 2 });
    g.complete('a', 1);
    g.complete('b', 2);
    g.complete('a', 3);
    expect(g.size).toBe(2);
    expect(g.start('b', 4).gapMs).toBe(2);
  });
});

describe('session keys', () => {
  it('a key up to KEY_MAX_CHARS is kept as is; a longer one is a fixed-size digest', () => {
    const short = 'x'.repeat(KEY_MAX_CHARS);
    expect(storedKey(short)).toBe(`k${short}`);
    expect(storedKey('x'.repeat(KEY_MAX_CHARS + 1))).toMatch(/^h[0-9a-f]{16}$/);
    expect(storedKey('y'.repeat(1_000_000))).toMatch(/^h[0-9a-f]{16}$/);
  });

  it('a short key that looks like a digest is a different session', () => {
    const long = 'z'.repeat(KEY_MAX_CHARS + 10);
    const lookalike = storedKey(long).slice(1); // the digest's text, sent as a short key
    expect(storedKey(lookalike)).not.toBe(storedKey(long));
    const g = new SessionGaps();
    g.complete(long, 0);
    expect(g.start(lookalike, 1).gapClass).toBe('first');
    expect(g.start(long, 1).gapMs).toBe(1);
  });

  it('long keys differing only at the end, or only in length, are different sessions', () => {
    const base = 'q'.repeat(10_000);
    const keys = [`${base}a`, `${base}b`, `${base}ab`, `${base}`, `a${base}`];
    expect(new Set(keys.map(storedKey)).size).toBe(keys.length);
  });

  it('hostile keys (huge, empty, lone surrogates, NUL, the tag characters) are bounded and distinct', () => {
    const hostile = ['', '\u0000', '\ud800', '\udfff\ud800', 'k', 'h', 'h0123456789abcdef', '__proto__', 'constructor', '\u0000'.repeat(5_000), '\ud800'.repeat(300)];
    const stored = hostile.map(storedKey);
    expect(new Set(stored).size).toBe(hostile.length);
    for (const s of stored) expect(s.length).toBeLessThanOrEqual(KEY_MAX_CHARS + 1);
    const g = new SessionGaps({ maxSessions: 4 });
    hostile.forEach((key, i) => g.complete(key, i));
    expect(g.size).toBe(4);
    expect(g.start('\ud800'.repeat(300), 20).gapMs).toBe(20 - (hostile.length - 1));
  });
});

/** One call against the tracker: which session (from a small pool so they repeat), and how far the clock moves. */
type Op = { readonly kind: 'start' | 'complete'; readonly session: number; readonly advance: number };

const op: fc.Arbitrary<Op> = fc.record({
  kind: fc.constantFrom('start' as const, 'complete' as const),
  session: fc.nat(12),
  // Mostly small steps, some large enough to cross every class bound and the TTL, and a few backwards.
  advance: fc.oneof(fc.integer({ min: 0, max: 20_000 }), fc.integer({ min: 0, max: 3 * 60 * MIN }), fc.integer({ min: -5_000, max: 0 })),
});

const keyOf = (session: number): string => (session % 3 === 0 ? `long-${session}-${'s'.repeat(KEY_MAX_CHARS)}` : `s${session}`);

describe('SessionGaps properties', () => {
  it('never more than maxSessions entries; gap never negative; class always in GAP_CLASSES and matching the gap', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 6 }), fc.integer({ min: 1, max: 90 * MIN }), fc.array(op, { maxLength: 200 }), (maxSessions, ttlMs, ops) => {
        const g = new SessionGaps({ maxSessions, ttlMs });
        let now = 0;
        for (const o of ops) {
          now += o.advance;
          if (o.kind === 'complete') {
            g.complete(keyOf(o.session), now);
          } else {
            const r = g.start(keyOf(o.session), now);
            if (r.gapMs === null) {
              expect(r.gapClass).toBe('first');
            } else {
              expect(r.gapMs).toBeGreaterThanOrEqual(0);
              expect(r.gapMs).toBeLessThanOrEqual(ttlMs);
              expect(GAP_CLASSES).toContain(r.gapClass);
              expect(r.gapClass).toBe(gapClassOf(r.gapMs));
            }
          }
          expect(g.size).toBeLessThanOrEqual(maxSessions);
        }
      }),
    );
  });

  it('with room for every session, each gap equals a naive model of last completion (monotonic clock)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 90 * MIN }), fc.array(op, { maxLength: 200 }), (ttlMs, ops) => {
        const g = new SessionGaps({ maxSessions: 64, ttlMs });
        const last = new Map<number, number>();
        let now = 0;
        for (const o of ops) {
          now += Math.max(0, o.advance);
          if (o.kind === 'complete') {
            g.complete(keyOf(o.session), now);
            last.set(o.session, now);
          } else {
            const prev = last.get(o.session);
            const expected = prev === undefined || now - prev > ttlMs ? null : now - prev;
            if (expected === null) last.delete(o.session);
            expect(g.start(keyOf(o.session), now).gapMs).toBe(expected);
          }
        }
      }),
    );
  });

  it('gapClassOf is total and monotone', () => {
    fc.assert(
      fc.property(fc.double(), fc.double(), (x, y) => {
        expect(GAP_CLASSES).toContain(gapClassOf(x));
        const [lo, hi] = x <= y ? [x, y] : [y, x];
        if (!Number.isNaN(lo) && !Number.isNaN(hi)) {
          expect(GAP_CLASSES.indexOf(gapClassOf(lo))).toBeLessThanOrEqual(GAP_CLASSES.indexOf(gapClassOf(hi)));
        }
      }),
    );
  });
});
