/**
 * Limits per tenant (docs/security.md, "Limits per tenant"): requests and tokens per minute, and requests in flight.
 *
 * - **Windows.** Fixed 60 s windows, numbered `floor(now / 60 s)` on the injected clock: a window's counts start at
 *   zero when it opens, so `x-ratelimit-reset-*` and `Retry-After` are exact (the time until the window ends). A
 *   tenant can burst up to twice its limit across a window boundary; that is the price of exact, cheap, atomic
 *   counts that a shared store (redis-limit-store.ts: one hash per tenant, reset when a window opens) keeps just as well.
 * - **Tokens.** Reserved at admission from an estimate (the prompt's estimate plus the output the request may ask
 *   for: `reservedTokens`), then corrected to the real usage (prompt + completion) when the request settles —
 *   cancelled and failed requests included. A request without usage that relayed output (its client left before
 *   the usage chunk, its stream broke) is charged the larger of its reservation and the estimate of what it relayed
 *   (`chargedTokens`): what it took beyond its reservation is charged into the window, so the tenant's next requests
 *   wait for it. One that relayed nothing keeps its reservation.
 * - **In flight.** A slot is taken at admission and released exactly once, when the request settles (LimitTicket).
 *
 * The decision is pure (`decide`); a LimitStore holds the counts and applies the decision atomically. The store
 * here lives in the process; a store shared across replicas implements the same interface (every method may answer
 * with a promise) without any caller changing.
 */
import { LIMIT_NAMES, type LimitName } from '../telemetry/labels.js';

/** What a request reserves and is charged (limit-tokens.ts), read from here by the routes and the tests. */
export { chargedTokens, reservedTokens, usedTokens } from './limit-tokens.js';

export const WINDOW_MS = 60_000;

/** What a refusal is counted under (`waybill_rate_limited_total{limit}`): a closed set of telemetry/labels.ts. */
export { LIMIT_NAMES, type LimitName } from '../telemetry/labels.js';

/** A tenant's limits; each absent one is no limit. */
export interface TenantLimits {
  readonly requestsPerMinute?: number | undefined;
  readonly tokensPerMinute?: number | undefined;
  readonly maxConcurrent?: number | undefined;
}

/** How long a refusal for `max_concurrent` tells the client to wait: nobody knows when a request in flight ends. */
export const CONCURRENT_RETRY_MS = 1000;

type MaybePromise<T> = T | Promise<T>;

/** One tenant's counts in the current window. */
export interface Counts {
  /** The window they belong to: floor(now / WINDOW_MS). */
  readonly window: number;
  readonly requests: number;
  readonly tokens: number;
  /** Requests in flight (not per window). */
  readonly inflight: number;
}

/** A per-minute limit as the `x-ratelimit-*` headers state it. */
export interface WindowUse {
  readonly limit: number;
  /** What is left of the limit in this window (never below 0). */
  readonly remaining: number;
  /** Until the window ends. */
  readonly resetMs: number;
}

export interface LimitState {
  readonly requests?: WindowUse;
  readonly tokens?: WindowUse;
}

/** What an admitted request holds: given back to the store when it settles. */
export interface Reservation {
  readonly tenant: string;
  /** The window the request was counted in. */
  readonly window: number;
  /** Tokens reserved in that window. */
  readonly tokens: number;
  /** A slot was taken (the tenant has max_concurrent). */
  readonly concurrent: boolean;
}

export type Decision =
  | { readonly admitted: true; readonly reservation: Reservation; readonly state: LimitState; readonly after: Counts }
  | {
      readonly admitted: false;
      /** Every limit the request would pass, in the order requests, tokens, concurrent; the first names the refusal. */
      readonly exceeded: readonly [LimitName, ...LimitName[]];
      /** Until every exceeded limit frees enough; undefined: never (the request alone is over tokens_per_minute). */
      readonly retryAfterMs: number | undefined;
      readonly state: LimitState;
      readonly counts: Counts;
      readonly requestedTokens: number;
    };

/**
 * The whole admission rule, pure: may one more request reserving `tokens` pass, given the tenant's counts? `counts`
 * must already be of `now`'s window (a new window starts at zero requests and tokens; the in-flight count carries).
 * A refused request changes nothing: it is not counted against the window.
 */
