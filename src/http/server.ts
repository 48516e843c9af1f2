/**
 * The HTTP surface: routes, body limits and OpenAI-shaped errors. No accounting happens here; a completion
 * request is checked, then handed to an Exchange (proxy/) that owns the raw response.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { RequestLedger, type Settlement } from '../accounting/ledger.js';
import { OTHER, type ProxiedRoute, type Route } from '../accounting/outcomes.js';
import { requestInfo, type Config } from '../config/load.js';
import { Exchange, type ExchangeDeps } from '../proxy/exchange.js';
import { upstreamHeaders } from '../proxy/headers.js';
import { UpstreamRegistry } from '../proxy/upstreams.js';
import { createLogger } from '../telemetry/logger.js';
import { GatewayMetrics } from '../telemetry/metrics.js';
import { ObserverGuard } from '../telemetry/guard.js';
import { NO_TRACE, startRequestTrace, type RequestTrace } from '../telemetry/request-trace.js';
import { createSettlementRecorder } from '../telemetry/settlement.js';
import { disabledTracing, type Tracing } from '../telemetry/tracing.js';
import { isRecord } from '../util/json.js';
import { within } from '../util/within.js';
import { BodyAbandoned, BodyError, readJsonBody, type ParsedBody } from './body.js';
import { checkCompletion, withUsageRequested } from './completions.js';
import { ERRORS, errorBody, type ErrorBody, type ErrorCode } from '../delivery/errors.js';

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

const ROUTE_PATHS: Record<ProxiedRoute, string> = { chat_completions: '/v1/chat/completions', completions: '/v1/completions' };

const ROUTES: ReadonlyMap<string, ProxiedRoute> = new Map(
  Object.entries(ROUTE_PATHS).map(([route, path]) => [path, route as ProxiedRoute]),
);

/** A client request id we keep: a safe token, so it can go into logs and upstream headers as it is. */
const SAFE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

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

/** Node's HTTP-level refusals (before any route): the code Waybill answers each with. */
function clientErrorCode(error: NodeJS.ErrnoException): ErrorCode {
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') return 'request_timeout';
  if (error.code === 'HPE_HEADER_OVERFLOW') return 'headers_too_large';
  return 'bad_request';
}

