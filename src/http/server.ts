/**
 * The HTTP surface: routes, body limits and OpenAI-shaped errors. No accounting happens here; a completion
 * request is checked, then handed to an Exchange (proxy/) that owns the raw response.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { pino, type Logger } from 'pino';
import { RequestLedger, type Settlement } from '../accounting/ledger.js';
import { OTHER, type Route } from '../accounting/outcomes.js';
import type { Config } from '../config/load.js';
import { Exchange } from '../proxy/exchange.js';
import { upstreamHeaders } from '../proxy/headers.js';
import { UpstreamRegistry } from '../proxy/upstreams.js';
import { GatewayMetrics } from '../telemetry/metrics.js';
import { checkCompletion, withUsageRequested } from './completions.js';
import { errorBody, type ErrorBody, type ErrorCode } from './errors.js';

export interface GatewayOptions {
  logger?: Logger;
  /** Called with every settled logical request. */
  onSettled?: (settlement: Settlement, requestId: string) => void;
  /** prom-client's process and Node.js metrics (default on). */
  defaultMetrics?: boolean;
}

export interface Gateway {
  readonly app: FastifyInstance;
  readonly metrics: GatewayMetrics;
  readonly upstreams: UpstreamRegistry;
  /** Starts health checks and discovery, then listens; resolves to the base URL. */
  listen(): Promise<string>;
  close(): Promise<void>;
}

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
  const logger = options.logger ?? pino({ level: config.logging.level, base: { service: 'waybill' } });
  const metrics = new GatewayMetrics(config.metrics.buckets, { defaultMetrics: options.defaultMetrics ?? true });
  const upstreams = new UpstreamRegistry(config, logger.child({ component: 'upstreams' }));
  const now = () => performance.now();
  // Typed as fastify's logger so the instance keeps fastify's default generics.
  const fastifyLogger: FastifyBaseLogger = logger;

  const app = Fastify({
    loggerInstance: fastifyLogger,
    // One wide log line per logical request comes from the ledger, not fastify's per-request pair.
    logController: new LogController({ disableRequestLogging: true }),
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

  /** A completion request the gateway answered itself still counts as one logical request. */
  const recordRejection = (request: FastifyRequest, route: Route, stream: boolean, status: number, model?: unknown) => {
    const ledger = new RequestLedger(
      {
        model: typeof model === 'string' && upstreams.poolFor(model) !== undefined ? model : OTHER,
        route,
        stream,
        expectedChoices: 1,
        dropUsageChunk: false,
        slo: config.slo.defaults,
        promptLenBoundaries: config.metrics.promptLenBoundaries,
        promptLenClasses: config.metrics.promptLenClasses,
      },
      request.arrivalAt,
    );
    ledger.reject(status);
    const settlement = ledger.settle(now());
    metrics.record(settlement, false);
    options.onSettled?.(settlement, request.id);
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
      void reply.hijack();
      new Exchange(
        { config, upstreams, metrics, logger, now, ...(options.onSettled ? { onSettled: options.onSettled } : {}) },
        {
          route: target.route,
          apiPath: target.apiPath,
          model: fields.model,
          stream: fields.stream,
          body: injectUsage ? withUsageRequested(parsed.raw, parsed.json as Record<string, unknown>) : parsed.raw,
          expectedChoices: fields.expectedChoices,
          dropUsageChunk: injectUsage,
          requestId: request.id,
          headers: upstreamHeaders(request.headers, request.id, fields.stream),
          arrivalAt: request.arrivalAt,
        },
        reply.raw,
      ).start();
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
    const ready = upstreams.isReady();
    void reply.code(ready ? 200 : 503).send({
      status: ready ? 'ready' : 'not_ready',
      pools: upstreams.pools.map((pool) => ({
        name: pool.config.name,
        models: pool.models,
        upstreams: pool.upstreams.map((u) => ({ name: u.name, healthy: u.healthy ?? null })),
      })),
    });
  });

  app.get('/metrics', async (_request, reply) => {
    const text = await metrics.registry.metrics();
    void reply.type(metrics.registry.contentType).send(text);
  });

  return {
    app,
    metrics,
    upstreams,
    async listen() {
      await upstreams.start();
      metrics.declareModels(upstreams.models());
      return app.listen({ host: config.server.host, port: config.server.port });
    },
    async close() {
      await app.close();
      await upstreams.close();
    },
  };
}
