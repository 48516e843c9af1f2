/** CircuitBreaker (src/proxy/breaker.ts): passive health per upstream: ejection, the half-open trial, doubling lengths, held ejections. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CircuitBreaker } from '../src/proxy/breaker.js';

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
