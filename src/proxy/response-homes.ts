/**
 * Where a stored response lives. vLLM keeps stored and background responses in the memory of the one process that
 * generated them (docs/routes.md), so `GET /v1/responses/{id}`, `/cancel` and a continuation (`previous_response_id`)
 * must reach that process. Waybill remembers the upstream of every response id it relayed (a bounded map, least
 * recent forgotten) and, for an id it does not know — another gateway replica relayed it, or this one restarted —
 * asks every upstream at once; a 404 from all of them is the answer, remembered for `responses.negative_cache_ttl`.
 * Each lookup GET is reported (`onLookup`: counted as an attempt), and each tenant has its own cap of lookups in
 * flight, so one tenant's junk ids cannot refuse another's real lookup. Who may ask is response-owners.ts.
 */
import type { AttemptResult } from '../accounting/outcomes.js';
import type { Upstream, UpstreamRegistry } from './upstreams.js';

/** A response id as vLLM makes them (`resp_<hex>`, or the client's `request_id`): a bounded, path-safe token. */
const RESPONSE_ID = /^[A-Za-z0-9._:-]{1,256}$/;

export function isResponseId(id: string): boolean {
  // Not `.` or `..`: a proxy on the way that normalises paths would turn them into another path.
  return RESPONSE_ID.test(id) && !/^\.+$/.test(id);
}

/**
 * Lookups in flight at once for callers that name no tenant (the gateway's own, e.g. following a background
 * response); a tenant's own are capped by `maxLookupsPerTenant`. Past the cap a lookup is refused, not queued.
 */
export const MAX_LOOKUPS = 32;

/** Ids a negative answer is remembered for at most (oldest forgotten first). */
export const NEGATIVE_CACHE_LIMIT = 10_000;

/** The caller of a lookup nobody names: the gateway itself. */
const NO_TENANT = '';

export interface HomesOptions {
  /** A tenant's lookups in flight at once (`responses.max_lookups_per_tenant`). */
  readonly maxLookupsPerTenant?: number;
  /** How long an id found nowhere is answered as missing without asking again (`responses.negative_cache_ttl`; 0: off). */
  readonly negativeTtlMs?: number;
  /** Each lookup GET, with its result as an attempt's (`waybill_upstream_attempts_total{model="_lookup"}`). */
  readonly onLookup?: (upstream: Upstream, result: AttemptResult) => void;
  /** Monotonic milliseconds. */
  readonly now?: () => number;
}

export interface FindOptions {
  /** Whose request asks: its lookups count against its own cap. Absent: the gateway's own (MAX_LOOKUPS). */
  readonly tenant?: string;
}

export class ResponseHomes {
  /** Response id → upstream name, least recently used first. */
  private readonly homes = new Map<string, string>();
  /** Lookups in flight, by tenant (NO_TENANT: the gateway's own). */
  private readonly lookups = new Map<string, number>();
  /** Ids found nowhere → when that answer expires; oldest first. */
  private readonly missing = new Map<string, number>();
  private readonly maxLookupsPerTenant: number;
  private readonly negativeTtlMs: number;
  private readonly now: () => number;

  constructor(
    private readonly capacity: number,
    private readonly lookupTimeoutMs: number,
    private readonly options: HomesOptions = {},
  ) {
    this.maxLookupsPerTenant = options.maxLookupsPerTenant ?? MAX_LOOKUPS;
    this.negativeTtlMs = options.negativeTtlMs ?? 0;
    this.now = options.now ?? (() => performance.now());
  }

  get size(): number {
    return this.homes.size;
  }

  learn(responseId: string, upstream: string): void {
    this.missing.delete(responseId);
    if (this.capacity === 0 || !isResponseId(responseId)) return;
    this.homes.delete(responseId);
    this.homes.set(responseId, upstream);
    if (this.homes.size > this.capacity) {
      const oldest = this.homes.keys().next();
      if (oldest.done !== true) this.homes.delete(oldest.value);
    }
  }

