/**
 * Requests the gateway answers itself — bad bodies, unknown models and routes, limits, Node's HTTP-level refusals —
 * still count as one logical request each: metrics, the wide log line, and a span for the proxied routes.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Tracer } from '@opentelemetry/api';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { ANONYMOUS, OTHER, UNAUTHENTICATED, type ProxiedRoute, type Route } from '../accounting/outcomes.js';
import { cancelledRecord, rejectedRecord, settle } from '../accounting/settle.js';
import type { Config } from '../config/load.js';
import { requestInfo } from '../proxy/request-facts.js';
import { ERRORS, errorBody, errorBodyFor, type ErrorBody, type ErrorCode } from '../delivery/errors.js';
import type { UpstreamRegistry } from '../proxy/upstreams.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import { NO_TRACE, startRequestTrace, type RequestTrace } from '../telemetry/request-trace.js';
import type { PublishSettlement } from '../telemetry/settlement.js';
import { isRecord } from '../util/json.js';
import type { ParsedBody } from './body.js';
import { clientRetryOf } from './client-retry.js';

/**
 * Every JSON API path Waybill serves with POST, with its `route` label; the upstream path is the same
 * (docs/routes.md). Several paths may share a route: vLLM serves scoring and reranking under aliases.
 */
export const API_PATHS: ReadonlyArray<readonly [path: string, route: ProxiedRoute]> = [
  ['/v1/chat/completions', 'chat_completions'],
  ['/v1/completions', 'completions'],
  ['/v1/responses', 'responses'],
  ['/v1/messages', 'messages'],
  ['/v1/messages/count_tokens', 'count_tokens'],
  ['/v1/embeddings', 'embeddings'],
  ['/pooling', 'pooling'],
  ['/classify', 'classify'],
  ['/score', 'score'],
  ['/v1/score', 'score'],
  ['/rerank', 'rerank'],
  ['/v1/rerank', 'rerank'],
  ['/v2/rerank', 'rerank'],
  ['/tokenize', 'tokenize'],
  ['/detokenize', 'detokenize'],
];

/** The multipart (audio) paths, POST. */
export const FORM_PATHS: ReadonlyArray<readonly [path: string, route: 'transcriptions' | 'translations']> = [
  ['/v1/audio/transcriptions', 'transcriptions'],
  ['/v1/audio/translations', 'translations'],
];

declare module 'fastify' {
  interface FastifyContextConfig {
    /** The `route` label of every request this Fastify route serves. */
    waybillRoute?: ProxiedRoute;
  }
}

/** The `route` label of a request: the proxied route it matched (method and path), else `_other`. */
export function routeOf(request: FastifyRequest): Route {
  return request.routeOptions.config.waybillRoute ?? '_other';
}

export interface AnsweredStart {
  readonly route: Route;
  /** The client's tenant label value. */
  readonly tenant: string;
  readonly stream: boolean;
  readonly requestId: string;
  readonly arrivalAt: number;
  /** The path the client asked for. */
  readonly path: string;
  readonly headers: IncomingHttpHeaders;
  readonly body: unknown;
  /** The model the body named, if any: counted under it when it is served, else `_other`. */
  readonly model?: unknown;
}

export interface AnswersDeps {
  /** The configuration in force (it may be reloaded): read at each answer. */
  readonly config: Config;
  /** The upstreams of the configuration in force: read at each answer. */
  readonly upstreams: UpstreamRegistry;
  readonly tracer: Tracer | undefined;
  readonly guard: ObserverGuard;
  readonly publish: PublishSettlement;
  readonly now: () => number;
}

export interface Answers {
  /** Counts a request answered by the gateway with `status` (or abandoned by its client: 'cancelled'). */
  record(start: AnsweredStart, status: number | 'cancelled'): void;
  /** Answers with an OpenAI-shaped error and counts it. */
  reject(request: FastifyRequest, reply: FastifyReply, route: Route, stream: boolean, body: ErrorBody, model?: unknown): void;
  startOf(request: FastifyRequest, route: Route, stream: boolean, model?: unknown): AnsweredStart;
  /** Node's HTTP-level refusals (malformed request, header overflow, header timeout), answered and counted. */
  onClientError(error: NodeJS.ErrnoException, socket: Socket): void;
  /**
   * The status Node's parser refused this socket's request in flight with (a malformed or cut body), if it did:
   * that request is counted by its own path, with this status, rather than twice.
   */
  refusedWith(socket: Socket): number | undefined;
}

