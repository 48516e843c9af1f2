/**
 * The tenants' limits of a gateway run as several worker processes (`server.workers`) without Redis: each worker's
 * LimitStore forwards every step to the primary process, which keeps the one count (an InProcessLimitStore on its own
 * clock), so N workers enforce one limit exactly, as one process would. A step the primary does not answer within
 * `timeoutMs` fails like an unreachable Redis: the limiter then admits unlimited or refuses (limits.redis_fail_open).
 */
import { InProcessLimitStore, type Decision, type LimitStore, type Reservation, type TenantLimits } from './tenant-limits.js';

/** One step, as it travels between a worker and the primary (structured-clone safe: plain data only). */
export type LimitCall =
  | { readonly op: 'reserve'; readonly tenant: string; readonly limits: TenantLimits; readonly tokens: number }
  | { readonly op: 'settle'; readonly reservation: Reservation; readonly usedTokens: number | null }
  | { readonly op: 'release'; readonly reservation: Reservation };

/** Sends one step to the primary; resolves with its answer. */
export type LimitChannel = (call: LimitCall) => Promise<unknown>;

export class ClusterLimitStore implements LimitStore {
  constructor(private readonly channel: LimitChannel) {}

  reserve(tenant: string, limits: TenantLimits, tokens: number, _now: number): Promise<Decision> {
    // The primary's clock numbers the windows: the workers' monotonic clocks start at different origins.
    return this.channel({ op: 'reserve', tenant, limits, tokens }) as Promise<Decision>;
  }

  async settle(reservation: Reservation, usedTokens: number | undefined, _now: number): Promise<void> {
    await this.channel({ op: 'settle', reservation, usedTokens: usedTokens ?? null });
  }

  async release(reservation: Reservation): Promise<void> {
    await this.channel({ op: 'release', reservation });
  }
}

/** The primary's side: one count for every worker, on the primary's clock. */
export class LimitHost {
  private readonly store = new InProcessLimitStore();

  constructor(private readonly now: () => number) {}

  answer(call: LimitCall): Decision | undefined {
    if (call.op === 'reserve') return this.store.reserve(call.tenant, call.limits, call.tokens, this.now());
    if (call.op === 'settle') this.store.settle(call.reservation, call.usedTokens ?? undefined, this.now());
    else this.store.release(call.reservation);
    return undefined;
  }
}
