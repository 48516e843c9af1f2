/**
 * What the gateway asks of every request before any route runs: Fastify's options (header size and time, request
 * ids, no per-request logging), the connection limit, the body reader, and the error and not-found handlers — each
 * answering in OpenAI's shape and counting the request once.
 */
import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import type { Server } from 'node:http';
import { LogController, type FastifyBaseLogger, type FastifyError, type FastifyHttpOptions, type FastifyInstance, type FastifyRequest } from 'fastify';
import type { Config } from '../config/load.js';
import { errorBody, type ErrorCode } from '../delivery/errors.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import { routeOf, type Answers } from './answers.js';
import { BodyAbandoned, BodyError, readFormBody, readJsonBody } from './body.js';
import type { Generation } from './generation.js';
import { requestlessLogger } from './fastify-logger.js';
import { UNAUTHENTICATED } from '../accounting/outcomes.js';

declare module 'fastify' {
  interface FastifyRequest {
    arrivalAt: number;
    /** The client's tenant (auth.ts): a configured name, `_anonymous`, or `_unauthenticated`. */
    tenant: string;
  }
}

/** A client request id we keep: a safe token, so it can go into logs and upstream headers as it is. */
const SAFE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

const BODYLESS = new Set(['responses_retrieve', 'responses_cancel', 'passthrough']);

const FASTIFY_ERRORS: Record<string, ErrorCode> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'body_too_large',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalid_request',
};

export function fastifyOptions(config: Config, logger: FastifyBaseLogger, answers: Answers): FastifyHttpOptions<Server> {
  return {
    loggerInstance: requestlessLogger(logger),
    // One wide log line per logical request comes from the ledger, not fastify's per-request pair.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: config.server.body_limit_bytes,
    http: {
      maxHeaderSize: config.server.max_header_bytes,
      headersTimeout: config.server.headers_timeout,
      // Node checks its header deadline on this interval: 30 s by default, far coarser than the deadline.
      connectionsCheckingInterval: Math.min(1000, config.server.headers_timeout),
    },
    clientErrorHandler: (error: NodeJS.ErrnoException, socket: Socket) => answers.onClientError(error, socket),
    requestIdHeader: false,
    // Fastify answers a path parameter longer than this itself (414, its own shape, uncounted): let the request line's
    // own limit bound it, and the route refuse an id that is not a plain token (404, counted).
    routerOptions: { maxParamLength: config.server.max_header_bytes },
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && SAFE_REQUEST_ID.test(given) ? given : randomUUID();
    },
    // Streams can last many minutes; Waybill's own clocks bound them. The body has its own deadline (body.ts).
    requestTimeout: 0,
    // Waybill answers requests during the drain itself (front door), in OpenAI's shape and counted.
    return503OnClosing: false,
  };
}

export interface FrontDoorDeps {
  /** The configuration the listener started with: its server.* settings change only with a restart. */
  readonly config: Config;
  /** The generation in force: each request takes it once, on arrival, and keeps it (request.generation). */
  readonly current: () => Generation;
  readonly answers: Answers;
  readonly guard: ObserverGuard;
  readonly now: () => number;
  /** The drain closed the listener: requests still arriving on open connections get 503 shutting_down. */
  readonly closing: () => boolean;
}

export function installFrontDoor(app: FastifyInstance, deps: FrontDoorDeps): void {
  const { config, answers, guard, now, closing, current } = deps;
  app.decorateRequest('arrivalAt', 0);
  app.decorateRequest('tenant', UNAUTHENTICATED);
  // Set on every request by the hook below, before any handler; a placeholder until then.
  app.decorateRequest('generation', null as unknown as Generation);

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
    // Read once: the request's keys, limits and upstreams are those of the configuration in force now, to its end.
    const generation = current();
    request.generation = generation;
    generation.hold();
    // `on` and a flag, not `once`: `once`'s wrapper and its removal at the close cost ~3k instructions per request.
    let holding = true;
    reply.raw.on('close', () => {
      if (!holding) return;
      holding = false;
      generation.release();
    });
    const identity = generation.authenticate(request.headers);
    request.tenant = identity.tenant;
    if (overLimit.has(request.raw.socket)) {
      void reply.header('connection', 'close');
      const message = `more than ${config.server.max_connections} open connections; retry later`;
      answers.reject(request, reply, routeOf(request), false, errorBody('too_many_connections', message));
      return;
    }
    if (closing()) {
      // Fastify's own return503OnClosing would answer in its shape, uncounted.
      void reply.header('connection', 'close');
      answers.reject(request, reply, routeOf(request), false, errorBody('shutting_down', 'the gateway is shutting down; retry the request'));
      return;
    }
    // The API needs a key (where keys are configured); operational endpoints and unknown paths do not.
    if (!identity.ok && (request.routeOptions.config.waybillRoute !== undefined || request.routeOptions.url === '/v1/models')) {
      // Answered before the body is read: the connection closes after the answer, so the unread body is no request.
      void reply.header('www-authenticate', 'Bearer').header('connection', 'close');
      answers.reject(request, reply, routeOf(request), false, errorBody('invalid_api_key', identity.message));
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
      // Routes that need no body accept an empty one labelled JSON (a client's POST …/cancel).
      BODYLESS.has(request.routeOptions.config.waybillRoute ?? '_other'),
    ),
  );
  // The audio routes' uploads: their own size limit; any other route refuses a form (415).
  app.addContentTypeParser('multipart/form-data', async (request: FastifyRequest) => {
    // Only the audio routes take a form: any other route refuses it before a byte is read (its body limit is not
    // the upload limit), and the connection is closed, since the unread body follows.
    const route = request.routeOptions.config.waybillRoute;
    if (route !== 'transcriptions' && route !== 'translations') {
      throw new BodyError('unsupported_media_type', 'send the request as application/json', true);
    }
    return readFormBody(
      request.raw,
      { maxBytes: config.server.max_upload_bytes, readTimeoutMs: config.server.read_timeout, maxDepth: config.server.max_json_depth },
      config.server.read_timeout - (now() - request.arrivalAt),
    );
  });

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const route = routeOf(request);
    if (error instanceof BodyAbandoned) {
      // The body never arrived whole. Either Node's parser refused it (a cut or malformed body: already answered
      // on the socket, counted here with that status), or the client reset the connection: a cancellation, with
      // nobody left to answer.
      answers.record(answers.startOf(request, route, false), answers.refusedWith(request.raw.socket) ?? 'cancelled');
      void reply.hijack();
      reply.raw.destroy();
      return;
    }
    if (error instanceof BodyError) {
      if (error.close) void reply.header('connection', 'close');
      answers.reject(request, reply, route, false, errorBody(error.code, error.message));
      return;
    }
    const code: ErrorCode = FASTIFY_ERRORS[error.code] ?? (error.statusCode === 400 ? 'invalid_request' : 'internal_error');
    if (code === 'internal_error') guard.report('http', error);
    answers.reject(request, reply, route, false, errorBody(code, code === 'internal_error' ? 'internal error' : error.message));
  });

  app.setNotFoundHandler((request, reply) => {
    answers.reject(request, reply, '_other', false, errorBody('not_found', `no route for ${request.method} ${request.url.split('?')[0] ?? ''}`));
  });
}
