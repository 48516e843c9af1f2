/** RetryBudget (src/delivery/retry-budget.ts): retries as a share of recent requests, with a floor for low traffic. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { RetryBudget } from '../src/delivery/retry-budget.js';

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
