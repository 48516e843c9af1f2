/**
 * The tenants' limits of a gateway run as several worker processes (`server.workers`) without Redis: each worker's
 * LimitStore forwards every step to the primary process, which keeps the one count (an InProcessLimitStore on its own
 * clock), so N workers enforce one limit exactly, as one process would.
 *
 * - A step the primary does not answer within the worker's deadline fails like an unreachable Redis
 *   (LimitStoreUnavailable: the limiter then admits unlimited, or refuses with limits.redis_fail_open: false). The
 *   worker then sends `cancel`: the primary gives back what a reserve it answered late took (its tokens and its
 *   slot; the request stays counted, erring strict), as the Redis store undoes a late admission.
 * - The primary knows which worker holds which admission (its `slot`): a worker that dies gives back every slot it
 *   held, instead of blocking its tenants' max_concurrent until the gateway restarts.
 */
import { LimitStoreUnavailable } from './redis-limit-store.js';
import { InProcessLimitStore, type Decision, type LimitStore, type Reservation, type TenantLimits } from './tenant-limits.js';

/** One step, as it travels between a worker and the primary (structured-clone safe: plain data only). */
export type LimitCall =
  | { readonly op: 'reserve'; readonly tenant: string; readonly limits: TenantLimits; readonly tokens: number }
  | { readonly op: 'settle'; readonly reservation: Reservation; readonly usedTokens: number | null }
  | { readonly op: 'release'; readonly reservation: Reservation };

/** Sends one step to the primary; resolves with its answer. */
export type LimitChannel = (call: LimitCall) => Promise<unknown>;

/** An admission the primary counted, as it travels: which worker's, which call. */
interface SlottedReservation extends Reservation {
  readonly slot?: string;
}

export class ClusterLimitStore implements LimitStore {
  constructor(private readonly channel: LimitChannel) {}

  reserve(tenant: string, limits: TenantLimits, tokens: number, _now: number): Promise<Decision> {
    // The primary's clock numbers the windows: the workers' monotonic clocks start at different origins.
    return this.send('reserve', { op: 'reserve', tenant, limits, tokens }) as Promise<Decision>;
  }

  async settle(reservation: Reservation, usedTokens: number | undefined, _now: number): Promise<void> {
    await this.send('settle', { op: 'settle', reservation, usedTokens: usedTokens ?? null });
  }

  async release(reservation: Reservation): Promise<void> {
    await this.send('release', { op: 'release', reservation });
  }

  private async send(op: LimitCall['op'], call: LimitCall): Promise<unknown> {
    try {
      return await this.channel(call);
    } catch (error) {
      throw new LimitStoreUnavailable(op, error);
    }
  }
}

/** The primary's side: one count for every worker, on the primary's clock, and who holds what. */
export class LimitHost {
  private readonly store = new InProcessLimitStore();
  /** Admissions not yet released, by slot (`<worker>:<call>`). */
  private readonly held = new Map<string, Reservation>();

  constructor(private readonly now: () => number) {}

  answer(call: LimitCall, worker: number, callId: number): Decision | undefined {
    if (call.op === 'reserve') {
      const decision = this.store.reserve(call.tenant, call.limits, call.tokens, this.now());
      if (!decision.admitted) return decision;
      const slot = `${worker}:${callId}`;
      const reservation: SlottedReservation = { ...decision.reservation, slot };
      this.held.set(slot, reservation);
      return { ...decision, reservation };
    }
    if (call.op === 'settle') {
      this.store.settle(call.reservation, call.usedTokens ?? undefined, this.now());
      return undefined;
    }
    const slot = (call.reservation as SlottedReservation).slot;
    // Released once: a slot already given back (its worker's cancel, or its death) is not released twice.
    if (slot === undefined || this.held.delete(slot)) this.store.release(call.reservation);
    return undefined;
  }

  /** The worker gave up waiting for its reserve `callId`: what it took goes back (tokens, slot). */
  cancel(worker: number, callId: number): void {
    const slot = `${worker}:${callId}`;
    const reservation = this.held.get(slot);
    if (reservation === undefined) return;
    this.held.delete(slot);
    this.store.settle(reservation, 0, this.now());
    this.store.release(reservation);
  }

  /** A worker died: every slot it held goes back (its requests' tokens stay counted: they may have run). */
  workerGone(worker: number): number {
    let freed = 0;
    for (const [slot, reservation] of this.held) {
      if (!slot.startsWith(`${worker}:`)) continue;
      this.held.delete(slot);
      this.store.release(reservation);
      freed++;
    }
    return freed;
  }
}
