/**
 * The HTTP surface: routes, body limits and OpenAI-shaped errors. No accounting happens here; a completion
 * request is checked, then handed to an Exchange (proxy/) that owns the raw response.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { RequestLedger, type Settlement } from '../accounting/ledger.js';
import { OTHER, type Route } from '../accounting/outcomes.js';
import type { Config } from '../config/load.js';
import { Exchange, ledgerInfo, publishSettlement, type ExchangeDeps } from '../proxy/exchange.js';
import { upstreamHeaders } from '../proxy/headers.js';
import { UpstreamRegistry } from '../proxy/upstreams.js';
import { createLogger } from '../telemetry/logger.js';
import { GatewayMetrics } from '../telemetry/metrics.js';
import { startRequestTrace } from '../telemetry/request-trace.js';
import { disabledTracing, type Tracing } from '../telemetry/tracing.js';
import { isRecord } from '../sse/classify.js';
import { within } from '../util/within.js';
import { checkCompletion, withUsageRequested } from './completions.js';
import { errorBody, type ErrorBody, type ErrorCode } from './errors.js';

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
  /** Starts health checks and discovery, then listens; resolves to the base URL. */
  listen(): Promise<string>;
  /**
   * Graceful shutdown: /readyz turns 503 at once; after `shutdown.grace` new connections are refused; in-flight
   * requests run up to `shutdown.drain_timeout`, then whatever is left is ended and counted; then everything closes.
   */
  drain(): Promise<void>;
  /** Logical requests in progress. */
  readonly inflight: number;
  close(): Promise<void>;
}

const ROUTE_PATHS: Record<Route, string> = { chat_completions: '/v1/chat/completions', completions: '/v1/completions' };

const ROUTES: Record<string, { route: Route; apiPath: string }> = {
  '/v1/chat/completions': { route: 'chat_completions', apiPath: '/v1/chat/completions' },
  '/v1/completions': { route: 'completions', apiPath: '/v1/completions' },
};

/** A client request id we keep: a safe token, so it can go into logs and upstream headers as it is. */
const SAFE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

interface ParsedBody {
  raw: Buffer;
  json: unknown;
}

declare module 'fastify' {
  interface FastifyRequest {
    arrivalAt: number;
  }
}

const FASTIFY_ERRORS: Record<string, ErrorCode> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'body_too_large',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalid_request',
};