export function decide(tenant: string, limits: TenantLimits, counts: Counts, tokens: number, now: number): Decision {
  const resetMs = (counts.window + 1) * WINDOW_MS - now;
  const exceeded: LimitName[] = [];
  let retryAfterMs: number | undefined = 0;
  const wait = (ms: number | undefined) => {
    retryAfterMs = retryAfterMs === undefined || ms === undefined ? undefined : Math.max(retryAfterMs, ms);
  };
  const { requestsPerMinute, tokensPerMinute, maxConcurrent } = limits;
  if (requestsPerMinute !== undefined && counts.requests + 1 > requestsPerMinute) {
    exceeded.push('requests');
    wait(resetMs);
  }
  if (tokensPerMinute !== undefined && counts.tokens + tokens > tokensPerMinute) {
    exceeded.push('tokens');
    // A fixed window frees everything when it ends; a request larger than the whole limit never fits.
    wait(tokens > tokensPerMinute ? undefined : resetMs);
  }
  if (maxConcurrent !== undefined && counts.inflight + 1 > maxConcurrent) {
    exceeded.push('concurrent');
    wait(CONCURRENT_RETRY_MS);
  }
  const [first, ...rest] = exceeded;
  if (first !== undefined) return { admitted: false, exceeded: [first, ...rest], retryAfterMs, state: stateOf(limits, counts, resetMs), counts, requestedTokens: tokens };
  const after: Counts = {
    window: counts.window,
    requests: counts.requests + 1,
    tokens: counts.tokens + tokens,
    inflight: counts.inflight + (maxConcurrent === undefined ? 0 : 1),
  };
  return {
    admitted: true,
    reservation: { tenant, window: counts.window, tokens, concurrent: maxConcurrent !== undefined },
    state: stateOf(limits, after, resetMs),
    after,
  };
}

/**
 * The tokens a settled request corrects its window's count by. In the window it was counted in: the real use
 * replaces the reservation (up or down). After that window ended, the reservation went with it and only use beyond
 * it is charged, to the current window. No usage: the reservation stands.
 */
export function correction(reservation: Reservation, usedTokens: number | undefined, window: number): number {
  if (usedTokens === undefined) return 0;
  const delta = usedTokens - reservation.tokens;
  return window === reservation.window ? delta : Math.max(0, delta);
}

function stateOf(limits: TenantLimits, counts: Counts, resetMs: number): LimitState {
  const use = (limit: number | undefined, used: number): WindowUse | undefined => (limit === undefined ? undefined : { limit, remaining: Math.max(0, limit - used), resetMs });
  const requests = use(limits.requestsPerMinute, counts.requests);
  const tokens = use(limits.tokensPerMinute, counts.tokens);
  return { ...(requests !== undefined && { requests }), ...(tokens !== undefined && { tokens }) };
}

export function windowOf(now: number): number {
  return Math.floor(now / WINDOW_MS);
}

/**
 * Where the counts live. Each method is one atomic step (in Redis: one script), and may answer with a promise.
 * `reserve` checks every limit and, when all pass, counts the request, its tokens and its slot together.
 */
export interface LimitStore {
  reserve(tenant: string, limits: TenantLimits, tokens: number, now: number): MaybePromise<Decision>;
  /** Corrects the reserved tokens to the real use (undefined: none reported; the reservation stands). */
  settle(reservation: Reservation, usedTokens: number | undefined, now: number): MaybePromise<void>;
  /** Gives back the in-flight slot (a reservation without one: nothing). */
  release(reservation: Reservation): MaybePromise<void>;
}

interface MutableCounts {
  window: number;
  requests: number;
  tokens: number;
  inflight: number;
}

/** The counts of this process alone: with several replicas, each applies the limits on its own. */
export class InProcessLimitStore implements LimitStore {
  private readonly tenants = new Map<string, MutableCounts>();

  /** The tenant's counts as of `now` (a new window starts from zero requests and tokens). */
  counts(tenant: string, now: number): Counts {
    return { ...this.current(tenant, now) };
  }

  reserve(tenant: string, limits: TenantLimits, tokens: number, now: number): Decision {
    const counts = this.current(tenant, now);
    const decision = decide(tenant, limits, counts, tokens, now);
    if (decision.admitted) Object.assign(counts, decision.after);
    return decision;
  }

  settle(reservation: Reservation, usedTokens: number | undefined, now: number): void {
    const counts = this.current(reservation.tenant, now);
    counts.tokens = Math.max(0, counts.tokens + correction(reservation, usedTokens, counts.window));
  }

