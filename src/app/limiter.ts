/**
 * The tenants' limiter of a configuration, and the connection to its shared store: built by a generation
 * (generations.ts), kept across a reload that leaves the limits alone, closed when no open generation uses it.
 */
import type { Logger } from 'pino';
import { ANONYMOUS } from '../accounting/outcomes.js';
import type { Config } from '../config/load.js';
import { canonicalJson } from '../config/reload.js';
import { LIMIT_STORE_OPS, LimitStoreUnavailable, RedisLimitStore, redisTarget } from '../proxy/redis-limit-store.js';
import { TenantLimiter, type LimiterSettings, type LimitStore } from '../proxy/tenant-limits.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';

export interface LimiterDeps {
  readonly guard: ObserverGuard;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  readonly now: () => number;
  /** Counts shared with other processes (the workers' primary), when there is no Redis to share them. */
  readonly shared?: LimitStore | undefined;
}

/** A tenant limiter and the connection to its shared store, if any, to close once nothing uses it. */
export interface LimiterHandle {
  readonly limiter: TenantLimiter;
  /** What the limiter was built from: a reload with the same keeps the limiter (and its counts). */
  readonly settings: string;
  close(): Promise<void>;
}

/** What a limiter is built from, as canonical text: a reload keeps the limiter when this is unchanged. */
export function limiterSettings(config: Config): string {
  return canonicalJson({ tenants: Object.entries(config.tenants).map(([tenant, rules]) => [tenant, rules.limits]), anonymous: config.limits.anonymous, redis: config.limits.redis, totalMs: config.timeouts.totalMs, drainGraceMs: config.streaming.drainGraceMs });
}

/**
 * The limiter of the configured `tenants.<name>.limits` and `limits.anonymous`: counting in this process, or, with
 * `limits.redis_url` (and any tenant limited), in Redis, shared by every replica. The store's failures are counted
 * (`waybill_limit_store_errors_total{op}`) and its up/down transitions logged once each and kept in
 * `waybill_limit_store_up`; the handle closes the connection.
 */
export function createLimiter(config: Config, deps: LimiterDeps): LimiterHandle {
  const { guard, metrics, logger } = deps;
  const settings: LimiterSettings = {
    tenants: { ...Object.fromEntries(Object.entries(config.tenants).map(([tenant, rules]) => [tenant, rules.limits])), [ANONYMOUS]: config.limits.anonymous },
  };
  const redis = config.limits.redis;
  let store: RedisLimitStore | undefined;
  if (redis !== undefined && Object.values(settings.tenants).some((limits) => limits !== undefined)) {
    const target = redisTarget(redis.url);
    const log = logger.child({ component: 'limits', store: target });
    metrics.limitStoreUp('redis', false);
    for (const op of LIMIT_STORE_OPS) metrics.limitStoreError(op, 0);
    store = new RedisLimitStore({
      url: redis.url,
      password: redis.password,
      timeoutMs: redis.timeoutMs,
      keyPrefix: redis.keyPrefix,
      // A request settles by timeouts.total (from its arrival, before its admission), then its client may linger
      // for the drain grace; the margin covers the release's own round trip.
      inflightTtlMs: config.timeouts.totalMs + config.streaming.drainGraceMs + INFLIGHT_MARGIN_MS + redis.timeoutMs,
      // Renewed while the request runs: a process that dies gives its slots back within one lease.
      slotLeaseMs: redis.slotLeaseMs,
      onError: (op) => guard.run('metrics', () => metrics.limitStoreError(op)),
      onState: (up, error) => {
        guard.run('metrics', () => metrics.limitStoreUp('redis', up));
        if (up) log.info('limit store answers: limits per tenant are shared through it');
        else if (redis.failOpen) log.warn({ err: error }, 'limit store unavailable: requests of limited tenants are admitted without limits until it answers (limits.redis_fail_open)');
        else log.error({ err: error }, 'limit store unavailable: requests of limited tenants are refused with 503 limits_unavailable until it answers');
      },
    });
  }
  const limiter = new TenantLimiter(settings, {
    ...(store !== undefined ? { store } : deps.shared !== undefined && { store: deps.shared }),
    now: deps.now,
    failOpen: redis?.failOpen ?? true,
    // The shared store's failures are counted and logged by its transitions above, not once per request.
    onError: (error) => {
      if (!(error instanceof LimitStoreUnavailable)) guard.report('http', error);
    },
  });
  // Every limit's refusal series from the start, so an alert on any increase sees the first one.
  for (const { tenant, limits } of limiter.limited()) for (const limit of limits) metrics.rateLimited(tenant, limit, 0);
  const closing = store;
  return { limiter, settings: limiterSettings(config), close: async () => closing?.close() };
}

/** How long an in-flight slot in Redis outlives the longest a request can take: its release's way there. */
const INFLIGHT_MARGIN_MS = 2_000;
