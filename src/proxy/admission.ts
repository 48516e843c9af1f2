/**
 * Per-model admission control. vLLM never answers 429: it queues everything and lets latency grow without bound, so
 * the gateway bounds concurrency and queueing itself. No clock or timers of its own: both are injected.
 */
import { LiveList, type LiveEntry } from '../util/live-list.js';

export interface AdmissionOptions {
  readonly maxInflight: number;
  readonly maxQueue: number;
  readonly queueTimeoutMs: number;
}

export type Admission =
  | {
      readonly admitted: true;
      readonly waitedMs: number;
      /** Frees the slot and admits the next waiter (FIFO). Idempotent. */
      release(): void;
    }
  | { readonly admitted: false; readonly reason: 'queue_full' | 'queue_timeout' | 'cancelled'; readonly waitedMs: number };

export interface AdmissionHooks {
  setTimer(fn: () => void, ms: number): { cancel(): void };
  now(): number;
}

interface Waiter {
  readonly enqueuedAt: number;
  /** The request's prompt tokens as estimated before dispatch (0 when unknown), for the queued-tokens gauge. */
  readonly promptTokens: number;
  readonly settle: (admission: Admission) => void;
  readonly signal: AbortSignal | undefined;
  readonly onAbort: () => void;
  timer: { cancel(): void } | undefined;
  /** Its place in the queue; undefined once it left (admitted, timed out, cancelled). */
  entry: LiveEntry<Waiter> | undefined;
}

/**
 * A counting semaphore with a bounded FIFO queue. A freed slot passes straight to the oldest waiter, so a newcomer
 * can never overtake the queue and `inflight` never dips below the limit while anyone waits.
 *
 * An admission handed to a waiter counts as in flight from that moment, before the caller's `await` resumes: a caller
 * whose client went away in between must still `release()` it.
 *
 * @example
 * const gate = new AdmissionGate({ maxInflight: 64, maxQueue: 256, queueTimeoutMs: 30_000 }, {
 *   setTimer: (fn, ms) => { const t = setTimeout(fn, ms); return { cancel: () => clearTimeout(t) }; },
 *   now: () => performance.now(),
 * });
 * const admission = await gate.acquire(request.signal);
 * if (!admission.admitted) return reject(admission.reason);
 * try { … } finally { admission.release(); }
 */
export class AdmissionGate {
  private active = 0;
  /**
   * A FIFO with O(1) removal from the middle, which timeouts and aborts need. Not a Set: a long-lived Set's rehashed
   * tables keep the waiters, and their requests, alive through scavenges (util/live-list.ts).
   */
  private readonly queue = new LiveList<Waiter>();
  /** The waiters' estimated prompt tokens, kept as they enter and leave so a scrape reads it in O(1). */
  private queuedTokens = 0;

  constructor(
    private readonly options: AdmissionOptions,
    private readonly hooks: AdmissionHooks,
  ) {}

  get inflight(): number {
    return this.active;
  }

  /** Waiters in the queue. */
  get depth(): number {
    return this.queue.size;
  }

  /** How long the oldest waiter has waited so far, in ms (the queue is FIFO: the first in the list); 0 when none waits. */
  get oldestWaitMs(): number {
    const oldest = this.queue.first();
    return oldest === undefined ? 0 : this.waitedBy(oldest);
  }

  /** The waiters' prompt tokens, as estimated from their requests before dispatch (a waiter without an estimate adds 0). */
  get queuedPromptTokens(): number {
    return this.queuedTokens;
  }

  /**
   * Admits at once when under maxInflight, synchronously (no Promise on the fast path); otherwise queues (FIFO) up to
   * maxQueue and returns a Promise settled when admitted, when queueTimeoutMs passes ('queue_timeout'), or when
   * `signal` aborts ('cancelled'). Over maxQueue, or with `signal` already aborted, refuses synchronously.
   * `promptTokens` is the request's estimated prompt length, counted in queuedPromptTokens while it waits.
   */
  acquire(signal?: AbortSignal, promptTokens = 0): Admission | Promise<Admission> {
    if (signal?.aborted === true) return { admitted: false, reason: 'cancelled', waitedMs: 0 };
    if (this.active < this.options.maxInflight) {
      this.active++;
      return this.admit(0);
    }
    if (this.queue.size >= this.options.maxQueue) return { admitted: false, reason: 'queue_full', waitedMs: 0 };
    return new Promise<Admission>((resolve) => {
      const waiter: Waiter = {
        enqueuedAt: this.hooks.now(),
        promptTokens: Number.isFinite(promptTokens) && promptTokens > 0 ? promptTokens : 0,
        settle: resolve,
        signal,
        onAbort: () => this.leave(waiter, 'cancelled'),
        timer: undefined,
        entry: undefined,
      };
      waiter.entry = this.queue.add(waiter);
      this.queuedTokens += waiter.promptTokens;
      waiter.timer = this.hooks.setTimer(() => this.leave(waiter, 'queue_timeout'), this.options.queueTimeoutMs);
      signal?.addEventListener('abort', waiter.onAbort, { once: true });
    });
  }

  private admit(waitedMs: number): Admission {
    let released = false;
    return {
      admitted: true,
      waitedMs,
      release: () => {
        if (released) return;
        released = true;
        this.handOver();
      },
    };
  }

  /** A slot was freed: it goes to the oldest waiter, or back to the pool. */
  private handOver(): void {
    const next = this.queue.first();
    if (next === undefined) {
      this.active--;
      return;
    }
    this.dequeue(next);
    next.settle(this.admit(this.waitedBy(next)));
  }

  private leave(waiter: Waiter, reason: 'queue_timeout' | 'cancelled'): void {
    // Already admitted or gone: a timer that fired after its cancel, or an abort after the hand-over.
    if (waiter.entry === undefined) return;
    this.dequeue(waiter);
    waiter.settle({ admitted: false, reason, waitedMs: this.waitedBy(waiter) });
  }

  private dequeue(waiter: Waiter): void {
    if (waiter.entry !== undefined) this.queue.delete(waiter.entry);
    waiter.entry = undefined;
    this.queuedTokens -= waiter.promptTokens;
    waiter.timer?.cancel();
    waiter.signal?.removeEventListener('abort', waiter.onAbort);
  }

  private waitedBy(waiter: Waiter): number {
    return Math.max(0, this.hooks.now() - waiter.enqueuedAt);
  }
}
