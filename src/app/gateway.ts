/**
 * The composition root: the gateway assembled from its parts, and its configuration's reloads. It makes what lives as
 * long as the process — the observers (metrics, tracing, the settlement recorder and the guard around them), the
 * stored responses' homes and owners, the background holds, route sharing — builds a generation of each
 * configuration (generations.ts), and hands the HTTP surface (http/surface.ts) the generation in force. A reload
 * builds and starts the next generation, swaps it in at once, and retires the previous one.
 */
import { performance } from 'node:perf_hooks';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Settlement } from '../accounting/ledger.js';
import { SchemaCache } from '../accounting/schemas.js';
import type { Config } from '../config/load.js';
import { bucketsKept, configHash, restartRequiredKeys } from '../config/reload.js';
import { createHttpSurface } from '../http/surface.js';
import { BackgroundHolds } from '../proxy/background-holds.js';
import type { HeldRequests } from '../proxy/exchange.js';
import { ModelLabels } from '../proxy/model-labels.js';
import { ReadTurns } from '../proxy/read-turns.js';
import { ResponseHomes } from '../proxy/response-homes.js';
import { ResponseOwners } from '../proxy/response-owners.js';
import { RevisionLabels } from '../proxy/revision-labels.js';
import type { LimitStore } from '../proxy/tenant-limits.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import { RouteBus } from '../routing/route-bus.js';
import { ObserverGuard } from '../telemetry/guard.js';
import { BACKGROUND_HOLD_ENDS, ROUTE_SHARE_RESULTS } from '../telemetry/labels.js';
import { onStdoutDrops } from '../telemetry/log-destination.js';
import { createLogger } from '../telemetry/logger.js';
import { GatewayMetrics } from '../telemetry/metrics.js';
import { createSettlementRecorder } from '../telemetry/settlement.js';
import { createStatusWindow } from '../telemetry/status.js';
import { disabledTracing, type Tracing } from '../telemetry/tracing.js';
import { buildInfo } from '../util/build.js';
import { createGenerations } from './generations.js';

export interface GatewayOptions {
  logger?: Logger;
  /** Called with every settled logical request. */
  onSettled?: (settlement: Settlement, requestId: string) => void;
  /** prom-client's process and Node.js metrics (default on). */
  defaultMetrics?: boolean;
  /** Randomness for picking and retry jitter (tests pass a seeded one). */
  random?: () => number;
  /** OpenTelemetry tracing (see startTracing); default off. */
  tracing?: Tracing;
  /** This gateway is one of several worker processes (`server.workers`; app/cluster.ts). */
  worker?: WorkerRole;
}

/** What a worker process shares with the others, through its primary. */
export interface WorkerRole {
  readonly index: number;
  readonly count: number;
  /** The scrape of every worker's metrics, aggregated (answers /metrics). */
  readonly scrape: () => Promise<{ contentType: string; body: string }>;
  /** The tenants' limits counted once for all workers (used unless limits.redis_url is set). */
  readonly limitStore: LimitStore;
  /** Tells the primary which requests this worker holds: it counts them if the worker dies. */
  readonly held?: HeldRequests | undefined;
  /** Owners of stored responses under client-chosen ids, told to and learned from the other workers. */
  readonly owners?: { share(id: string, tenant: string): void; onShared(listener: (id: string, tenant: string) => void): void } | undefined;
  /** Where cache_aware sent which prefix blocks, told to and learned from the other workers (docs/routing.md). */
  readonly routes?: RouteSharing | undefined;
}

export interface RouteSharing {
  share(pool: string, upstream: string, blocks: readonly number[]): void;
  onShared(listener: (pool: string, upstream: string, blocks: readonly number[]) => void): void;
}

export type ReloadResult =
  | { readonly result: 'ok'; readonly hash: string }
  | { readonly result: 'restart_required'; readonly keys: readonly string[]; readonly hash: string }
  /** The gateway is shutting down: nothing applied, nothing counted. */
  | { readonly result: 'ignored'; readonly hash: string };

