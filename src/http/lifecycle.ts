/**
 * The gateway's life: the operational endpoints (alive, ready, metrics), start-up, and the graceful drain —
 * readiness turns 503 at once, new connections are refused after the grace, in-flight requests run to the drain
 * deadline, and whatever is left is ended and counted.
 *
 * The operational endpoints are served by the API's own app, or, with `server.admin_port`, by a second app on a
 * port of their own (the admin listener): it shares the metrics registry, answers readiness (503, draining) all
 * through the drain, and is closed last. The live status page (status-page.ts) is served beside them; its event
 * streams are ended before the listener serving them closes, so they never hold a shutdown.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type onRequestHookHandler } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/load.js';
import type { Exchange } from '../proxy/exchange.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import { errorBody } from '../delivery/errors.js';
import type { StatusPage } from './status-page.js';
import type { CheckOpsAccess } from './auth.js';
import { LiveList } from '../util/live-list.js';
import { within } from '../util/within.js';
import { requestlessLogger } from './fastify-logger.js';

export interface LifecycleDeps {
  readonly app: FastifyInstance;
  /** The admin listener's app (server.admin_port); absent, `app` serves the operational endpoints. */
  readonly admin?: FastifyInstance | undefined;
  /** The configuration in force and its upstreams (a reload replaces them): read at each use. */
  readonly current: () => { readonly config: Config; readonly upstreams: UpstreamRegistry };
  /** Closes the upstreams of every generation still open (the current one, and any a reload retired). */
  readonly closeUpstreams: () => Promise<void>;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  readonly now: () => number;
  /** Answers /metrics instead of the metrics' own scrape: a worker's, aggregated over every worker. */
  readonly scrape?: (() => Promise<{ contentType: string; body: string }>) | undefined;
  /** The live status page, served where /metrics is. */
  readonly statusPage?: StatusPage | undefined;
  /** Who may read /metrics and the status page (on the API port); absent: anyone (the admin listener). */
  readonly opsAccess?: CheckOpsAccess | undefined;
}

export interface Lifecycle {
  /** Starts health checks and discovery, then listens (the admin listener first); resolves to the API's base URL. */
  listen(): Promise<string>;
  /** The admin listener's base URL once listening; undefined without server.admin_port. */
  readonly adminUrl: string | undefined;
  drain(): Promise<void>;
  close(): Promise<void>;
  /** Logical requests in progress. */
  readonly inflight: number;
  track(exchange: Exchange): void;
  /** The exchange holds nothing any more. */
  done(exchange: Exchange): void;
  /** The listener is closed: requests on connections still open are refused. */
  readonly closing: boolean;
  /** The drain (or close) has begun. */
  readonly stopping: boolean;
}

/**
 * The admin listener's app: the operational endpoints only, none of the API's front door (no client keys, no
 * connection limit, no request accounting: a probe or a scrape is not a request of the API).
 */
export function createAdminApp(logger: FastifyBaseLogger): FastifyInstance {
  const admin = Fastify({ loggerInstance: requestlessLogger(logger), logController: new LogController({ disableRequestLogging: true }) });
  admin.setNotFoundHandler((request, reply) => {
    void reply.code(404).send(errorBody('not_found', `no route for ${request.method} ${request.url.split('?')[0] ?? ''} on the admin listener (/metrics, /healthz, /readyz, /status)`));
  });
  return admin;
}