export function createGateway(config: Config, options: GatewayOptions = {}): Gateway {
  const logger = options.logger ?? createLogger(config.logging);
  const tracing = options.tracing ?? disabledTracing();
  const tracer = tracing.enabled ? tracing.tracer : undefined;
  const metrics = new GatewayMetrics(config.metrics.buckets, { defaultMetrics: options.defaultMetrics ?? true });
  const random = options.random ?? Math.random;
  const upstreams = new UpstreamRegistry(config, logger.child({ component: 'upstreams' }), random, {
    onEjected: (upstream, reason) => metrics.upstreamEjected(upstream, reason),
  });
  const now = () => performance.now();
  metrics.observe({
    *upstreams() {
      const at = now();
      for (const upstream of upstreams.upstreams) yield { name: upstream.name, up: upstream.isUp(at), inflight: upstream.inflight };
    },
    queues: () => upstreams.queues(),
  });
  const exchanges = new Set<Exchange>();
  let draining = false;
  /** Drain or close, whichever came first: both end in the same closed state, once. */
  let stopping: Promise<void> | undefined;
  let allDone: (() => void) | undefined;
  const exchangeDeps: ExchangeDeps = {
    config,
    upstreams,
    metrics,
    logger,
    now,
    random,
    ...(options.onSettled ? { onSettled: options.onSettled } : {}),
    onDone: (exchange) => {
      exchanges.delete(exchange);
      if (exchanges.size === 0) allDone?.();
    },
  };
  // Typed as fastify's logger so the instance keeps fastify's default generics.
  const fastifyLogger: FastifyBaseLogger = logger;

  const app = Fastify({
    loggerInstance: fastifyLogger,
    // One wide log line per logical request comes from the ledger, not fastify's per-request pair.
    logController: new LogController({ disableRequestLogging: true }),
    // Fastify would make a child logger per request; Waybill logs per request once, from the ledger, with the id.
    childLoggerFactory: (parent) => parent,
    bodyLimit: config.server.body_limit_bytes,
    requestIdHeader: false,
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && SAFE_REQUEST_ID.test(given) ? given : randomUUID();
    },
    // Streams can last many minutes; Waybill's own clocks bound them.
    requestTimeout: 0,
    return503OnClosing: true,
  });
  app.decorateRequest('arrivalAt', 0);
  app.addHook('onRequest', (request, _reply, done) => {
    request.arrivalAt = now();
    done();
  });

  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, buffer: Buffer, done) => {
    try {
      done(null, { raw: buffer, json: JSON.parse(buffer.toString('utf8')) } satisfies ParsedBody);
    } catch {
      const error = new Error('the request body is not valid JSON') as FastifyError;
      error.code = 'WAYBILL_INVALID_JSON';
      error.statusCode = 400;
      done(error, undefined);
    }
  });

  const sendError = (reply: FastifyReply, status: number, body: ErrorBody) => {
    void reply.code(status).header('x-request-id', reply.request.id).type('application/json').send(body);
  };

  /** A completion request the gateway answered itself still counts as one logical request: metrics, span, log. */
  const recordRejection = (request: FastifyRequest, route: Route, stream: boolean, status: number, model?: unknown) => {
    const label = typeof model === 'string' && upstreams.poolFor(model) !== undefined ? model : OTHER;
    const body = (request.body as ParsedBody | undefined)?.json;
    const trace = startRequestTrace(
      tracer,
      request.headers,
      {
        route,
        path: ROUTE_PATHS[route],
        model: label,
        stream,
        requestId: request.id,
        arrivalAt: request.arrivalAt,
        body: isRecord(body) ? body : {},
      },
      config.tracing.captureContent,
    );
    // A rejection's SLO result (excluded, or failed for 429/503) does not depend on thresholds.
    const ledger = new RequestLedger(
      ledgerInfo(config, { model: label, route, stream, expectedChoices: 1, dropUsageChunk: false }),
      request.arrivalAt,
    );
    ledger.reject(status);
    const at = now();
    publishSettlement(exchangeDeps, ledger.settle(at), request.id, trace, false, at);
  };

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const code: ErrorCode =
      error.code === 'WAYBILL_INVALID_JSON' ? 'invalid_json' : (FASTIFY_ERRORS[error.code] ?? (error.statusCode === 400 ? 'invalid_request' : 'internal_error'));
    const status = code === 'internal_error' ? 500 : (error.statusCode ?? 400);
    if (code === 'internal_error') request.log.error({ err: error }, 'unhandled error');
    const target = ROUTES[request.routeOptions.url ?? ''];
    if (target !== undefined && request.method === 'POST') recordRejection(request, target.route, false, status);
    sendError(reply, status, errorBody(code, code === 'internal_error' ? 'internal error' : error.message));
  });

  app.setNotFoundHandler((request, reply) => {
    sendError(reply, 404, errorBody('not_found', `no route for ${request.method} ${request.url.split('?')[0] ?? ''}`));
  });

  for (const [url, target] of Object.entries(ROUTES)) {
    app.post(url, (request, reply) => {
      const parsed = request.body as ParsedBody | undefined;
      if (parsed === undefined) {
        recordRejection(request, target.route, false, 415);
        sendError(reply, 415, errorBody('unsupported_media_type', 'send the request as application/json'));
        return;
      }
      const checked = checkCompletion(target.route, parsed.json);
      if (!checked.ok) {
        const named = (parsed.json as { model?: unknown } | null)?.model;
        recordRejection(request, target.route, checked.stream, checked.status, named);
        sendError(reply, checked.status, checked.body);
        return;
      }
      const fields = checked.fields;
      if (upstreams.poolFor(fields.model) === undefined) {
        recordRejection(request, target.route, fields.stream, 404);
        sendError(reply, 404, errorBody('model_not_found', `The model \`${fields.model}\` does not exist.`, 'model'));
        return;
      }
      const injectUsage = fields.stream && config.streaming.injectUsage && !fields.clientAskedUsage;
      const trace = startRequestTrace(
        tracer,
        request.headers,
        {
          route: target.route,
          path: target.apiPath,
          model: fields.model,
          stream: fields.stream,
          requestId: request.id,
          arrivalAt: request.arrivalAt,
          body: parsed.json as Record<string, unknown>,
        },
        config.tracing.captureContent,
      );
      void reply.hijack();
      const exchange = new Exchange(
        exchangeDeps,
        {
          route: target.route,
          apiPath: target.apiPath,
          model: fields.model,
          stream: fields.stream,
          body: injectUsage ? withUsageRequested(parsed.raw, parsed.json as Record<string, unknown>) : parsed.raw,
          expectedChoices: fields.expectedChoices,
          dropUsageChunk: injectUsage,
          requestId: request.id,
          headers: upstreamHeaders(request.headers, request.id, fields.stream, tracer === undefined),
          arrivalAt: request.arrivalAt,
          trace,
        },
        reply.raw,
      );
      exchanges.add(exchange);
      exchange.start();
    });
  }

  app.get('/v1/models', (_request, reply) => {
    const created = Math.floor(Date.now() / 1000);
    void reply.send({
      object: 'list',
      data: upstreams.models().map((id) => ({ id, object: 'model', created, owned_by: 'waybill' })),
    });
  });

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
        upstreams: pool.upstreams.map((u) => ({
          name: u.name,
          healthy: u.healthy ?? null,
          circuit: u.breaker.state(at),
          inflight: u.inflight,
        })),
      })),
    });
  });

  app.get('/metrics', async (request, reply) => {
    const { contentType, body } = await metrics.scrape(request.headers.accept);
    void reply.type(contentType).send(body);
  });

  return {
    app,
    metrics,
    upstreams,
    async listen() {
      await upstreams.start();
      metrics.declareModels(upstreams.models(), config.metrics.promptLenClasses);
      return app.listen({ host: config.server.host, port: config.server.port });
    },
    get inflight() {
      return exchanges.size;
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
  };

  async function drainAndClose(): Promise<void> {
    draining = true;
    logger.info({ inflight: exchanges.size, graceMs: config.shutdown.graceMs }, 'draining: not ready; still serving during the grace period');
    await sleep(config.shutdown.graceMs);
    // Stops accepting connections; requests already in flight go on (fastify answers new ones on open
    // keep-alive connections with 503).
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
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