export interface Gateway {
  readonly app: FastifyInstance;
  readonly metrics: GatewayMetrics;
  /** The upstreams of the configuration in force. */
  readonly upstreams: UpstreamRegistry;
  /** The configuration in force. */
  readonly config: Config;
  /** Its hash (waybill_config_hash{hash}). */
  readonly configHash: string;
  /**
   * Applies a new configuration to new requests (docs/operations.md, "Reloading the configuration"): its upstreams
   * are started (health-checked) first, then swapped in at once; requests in flight finish on the configuration they
   * arrived under, whose upstreams close when the last of them is done. A change to a key only a restart applies
   * (restartRequiredKeys) rejects the reload whole. Counted in waybill_config_reloads_total{result}.
   */
  reload(next: Config): Promise<ReloadResult>;
  /** The admin listener's app (server.admin_port: /metrics, /healthz, /readyz); undefined without one. */
  readonly admin: FastifyInstance | undefined;
  /** Starts health checks and discovery, then listens; resolves to the API's base URL. */
  listen(): Promise<string>;
  /** The admin listener's base URL once `listen` resolved; undefined without server.admin_port. */
  readonly adminUrl: string | undefined;
  /**
   * Graceful shutdown: /readyz turns 503 at once; after `shutdown.grace` new connections are refused; in-flight
   * requests run up to `shutdown.drain_timeout`, then whatever is left is ended and counted; then everything closes.
   */
  drain(): Promise<void>;
  /** Logical requests in progress. */
  readonly inflight: number;
  close(): Promise<void>;
}

