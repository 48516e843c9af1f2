import { getEventListeners } from 'node:events';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { AdmissionGate, type Admission, type AdmissionHooks, type AdmissionOptions } from '../src/proxy/admission.js';
import { CircuitBreaker } from '../src/proxy/breaker.js';
import { ModelLabels } from '../src/proxy/model-labels.js';
import { pickUpstream, type Candidate } from '../src/proxy/picker.js';
import { parseRetryAfter } from '../src/proxy/retry-after.js';
import { RetryBudget } from '../src/delivery/retry-budget.js';
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

describe('CircuitBreaker', () => {
  const options = { failureThreshold: 3, baseEjectionMs: 1_000, maxEjectionMs: 5_000 };

  /** Sends one request at `now` and reports a failure at once. */
  function fail(breaker: CircuitBreaker, now: number): ReturnType<CircuitBreaker['onFailure']> {
    return breaker.onFailure(now, breaker.onSend(now));
  }

  it('walks closed → open → half_open → open (×2, capped) → closed, back to base', () => {
    const breaker = new CircuitBreaker(options);
    expect(breaker.state(0)).toBe('closed');
    expect(fail(breaker, 0)).toBeUndefined();
    expect(fail(breaker, 1)).toBeUndefined();
    expect(breaker.isEligible(2)).toBe(true);
    expect(fail(breaker, 10)).toBe('consecutive_failures');
    expect(breaker.ejections).toBe(1);
    expect(breaker.state(10)).toBe('open');
    expect(breaker.isEligible(1_009)).toBe(false);
    expect(breaker.state(1_010)).toBe('half_open');
    expect(breaker.isEligible(1_010)).toBe(true);

    // Trial failures double the ejection: 2 s, 4 s, then the 5 s cap.
    let now = 1_010;
    for (const length of [2_000, 4_000, 5_000, 5_000]) {
      const trial = breaker.onSend(now);
      expect(breaker.isEligible(now)).toBe(false);
      expect(breaker.onFailure(now + 5, trial)).toBe('trial_failed');
      now += 5;
      expect(breaker.state(now + length - 1)).toBe('open');
      now += length;
      expect(breaker.state(now)).toBe('half_open');
    }
    expect(breaker.ejections).toBe(5);

    const trial = breaker.onSend(now);
    breaker.onSuccess(now + 5, trial);
    expect(breaker.state(now + 5)).toBe('closed');
    expect(breaker.isEligible(now + 5)).toBe(true);

    // Recovered: the next ejection is base length again, after a full threshold of failures.
    now += 100;
    expect(fail(breaker, now)).toBeUndefined();
    expect(fail(breaker, now)).toBeUndefined();
    expect(fail(breaker, now)).toBe('consecutive_failures');
    expect(breaker.state(now + 999)).toBe('open');
    expect(breaker.state(now + 1_000)).toBe('half_open');
  });

  it('counts only consecutive failures: a success resets the count', () => {
    const breaker = new CircuitBreaker(options);
    fail(breaker, 0);
    fail(breaker, 0);
    breaker.onSuccess(0, breaker.onSend(0));
    expect(fail(breaker, 0)).toBeUndefined();
    expect(fail(breaker, 0)).toBeUndefined();
    expect(breaker.state(0)).toBe('closed');
    expect(fail(breaker, 0)).toBe('consecutive_failures');
  });

  it('ignores late reports from requests sent before the ejection', () => {
    const breaker = new CircuitBreaker(options);
    const longStream = breaker.onSend(0);
    const otherStream = breaker.onSend(0);
    for (let i = 0; i < 3; i++) fail(breaker, 100);
    expect(breaker.state(100)).toBe('open');

    // While open: neither success nor failure changes anything.
    breaker.onSuccess(500, longStream);
    expect(breaker.state(500)).toBe('open');
    expect(breaker.onFailure(500, otherStream)).toBeUndefined();
    expect(breaker.ejections).toBe(1);

    // In half_open, with the trial in flight: only the trial decides.
    const trial = breaker.onSend(1_100);
    breaker.onSuccess(1_150, longStream);
    expect(breaker.state(1_150)).toBe('half_open');
    expect(breaker.onFailure(1_150, otherStream)).toBeUndefined();
    expect(breaker.isEligible(1_150)).toBe(false);
    breaker.onSuccess(1_200, trial);
    expect(breaker.state(1_200)).toBe('closed');

    // After recovery, reports from before the ejection still do not count toward the next one.
    const fresh1 = breaker.onSend(1_300);
    const fresh2 = breaker.onSend(1_300);
    expect(breaker.onFailure(1_300, otherStream)).toBeUndefined();
    expect(breaker.onFailure(1_300, fresh1)).toBeUndefined();
    expect(breaker.onFailure(1_300, fresh2)).toBeUndefined();
    expect(breaker.state(1_300)).toBe('closed');
    expect(fail(breaker, 1_300)).toBe('consecutive_failures');
  });

  it('allows a single trial at a time in half_open', () => {
    const breaker = new CircuitBreaker(options);
    for (let i = 0; i < 3; i++) fail(breaker, 0);
    const trial = breaker.onSend(1_000);
    expect(breaker.isEligible(1_000)).toBe(false);
    // A send despite ineligibility (a caller race) is not a second trial.
    const stray = breaker.onSend(1_000);
    breaker.onSuccess(1_001, stray);
    expect(breaker.state(1_001)).toBe('half_open');
    expect(breaker.onFailure(1_002, stray)).toBeUndefined();
    expect(breaker.onFailure(1_003, trial)).toBe('trial_failed');
  });

  it('an abandoned trial frees the slot; its late verdict is ignored', () => {
    const breaker = new CircuitBreaker(options);
    for (let i = 0; i < 3; i++) fail(breaker, 0);
    const cancelled = breaker.onSend(1_000);
    breaker.onAbandon(1_010, cancelled);
    expect(breaker.isEligible(1_010)).toBe(true);
    expect(breaker.state(1_010)).toBe('half_open');
    const trial = breaker.onSend(1_020);
    expect(breaker.onFailure(1_030, cancelled)).toBeUndefined();
    breaker.onAbandon(1_030, cancelled); // not the trial any more: nothing to free
    expect(breaker.isEligible(1_030)).toBe(false);
    breaker.onSuccess(1_040, trial);
    expect(breaker.state(1_040)).toBe('closed');
  });

  it('abandoning a non-trial request changes nothing', () => {
    const breaker = new CircuitBreaker(options);
    fail(breaker, 0);
    fail(breaker, 0);
    breaker.onAbandon(0, breaker.onSend(0));
    expect(fail(breaker, 0)).toBe('consecutive_failures');
  });

  it('rejects options that cannot work', () => {
    expect(() => new CircuitBreaker({ ...options, failureThreshold: 0 })).toThrow(RangeError);
    expect(() => new CircuitBreaker({ ...options, baseEjectionMs: 0 })).toThrow(RangeError);
    expect(() => new CircuitBreaker({ ...options, maxEjectionMs: 999 })).toThrow(RangeError);
  });

  it('property: open is never eligible, ejections are bounded by the cap, and only reports open the circuit', () => {
    type Op = { kind: 'send' } | { kind: 'success' | 'failure' | 'abandon'; pick: number } | { kind: 'wait'; ms: number };
    const op: fc.Arbitrary<Op> = fc.oneof(
      fc.constant({ kind: 'send' as const }),
      fc.record({ kind: fc.constantFrom('success' as const, 'failure' as const, 'abandon' as const), pick: fc.nat() }),
      fc.record({ kind: fc.constant('wait' as const), ms: fc.integer({ min: 0, max: 6_000 }) }),
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 200 }), (ops) => {
        const breaker = new CircuitBreaker(options);
        const open: number[] = [];
        let now = 0;
        let ejections = 0;
        let openSince: number | undefined;
        for (const step of ops) {
          const before = breaker.state(now);
          if (step.kind === 'wait') now += step.ms;
          else if (step.kind === 'send') {
            if (breaker.isEligible(now)) open.push(breaker.onSend(now));
          } else if (open.length > 0) {
            const [ticket] = open.splice(step.pick % open.length, 1);
            if (ticket === undefined) throw new Error('unreachable');
            if (step.kind === 'success') breaker.onSuccess(now, ticket);
            else if (step.kind === 'abandon') breaker.onAbandon(now, ticket);
            else if (breaker.onFailure(now, ticket) !== undefined) {
              ejections++;
              openSince = now;
            }
          }
          const after = breaker.state(now);
          if (after === 'open') {
            expect(breaker.isEligible(now)).toBe(false);
            expect(now - (openSince ?? Number.NaN)).toBeLessThan(options.maxEjectionMs);
          }
          // Time alone never closes a circuit; only a trial's success does.
          if (before !== 'closed' && after === 'closed') expect(step.kind).toBe('success');
          expect(breaker.ejections).toBe(ejections);
        }
      }),
    );
  });
});

