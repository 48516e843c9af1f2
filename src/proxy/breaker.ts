/**
 * Passive health per upstream: a circuit breaker fed by the outcomes of real requests. Pure: time comes in as `now`.
 */

export interface BreakerOptions {
  /** Consecutive failures that eject the upstream, e.g. 3. */
  readonly failureThreshold: number;
  /** Length of the first ejection. */
  readonly baseEjectionMs: number;
  /** Cap on the ejection length, which doubles with each consecutive ejection. */
  readonly maxEjectionMs: number;
}

export type BreakerState = 'closed' | 'open' | 'half_open';
import type { EjectionReason } from '../accounting/outcomes.js';

export type { EjectionReason };

/** Names the request a report is about; returned by {@link CircuitBreaker.onSend}. */
export type SendTicket = number;

/**
 * ```text
 *   closed ── failureThreshold consecutive failures ──▶ open ── ejection ends ──▶ half_open
 *     ▲                                                  ▲                          │ onSend: the trial
 *     │                                                  └─ trial fails: length ×2 ─┤    (capped)
 *     └──────────────── trial succeeds: failure count and length back to base ──────┘
 * ```
 * - closed: eligible. Each failure counts, each success resets the count.
 * - open: not eligible. Reports are ignored: they come from requests sent before the ejection, and a success from
 *   a long stream that began before the upstream broke says nothing about it now.
 * - half_open: eligible until one request is sent; that request is the trial and only its report decides.
 *   A trial abandoned without a verdict (client cancelled) frees the slot for another.
 *
 * Reports carry the {@link SendTicket} of their request because outcomes arrive out of order: without it, a late
 * report from before the ejection, arriving in half_open, would be taken for the trial's. A report is ignored when its
 * request was sent before the latest transition (ejection or recovery).
 *
 * @example
 * const ticket = breaker.onSend(now);
 * // … the attempt ends …
 * const ejected = breaker.onFailure(now, ticket); // 'consecutive_failures' → log and count an ejection
 */
export class CircuitBreaker {
  private readonly options: BreakerOptions;
  private failures = 0;
  /** Set while open or half_open: half_open is "open, but the ejection has ended". */
  private openUntil: number | undefined = undefined;
  /** Length of the latest ejection, doubled by the next consecutive one. */
  private ejectionMs: number;
  private tickets = 0;
  /** Tickets up to this one were issued before the latest transition; their reports are stale. */
  private staleUpTo = 0;
  private trial: SendTicket | undefined = undefined;
  private ejectionCount = 0;

  constructor(options: BreakerOptions) {
    const { failureThreshold, baseEjectionMs, maxEjectionMs } = options;
    if (!Number.isInteger(failureThreshold) || failureThreshold < 1) throw new RangeError('failureThreshold must be an integer ≥ 1');
    if (!(baseEjectionMs > 0) || !(maxEjectionMs >= baseEjectionMs)) {
      throw new RangeError('ejection lengths must satisfy 0 < baseEjectionMs ≤ maxEjectionMs');
    }
    this.options = { ...options };
    this.ejectionMs = baseEjectionMs;
  }

  /** How many times the circuit opened. */
  get ejections(): number {
    return this.ejectionCount;
  }

  state(now: number): BreakerState {
    if (this.openUntil === undefined) return 'closed';
    return now < this.openUntil ? 'open' : 'half_open';
  }

  /** May this upstream be picked now? closed: yes. open: no. half_open: yes only while no trial request is in flight. */
  isEligible(now: number): boolean {
    switch (this.state(now)) {
      case 'closed':
        return true;
      case 'open':
        return false;
      case 'half_open':
        return this.trial === undefined;
    }
  }

  /** A request was sent to this upstream; in half_open it becomes THE trial. Keep the ticket for the report. */
  onSend(now: number): SendTicket {
    const ticket = ++this.tickets;
    if (this.trial === undefined && this.state(now) === 'half_open') this.trial = ticket;
    return ticket;
  }

  onSuccess(now: number, ticket: SendTicket): void {
    switch (this.state(now)) {
      case 'closed':
        if (ticket > this.staleUpTo) this.failures = 0;
        return;
      case 'open':
        return;
      case 'half_open':
        if (ticket === this.trial) this.close();
        return;
    }
  }

  /**
   * Returns the ejection reason when this report opened the circuit, or `held` when it would have but `mayEject`
   * said no (the pool's max ejection share, decided by the caller): the circuit stays closed, its failures at the
   * threshold, so the next failure asks again (once another upstream is back, it ejects). A failed trial that may
   * not eject leaves the circuit half open with its trial slot free: the next request is another trial.
   */
  onFailure(now: number, ticket: SendTicket, mayEject = true): EjectionReason | 'held' | undefined {
    switch (this.state(now)) {
      case 'closed':
        if (ticket <= this.staleUpTo) return undefined;
        if (++this.failures < this.options.failureThreshold) return undefined;
        if (!mayEject) {
          this.failures = this.options.failureThreshold - 1;
          return 'held';
        }
        this.eject(now, this.options.baseEjectionMs);
        return 'consecutive_failures';
      case 'open':
        return undefined;
      case 'half_open':
        if (ticket !== this.trial) return undefined;
        if (!mayEject) {
          // Still ejected but eligible: the next request is another trial.
          this.trial = undefined;
          return 'held';
        }
        this.eject(now, Math.min(this.ejectionMs * 2, this.options.maxEjectionMs));
        return 'trial_failed';
    }
  }

  /** A request ended without a verdict on the upstream (client cancelled); if it was the trial, free the slot. */
  onAbandon(_now: number, ticket: SendTicket): void {
    if (ticket === this.trial) this.trial = undefined;
  }

  private eject(now: number, lengthMs: number): void {
    this.openUntil = now + lengthMs;
    this.ejectionMs = lengthMs;
    this.ejectionCount++;
    this.resetEpoch();
  }

  private close(): void {
    this.openUntil = undefined;
    this.ejectionMs = this.options.baseEjectionMs;
    this.resetEpoch();
  }

  private resetEpoch(): void {
    this.failures = 0;
    this.trial = undefined;
    this.staleUpTo = this.tickets;
  }
}