export function createGateway(config: Config, options: GatewayOptions = {}): Gateway {
  const logger = options.logger ?? createLogger(config.logging);
  const tracing = options.tracing ?? disabledTracing();
  const tracer = tracing.enabled ? tracing.tracer : undefined;
  const metrics = new GatewayMetrics(config.metrics.buckets, { defaultMetrics: options.defaultMetrics ?? true, build: buildInfo() });
  const random = options.random ?? Math.random;
  const now = () => performance.now();
  const guard = new ObserverGuard((component, error) => {
    logger.error({ err: error, component }, 'internal error');
    metrics.internalError(component);
  });
  // The status page's window reads the ledger's settlements, not Prometheus; the page is off with status.enabled.
  const statusWindow = createStatusWindow({
    now: () => Date.now(),
    ttftBuckets: config.metrics.buckets.ttft,
    tpotBuckets: config.metrics.buckets.tpot,
    firstOutputBuckets: config.metrics.buckets.ttft,
  });
  const publish = createSettlementRecorder({
    metrics,
    logger,
    guard,
    logRequests: config.logging.requests,
    onSettled: [
      ...(options.onSettled === undefined ? [] : [options.onSettled]),
      (settlement, requestId, traceId) => {
        if (current.config.status.enabled) statusWindow.record(settlement, requestId, traceId);
      },
    ],
    evaluation: config.evaluation,
  });
  const schemas = new SchemaCache({ size: config.outputChecks.schemaCacheSize, maxSchemaChars: config.outputChecks.maxSchemaChars });
  const homes = new ResponseHomes(config.responses.maxRememberedIds, config.responses.lookupTimeoutMs, {
    maxLookupsPerTenant: config.responses.maxLookupsPerTenant,
    negativeTtlMs: config.responses.negativeCacheTtlMs,
    onLookup: (upstream, result) => guard.run('metrics', () => metrics.lookupAttempt(upstream.name, result)),
    now,
  });
  // Whose each stored response is (docs/security.md): an id that nobody owns is usable only without client keys.
  const owners = new ResponseOwners({
    secret: config.responses.idSecret,
    capacity: config.responses.maxRememberedIds,
    // Read at each use: a reload may add the first keys (or remove the last).
    unownedUsable: () => current.config.auth.keys.length === 0,
    onBind: options.worker?.owners === undefined ? undefined : (id, tenant) => guard.run('exchange', () => options.worker?.owners?.share(id, tenant)),
  });
  options.worker?.owners?.onShared((id, tenant) => owners.learn(id, tenant));
  // What the other workers' picks sent where: recorded in the generation in force (a reload's new registry learns
  // from then on; one whose router was carried over keeps what it knew).
  const learnRoute = (pool: string, upstream: string, blocks: readonly number[]) => guard.run('exchange', () => current.upstreams.learnRoute(pool, upstream, blocks));
  options.worker?.routes?.onShared(learnRoute);
  // What other replicas' picks sent where, through Redis (route_sharing); one subscription per process.
  const sharing = config.routeSharing;
  const routeBus = sharing === undefined ? undefined : new RouteBus({
    url: sharing.url,
    password: sharing.password,
    channel: sharing.channel,
    onRoute: learnRoute,
    onResult: (result) => guard.run('metrics', () => metrics.routeShared(result)),
    onError: (error) => logger.debug({ err: error, component: 'route_sharing' }, 'route sharing: Redis unavailable (the local index serves alone)'),
  });
  if (routeBus !== undefined) for (const result of ROUTE_SHARE_RESULTS) metrics.routeShared(result, 0);
  const shareRoute = options.worker?.routes === undefined && routeBus === undefined ? undefined : (pool: string, upstream: string, blocks: readonly number[]) => {
    guard.run('exchange', () => options.worker?.routes?.share(pool, upstream, blocks));
    guard.run('exchange', () => routeBus?.share(pool, upstream, blocks));
  };
  // One per process, whatever the generation: a model name's label is the process's (discovery.max_models_per_pool).
  const modelLabels = new ModelLabels();
  metrics.labelModels((model) => modelLabels.label(model));
  // One per process too: a revision's label is the process's (discovery.max_revisions_per_pool).
  const revisionLabels = new RevisionLabels();
  // One per process, like the homes: a background response is held across reloads, and polled on the upstream of
  // its name in the configuration in force when it is asked (limits.background_*, read at start).
  const backgroundHolds = new BackgroundHolds({
    settings: { ...config.limits.background, pollTimeoutMs: config.responses.lookupTimeoutMs },
    upstream: (name) => current.upstreams.upstreams.find((upstream) => upstream.name === name),
    now,
    onEnded: (how) => guard.run('metrics', () => metrics.backgroundHoldEnded(how)),
    onHolding: (count) => guard.run('metrics', () => metrics.backgroundHolding(count)),
    onError: (error) => guard.report('exchange', error),
  });
  for (const how of BACKGROUND_HOLD_ENDS) metrics.backgroundHoldEnded(how, 0);
  metrics.backgroundHolding(0);
  // stdout's dropped log lines, counted here whichever logger dropped them (one destination per process).
  onStdoutDrops((lines) => guard.run('metrics', () => metrics.logLinesDropped(lines)));
  // One per process, whatever the generation: the event loop's turns are the process's.
  const readTurns = new ReadTurns({ onYield: () => guard.run('metrics', () => metrics.turnYielded()) });

  const generations = createGenerations({
    worker: options.worker,
    logger,
    metrics,
    guard,
    random,
    now,
    publish,
    homes,
    owners,
    readTurns,
    backgroundHolds,
    modelLabels,
    revisionLabels,
    shareRoute,
    onExchangeStarted: (exchange) => lifecycle.track(exchange),
    onExchangeDone: (exchange) => lifecycle.done(exchange),
  });

  let current = generations.build(config, undefined);
  let hash = configHash(config);
  metrics.configInForce(hash);
  metrics.observe({
    *upstreams() {
      const at = now();
      for (const upstream of current.upstreams.upstreams) yield { name: upstream.name, up: upstream.isUp(at), inflight: upstream.inflight };
    },
    queues: () => current.upstreams.queues(),
    engineSignals: () => (current.config.engineSignals.enabled ? current.upstreams.engineSignalStates(now()) : []),
    revisions: () => current.upstreams.revisions(),
    routingIndexes: () => current.upstreams.routingIndexes(),
  });
  // The revision of the upstream that answered, as the configuration in force knows it at settlement.
  metrics.labelRevisions((upstream) => current.upstreams.revisionOf(upstream));
  const { app, admin, statusPage, lifecycle } = createHttpSurface({
    config,
    current: () => current,
    logger,
    tracer,
    guard,
    publish,
    metrics,
    now,
    schemas,
    homes,
    owners,
    statusWindow,
    scrape: options.worker?.scrape,
    closeUpstreams: async () => {
      // Before the limiters close: each held slot is given back while its store still answers.
      backgroundHolds.close();
      await generations.closeAll();
      await routeBus?.close();
    },
  });
  if (config.auth.keys.length === 0) logger.warn('no client keys are configured (auth.keys): every client is served, counted as tenant _anonymous');
  warnOpsRefused(config, logger);

  /** Reloads run one at a time, in the order asked. */
  let reloading: Promise<unknown> = Promise.resolve();

  async function reload(next: Config): Promise<ReloadResult> {
    const log = logger.child({ component: 'config' });
    if (lifecycle.stopping) {
      log.warn('configuration reload ignored: the gateway is shutting down');
      return { result: 'ignored', hash };
    }
    const keys = restartRequiredKeys(current.config, next);
    if (keys.length > 0) {
      metrics.configReloaded('restart_required');
      log.error({ keys, hash }, `configuration reload rejected: ${keys.join(', ')} change only with a restart; the configuration in force stays`);
      return { result: 'restart_required', keys, hash };
    }
    const nextHash = configHash(next);
    const generation = generations.build(next, current);
    // Readiness holds across the swap: the new upstreams are health-checked (and discovered) before they serve.
    try {
      await generation.upstreams.start();
    } catch (error) {
      await generation.close();
      throw error;
    }
    if (lifecycle.stopping) {
      await generation.close();
      log.warn('configuration reload ignored: the gateway is shutting down');
      return { result: 'ignored', hash };
    }
    const previous = current;
    current = generation;
    hash = nextHash;
    previous.retire();
    // A status stream on the API port holds the generation it arrived under (front door): ended, it reconnects to
    // the new one, and the retired generation can close.
    if (admin === undefined) statusPage.closeStreams(false);
    metrics.declareModels(generation.upstreams.models(), next.metrics.promptLenClasses, next.auth.servedTenants, (model) => generation.upstreams.poolFor(model)?.upstreams.map((u) => u.name) ?? []);
    metrics.declareRouting(generation.upstreams);
    metrics.configInForce(hash);
    metrics.configReloaded('ok');
    if (bucketsKept(previous.config, next)) {
      log.warn('the latency histograms keep the buckets they started with (metrics.buckets and the SLO thresholds as boundaries) until a restart; the SLO counter uses the new thresholds');
    }
    if (next.auth.keys.length === 0) log.warn('no client keys are configured (auth.keys): every client is served, counted as tenant _anonymous');
    warnOpsRefused(next, log);
    log.info(
      {
        hash,
        previous: configHash(previous.config),
        models: generation.upstreams.models(),
        pools: next.pools.map((pool) => ({ name: pool.name, upstreams: pool.upstreams.map((u) => u.name) })),
        tenants: next.auth.servedTenants,
      },
      'configuration reloaded: new requests use it; requests in flight finish on the previous one',
    );
    return { result: 'ok', hash };
  }

  return {
    app,
    admin,
    metrics,
    get upstreams() {
      return current.upstreams;
    },
    get config() {
      return current.config;
    },
    get configHash() {
      return hash;
    },
    reload(next) {
      const done = reloading.then(() => reload(next));
      reloading = done.catch(() => undefined);
      return done;
    },
    listen: () => lifecycle.listen(),
    get adminUrl() {
      return lifecycle.adminUrl;
    },
    drain: () => lifecycle.drain(),
    close: () => lifecycle.close(),
    get inflight() {
      return lifecycle.inflight;
    },
  };
}

/**
 * Client keys exist, the API port serves /metrics and the status page (no server.admin_port), and no key may read
 * them: every scrape is refused. Said once at start-up (and at each reload), with the two ways out.
 */
function warnOpsRefused(config: Config, logger: Logger): void {
  const { keys } = config.auth;
  if (keys.length === 0 || config.server.admin_port !== undefined || keys.some((key) => key.admin)) return;
  logger.warn(
    '/metrics, /status, /status.json and /status/events are refused to every client: auth.keys are configured, none has admin: true, and there is no server.admin_port; set server.admin_port (a listener of their own) or give a key admin: true',
  );
}