export function createLifecycle(deps: LifecycleDeps): Lifecycle {
  const { app, admin, current, closeUpstreams, metrics, logger, now, statusPage, scrape, opsAccess } = deps;
  /**
   * /metrics and the status page name tenants and other tenants' request ids: on the API port, where client keys
   * exist, only a key with admin: true reads them (Bearer, x-api-key, or HTTP Basic's password, so a browser can
   * open the page). /healthz and /readyz stay open for probes.
   */
  const gate: onRequestHookHandler | undefined =
    opsAccess === undefined
      ? undefined
      : (request, reply, done) => {
          const access = opsAccess(request.headers);
          if (access === 'allowed') {
            done();
            return;
          }
          if (access === 'missing') {
            void reply
              .code(401)
              .header('www-authenticate', 'Bearer, Basic realm="waybill operations"')
              .header('cache-control', 'no-store')
              .send(errorBody('invalid_api_key', 'this endpoint needs a client key with admin: true (auth.keys), or server.admin_port'));
            return;
          }
          void reply.code(403).header('cache-control', 'no-store').send(errorBody('admin_required', 'this client key may not read the operational endpoints: give it admin: true (auth.keys), or use server.admin_port'));
        };
  /** Where /healthz, /readyz and /metrics are served. */
  const ops = admin ?? app;
  let adminUrl: string | undefined;
  // Not a Set: a long-lived Set's rehashed tables keep the requests in flight alive through scavenges (util/live-list.ts).
  const exchanges = new LiveList<Exchange>();
  let draining = false;
  let closing = false;
  /** Drain or close, whichever came first: both end in the same closed state, once. */
  let stopping: Promise<void> | undefined;
  let allDone: (() => void) | undefined;

  ops.get('/healthz', (_request, reply) => {
    void reply.send({ status: 'ok' });
  });

  ops.get('/readyz', (_request, reply) => {
    const at = now();
    const { upstreams } = current();
    const ready = !draining && upstreams.isReady(at);
    void reply.code(ready ? 200 : 503).send({
      status: draining ? 'draining' : ready ? 'ready' : 'not_ready',
      pools: upstreams.pools.map((pool) => ({
        name: pool.config.name,
        models: pool.models,
        upstreams: pool.upstreams.map((u) => ({ name: u.name, healthy: u.healthy ?? null, circuit: u.breaker.state(at), inflight: u.inflight })),
      })),
    });
  });

  ops.get('/metrics', { ...(gate !== undefined && { onRequest: gate }) }, async (request, reply) => {
    if (scrape === undefined) {
      const { contentType, body } = await metrics.scrape(request.headers.accept);
      void reply.type(contentType).send(body);
      return;
    }
    // Every worker's, added up by the primary; a worker that does not answer in time fails the scrape, never
    // serves a partial sum (a counter that seems to fall reads as a reset).
    try {
      const { contentType, body } = await scrape();
      void reply.type(contentType).send(body);
    } catch (error) {
      logger.warn({ err: error }, 'aggregated metrics unavailable');
      void reply.code(503).header('retry-after', '1').send(errorBody('metrics_unavailable', 'The metrics of every worker could not be collected in time. Please try again.'));
    }
  });

  // Its paths are reserved (config/load.ts): no pass-through path can claim them.
  statusPage?.register(ops, gate);

  async function drainAndClose(): Promise<void> {
    const { config } = current();
    draining = true;
    logger.info({ inflight: exchanges.size, graceMs: config.shutdown.graceMs }, 'draining: not ready; still serving during the grace period');
    await new Promise((resolve) => setTimeout(resolve, config.shutdown.graceMs));
    // Stops accepting connections; requests already in flight go on (fastify answers new ones on open
    // keep-alive connections with 503). Status streams on this port would hold the close: they end now.
    if (admin === undefined) statusPage?.closeStreams(true);
    closing = true;
    const closed = app.close();
    const idle = () => new Promise<void>((resolve) => (exchanges.size === 0 ? resolve() : (allDone = resolve)));
    if (!(await within(idle(), config.shutdown.drainTimeoutMs)) && exchanges.size > 0) {
      logger.warn({ inflight: exchanges.size }, 'drain timeout: ending the requests still in flight');
      for (const exchange of exchanges) exchange.shutdown();
      await within(idle(), config.streaming.drainGraceMs + 1000);
    }
    // Connections kept alive after their last response would hold the close until their keep-alive timeout.
    app.server.closeIdleConnections();
    await within(closed, config.streaming.drainGraceMs + 1000);
    await closeUpstreams();
    logger.info('drained');
    // Last: probes, scrapes and the status page are answered (readiness 503, draining) until the API is closed.
    statusPage?.closeStreams(true);
    await admin?.close();
  }

  return {
    async listen() {
      const { config, upstreams } = current();
      await upstreams.start();
      metrics.declareModels(upstreams.models(), config.metrics.promptLenClasses, config.auth.servedTenants, (model) => upstreams.poolFor(model)?.upstreams.map((u) => u.name) ?? []);
      metrics.declareRouting(upstreams);
      // The admin listener listens where the API does unless server.admin_host says otherwise.
      if (admin !== undefined) adminUrl = await admin.listen({ host: config.server.admin_host ?? config.server.host, port: config.server.admin_port ?? 0 });
      try {
        return await app.listen({ host: config.server.host, port: config.server.port });
      } catch (err) {
        await admin?.close();
        adminUrl = undefined;
        throw err;
      }
    },
    get adminUrl() {
      return adminUrl;
    },
    drain() {
      stopping ??= drainAndClose();
      return stopping;
    },
    close() {
      stopping ??= (async () => {
        statusPage?.closeStreams(true);
        await app.close();
        await closeUpstreams();
        await admin?.close();
      })();
      return stopping;
    },
    get inflight() {
      return exchanges.size;
    },
    get closing() {
      return closing;
    },
    get stopping() {
      return stopping !== undefined;
    },
    track(exchange) {
      // Once: a second entry would never be taken out, and the drain would wait for it until its timeout.
      if (exchange.inFlight !== undefined) return;
      exchange.inFlight = exchanges.add(exchange);
    },
    done(exchange) {
      if (exchange.inFlight !== undefined) exchanges.delete(exchange.inFlight);
      exchange.inFlight = undefined;
      if (exchanges.size === 0) allDone?.();
    },
  };
}
