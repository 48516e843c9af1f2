/**
 * The gateway, assembled: its observers (metrics, tracing, the settlement recorder and the guard around them), the
 * upstream registry, and the HTTP app from its parts — the front door (answers.ts, front-door.ts, body.ts), the API
 * routes (routes.ts) and the lifecycle (lifecycle.ts).
 */
import { performance } from 'node:perf_hooks';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Settlement } from '../accounting/ledger.js';
import type { Config } from '../config/load.js';
import type { ExchangeDeps } from '../proxy/exchange.js';
import { UpstreamRegistry } from '../proxy/upstreams.js';
import { ObserverGuard } from '../telemetry/guard.js';
import { createLogger } from '../telemetry/logger.js';
import { GatewayMetrics } from '../telemetry/metrics.js';
import { SchemaCache } from '../accounting/schemas.js';
import { createSettlementRecorder } from '../telemetry/settlement.js';
import { disabledTracing, type Tracing } from '../telemetry/tracing.js';
import { buildInfo } from '../util/build.js';
import { createAnswers } from './answers.js';
import { fastifyOptions, installFrontDoor } from './front-door.js';
import { createAdminApp, createLifecycle } from './lifecycle.js';
import { registerApiRoutes } from './routes.js';
import { createAuthenticator } from './auth.js';
import { ResponseHomes } from '../proxy/response-homes.js';

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
}

export interface Gateway {
  readonly app: FastifyInstance;
  readonly metrics: GatewayMetrics;
  readonly upstreams: UpstreamRegistry;
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
  const upstreams = new UpstreamRegistry(config, logger.child({ component: 'upstreams' }), random, {
    onEjected: (upstream, reason) => metrics.upstreamEjected(upstream, reason),
    onProbeFailed: (upstream, probe) => metrics.probeFailed(upstream, probe),
  }, now);
  metrics.observe({
    *upstreams() {
      const at = now();
      for (const upstream of upstreams.upstreams) yield { name: upstream.name, up: upstream.isUp(at), inflight: upstream.inflight };
    },
    queues: () => upstreams.queues(),
  });
  const guard = new ObserverGuard((component, error) => {
    logger.error({ err: error, component }, 'internal error');
    metrics.internalError(component);
  });
  const publish = createSettlementRecorder({
    metrics,
    logger,
    guard,
    logRequests: config.logging.requests,
    onSettled: options.onSettled,
    evaluation: config.evaluation,
  });
  const schemas = new SchemaCache({ size: config.outputChecks.schemaCacheSize, maxSchemaChars: config.outputChecks.maxSchemaChars });
  const answers = createAnswers({ config, upstreams, tracer, guard, publish, now });

  // Typed as fastify's logger so the instance keeps fastify's default generics.
  const fastifyLogger: FastifyBaseLogger = logger;
  const app = Fastify(fastifyOptions(config, fastifyLogger, answers));
  // With server.admin_port, the operational endpoints get a listener of their own and the API port serves only the API.
  const admin = config.server.admin_port === undefined ? undefined : createAdminApp(fastifyLogger);
  const lifecycle = createLifecycle({ app, admin, config, upstreams, metrics, logger, now });
  if (config.auth.keys.length === 0) logger.warn('no client keys are configured (auth.keys): every client is served, counted as tenant _anonymous');
  const homes = new ResponseHomes(config.responses.maxRememberedIds, config.responses.lookupTimeoutMs);
  const exchangeDeps: ExchangeDeps = {
    config,
    upstreams,
    metrics,
    logger,
    now,
    wallNow: () => Date.now(),
    random,
    publish,
    guard,
    onDone: (exchange) => lifecycle.done(exchange),
    homes,
  };
  installFrontDoor(app, { config, answers, guard, now, closing: () => lifecycle.closing, authenticate: createAuthenticator(config.auth) });
  registerApiRoutes(app, { config, upstreams, tracer, guard, answers, exchangeDeps, onExchange: (exchange) => lifecycle.track(exchange), schemas, homes });

  return {
    app,
    admin,
    metrics,
    upstreams,
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