describe('RetryBudget', () => {
  it('the floor lets low traffic retry: minPerSecond × window seconds', () => {
    const budget = new RetryBudget({ ratio: 0.2, minPerSecond: 3, windowMs: 10_000 });
    for (let i = 0; i < 30; i++) expect(budget.tryAcquire(i)).toBe(true);
    expect(budget.tryAcquire(30)).toBe(false);
  });

  it('above the floor, retries are limited to ratio × requests in the window', () => {
    const budget = new RetryBudget({ ratio: 0.2, minPerSecond: 3, windowMs: 10_000 });
    for (let i = 0; i < 1_000; i++) budget.recordRequest(i);
    let granted = 0;
    while (budget.tryAcquire(2_000)) granted++;
    expect(granted).toBe(200);
    for (let i = 0; i < 5; i++) budget.recordRequest(2_000);
    expect(budget.tryAcquire(2_000)).toBe(true); // 1005 requests × 0.2 = 201: room for one more
    expect(budget.tryAcquire(2_000)).toBe(false);
  });

  it('events count for the whole window and expire after it (buckets of windowMs / 10)', () => {
    const budget = new RetryBudget({ ratio: 0, minPerSecond: 1, windowMs: 10_000 });
    for (let i = 0; i < 10; i++) expect(budget.tryAcquire(0)).toBe(true);
    expect(budget.tryAcquire(9_999)).toBe(false);
    expect(budget.tryAcquire(10_000)).toBe(true);
  });

  it('requests expire too, shrinking the budget back to the floor', () => {
    const budget = new RetryBudget({ ratio: 0.5, minPerSecond: 0, windowMs: 1_000 });
    for (let i = 0; i < 10; i++) budget.recordRequest(0);
    expect(budget.tryAcquire(999)).toBe(true);
    expect(budget.tryAcquire(1_000)).toBe(false); // the requests at 0 expired; the floor is 0
    budget.recordRequest(1_000);
    budget.recordRequest(1_000);
    expect(budget.tryAcquire(1_000)).toBe(false); // the retry at 999 still counts: 1 ≥ 0.5 × 2
    budget.recordRequest(1_000);
    budget.recordRequest(1_000);
    expect(budget.tryAcquire(1_000)).toBe(true);
  });

  it('slides: expiry is per bucket, not all at once', () => {
    const budget = new RetryBudget({ ratio: 0, minPerSecond: 1, windowMs: 10_000 });
    for (let second = 0; second < 10; second++) expect(budget.tryAcquire(second * 1_000)).toBe(true);
    expect(budget.tryAcquire(9_500)).toBe(false);
    // At 10 s only the retry from second 0 has expired.
    expect(budget.tryAcquire(10_000)).toBe(true);
    expect(budget.tryAcquire(10_000)).toBe(false);
  });

  it('survives time jumping forward by more than a window, and a clock stepping back', () => {
    const budget = new RetryBudget({ ratio: 0, minPerSecond: 1, windowMs: 10_000 });
    for (let i = 0; i < 10; i++) budget.tryAcquire(5_000);
    expect(budget.tryAcquire(5_000)).toBe(false);
    expect(budget.tryAcquire(5_000 + 1e9)).toBe(true);
    for (let i = 0; i < 9; i++) expect(budget.tryAcquire(5_000 + 1e9)).toBe(true);
    expect(budget.tryAcquire(1_000)).toBe(false); // counted in the newest bucket, not in the past
  });

  it('property: agrees with a log of every event under the same bucketed window', () => {
    const windowMs = 1_000;
    const step = fc.record({ dt: fc.integer({ min: 0, max: 400 }), retry: fc.boolean() });
    fc.assert(
      fc.property(fc.array(step, { maxLength: 300 }), fc.integer({ min: 0, max: 5 }), (steps, minPerSecond) => {
        const budget = new RetryBudget({ ratio: 0.25, minPerSecond, windowMs });
        const log: { bucket: number; retry: boolean }[] = [];
        let now = 0;
        for (const { dt, retry } of steps) {
          now += dt;
          const bucket = Math.floor(now / (windowMs / 10));
          const live = log.filter((e) => e.bucket > bucket - 10);
          if (!retry) {
            budget.recordRequest(now);
            log.push({ bucket, retry });
            continue;
          }
          const requests = live.filter((e) => !e.retry).length;
          const retries = live.length - requests;
          const expected = retries < Math.max(0.25 * requests, minPerSecond);
          expect(budget.tryAcquire(now)).toBe(expected);
          if (expected) log.push({ bucket, retry });
        }
      }),
    );
  });
});