  /** Its home no longer holds it (a 404 there): the next request asks every upstream again. */
  forget(responseId: string): void {
    this.homes.delete(responseId);
  }

  /** The upstream remembered as holding `responseId`, without asking anyone; undefined when none is. */
  known(responseId: string, registry: UpstreamRegistry): Upstream | undefined {
    const name = this.homes.get(responseId);
    return name === undefined ? undefined : registry.upstreams.find((upstream) => upstream.name === name);
  }

  /**
   * The upstream holding `responseId`: the remembered one, or the first that answers it with a 2xx (an error is no
   * answer: a 503 or a 401 says nothing about where the response lives); undefined if none does, or none did within
   * the negative cache's time; 'busy' when the caller's lookups in flight are at their cap.
   */
  async find(responseId: string, registry: UpstreamRegistry, options: FindOptions = {}): Promise<Upstream | undefined | 'busy'> {
    const remembered = this.known(responseId, registry);
    if (remembered !== undefined) {
      this.learn(responseId, remembered.name);
      return remembered;
    }
    const expires = this.missing.get(responseId);
    if (expires !== undefined) {
      if (expires > this.now()) return undefined;
      this.missing.delete(responseId);
    }
    const caller = options.tenant ?? NO_TENANT;
    const inFlight = this.lookups.get(caller) ?? 0;
    if (inFlight >= (caller === NO_TENANT ? MAX_LOOKUPS : this.maxLookupsPerTenant)) return 'busy';
    this.lookups.set(caller, inFlight + 1);
    try {
      const path = `/v1/responses/${encodeURIComponent(responseId)}`;
      const answers = await Promise.all(distinct(registry.upstreams).map(async (upstream) => ((await this.ask(upstream, path)) ? upstream : undefined)));
      const home = answers.find((upstream) => upstream !== undefined);
      if (home !== undefined) this.learn(responseId, home.name);
      else this.remember404(responseId);
      return home;
    } finally {
      const left = (this.lookups.get(caller) ?? 1) - 1;
      if (left === 0) this.lookups.delete(caller);
      else this.lookups.set(caller, left);
    }
  }

  /** One lookup GET: whether `upstream` holds the response, its result reported as an attempt's. */
  private async ask(upstream: Upstream, path: string): Promise<boolean> {
    let status: number;
    try {
      status = await upstream.lookup(path, this.lookupTimeoutMs);
    } catch (error) {
      this.report(upstream, lookupFailure(error));
      return false;
    }
    this.report(upstream, status >= 500 ? 'http_5xx' : status >= 400 ? 'http_4xx' : status >= 300 ? 'http_3xx' : 'ok');
    return status >= 200 && status < 300;
  }

  private report(upstream: Upstream, result: AttemptResult): void {
    try {
      this.options.onLookup?.(upstream, result);
    } catch {
      // An observer cannot break the lookup (its own guard reports what it threw).
    }
  }

  private remember404(responseId: string): void {
    if (this.negativeTtlMs <= 0) return;
    this.missing.delete(responseId);
    this.missing.set(responseId, this.now() + this.negativeTtlMs);
    if (this.missing.size > NEGATIVE_CACHE_LIMIT) {
      const oldest = this.missing.keys().next();
      if (oldest.done !== true) this.missing.delete(oldest.value);
    }
  }
}

/** A lookup that got no status, as an attempt's result: its deadline, a refused connection, or a cut one. */
function lookupFailure(error: unknown): AttemptResult {
  const { name, code } = (error ?? {}) as { name?: unknown; code?: unknown };
  if (name === 'TimeoutError' || name === 'AbortError' || code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') return 'timeout';
  if (code === 'ECONNREFUSED' || code === 'UND_ERR_CONNECT_TIMEOUT' || code === 'ENOTFOUND' || code === 'EHOSTUNREACH') return 'connect_error';
  return 'reset';
}

function distinct(upstreams: readonly Upstream[]): Upstream[] {
  const seen = new Set<string>();
  return upstreams.filter((upstream) => !seen.has(upstream.name) && seen.add(upstream.name) !== undefined);
}