  release(reservation: Reservation): void {
    const counts = this.tenants.get(reservation.tenant);
    if (reservation.concurrent && counts !== undefined) counts.inflight = Math.max(0, counts.inflight - 1);
  }

  private current(tenant: string, now: number): MutableCounts {
    const window = windowOf(now);
    let counts = this.tenants.get(tenant);
    if (counts === undefined) {
      counts = { window, requests: 0, tokens: 0, inflight: 0 };
      this.tenants.set(tenant, counts);
    } else if (counts.window !== window) {
      counts.window = window;
      counts.requests = 0;
      counts.tokens = 0;
    }
    return counts;
  }
}

/** A duration as OpenAI writes `x-ratelimit-reset-*`: `250ms`, `12.5s`, `1m0s`. */
export function formatReset(ms: number): string {
  if (ms <= 0) return '0s';
  if (ms < 1000) return `${Math.ceil(ms)}ms`;
  const seconds = (s: number) => `${Number(s.toFixed(3))}s`;
  if (ms < 60_000) return seconds(ms / 1000);
  const minutes = Math.floor(ms / 60_000);
  return `${minutes}m${seconds((ms - minutes * 60_000) / 1000)}`;
}

/** OpenAI's `x-ratelimit-*` headers for the limits the tenant has (requests, tokens). */
export function rateLimitHeaders(state: LimitState): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [name, use] of [
    ['requests', state.requests],
    ['tokens', state.tokens],
  ] as const) {
    if (use === undefined) continue;
    headers[`x-ratelimit-limit-${name}`] = String(use.limit);
    headers[`x-ratelimit-remaining-${name}`] = String(use.remaining);
    headers[`x-ratelimit-reset-${name}`] = formatReset(use.resetMs);
  }
  return headers;
}

/** Whole seconds for `Retry-After`, at least 1. */
export function retryAfterSeconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** An admitted request's hold on its tenant's limits: settled once, whatever ends the request. */
export interface LimitTicket {
  /** The tenant's `x-ratelimit-*` headers as of the admission. */
  readonly headers: Readonly<Record<string, string>>;
  /**
   * Corrects the reserved tokens to `usedTokens` (undefined: keep the reservation) and frees the slot; later calls do
   * nothing. An `estimated` use (no usage reported) never charges less than the reservation: the estimate is of what
   * was relayed, and the upstream may have generated more.
   */
  settle(usedTokens: number | undefined, estimated?: boolean): void;
}

export type Admission =
  | { readonly admitted: true; readonly ticket: LimitTicket }
  | {
      readonly admitted: false;
      readonly limit: LimitName;
      /** For the 429's body: names the limit and the numbers. */
      readonly message: string;
      /** Seconds for `Retry-After`; undefined when waiting cannot help (the request alone is over the limit). */
      readonly retryAfter: number | undefined;
      readonly headers: Readonly<Record<string, string>>;
    }
  | {
      readonly admitted: false;
      /** The store failed and the limiter fails closed (`failOpen: false`): 503 limits_unavailable. */
      readonly unavailable: true;
      readonly message: string;
    };

export interface LimiterSettings {
  /** Limits by tenant name; a tenant absent here (or with none set) is not limited. */
  readonly tenants: Readonly<Record<string, TenantLimits | undefined>>;
}

export interface LimiterOptions {
  readonly store?: LimitStore;
  /** Milliseconds; windows are numbered on this clock. */
  readonly now: () => number;
  /** A store that failed (a shared one unreachable): the request is admitted unlimited, and the error reported here. */
  readonly onError?: (error: unknown) => void;
  /** false: a request whose admission the store failed is refused (`unavailable`) rather than admitted unlimited. */
  readonly failOpen?: boolean;
}

function hasLimits(limits: TenantLimits | undefined): limits is TenantLimits {
  return limits !== undefined && (limits.requestsPerMinute !== undefined || limits.tokensPerMinute !== undefined || limits.maxConcurrent !== undefined);
}

/** The gateway's limiter: which tenant has which limits, applied through a store. */
export class TenantLimiter {
  private readonly store: LimitStore;

  constructor(
    private readonly settings: LimiterSettings,
    private readonly options: LimiterOptions,
  ) {
    this.store = options.store ?? new InProcessLimitStore();
  }