/** Timers on a fake clock, fired in order by `advance`. */
function createFakeTime(): AdmissionHooks & { advance(ms: number): void; pending(): number } {
  let clock = 0;
  const timers: { at: number; fn: () => void; live: boolean }[] = [];
  return {
    now: () => clock,
    setTimer(fn, ms) {
      const timer = { at: clock + ms, fn, live: true };
      timers.push(timer);
      return { cancel: () => void (timer.live = false) };
    },
    advance(ms) {
      const target = clock + ms;
      for (;;) {
        const due = timers.filter((t) => t.live && t.at <= target).sort((a, b) => a.at - b.at)[0];
        if (due === undefined) break;
        clock = due.at;
        due.live = false;
        due.fn();
      }
      clock = target;
    },
    pending: () => timers.filter((t) => t.live).length,
  };
}

function admitted(admission: Admission | Promise<Admission>): Extract<Admission, { admitted: true }> {
  if (admission instanceof Promise || !admission.admitted) throw new Error('expected a synchronous admission');
  return admission;
}

describe('AdmissionGate', () => {
  const options: AdmissionOptions = { maxInflight: 2, maxQueue: 2, queueTimeoutMs: 1_000 };

  it('reports the oldest waiter age and the queued prompt tokens as waiters enter and leave', async () => {
    const time = createFakeTime();
    const gate = new AdmissionGate({ ...options, maxInflight: 1, maxQueue: 3 }, time);
    expect([gate.oldestWaitMs, gate.queuedPromptTokens]).toEqual([0, 0]);
    const holder = admitted(gate.acquire(undefined, 500));
    // Admitted at once: never queued, so not counted.
    expect(gate.queuedPromptTokens).toBe(0);
    const a = gate.acquire(undefined, 100);
    time.advance(300);
    const leaving = new AbortController();
    const b = gate.acquire(leaving.signal, 40);
    time.advance(200);
    const c = gate.acquire(undefined, Number.NaN);
    expect([gate.depth, gate.oldestWaitMs, gate.queuedPromptTokens]).toEqual([3, 500, 140]);
    // b leaves from the middle: a is still the oldest.
    leaving.abort();
    expect(await b).toMatchObject({ admitted: false, reason: 'cancelled' });
    expect([gate.oldestWaitMs, gate.queuedPromptTokens]).toEqual([500, 100]);
    // The slot goes to a: c (no estimate, so 0 tokens), queued at 500, is the oldest now.
    time.advance(50);
    holder.release();
    admitted(await a);
    expect([gate.depth, gate.oldestWaitMs, gate.queuedPromptTokens]).toEqual([1, 50, 0]);
    time.advance(1_000);
    expect(await c).toMatchObject({ admitted: false, reason: 'queue_timeout' });
    expect([gate.depth, gate.oldestWaitMs, gate.queuedPromptTokens]).toEqual([0, 0, 0]);
  });

  it('admits synchronously under maxInflight', () => {
    const gate = new AdmissionGate(options, createFakeTime());
    const first = gate.acquire();
    expect(first).not.toBeInstanceOf(Promise);
    expect(first).toMatchObject({ admitted: true, waitedMs: 0 });
    expect(gate.inflight).toBe(1);
    admitted(first).release();
    expect(gate.inflight).toBe(0);
  });

  it('queues FIFO and hands each freed slot to the oldest waiter', async () => {
    const time = createFakeTime();
    const gate = new AdmissionGate({ ...options, maxInflight: 1, maxQueue: 3 }, time);
    const holder = admitted(gate.acquire());
    const order: string[] = [];
    const waiters = ['a', 'b', 'c'].map((name) => {
      const pending = gate.acquire();
      if (!(pending instanceof Promise)) throw new Error('expected to queue');
      return pending.then((admission) => {
        order.push(name);
        return admission;
      });
    });
    expect(gate.depth).toBe(3);
    time.advance(250);
    holder.release();
    expect(gate.inflight).toBe(1); // handed over, never back to 0
    expect(gate.depth).toBe(2);
    const a = await waiters[0];
    expect(a).toMatchObject({ admitted: true, waitedMs: 250 });
    if (a?.admitted !== true) throw new Error('unreachable');
    a.release();
    const b = await waiters[1];
    if (b?.admitted !== true) throw new Error('unreachable');
    b.release();
    const c = await waiters[2];
    if (c?.admitted !== true) throw new Error('unreachable');
    c.release();
    expect(order).toEqual(['a', 'b', 'c']);
    expect([gate.inflight, gate.depth, time.pending()]).toEqual([0, 0, 0]);
  });

  it('refuses synchronously with queue_full when the queue is full', () => {
    const gate = new AdmissionGate(options, createFakeTime());
    admitted(gate.acquire());
    admitted(gate.acquire());
    void gate.acquire();
    void gate.acquire();
    expect(gate.acquire()).toEqual({ admitted: false, reason: 'queue_full', waitedMs: 0 });
    expect(gate.depth).toBe(2);
  });

  it('times a waiter out after queueTimeoutMs without leaking a slot', async () => {
    const time = createFakeTime();
    const gate = new AdmissionGate({ ...options, maxInflight: 1 }, time);
    const holder = admitted(gate.acquire());
    const waiting = gate.acquire();
    time.advance(999);
    expect(gate.depth).toBe(1);
    time.advance(1);
    expect(await waiting).toEqual({ admitted: false, reason: 'queue_timeout', waitedMs: 1_000 });
    expect(gate.depth).toBe(0);
    holder.release();
    expect(gate.inflight).toBe(0);
  });

  it('cancels a waiter when its signal aborts, removing its listener and timer', async () => {
    const time = createFakeTime();
    const gate = new AdmissionGate({ ...options, maxInflight: 1 }, time);
    const holder = admitted(gate.acquire());
    const controller = new AbortController();
    const waiting = gate.acquire(controller.signal);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(1);
    time.advance(40);
    controller.abort();
    expect(await waiting).toEqual({ admitted: false, reason: 'cancelled', waitedMs: 40 });
    expect([gate.depth, time.pending()]).toEqual([0, 0]);
    holder.release();
    expect(gate.inflight).toBe(0);
  });

  it('removes the abort listener when a waiter is admitted or times out', async () => {
    const time = createFakeTime();
    const gate = new AdmissionGate({ ...options, maxInflight: 1 }, time);
    const holder = admitted(gate.acquire());
    const admittedSignal = new AbortController().signal;
    const timedOutSignal = new AbortController().signal;
    const first = gate.acquire(admittedSignal);
    const second = gate.acquire(timedOutSignal);
    holder.release();
    expect(getEventListeners(admittedSignal, 'abort')).toHaveLength(0);
    time.advance(1_000);
    expect(getEventListeners(timedOutSignal, 'abort')).toHaveLength(0);
    expect(await second).toMatchObject({ admitted: false, reason: 'queue_timeout' });
    const admission = await first;
    if (!admission.admitted) throw new Error('expected admission');
    admission.release();
    expect([gate.inflight, gate.depth, time.pending()]).toEqual([0, 0, 0]);
  });

  it('refuses an already-aborted signal synchronously, even with slots free', () => {
    const gate = new AdmissionGate(options, createFakeTime());
    expect(gate.acquire(AbortSignal.abort())).toEqual({ admitted: false, reason: 'cancelled', waitedMs: 0 });
    expect(gate.inflight).toBe(0);
  });

  it('release is idempotent', () => {
    const gate = new AdmissionGate(options, createFakeTime());
    const first = admitted(gate.acquire());
    admitted(gate.acquire());
    first.release();
    first.release();
    expect(gate.inflight).toBe(1);
  });

  it('property: no slot leaks under any sequence of acquire, release, abort and timeout', async () => {
    type Op =
      | { kind: 'acquire'; withSignal: boolean }
      | { kind: 'release'; pick: number; twice: boolean }
      | { kind: 'abort'; pick: number }
      | { kind: 'advance'; ms: number };
    const op: fc.Arbitrary<Op> = fc.oneof(
      fc.record({ kind: fc.constant('acquire' as const), withSignal: fc.boolean() }),
      fc.record({ kind: fc.constant('release' as const), pick: fc.nat(), twice: fc.boolean() }),
      fc.record({ kind: fc.constant('abort' as const), pick: fc.nat() }),
      fc.record({ kind: fc.constant('advance' as const), ms: fc.integer({ min: 0, max: 60 }) }),
    );
    const config = fc.record({
      maxInflight: fc.integer({ min: 1, max: 3 }),
      maxQueue: fc.integer({ min: 0, max: 3 }),
      queueTimeoutMs: fc.integer({ min: 1, max: 100 }),
    });
    const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

    await fc.assert(
      fc.asyncProperty(config, fc.array(op, { maxLength: 80 }), async (gateOptions, ops) => {
        const time = createFakeTime();
        const gate = new AdmissionGate(gateOptions, time);
        const held: Extract<Admission, { admitted: true }>[] = [];
        const waiting = new Set<{ seq: number; controller: AbortController }>();
        let seq = 0;
        let lastAdmittedSeq = -1;

        const check = (): void => {
          expect(gate.inflight).toBeLessThanOrEqual(gateOptions.maxInflight);
          expect(gate.depth).toBeLessThanOrEqual(gateOptions.maxQueue);
          expect(gate.inflight).toBe(held.length);
          expect(gate.depth).toBe(waiting.size);
          // Work-conserving: nobody waits while a slot is free.
          if (gate.depth > 0) expect(gate.inflight).toBe(gateOptions.maxInflight);
        };

        const take = (admission: Admission | Promise<Admission>, controller: AbortController): void => {
          if (!(admission instanceof Promise)) {
            if (admission.admitted) held.push(admission);
            return;
          }
          const entry = { seq: seq++, controller };
          waiting.add(entry);
          void admission.then((result) => {
            waiting.delete(entry);
            if (!result.admitted) return;
            expect(entry.seq).toBeGreaterThan(lastAdmittedSeq); // FIFO
            lastAdmittedSeq = entry.seq;
            held.push(result);
          });
        };

        for (const step of ops) {
          switch (step.kind) {
            case 'acquire': {
              const controller = new AbortController();
              take(gate.acquire(step.withSignal ? controller.signal : undefined), controller);
              break;
            }
            case 'release': {
              const [admission] = held.splice(step.pick % Math.max(1, held.length), 1);
              admission?.release();
              if (step.twice) admission?.release();
              break;
            }
            case 'abort':
              [...waiting][step.pick % Math.max(1, waiting.size)]?.controller.abort();
              break;
            case 'advance':
              time.advance(step.ms);
              break;
          }
          await flush();
          check();
        }

        // Drain: release everything, including what the releases hand to waiters.
        while (held.length > 0) {
          for (const admission of held.splice(0)) admission.release();
          await flush();
        }
        time.advance(gateOptions.queueTimeoutMs);
        await flush();
        expect([gate.inflight, gate.depth, time.pending(), held.length, waiting.size]).toEqual([0, 0, 0, 0, 0]);
      }),
      { numRuns: 200 },
    );
  });
});