export function createAnswers(deps: AnswersDeps): Answers {
  // deps.config and deps.upstreams are read at each use: a reload replaces them.
  const { tracer, guard, publish, now } = deps;
  /** Sockets Node's parser already refused: it reports every later read of the same socket again. */
  const refused = new WeakMap<Socket, number>();

  const record = (start: AnsweredStart, status: number | 'cancelled') => {
    const model = typeof start.model === 'string' && deps.upstreams.poolFor(start.model) !== undefined ? start.model : OTHER;
    const route = start.route;
    let trace: RequestTrace = NO_TRACE;
    if (route !== '_other') {
      const started = guard.run(
        'tracing',
        () =>
          startRequestTrace(
            tracer,
            start.headers,
            {
              route,
              path: start.path,
              model,
              stream: start.stream,
              requestId: start.requestId,
              arrivalAt: start.arrivalAt,
              body: isRecord(start.body) ? start.body : {},
            },
            deps.config.tracing.captureContent,
          ),
        NO_TRACE,
      );
      trace = guard.trace(started);
    }
    // A rejection's SLO result (excluded, or failed for 429/503) does not depend on thresholds.
    const info = requestInfo(deps.config, { model, tenant: start.tenant, route, stream: start.stream, expectedChoices: 1, dropUsageChunk: false, clientRetry: clientRetryOf(start.headers) });
    const at = now();
    // Settled by the same function as a proxied request, from a record without attempts.
    const record = status === 'cancelled' ? cancelledRecord(info, start.arrivalAt, at) : rejectedRecord(info, start.arrivalAt, status);
    publish(settle(record, info, at), start.requestId, trace, undefined, at);
  };

  const startOf = (request: FastifyRequest, route: Route, stream: boolean, model?: unknown): AnsweredStart => ({
    route,
    tenant: request.tenant,
    stream,
    model,
    requestId: request.id,
    arrivalAt: request.arrivalAt,
    path: request.routeOptions.url ?? request.url,
    headers: request.headers,
    body: (request.body as ParsedBody | undefined)?.json,
  });

  return {
    record,
    startOf,
    reject(request, reply, route, stream, body, model) {
      const status = ERRORS[body.error.code as ErrorCode]?.status ?? 400;
      record(startOf(request, route, stream, model), status);
      sendError(reply, status, body, route);
    },
    refusedWith: (socket) => refused.get(socket),
    onClientError(error, socket) {
      // A connection reset before a whole request arrived: no request, nobody to answer. A socket already refused:
      // Node reports each later read of it again, and it was answered and counted once.
      if (error.code === 'ECONNRESET' || socket.destroyed || refused.has(socket)) {
        socket.destroy();
        return;
      }
      // A connection that never sent a byte (a client's pre-opened pool socket, a browser's preconnect) timing out
      // is no request: closed, not answered, not counted.
      if (socket.bytesRead === 0) {
        socket.destroy();
        return;
      }
      const code = clientErrorCode(error);
      const status = ERRORS[code].status;
      refused.set(socket, status);
      const inFlight = (socket as SocketWithResponse)._httpMessage;
      // Node's own rule: answer only where no response of an earlier request has started on this socket.
      // (Node sets it to null, not undefined, once the response on the socket is done.)
      if (socket.writable && (inFlight == null || !inFlight.headersSent)) {
        const message =
          code === 'request_timeout'
            ? `the request headers did not arrive within ${deps.config.server.headers_timeout} ms`
            : code === 'headers_too_large'
              ? `the request headers are larger than ${deps.config.server.max_header_bytes} bytes`
              : 'the request is not valid HTTP';
        // Closed once the answer is out: ending only the write side would leave the parser fed with more reads.
        socket.end(rawErrorResponse(code, message), () => socket.destroy());
      } else {
        socket.destroy();
      }
      // A request in flight on this socket (its body was being read) is counted by its own path, with this status.
      if (inFlight != null) return;
      const at = now();
      guard.run('http', () =>
        record(
          { route: '_other', tenant: deps.config.auth.required ? UNAUTHENTICATED : ANONYMOUS, stream: false, requestId: randomUUID(), arrivalAt: at, path: '', headers: {}, body: undefined },
          status,
        ),
      );
    },
  };
}

/** An error answer, in the route's shape (Anthropic's on `/v1/messages`, OpenAI's elsewhere). */
export function sendError(reply: FastifyReply, status: number, body: ErrorBody, route: Route = '_other'): void {
  void reply.code(status).header('x-request-id', reply.request.id).type('application/json').send(errorBodyFor(route, status, body));
}

/** An error answer on a hijacked response; a client already gone is simply not answered. */
export function answerRaw(res: ServerResponse, requestId: string, status: number, body: ErrorBody): void {
  if (res.headersSent || res.destroyed) return;
  const payload = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': payload.length, 'x-request-id': requestId });
  res.end(payload);
}

/** Node's HTTP-level refusals (before any route): the code Waybill answers each with. */
function clientErrorCode(error: NodeJS.ErrnoException): ErrorCode {
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') return 'request_timeout';
  if (error.code === 'HPE_HEADER_OVERFLOW') return 'headers_too_large';
  return 'bad_request';
}

const STATUS_TEXT: Record<number, string> = { 400: 'Bad Request', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' };

/** A whole HTTP/1.1 error response in bytes, for a socket no request object owns. */
function rawErrorResponse(code: ErrorCode, message: string): string {
  const status = ERRORS[code].status;
  const body = JSON.stringify(errorBody(code, message));
  return `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? 'Error'}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

/** What Node's HTTP server keeps of the response in flight on a socket (undocumented, stable since Node 0.x). */
type SocketWithResponse = Socket & { _httpMessage?: ServerResponse | null };
