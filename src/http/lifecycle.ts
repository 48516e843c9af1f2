/**
 * The gateway's life: the operational endpoints (alive, ready, metrics), start-up, and the graceful drain —
 * readiness turns 503 at once, new connections are refused after the grace, in-flight requests run to the drain
 * deadline, and whatever is left is ended and counted.
 */
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/load.js';
import type { Exchange } from '../proxy/exchange.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import { within } from '../util/within.js';

export interface LifecycleDeps {
  readonly app: FastifyInstance;
  readonly config: Config;
  readonly upstreams: UpstreamRegistry;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  readonly now: () => number;
}

export interface Lifecycle {
  /** Starts health checks and discovery, then listens; resolves to the base URL. */
  listen(): Promise<string>;
  drain(): Promise<void>;
  close(): Promise<void>;
  /** Logical requests in progress. */
  readonly inflight: number;
  track(exchange: Exchange): void;
  /** The exchange holds nothing any more. */
  done(exchange: Exchange): void;
  /** The listener is closed: requests on connections still open are refused. */
  readonly closing: boolean;
}

export function createLifecycle(deps: LifecycleDeps): Lifecycle {
  const { app, config, upstreams, metrics, logger, now } = deps;
  const exchanges = new Set<Exchange>();
  let draining = false;
  let closing = false;
  /** Drain or close, whichever came first: both end in the same closed state, once. */
  let stopping: Promise<void> | undefined;
  let allDone: (() => void) | undefined;

  app.get('/healthz', (_request, reply) => {
    void reply.send({ status: 'ok' });
  });

  app.get('/readyz', (_request, reply) => {
    const at = now();
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

  app.get('/metrics', async (request, reply) => {
    const { contentType, body } = await metrics.scrape(request.headers.accept);
    void reply.type(contentType).send(body);
  });

  async function drainAndClose(): Promise<void> {
    draining = true;
    logger.info({ inflight: exchanges.size, graceMs: config.shutdown.graceMs }, 'draining: not ready; still serving during the grace period');
    await new Promise((resolve) => setTimeout(resolve, config.shutdown.graceMs));
    // Stops accepting connections; requests already in flight go on (fastify answers new ones on open
    // keep-alive connections with 503).
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
    await upstreams.close();
    logger.info('drained');
  }

  return {
    async listen() {
      await upstreams.start();
      metrics.declareModels(upstreams.models(), config.metrics.promptLenClasses);
      return app.listen({ host: config.server.host, port: config.server.port });
    },
    drain() {
      stopping ??= drainAndClose();
      return stopping;
    },
    close() {
      stopping ??= (async () => {
        await app.close();
        await upstreams.close();
      })();
      return stopping;
    },
    get inflight() {
      return exchanges.size;
    },
    get closing() {
      return closing;
    },
    track(exchange) {
      exchanges.add(exchange);
    },
    done(exchange) {
      exchanges.delete(exchange);
      if (exchanges.size === 0) allDone?.();
    },
  };
}