describe('parseRetryAfter', () => {
  const now = Date.UTC(2025, 5, 1, 12, 0, 0); // Sun, 01 Jun 2025 12:00:00 GMT

  it('reads delay-seconds', () => {
    expect(parseRetryAfter('120', now)).toBe(120_000);
    expect(parseRetryAfter('0', now)).toBe(0);
    expect(parseRetryAfter(' 5 ', now)).toBe(5_000);
    expect(parseRetryAfter('9'.repeat(400), now)).toBe(2 ** 31 * 1000);
  });

  it('reads all three HTTP-date formats', () => {
    expect(parseRetryAfter('Sun, 01 Jun 2025 12:00:30 GMT', now)).toBe(30_000);
    expect(parseRetryAfter('Sunday, 01-Jun-25 12:01:00 GMT', now)).toBe(60_000);
    expect(parseRetryAfter('Sun Jun  1 12:00:05 2025', now)).toBe(5_000);
    // Two-digit years more than 50 years ahead are in the past century (RFC 9110 §5.6.7).
    const in1994 = Date.UTC(1994, 10, 6, 8, 49, 0);
    expect(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', in1994)).toBe(37_000);
    expect(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', now)).toBe(0);
  });

  it('a date in the past is 0, never negative', () => {
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:28:00 GMT', now)).toBe(0);
    expect(parseRetryAfter('Sun, 01 Jun 2025 11:59:59 GMT', now)).toBe(0);
  });

  it('rejects absent, garbage and invalid values', () => {
    for (const value of [
      undefined,
      '',
      '   ',
      'soon',
      '-5',
      '1.5',
      '+3',
      '12abc',
      '0x10',
      'Sun, 31 Feb 2025 12:00:00 GMT', // no such day
      'Sun, 01 Jun 2025 24:00:00 GMT',
      'sun, 01 jun 2025 12:00:30 gmt', // HTTP-date is case-sensitive
      'Sun, 01 Jun 2025 12:00:30 UTC',
      '2025-06-01T12:00:30Z',
      [],
      ['5', '6'],
    ]) {
      expect(parseRetryAfter(value, now), JSON.stringify(value)).toBeUndefined();
    }
  });

  it('accepts a repeated field whose copies agree', () => {
    expect(parseRetryAfter(['7'], now)).toBe(7_000);
    expect(parseRetryAfter(['7', ' 7'], now)).toBe(7_000);
  });

  it('property: never negative, always finite, for any string', () => {
    fc.assert(
      fc.property(fc.string(), fc.integer({ min: 0, max: 4_102_444_800_000 }), (value, at) => {
        const parsed = parseRetryAfter(value, at);
        if (parsed !== undefined) {
          expect(parsed).toBeGreaterThanOrEqual(0);
          expect(Number.isFinite(parsed)).toBe(true);
        }
      }),
    );
  });
});

describe('ModelLabels: the model label set, capped per pool for the life of the process', () => {
  it('admits discovered names up to the cap, keeps them for good, and reports the first refusal once per pool', () => {
    const labels = new ModelLabels();
    labels.configure(['configured']);
    expect(labels.admit('p', 2, ['configured', 'a', 'b'])).toEqual({ refused: 0, firstRefusal: false });
    expect(labels.admit('p', 2, ['c', 'd'])).toEqual({ refused: 2, firstRefusal: true });
    expect(labels.admit('p', 2, ['e'])).toEqual({ refused: 1, firstRefusal: false });
    // Another pool has a cap of its own; a name already labelled costs no pool a place.
    expect(labels.admit('q', 1, ['a', 'f', 'g'])).toEqual({ refused: 1, firstRefusal: true });
    expect(['configured', 'a', 'b', 'c', 'f', 'g'].map((m) => labels.label(m))).toEqual(['configured', 'a', 'b', '_other', 'f', '_other']);
    // A name once labelled keeps its label though discovery no longer lists it.
    expect(labels.admit('p', 2, ['z'])).toEqual({ refused: 1, firstRefusal: false });
    expect(labels.label('b')).toBe('b');
  });
});

describe('CircuitBreaker: an ejection the pool may not afford is held', () => {
  it('stays closed at the threshold while held, ejects on the next failure once allowed; a held trial leaves it on trial', () => {
    const breaker = new CircuitBreaker({ failureThreshold: 2, baseEjectionMs: 100, maxEjectionMs: 400 });
    expect(breaker.onFailure(0, breaker.onSend(0), false)).toBeUndefined();
    expect(breaker.onFailure(0, breaker.onSend(0), false)).toBe('held');
    expect(breaker.onFailure(0, breaker.onSend(0), false)).toBe('held');
    expect(breaker.state(0)).toBe('closed');
    expect(breaker.onFailure(0, breaker.onSend(0), true)).toBe('consecutive_failures');
    expect(breaker.state(50)).toBe('open');
    const trial = breaker.onSend(100);
    expect(breaker.isEligible(100)).toBe(false);
    expect(breaker.onFailure(100, trial, false)).toBe('held');
    expect(breaker.state(100)).toBe('half_open');
    expect(breaker.isEligible(100)).toBe(true);
    expect(breaker.ejections).toBe(1);
  });
});