/** A whole HTTP/1.1 error response in bytes, for a socket no request object owns. */
function rawErrorResponse(code: ErrorCode, message: string): string {
  const status = ERRORS[code].status;
  const body = JSON.stringify(errorBody(code, message));
  return `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? 'Error'}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

const STATUS_TEXT: Record<number, string> = { 400: 'Bad Request', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' };

/** What Node's HTTP server keeps of the response in flight on a socket (undocumented, stable since Node 0.x). */
type SocketWithResponse = Socket & { _httpMessage?: ServerResponse };

export function createGateway(config: Config, options: GatewayOptions = {}): Gateway {
  const logger = options.logger ?? createLogger(config.logging);
  const tracing = options.tracing ?? disabledTracing();
  const tracer = tracing.enabled ? tracing.tracer : undefined;
  const metrics = new GatewayMetrics(config.metrics.buckets, { defaultMetrics: options.defaultMetrics ?? true });
  const random = options.random ?? Math.random;
  const upstreams = new UpstreamRegistry(config, logger.child({ component: 'upstreams' }), random, {
    onEjected: (upstream, reason) => metrics.upstreamEjected(upstream, reason),
    onProbeFailed: (upstream, probe) => metrics.probeFailed(upstream, probe),
  });
  const now = () => performance.now();
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
    wallNow: () => Date.now(),
    random,
    publish,
    guard,
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
    http: {
      maxHeaderSize: config.server.max_header_bytes,
      headersTimeout: config.server.headers_timeout,
      // Node checks its header deadline on this interval: 30 s by default, far coarser than the deadline.
      connectionsCheckingInterval: Math.min(1000, config.server.headers_timeout),
    },
    // Node's HTTP-level refusals (malformed request, header overflow, header timeout) answered in OpenAI's shape and
    // counted, like every other request.
    clientErrorHandler: (error: NodeJS.ErrnoException, socket: Socket) => onClientError(error, socket),
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

  // Connections past server.max_connections are answered (503, then closed) at their first request rather than
  // dropped unanswered at accept: every request gets an answer and a count.
  const overLimit = new WeakSet<Socket>();
  let connections = 0;
  app.server.on('connection', (socket: Socket) => {
    connections++;
    if (connections > config.server.max_connections) overLimit.add(socket);
    socket.once('close', () => connections--);
  });

  app.addHook('onRequest', (request, reply, done) => {
    request.arrivalAt = now();
    if (overLimit.has(request.raw.socket)) {
      void reply.header('connection', 'close');
      answerRejection(request, reply, routeOf(request), false, errorBody('too_many_connections', `more than ${config.server.max_connections} open connections; retry later`));
      return;
    }
    done();
  });

  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', async (request: FastifyRequest) =>
    readJsonBody(
      request.raw,
      { maxBytes: config.server.body_limit_bytes, readTimeoutMs: config.server.read_timeout, maxDepth: config.server.max_json_depth },
      config.server.read_timeout - (now() - request.arrivalAt),
    ),
  );

  const sendError = (reply: FastifyReply, status: number, body: ErrorBody) => {
    void reply.code(status).header('x-request-id', reply.request.id).type('application/json').send(body);
  };

  /**
   * A request the gateway answered itself still counts as one logical request: metrics, log line, and a span for
   * the proxied routes. `cancelled`: the client left before it could be answered.
   */
  const recordAnswered = (
    start: { route: Route; stream: boolean; requestId: string; arrivalAt: number; headers: IncomingHttpHeaders; body: unknown; model?: unknown },
    status: number | 'cancelled',
  ) => {
    const model = typeof start.model === 'string' && upstreams.poolFor(start.model) !== undefined ? start.model : OTHER;
    const route = start.route;
    let trace: RequestTrace = NO_TRACE;
    if (route !== '_other') {
      trace = guard.trace(
        guard.run(
          'tracing',
          () =>
            startRequestTrace(
              tracer,
              start.headers,
              {
                route,
                path: ROUTE_PATHS[route],
                model,
                stream: start.stream,
                requestId: start.requestId,
                arrivalAt: start.arrivalAt,
                body: isRecord(start.body) ? start.body : {},
              },
              config.tracing.captureContent,
            ),
          NO_TRACE,
        ),
      );
    }
    // A rejection's SLO result (excluded, or failed for 429/503) does not depend on thresholds.
    const ledger = new RequestLedger(
      requestInfo(config, { model, route, stream: start.stream, expectedChoices: 1, dropUsageChunk: false }),
      start.arrivalAt,
    );
    const at = now();
    if (status === 'cancelled') ledger.clientCancelled(at);
    else ledger.reject(status);
    publish(ledger.settle(at), start.requestId, trace, false, at);
  };

  const answerRejection = (request: FastifyRequest, reply: FastifyReply, route: Route, stream: boolean, body: ErrorBody, model?: unknown) => {
    const status = ERRORS[body.error.code as ErrorCode]?.status ?? 400;
    recordAnswered(requestStart(request, route, stream, model), status);
    sendError(reply, status, body);
  };

  const requestStart = (request: FastifyRequest, route: Route, stream: boolean, model?: unknown) => ({
    route,
    stream,
    model,
    requestId: request.id,
    arrivalAt: request.arrivalAt,
    headers: request.headers,
    body: (request.body as ParsedBody | undefined)?.json,
  });

  function onClientError(error: NodeJS.ErrnoException, socket: Socket): void {
    // A connection reset before a whole request arrived: no request, nobody to answer.
    if (error.code === 'ECONNRESET' || socket.destroyed) {
      socket.destroy();
      return;
    }
    const code = clientErrorCode(error);
    const inFlight = (socket as SocketWithResponse)._httpMessage;
    // Node's own rule: answer only where no response of an earlier request has started on this socket.
    if (socket.writable && (inFlight === undefined || !inFlight.headersSent)) {
      const message =
        code === 'request_timeout'
          ? `the request headers did not arrive within ${config.server.headers_timeout} ms`
          : code === 'headers_too_large'
            ? `the request headers are larger than ${config.server.max_header_bytes} bytes`
            : 'the request is not valid HTTP';
      socket.end(rawErrorResponse(code, message));
    }
    socket.destroySoon();
    const at = now();
    guard.run('http', () =>
      recordAnswered({ route: '_other', stream: false, requestId: randomUUID(), arrivalAt: at, headers: {}, body: undefined }, ERRORS[code].status),
    );
  }

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const route = routeOf(request);
    if (error instanceof BodyAbandoned) {
      // The client left while sending its body: a cancellation, with nobody left to answer.
      recordAnswered(requestStart(request, route, false), 'cancelled');
      void reply.hijack();
      reply.raw.destroy();
      return;
    }
    if (error instanceof BodyError) {
      if (error.close) void reply.header('connection', 'close');
      answerRejection(request, reply, route, false, errorBody(error.code, error.message));
      return;
    }
    const code: ErrorCode = FASTIFY_ERRORS[error.code] ?? (error.statusCode === 400 ? 'invalid_request' : 'internal_error');
    if (code === 'internal_error') guard.report('http', error);
    answerRejection(request, reply, route, false, errorBody(code, code === 'internal_error' ? 'internal error' : error.message));
  });

  app.setNotFoundHandler((request, reply) => {
    answerRejection(request, reply, '_other', false, errorBody('not_found', `no route for ${request.method} ${request.url.split('?')[0] ?? ''}`));
  });

  for (const [apiPath, route] of ROUTES) {
    app.post(apiPath, (request, reply) => {
      const parsed = request.body as ParsedBody | undefined;
      if (parsed === undefined) {
        answerRejection(request, reply, route, false, errorBody('unsupported_media_type', 'send the request as application/json'));
        return;
      }
      const checked = checkCompletion(route, parsed.json, config.server.max_choices);
      if (!checked.ok) {
        answerRejection(request, reply, route, checked.stream, checked.body, (parsed.json as { model?: unknown } | null)?.model);
        return;
      }
      const fields = checked.fields;
      if (upstreams.poolFor(fields.model) === undefined) {
        answerRejection(request, reply, route, fields.stream, errorBody('model_not_found', `The model \`${fields.model}\` does not exist.`, 'model'));
        return;
      }
      const json = parsed.json as Record<string, unknown>;
      const withUsage = fields.stream && config.streaming.injectUsage && !fields.clientAskedUsage ? withUsageRequested(parsed.raw, json) : undefined;
      const trace = guard.trace(
        guard.run(
          'tracing',
          () =>
            startRequestTrace(
              tracer,
              request.headers,
              { route, path: apiPath, model: fields.model, stream: fields.stream, requestId: request.id, arrivalAt: request.arrivalAt, body: json },
              config.tracing.captureContent,
            ),
          NO_TRACE,
        ),
      );
      const completion = {
        route,
        apiPath,
        model: fields.model,
        stream: fields.stream,
        body: withUsage ?? parsed.raw,
        expectedChoices: fields.expectedChoices,
        dropUsageChunk: withUsage !== undefined,
        requestId: request.id,
        headers: upstreamHeaders(request.headers, request.id, fields.stream, tracer === undefined),
        arrivalAt: request.arrivalAt,
        trace,
      };
      void reply.hijack();
      let exchange: Exchange;
      try {
        exchange = new Exchange(exchangeDeps, completion, reply.raw);
      } catch (error) {
        // Nothing was started: answered and counted here, once. (Once started, the exchange guards itself.)
        guard.report('exchange', error);
        answerRaw(reply.raw, request.id, 500, errorBody('internal_error', 'internal error'));
        recordAnswered(requestStart(request, route, fields.stream, fields.model), 500);
        return;
      }
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

function routeOf(request: FastifyRequest): Route {
  return request.method === 'POST' ? (ROUTES.get(request.routeOptions.url ?? '') ?? '_other') : '_other';
}

/** An error answer on a hijacked response; a client already gone is simply not answered. */
function answerRaw(res: ServerResponse, requestId: string, status: number, body: ErrorBody): void {
  if (res.headersSent || res.destroyed) return;
  const payload = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': payload.length, 'x-request-id': requestId });
  res.end(payload);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
