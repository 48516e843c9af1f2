/** AdmissionGate (src/proxy/admission.ts): per-model in-flight cap and FIFO queue, its timers on a fake clock. */
import { getEventListeners } from 'node:events';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { AdmissionGate, type Admission, type AdmissionHooks, type AdmissionOptions } from '../src/proxy/admission.js';

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