  /** The tenants that have limits, with which. */
  limited(): Array<{ tenant: string; limits: LimitName[] }> {
    return Object.entries(this.settings.tenants)
      .filter((entry): entry is [string, TenantLimits] => hasLimits(entry[1]))
      .map(([tenant, limits]) => ({
        tenant,
        limits: LIMIT_NAMES.filter((name) => (name === 'requests' ? limits.requestsPerMinute : name === 'tokens' ? limits.tokensPerMinute : limits.maxConcurrent) !== undefined),
      }));
  }

  /** Admits or refuses one request reserving `tokens`; undefined when the tenant has no limits. */
  admit(tenant: string, tokens: number): MaybePromise<Admission> | undefined {
    const limits = this.settings.tenants[tenant];
    if (!hasLimits(limits)) return undefined;
    const now = this.options.now();
    let decision: MaybePromise<Decision>;
    try {
      decision = this.store.reserve(tenant, limits, tokens, now);
    } catch (error) {
      return this.failedOpen(error);
    }
    if (decision instanceof Promise) {
      return decision.then(
        (decided) => this.admission(tenant, limits, decided),
        (error: unknown) => this.failedOpen(error),
      );
    }
    return this.admission(tenant, limits, decision);
  }

  /** The store failed to admit: admitted unlimited (its ticket counted nothing, so it gives nothing back), or refused. */
  private failedOpen(error: unknown): Admission {
    this.options.onError?.(error);
    if (this.options.failOpen === false) return { admitted: false, unavailable: true, message: 'The rate limits cannot be checked right now (their store is unavailable). Please try again shortly.' };
    return { admitted: true, ticket: { headers: {}, settle: () => undefined } };
  }

  private admission(tenant: string, limits: TenantLimits, decision: Decision): Admission {
    const headers = rateLimitHeaders(decision.state);
    if (decision.admitted) return { admitted: true, ticket: this.ticket(decision.reservation, headers) };
    // Counted by the caller (waybill_rate_limited_total), which knows whether the client was still there to be refused.
    const limit = decision.exceeded[0];
    const retryAfter = decision.retryAfterMs === undefined ? undefined : retryAfterSeconds(decision.retryAfterMs);
    return { admitted: false, limit, message: refusalMessage(tenant, limits, decision, limit, retryAfter), retryAfter, headers };
  }

  private ticket(reservation: Reservation, headers: Record<string, string>): LimitTicket {
    let settled = false;
    return {
      headers,
      settle: (usedTokens, estimated = false) => {
        if (settled) return;
        settled = true;
        const used = estimated && usedTokens !== undefined ? Math.max(usedTokens, reservation.tokens) : usedTokens;
        this.guarded(() => this.store.settle(reservation, used, this.options.now()));
        this.guarded(() => this.store.release(reservation));
      },
    };
  }

  private guarded(step: () => MaybePromise<void>): void {
    try {
      const done = step();
      if (done instanceof Promise) done.catch((error: unknown) => this.options.onError?.(error));
    } catch (error) {
      this.options.onError?.(error);
    }
  }
}

function refusalMessage(tenant: string, limits: TenantLimits, decision: Extract<Decision, { admitted: false }>, limit: LimitName, retryAfter: number | undefined): string {
  const counts = decision.counts;
  const head = `Rate limit reached for tenant \`${tenant}\``;
  const retry = retryAfter === undefined ? '' : ` Please try again in ${retryAfter}s.`;
  switch (limit) {
    case 'requests':
      return `${head} on requests per minute: limit ${limits.requestsPerMinute ?? 0}, used ${counts.requests}, requested 1.${retry}`;
    case 'tokens':
      if (decision.retryAfterMs === undefined) {
        return `Request too large for tenant \`${tenant}\` on tokens per minute: limit ${limits.tokensPerMinute ?? 0}, requested ${decision.requestedTokens} (the prompt's estimate and the output it may ask for). Lower max_tokens or shorten the prompt.`;
      }
      return `${head} on tokens per minute: limit ${limits.tokensPerMinute ?? 0}, used ${counts.tokens}, requested ${decision.requestedTokens}.${retry}`;
    case 'concurrent':
      return `${head} on concurrent requests: limit ${limits.maxConcurrent ?? 0}, in flight ${counts.inflight}.${retry}`;
  }
}
