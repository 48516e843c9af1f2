/**
 * The simulated vLLM: node:http directly (no framework), one timer per stream, so a two-core machine can
 * hold hundreds of concurrent streams. Routing, auth, validation and fault selection live here; the
 * answer itself is written by stream.ts or nonstream.ts.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import {
  appliesToNonStream,
  drawFault,
  NO_DIRECTIVES,
  parseFaultHeader,
  type Directives,
  type Fault,
  type FaultKind,
} from './faults.js';
import {
  audioBody,
  audioResponseId,
  audioRouteOf,
  createAudioSerializer,
  FORM_PARSE_ERROR_BODY,
  readAudioForm,
  readAudioRequest,
  type AudioRoute,
} from './audio.js';
import { appliesToBackground, startBackground, startReplay } from './background.js';
import { engineErrorInfo, startEventStream, type EventWriter } from './event-stream.js';
import { createMessagesWriter, messagesBody, messagesFailure, messagesStatusBody, readMessagesRequest } from './messages.js';
import { startNonStream, type NonStreamHooks, type NonStreamPlan } from './nonstream.js';
import { resolveSimOptions, type SimOptions } from './options.js';
import { prefillDelayMs, shapeAnswer } from './plan.js';
import { poolingResponseId, renderPoolingAnswer, type PoolingAnswer } from './pooling-answer.js';
import {
  badRequestBody,
  poolingRouteOf,
  poolingWork,
  readPoolingRequest,
  usesEngine,
  type PoolingRequest,
  type PoolingRoute,
  type PoolingWork,
} from './pooling-request.js';
import { createRandom, deriveSeed, type Random } from '../util/prng.js';
import { MAX_MODEL_LEN, readGenerationRequest, type GenerationRequest } from './request.js';
import { sendBody } from './respond.js';
import { ResponseStore, StoredResponse } from './response-store.js';
import { CANNOT_CANCEL_BODY, responseNotFoundBody, retrieveQuery, storedResponseId, storedRouteOf, type StoredRoute } from './stored-routes.js';
import {
  createResponsesWriter,
  randomId,
  readResponsesRequest,
  responsesBody,
  type EventRouteRefusal,
  type FinalResponseHook,
  type ResponsesAnswer,
  type StoreLookup,
} from './responses.js';
import { SimTokenizer } from './tokens.js';
import { engineFinishReason, isOperationalPath, renderMetrics, StatsStore, type OperationalPath, type RecordedHeaders, type RequestRecord, type RouteName, type SimStats } from './stats.js';
import { startStream, type StreamControl } from './stream.js';
import { createEngineCore, peakBlocks } from './engine/core.js';
import { EngineMetrics } from './engine/metrics.js';
import { EngineRuntime, type EngineJob, type SequenceInput } from './engine/runtime.js';
import type { EngineSnapshot } from './engine/types.js';
import type { Modifiers } from './faults.js';
import type { AnswerShape } from './plan.js';
import type { Usage } from './wire.js';
import {
  choiceText,
  completionBody,
  createChunkSerializer,
  errorBody,
  errorInfo,
  ENGINE_DEAD_MESSAGE,
  METHOD_NOT_ALLOWED_BODY,
  modelListBody,
  NOT_FOUND_BODY,
  statusBody,
  UNAUTHORIZED_BODY,
  type GenerationRoute,
} from './wire.js';

export type { SimOptions } from './options.js';
export type { FaultKind } from './faults.js';
export type { RequestEnd, RequestRecord, RouteName, SimStats } from './stats.js';

export interface Simulator {
  /** Port 0 picks an ephemeral port. Resolves with the bound port and `http://host:port`. */
  listen(port?: number, host?: string): Promise<{ port: number; url: string }>;
  /** Close the server and destroy open sockets (stalled streams included), so tests end promptly. */
  close(): Promise<void>;
  /** The same object as GET /sim/stats, detached. */
  stats(): SimStats;
  resetStats(): void;
  /**
   * A dead engine: /health 503, generation and pooling requests 500 (object-shaped); /v1/models, /tokenize and
   * /detokenize (which never reach the engine) stay 200.
   */
  setEngineDead(dead: boolean): void;
  /**
   * An engine restart, as a pod replacement is: requests the engine is running are cut (connection reset), the
   * prefix cache is emptied, /metrics counters start again from 0 with a new process_start_time_seconds. Also
   * `POST /sim/restart`. Without the engine model only the counters start again.
   */
  restart(): void;
  /** The engine model's state (null without it): what /metrics' gauges and counters are made from. */
  engineSnapshot(): EngineSnapshot | null;
  /**
   * Emits 'request-start' with the RequestRecord so far when a generation or pooling request is accepted
   * (validated, fault chosen; a stream's 200 headers already sent), and 'request-end' with the final RequestRecord
   * when a generation, pooling (or unknown-route) request ends: completed, fault, client disconnect or rejected.
   */
  readonly events: EventEmitter;
}

/** vLLM (uvicorn) closes idle keep-alive connections after 5 s and sends no Keep-Alive hint. */
const IDLE_KEEP_ALIVE_MS = 5_000;
const MAX_BODY_BYTES = 64 * 1024 * 1024;
const MAX_RECORDED_HEADER = 256;
const METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';
/** The separate PRNG stream random faults are drawn from, in arrival order. */
const FAULT_STREAM = 0xfa017;
/** The stream lengthRate draws from: its own, so a share of `length` answers leaves the faults' draws as they were. */
const LENGTH_STREAM = 0x1e9;
/** The PRNG stream of other clients' arrivals (--external-load). */
const EXTERNAL_STREAM = 0xe7e41;

const ENGINE_DEAD_BODY = errorBody(errorInfo(500, ENGINE_DEAD_MESSAGE));

interface Exchange {
  readonly record: RequestRecord;
  phase: 'none' | 'waiting' | 'running';
  settled: boolean;
  control: StreamControl | null;
  /** A background response: its generation outlives the connection, which no longer ends the request. */
  detached: boolean;
  /** The engine model's sequences of this request, while it runs (an engine restart cuts it). */
  job?: EngineJob | undefined;
  res?: ServerResponse | undefined;
}

type BodyRead = Buffer | 'too_large' | null;

function readBody(req: IncomingMessage, limit: number): Promise<BodyRead> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    req.on('data', (chunk: Buffer) => {
      if (done) return;
      size += chunk.length;
      if (size > limit) {
        done = true;
        resolve('too_large');
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!done) {
        done = true;
        resolve(Buffer.concat(chunks, size));
      }
    });
    req.on('close', () => {
      if (!done) {
        done = true;
        resolve(null);
      }
    });
  });
}

function routeOf(path: string): RouteName {
  if (path === '/v1/chat/completions') return 'chat_completions';
  if (path === '/v1/completions') return 'completions';
  if (path === '/v1/responses') return 'responses';
  if (path === '/v1/messages') return 'messages';
  if (path === '/v1/messages/count_tokens') return 'count_tokens';
  return storedRouteOf(path) ?? audioRouteOf(path) ?? poolingRouteOf(path) ?? 'other';
}

/** count_tokens never reaches the engine: only the faults that answer before it. */
const COUNT_TOKENS_FAULTS = (kind: FaultKind): boolean => kind === 'status' || kind === 'reset_before_response';

function isGenerationRoute(route: RouteName): route is GenerationRoute {
  return route === 'chat_completions' || route === 'completions';
}

/** The prefixes vLLM's --api-key middleware guards (a plain string-prefix test on the path). */
const GUARDED_PREFIXES = ['/v1', '/v2', '/inference'] as const;

/** A request's parsed JSON body and its fault directives, once the common checks passed. */
interface ReadJson {
  readonly body: unknown;
  /** Whether an x-sim-fault header was sent (then no random fault is drawn). */
  readonly hasHeader: boolean;
  readonly directives: Directives;
}

function headerValue(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  if (Array.isArray(value)) return value.join(', ');
  return value;
}

function recordedHeaders(req: IncomingMessage): RecordedHeaders {
  const headers: RecordedHeaders = {};
  const requestId = headerValue(req, 'x-request-id');
  const traceparent = headerValue(req, 'traceparent');
  const tracestate = headerValue(req, 'tracestate');
  if (requestId !== undefined) headers['x-request-id'] = requestId.slice(0, MAX_RECORDED_HEADER);
  if (traceparent !== undefined) headers.traceparent = traceparent.slice(0, MAX_RECORDED_HEADER);
  if (tracestate !== undefined) headers.tracestate = tracestate.slice(0, MAX_RECORDED_HEADER);
  if (req.headers.authorization !== undefined) headers.authorization = 'present';
  return headers;
}

/**
 * Create a simulated vLLM. Options are validated once (every problem in one TypeError) and frozen.
 *
 * @example
 * const sim = createSimulator({ ttftMs: 5, itlMs: 1 });
 * const { url } = await sim.listen(0);
 * // POST `${url}/v1/chat/completions` with `x-sim-fault: error_after=3`
 * await sim.close();
 */
export function createSimulator(options: Partial<SimOptions> = {}): Simulator {
  return new SimServer(resolveSimOptions(options));
}

class SimServer implements Simulator {
  readonly events = new EventEmitter();
  private readonly server: Server;
  private readonly store = new StatsStore();
  private readonly sockets = new Set<Socket>();
  private readonly idleTimers = new Map<Socket, NodeJS.Timeout>();
  private readonly faultRandom: Random;
  private readonly lengthRandom: Random;
  private readonly tokenizer = new SimTokenizer();
  private readonly nonStreamFaultKinds: readonly FaultKind[];
  /** VLLM_ENABLE_RESPONSES_API_STORE's store: empty for ever when the option is off. */
  private readonly responses = new ResponseStore();
  private readonly storeLookup: StoreLookup = { contextChars: (id) => this.responses.get(id)?.contextChars };
  /** Background generations still running (close() stops them). */
  private readonly backgroundRuns = new Set<StreamControl>();
  private engineDead = false;
  private seq = 0;
  /** The engine model, or null (the timer). */
  private readonly engine: EngineRuntime | null;
  private readonly metrics: EngineMetrics | null;
  /** Requests with sequences in the engine, for a restart to cut. */
  private readonly engineExchanges = new Set<Exchange>();
  private restartTimer: NodeJS.Timeout | undefined;

  constructor(private readonly opts: Readonly<SimOptions>) {
    this.faultRandom = createRandom(deriveSeed(opts.seed, FAULT_STREAM));
    this.lengthRandom = createRandom(deriveSeed(opts.seed, LENGTH_STREAM));
    this.metrics = opts.engineModel ? this.newMetrics() : null;
    this.engine = opts.engineModel
      ? new EngineRuntime(
          createEngineCore({
            blockSize: opts.blockSize,
            kvBlocks: opts.kvBlocks,
            maxNumSeqs: opts.maxNumSeqs,
            maxNumBatchedTokens: opts.maxNumBatchedTokens,
            enablePrefixCaching: opts.enablePrefixCaching,
            cost: { baseMs: opts.stepBaseMs, prefillTokenMs: opts.stepPrefillTokenMs, decodeSeqMs: opts.stepDecodeSeqMs },
          }),
          this.metrics,
        )
      : null;
    this.nonStreamFaultKinds = opts.faultKinds.filter(appliesToNonStream);
    this.server = createServer((req, res) => this.handle(req, res));
    // 0 stops Node from sending `Keep-Alive: timeout=5`, a hint vLLM does not give; idle closing is ours.
    this.server.keepAliveTimeout = 0;
    this.server.on('connection', (socket: Socket) => {
      this.sockets.add(socket);
      socket.on('close', () => {
        this.sockets.delete(socket);
        this.clearIdle(socket);
      });
    });
  }

  listen(port = 0, host = '127.0.0.1'): Promise<{ port: number; url: string }> {
    return new Promise((resolve, reject) => {
      const onError = (error: Error): void => reject(error);
      this.server.once('error', onError);
      this.server.listen(port, host, () => {
        this.server.off('error', onError);
        this.startBackgroundWork();
        const bound = (this.server.address() as AddressInfo).port;
        const urlHost = host.includes(':') ? `[${host}]` : host;
        resolve({ port: bound, url: `http://${urlHost}:${bound}` });
      });
    });
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      if (!this.server.listening) {
        resolve();
        return;
      }
      this.server.close(() => resolve());
      clearInterval(this.restartTimer);
      this.engine?.close();
      for (const run of this.backgroundRuns) run.abort();
      this.backgroundRuns.clear();
      for (const socket of this.sockets) socket.destroy();
    });
  }

  stats(): SimStats {
    return this.store.snapshot();
  }

  resetStats(): void {
    this.store.reset();
  }

  setEngineDead(dead: boolean): void {
    this.engineDead = dead;
  }

  restart(): void {
    for (const ex of [...this.engineExchanges]) {
      this.engineExchanges.delete(ex);
      ex.control?.abort();
      const status = ex.res?.headersSent === true ? (ex.res.statusCode) : 0;
      this.settle(ex, 'fault', status);
      ex.res?.socket?.resetAndDestroy();
    }
    this.engine?.restart();
    this.metrics?.reset(Date.now() / 1000);
    this.store.restartEngine();
  }

  engineSnapshot(): EngineSnapshot | null {
    return this.engine?.snapshot() ?? null;
  }

  private newMetrics(): EngineMetrics {
    return new EngineMetrics({
      modelName: this.opts.models[0] ?? '',
      engineIndex: 0,
      blockSize: this.opts.blockSize,
      enablePrefixCaching: this.opts.enablePrefixCaching,
      maxModelLen: MAX_MODEL_LEN,
      kvCacheMetrics: this.opts.kvCacheMetrics,
      compat: this.opts.metricsCompat,
      numGpuBlocks: this.opts.kvBlocks,
      startTimeSeconds: Date.now() / 1000,
    });
  }

  /** vLLM's /metrics: the engine model's (src/sim/engine/metrics.ts), or the timer's five series. */
  private renderMetrics(): string {
    const snapshot = this.engine?.snapshot();
    if (this.metrics === null || snapshot === undefined) return renderMetrics(this.store.engine, this.opts.models[0] ?? '');
    return this.metrics.render({ running: snapshot.running, waiting: snapshot.waiting, kvUsage: snapshot.kvUsage });
  }

  /** Once listening: other clients' load and the restart schedule. */
  private startBackgroundWork(): void {
    const { opts } = this;
    if (this.engine !== null && opts.externalLoad > 0) {
      this.engine.startExternalLoad({ rate: opts.externalLoad, promptTokens: opts.externalPromptTokens, outputTokens: opts.externalOutputTokens, seed: deriveSeed(opts.seed, EXTERNAL_STREAM) });
    }
    if (opts.restartEveryMs >= 1 && this.restartTimer === undefined) {
      this.restartTimer = setInterval(() => this.restart(), opts.restartEveryMs);
      this.restartTimer.unref();
    }
  }

  // ---- connections ----

  private armIdle(socket: Socket): void {
    if (socket.destroyed) return;
    this.clearIdle(socket);
    const timer = setTimeout(() => socket.destroy(), IDLE_KEEP_ALIVE_MS);
    timer.unref();
    this.idleTimers.set(socket, timer);
  }

  private clearIdle(socket: Socket): void {
    const timer = this.idleTimers.get(socket);
    if (timer !== undefined) {
      clearTimeout(timer);
      this.idleTimers.delete(socket);
    }
  }

  private isAuthorized(req: IncomingMessage, path: string): boolean {
    // vLLM's --api-key middleware guards /v1, /v2 and /inference only: /health, /metrics, /tokenize, /pooling,
    // /score, /rerank… stay open.
    if (this.opts.apiKey === undefined || !GUARDED_PREFIXES.some((prefix) => path.startsWith(prefix))) return true;
    return req.headers.authorization === `Bearer ${this.opts.apiKey}`;
  }

  // ---- routing ----

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const socket = req.socket;
    this.clearIdle(socket);
    res.once('finish', () => this.armIdle(socket));
    const path = (req.url ?? '/').split('?', 1)[0] ?? '/';

    if (path === '/sim/stats') {
      // The control plane: reading the stats does not count as a request.
      req.resume();
      if (req.method === 'GET') sendBody(res, 200, JSON.stringify(this.store.snapshot()));
      else sendBody(res, 405, METHOD_NOT_ALLOWED_BODY, 'application/json', { allow: 'GET' });
      return;
    }

    if (path === '/sim/restart') {
      req.resume();
      if (req.method === 'POST') {
        this.restart();
        sendBody(res, 200, JSON.stringify({ restarted: true }));
      } else sendBody(res, 405, METHOD_NOT_ALLOWED_BODY, 'application/json', { allow: 'POST' });
      return;
    }

    if (isOperationalPath(path)) {
      // A gateway's own reads (health, discovery, scrapes): counted apart, never as requests (src/sim/stats.ts).
      this.store.countOperational(path);
      this.handleOperational(req, res, path);
      return;
    }
    const route = routeOf(path);
    this.store.countRequest(route);
    if (isGenerationRoute(route)) {
      void this.handleExchange(req, res, route, path, (ex) => this.serveGeneration(ex, req, res, route, path));
      return;
    }
    if (route === 'responses' || route === 'messages') {
      void this.handleExchange(req, res, route, path, (ex) => this.serveEventRoute(ex, req, res, route, path));
      return;
    }
    if (route === 'responses_retrieve' || route === 'responses_cancel') {
      void this.handleExchange(req, res, route, path, (ex) => {
        this.serveStored(ex, req, res, route, path);
        return Promise.resolve();
      });
      return;
    }
    if (route === 'count_tokens') {
      void this.handleExchange(req, res, route, path, (ex) => this.serveCountTokens(ex, req, res, path));
      return;
    }
    if (route === 'transcriptions' || route === 'translations') {
      void this.handleExchange(req, res, route, path, (ex) => this.serveAudio(ex, req, res, route, path));
      return;
    }
    if (route !== 'other') {
      void this.handleExchange(req, res, route, path, (ex) => this.servePooling(ex, req, res, route, path));
      return;
    }
    this.handleOther(req, res, path);
  }

  private respond(
    res: ServerResponse,
    status: number,
    body: string,
    contentType?: string | null,
    headers?: Record<string, string>,
  ): void {
    this.store.countStatus(status);
    sendBody(res, status, body, contentType, headers);
  }

  private handleOther(req: IncomingMessage, res: ServerResponse, path: string): void {
    req.resume();
    // Unknown routes get a record: a gateway sending traffic to the wrong path should be visible.
    const ex = this.open(req, 'other', path);
    const status = this.isAuthorized(req, path) ? 404 : 401;
    sendBody(res, status, status === 404 ? NOT_FOUND_BODY : UNAUTHORIZED_BODY);
    this.settle(ex, 'rejected', status);
  }

  /** vLLM's operational endpoints: no record, only a status count. `/ping` takes POST too, as SageMaker's does. */
  private handleOperational(req: IncomingMessage, res: ServerResponse, path: OperationalPath): void {
    req.resume();
    if (!this.isAuthorized(req, path)) {
      this.respond(res, 401, UNAUTHORIZED_BODY);
      return;
    }
    const methods = path === '/ping' ? ['GET', 'POST'] : ['GET'];
    if (!methods.includes(req.method ?? '')) {
      this.respond(res, 405, METHOD_NOT_ALLOWED_BODY, 'application/json', { allow: methods.join(', ') });
      return;
    }
    switch (path) {
      case '/health':
      case '/ping':
        this.respond(res, this.engineDead ? 503 : 200, '', null);
        return;
      case '/v1/models':
        this.respond(res, 200, modelListBody(this.opts.models, MAX_MODEL_LEN, Math.floor(Date.now() / 1000)));
        return;
      case '/metrics':
        this.respond(res, 200, this.renderMetrics(), METRICS_CONTENT_TYPE);
        return;
      case '/version':
        this.respond(res, 200, JSON.stringify({ version: this.opts.revision }));
        return;
      case '/load':
        // vLLM counts its load only with --enable-server-load-tracking; without it, 0.
        this.respond(res, 200, JSON.stringify({ server_load: 0 }));
        return;
    }
  }

  // ---- request records ----

  private open(req: IncomingMessage, route: RouteName, path: string): Exchange {
    this.seq += 1;
    const headers = recordedHeaders(req);
    const record: RequestRecord = {
      seq: this.seq,
      // vLLM's random_uuid() is 16 hex on the pooling routes; the generation routes keep the simulator's 32.
      requestId: headers['x-request-id'] ?? (isGenerationRoute(route) ? randomUUID().replaceAll('-', '') : randomBytes(8).toString('hex')),
      route,
      path: path.slice(0, MAX_RECORDED_HEADER),
      model: null,
      stream: false,
      n: 1,
      includeUsage: null,
      headers,
      fault: null,
      end: 'rejected',
      status: 0,
      outputEventsSent: 0,
      completionTokensSent: 0,
      promptTokens: null,
    };
    this.store.open();
    return { record, phase: 'none', settled: false, control: null, detached: false };
  }

  private setPhase(ex: Exchange, phase: Exchange['phase']): void {
    const engine = this.store.engine;
    if (ex.phase === 'waiting') engine.waiting -= 1;
    if (ex.phase === 'running') engine.running -= 1;
    if (phase === 'waiting') engine.waiting += 1;
    if (phase === 'running') engine.running += 1;
    ex.phase = phase;
  }

  /** `countStatus` false: the status was counted when it went out (a background response's answer). */
  /** One output event written: on the request's record and in the engine's completion-token counter. */
  private countOutput(ex: Exchange, tokens: number): void {
    ex.record.outputEventsSent += 1;
    ex.record.completionTokensSent += tokens;
    this.store.addCompletionTokens(tokens);
  }

  private settle(ex: Exchange, end: RequestRecord['end'], status: number, countStatus = true): void {
    if (ex.settled) return;
    ex.settled = true;
    this.engineExchanges.delete(ex);
    ex.record.end = end;
    ex.record.status = status;
    this.setPhase(ex, 'none');
    if (status > 0 && countStatus) this.store.countStatus(status);
    this.store.close(ex.record);
    this.events.emit('request-end', { ...ex.record, headers: { ...ex.record.headers } });
  }

  private reject(ex: Exchange, res: ServerResponse, status: number, body: string, headers?: Record<string, string>): void {
    sendBody(res, status, body, 'application/json', headers);
    this.settle(ex, 'rejected', status);
  }

  /**
   * An error a vLLM handler raised: Starlette's ServerErrorMiddleware answers, then re-raises, and uvicorn closes the
   * connection — after the response, with no `connection: close` header to warn the client's pool.
   */
  private rejectThenClose(ex: Exchange, res: ServerResponse, status: number, body: string): void {
    const { socket } = res; // detached from the response once it finishes
    res.once('finish', () => socket?.end());
    this.reject(ex, res, status, body);
  }

  private applyFault(ex: Exchange, fault: Fault): void {
    ex.record.fault = fault.kind;
    this.store.countFault(fault.kind);
  }

  // ---- generation ----

  private async handleExchange(
    req: IncomingMessage,
    res: ServerResponse,
    route: RouteName,
    path: string,
    serve: (ex: Exchange) => Promise<void>,
  ): Promise<void> {
    const ex = this.open(req, route, path);
    res.on('close', () => {
      if (ex.detached) return; // a background generation goes on without its client
      ex.control?.abort();
      if (!ex.settled) this.settle(ex, 'client_disconnect', res.headersSent ? res.statusCode : 0);
    });
    try {
      await serve(ex);
    } catch (error) {
      // A simulator bug must not look like a hang: answer 500 if we still can, else drop the connection.
      if (!res.headersSent) this.reject(ex, res, 500, errorBody(errorInfo(500, String(error))));
      else res.destroy();
      this.settle(ex, 'rejected', 500);
    }
  }

  /**
   * The checks every JSON route shares, in vLLM's order: method, auth, the fault header (a `reset_before_response`
   * fires before the body is read), body size, content type, JSON. Null when the request was answered here.
   * `schemaType`: the error `type` for content-type and JSON errors — FastAPI's "Bad Request" on the pooling routes;
   * the generation routes keep the simulator's historical "BadRequestError".
   */
  private async readJson(ex: Exchange, req: IncomingMessage, res: ServerResponse, path: string, schemaType: 'Bad Request' | 'BadRequestError'): Promise<ReadJson | null> {
    if (req.method !== 'POST') {
      req.resume();
      this.reject(ex, res, 405, METHOD_NOT_ALLOWED_BODY, { allow: 'POST' });
      return null;
    }
    if (!this.isAuthorized(req, path)) {
      req.resume();
      this.reject(ex, res, 401, UNAUTHORIZED_BODY);
      return null;
    }

    const header = headerValue(req, 'x-sim-fault');
    const parsed = header === undefined ? ({ ok: true, directives: NO_DIRECTIVES } as const) : parseFaultHeader(header);
    if (parsed.ok && parsed.directives.fault?.kind === 'reset_before_response') {
      this.applyFault(ex, parsed.directives.fault);
      this.settle(ex, 'fault', 0);
      req.socket.resetAndDestroy();
      return null;
    }

    const raw = await readBody(req, MAX_BODY_BYTES);
    if (ex.settled || raw === null) return null; // the client left; the close handler recorded it
    if (raw === 'too_large') {
      this.reject(ex, res, 413, errorBody(errorInfo(413, `Request body exceeds ${MAX_BODY_BYTES} bytes.`)), { connection: 'close' });
      return null;
    }
    if (!parsed.ok) {
      this.reject(ex, res, 400, errorBody(errorInfo(400, parsed.message, 'x-sim-fault')));
      return null;
    }
    const schemaError = (message: string): string =>
      schemaType === 'Bad Request' ? badRequestBody(message) : errorBody(errorInfo(400, message));
    const mediaType = (req.headers['content-type'] ?? '').split(';', 1)[0]?.trim().toLowerCase();
    if (mediaType !== 'application/json') {
      this.reject(ex, res, 400, schemaError("Unsupported Media Type: Only 'application/json' is allowed"));
      return null;
    }
    try {
      return { body: JSON.parse(raw.toString('utf8')) as unknown, hasHeader: header !== undefined, directives: parsed.directives };
    } catch {
      this.reject(ex, res, 400, schemaError('JSON decode error'));
      return null;
    }
  }

  /**
   * The fault of an accepted request: the header's, or a random one (null when `random` is false). `applies`: the
   * kinds this request honours (default: all for a stream, appliesToNonStream otherwise); others are dropped.
   */
  private chooseFault(ex: Exchange, read: ReadJson, stream: boolean, random = true, applies?: (kind: FaultKind) => boolean): Fault | null {
    let fault = read.directives.fault;
    if (!read.hasHeader) {
      const kinds = applies !== undefined ? this.opts.faultKinds.filter(applies) : stream ? this.opts.faultKinds : this.nonStreamFaultKinds;
      fault = random ? drawFault(this.faultRandom, this.opts.faultRate, kinds, this.opts.outputTokens) : null;
    } else if (fault !== null && !(applies ?? (stream ? () => true : appliesToNonStream))(fault.kind)) {
      fault = null; // e.g. stream-only faults mean nothing without a stream
    }
    if (fault !== null) this.applyFault(ex, fault);
    return fault;
  }

  /**
   * lengthRate: a request without an x-sim-fault header and without a random fault ends with finish_reason `length`
   * at that share (drawn only for such requests, from its own stream).
   */
  private withLengthRate(read: ReadJson, fault: Fault | null): Directives {
    const { directives } = read;
    if (read.hasHeader || fault !== null || this.opts.lengthRate <= 0 || this.lengthRandom() >= this.opts.lengthRate) return directives;
    return { ...directives, modifiers: { ...directives.modifiers, finishReason: 'length' } };
  }

  /** The faults that answer at once, before any delay: a status, or a reset. True when one did. */
  private answerFaultAtOnce(
    ex: Exchange,
    req: IncomingMessage,
    res: ServerResponse,
    fault: Fault | null,
    model: string,
    bodyOf: (status: number, model: string) => string = statusBody,
  ): boolean {
    if (fault?.kind === 'status') {
      sendBody(res, fault.status, bodyOf(fault.status, model));
      this.settle(ex, 'fault', fault.status);
      return true;
    }
    if (fault?.kind === 'reset_before_response') {
      this.settle(ex, 'fault', 0);
      req.socket.resetAndDestroy();
      return true;
    }
    return false;
  }

  private async serveGeneration(
    ex: Exchange,
    req: IncomingMessage,
    res: ServerResponse,
    route: GenerationRoute,
    path: string,
  ): Promise<void> {
    const read = await this.readJson(ex, req, res, path, 'BadRequestError');
    if (read === null) return;
    const result = readGenerationRequest(route, read.body, this.opts.models, ex.record);
    if (!result.ok) {
      this.reject(ex, res, result.status, result.body);
      return;
    }
    if (this.engineDead) {
      this.reject(ex, res, 500, ENGINE_DEAD_BODY);
      return;
    }

    const request = result.request;
    ex.record.promptTokens = request.promptTokens;
    const fault = this.chooseFault(ex, read, request.stream);
    if (this.answerFaultAtOnce(ex, req, res, fault, request.model)) return;
    this.generate(ex, res, request, fault, this.withLengthRate(read, fault));
  }

  private generate(ex: Exchange, res: ServerResponse, request: GenerationRequest, fault: Fault | null, directives: Directives): void {
    const { store } = this;
    const shape = shapeAnswer(request, directives.modifiers, this.opts, ex.record.requestId, Math.floor(Date.now() / 1000));
    const job = this.submitToEngine(request, shape, directives.modifiers);
    if (job === 'too_long') {
      this.reject(ex, res, 400, errorBody(errorInfo(400, `The prompt needs more KV cache blocks than this engine has (--kv-blocks ${this.opts.kvBlocks} of ${this.opts.blockSize} tokens).`, 'input_tokens')));
      return;
    }
    const usage = job === null ? shape.usage : this.engineUsage(shape, job, directives.modifiers);
    const common = {
      choiceCount: shape.choiceCount,
      tokensPerChoice: shape.tokensPerChoice,
      tokensPerEvent: shape.tokensPerEvent,
      finishReason: shape.finishReason,
      usage: shape.sendsUsage ? usage : null,
      ttftMs: shape.ttftMs,
      itlMs: shape.itlMs,
      jitter: shape.jitter,
      random: createRandom(deriveSeed(this.opts.seed, ex.record.seq)),
      fault,
      pacer: job === null || this.engine === null ? undefined : this.engine.pacer(job, shape.tokensPerEvent),
    };
    if (job !== null) {
      ex.job = job;
      ex.res = res;
      this.engineExchanges.add(ex);
    }
    const countSuccess = (): void => store.countSuccess(new Array<string>(shape.choiceCount).fill(shape.finishReason));
    const onFirstToken = (): void => this.setPhase(ex, 'running');

    store.addPromptTokens(request.promptTokens);
    this.setPhase(ex, 'waiting');
    const emitStart = (): void => {
      this.events.emit('request-start', { ...ex.record, headers: { ...ex.record.headers } });
    };
    if (request.stream) {
      const plan = { ...common, serializer: createChunkSerializer(request.route, shape.identity), framing: directives.modifiers };
      ex.control = startStream(res, plan, {
        onFirstToken,
        onOutput: (tokens) => this.countOutput(ex, tokens),
        onEnd: ({ end, generationComplete }) => {
          if (generationComplete) countSuccess();
          this.settle(ex, end, 200);
        },
      });
      emitStart();
      return;
    }
    const plan = {
      outputEvents: shape.choiceCount * Math.ceil(shape.tokensPerChoice / shape.tokensPerEvent),
      completionTokens: shape.choiceCount * shape.tokensPerChoice,
      ttftMs: common.ttftMs,
      itlMs: common.itlMs,
      jitter: common.jitter,
      random: common.random,
      fault,
      pacer: common.pacer,
      send: (): void => {
        const choices = Array.from({ length: shape.choiceCount }, (_, index) => ({
          text: choiceText(index, 0, shape.tokensPerChoice),
          finishReason: shape.finishReason,
        }));
        sendBody(res, 200, completionBody(request.route, shape.identity, choices, common.usage));
      },
    };
    ex.control = startNonStream(res, plan, {
      onFirstToken,
      onEnd: ({ end, status, completionTokensSent, generationComplete }) => {
        ex.record.completionTokensSent = completionTokensSent;
        store.addCompletionTokens(completionTokensSent);
        if (generationComplete) countSuccess();
        this.settle(ex, end, status);
      },
    });
    emitStart();
  }

  /**
   * The request's sequences in the engine model: one per choice of each prompt, in the order of the answer's choice
   * indices (choice + prompt × n). Null when there is no engine, nothing to tokenize (routes whose prompt the model does
   * not render), or the x-sim-fault header sets a timing, which then holds for that request alone.
   */
  private submitToEngine(request: GenerationRequest, shape: AnswerShape, modifiers: Modifiers): EngineJob | null | 'too_long' {
    if (this.engine === null || request.promptInputs.length === 0) return null;
    if (modifiers.ttftMs !== undefined || modifiers.itlMs !== undefined || modifiers.prefillMsPer1kTokens !== undefined) return null;
    const inputs: SequenceInput[] = [];
    const finishedReason = engineFinishReason(shape.finishReason);
    for (const prompt of request.promptInputs) {
      const promptTokenIds = typeof prompt === 'string' ? this.tokenizer.encode(prompt) : prompt;
      // What the core will hold at the sequence's longest (prompt and answer): every prompt is checked before any is added.
      if (peakBlocks(promptTokenIds.length, Math.max(1, shape.tokensPerChoice), this.opts.blockSize) > this.opts.kvBlocks) return 'too_long';
      for (let choice = 0; choice < request.n; choice++) {
        inputs.push({
          promptTokenIds,
          outputTokens: shape.tokensPerChoice,
          finishedReason,
          // One prompt's hit counts once: its other choices hit the blocks the first just allocated (vLLM reports the
          // request's num_cached_tokens, not a sum over its child requests).
          countsCached: choice === 0,
          ...(request.cacheSalt !== null ? { cacheSalt: request.cacheSalt } : {}),
        });
      }
    }
    return this.engine.submit(inputs);
  }

  /**
   * Usage whose cached_tokens is the engine's prefix-cache hit, read when the usage goes out (the hit is known once the
   * engine first schedules the request). Reported as vLLM does: with --enable-prompt-tokens-details, and only when not
   * 0; an x-sim-fault `cached_tokens` still wins.
   */
  private engineUsage(shape: AnswerShape, job: EngineJob, modifiers: Modifiers): Usage {
    const { promptTokens, completionTokens } = shape.usage;
    const details = this.opts.promptTokensDetails;
    const forced = modifiers.cachedTokens;
    return {
      promptTokens,
      completionTokens,
      get cachedTokens(): number | null {
        if (forced !== undefined) return forced > 0 ? Math.min(forced, promptTokens) : null;
        const hit = job.cachedTokens ?? 0;
        return details && hit > 0 ? Math.min(hit, promptTokens) : null;
      },
    };
  }

  // ---- /v1/responses and /v1/messages ----

  private refuse(ex: Exchange, res: ServerResponse, refusal: EventRouteRefusal): void {
    if (refusal.closes) this.rejectThenClose(ex, res, refusal.status, refusal.body);
    else this.reject(ex, res, refusal.status, refusal.body);
  }

  private async serveEventRoute(ex: Exchange, req: IncomingMessage, res: ServerResponse, route: 'responses' | 'messages', path: string): Promise<void> {
    const read = await this.readJson(ex, req, res, path, 'Bad Request');
    if (read === null) return;
    const result =
      route === 'responses'
        ? readResponsesRequest(read.body, this.opts.models, ex.record, this.engineDead, this.opts.responsesStore ? this.storeLookup : null)
        : readMessagesRequest(read.body, this.opts.models, ex.record, this.engineDead);
    if (!result.ok) {
      this.refuse(ex, res, result.refusal);
      return;
    }
    const request = result.request;
    ex.record.promptTokens = request.promptTokens;
    const background = request.route === 'responses' && request.background;
    const fault = this.chooseFault(ex, read, request.stream, true, background ? appliesToBackground : undefined);
    const statusBodyOf = route === 'messages' ? messagesStatusBody : statusBody;
    if (this.answerFaultAtOnce(ex, req, res, fault, request.model, statusBodyOf)) return;

    const { modifiers } = read.directives;
    const createdSeconds = Math.floor(Date.now() / 1000);
    // The timing, token count and finish reason are the chat route's (Messages runs as a chat completion); Responses
    // always reports cached tokens, whatever --prompt-tokens-details says.
    const cap = request.route === 'messages' ? request.maxTokens : request.maxOutputTokens;
    const shape = shapeAnswer(
      { route: 'chat_completions', model: request.model, stream: request.stream, n: 1, includeUsage: null, maxTokens: cap, promptTokens: request.promptTokens, prompts: 1, promptInputs: [], cacheSalt: null },
      modifiers,
      route === 'responses' ? { ...this.opts, promptTokensDetails: true } : this.opts,
      ex.record.requestId,
      createdSeconds,
    );
    const common = { tokens: shape.tokensPerChoice, finishReason: shape.finishReason, promptTokens: request.promptTokens, usage: !modifiers.noUsage };
    let writer: () => EventWriter;
    let body: () => string;
    let failure: NonStreamPlan['failure'];
    if (request.route === 'messages') {
      const answer = { ...common, id: shape.identity.id, model: request.model };
      writer = () => createMessagesWriter(answer);
      body = () => messagesBody(answer);
      failure = (code, beforeOutput) => messagesFailure(engineErrorInfo(code, beforeOutput));
    } else {
      // X-Request-Id is not used here: the id is the body's request_id, or resp_<16 hex> (the record's id if generated).
      const id = request.requestId ?? `resp_${ex.record.headers['x-request-id'] === undefined ? ex.record.requestId : randomId()}`;
      ex.record.responseId = id;
      const answer: ResponsesAnswer = { ...common, request, id, createdAt: createdSeconds, cachedTokens: shape.usage.cachedTokens ?? 0 };
      if (request.background) {
        this.runBackground(ex, res, answer, shape, fault, modifiers);
        return;
      }
      // Stored (with the store on and `store`) once the generation ran to its end, as the answer or
      // response.completed carries it; a cut, stalled or abandoned request leaves nothing.
      const onFinal: FinalResponseHook | undefined = request.store
        ? (final, status) => {
            const entry = new StoredResponse(answer, 'queued', null);
            entry.finish(final, status, choiceText(0, 0, answer.tokens).length);
            this.responses.put(entry);
          }
        : undefined;
      writer = () => createResponsesWriter(answer, onFinal);
      body = () => responsesBody(answer, onFinal);
      failure = undefined;
    }

    const { store } = this;
    const random = createRandom(deriveSeed(this.opts.seed, ex.record.seq));
    const countSuccess = (): void => store.countSuccess([shape.finishReason]);
    const onFirstToken = (): void => this.setPhase(ex, 'running');
    store.addPromptTokens(request.promptTokens);
    this.setPhase(ex, 'waiting');
    if (request.stream) {
      ex.control = startEventStream(
        res,
        {
          tokens: shape.tokensPerChoice,
          tokensPerEvent: shape.tokensPerEvent,
          ttftMs: shape.ttftMs,
          itlMs: shape.itlMs,
          jitter: shape.jitter,
          random,
          fault,
          framing: modifiers,
          writer: writer(),
        },
        {
          onFirstToken,
          onOutput: (tokens) => this.countOutput(ex, tokens),
          onEnd: ({ end, generationComplete }) => {
            if (generationComplete) countSuccess();
            this.settle(ex, end, 200);
          },
        },
      );
    } else {
      ex.control = startNonStream(
        res,
        {
          outputEvents: Math.ceil(shape.tokensPerChoice / shape.tokensPerEvent),
          completionTokens: shape.tokensPerChoice,
          ttftMs: shape.ttftMs,
          itlMs: shape.itlMs,
          jitter: shape.jitter,
          random,
          fault,
          send: () => sendBody(res, 200, body()),
          failure,
        },
        {
          onFirstToken,
          onEnd: ({ end, status, completionTokensSent, generationComplete }) => {
            ex.record.completionTokensSent = completionTokensSent;
            store.addCompletionTokens(completionTokensSent);
            if (generationComplete) countSuccess();
            this.settle(ex, end, status);
          },
        },
      );
    }
    this.events.emit('request-start', { ...ex.record, headers: { ...ex.record.headers } });
  }

  /**
   * `background: true` (with the store on): the response is stored `queued` and answered at once — as JSON, or as a
   * replay of the task's events (`stream`) — while the generation runs detached from the connection. The request's
   * record ends with the generation: `completed`, `fault` (an engine error killed it: the stored status stays
   * `queued`, a replay hangs) or `cancelled`; a stall never ends it unless cancelled.
   */
  private runBackground(
    ex: Exchange,
    res: ServerResponse,
    answer: ResponsesAnswer,
    shape: ReturnType<typeof shapeAnswer>,
    fault: Fault | null,
    modifiers: Directives['modifiers'],
  ): void {
    const { store } = this;
    const entry = new StoredResponse(answer, 'queued', answer.request.stream ? [] : null);
    this.responses.put(entry);
    const outputChars = choiceText(0, 0, answer.tokens).length;
    ex.detached = true;
    store.addPromptTokens(answer.promptTokens);
    this.setPhase(ex, 'waiting');
    const run = startBackground(
      {
        tokens: shape.tokensPerChoice,
        tokensPerEvent: shape.tokensPerEvent,
        ttftMs: shape.ttftMs,
        itlMs: shape.itlMs,
        jitter: shape.jitter,
        random: createRandom(deriveSeed(this.opts.seed, ex.record.seq)),
        fault,
        writer: createResponsesWriter(answer, (final, status) => entry.finish(final, status, outputChars)),
      },
      {
        onEvents: (events) => entry.push(events),
        onFirstToken: () => this.setPhase(ex, 'running'),
        onOutput: (tokens) => this.countOutput(ex, tokens),
        onEnd: (end) => {
          entry.task = null;
          this.backgroundRuns.delete(run);
          if (end === 'completed') store.countSuccess([shape.finishReason]);
          this.settle(ex, end === 'completed' && fault === null ? 'completed' : 'fault', 200, false);
        },
      },
    );
    this.backgroundRuns.add(run);
    entry.task = {
      cancel: () => {
        run.abort();
        this.backgroundRuns.delete(run);
        this.settle(ex, 'cancelled', 200, false);
      },
    };
    store.countStatus(200);
    if (answer.request.stream) startReplay(res, entry, 0, modifiers, { onEnd: () => undefined });
    else sendBody(res, 200, entry.body());
    this.events.emit('request-start', { ...ex.record, headers: { ...ex.record.headers } });
  }

  // ---- GET /v1/responses/{id}, POST /v1/responses/{id}/cancel, POST /v1/messages/count_tokens ----

  /**
   * The stored-response routes, which never reach the engine: method, auth, the fault header (only `status` and
   * `reset_before_response`), then vLLM's `retrieve_responses` / `cancel_responses` over the store.
   */
  private serveStored(ex: Exchange, req: IncomingMessage, res: ServerResponse, route: StoredRoute, path: string): void {
    req.resume();
    const method = route === 'responses_retrieve' ? 'GET' : 'POST';
    if (req.method !== method) {
      this.reject(ex, res, 405, METHOD_NOT_ALLOWED_BODY, { allow: method });
      return;
    }
    if (!this.isAuthorized(req, path)) {
      this.reject(ex, res, 401, UNAUTHORIZED_BODY);
      return;
    }
    const id = storedResponseId(path);
    ex.record.responseId = id;
    const header = headerValue(req, 'x-sim-fault');
    if (header !== undefined) {
      const parsed = parseFaultHeader(header);
      if (!parsed.ok) {
        this.reject(ex, res, 400, errorBody(errorInfo(400, parsed.message, 'x-sim-fault')));
        return;
      }
      const fault = parsed.directives.fault;
      if (fault?.kind === 'status' || fault?.kind === 'reset_before_response') {
        this.applyFault(ex, fault);
        if (fault.kind === 'reset_before_response') {
          this.settle(ex, 'fault', 0);
          req.socket.resetAndDestroy();
        } else {
          const body = fault.status === 404 ? responseNotFoundBody(id) : statusBody(fault.status, this.opts.models[0] ?? '');
          sendBody(res, fault.status, body);
          this.settle(ex, 'fault', fault.status);
        }
        return;
      }
    }
    if (route === 'responses_cancel') {
      const entry = this.responses.get(id);
      if (entry === undefined) this.reject(ex, res, 404, responseNotFoundBody(id));
      else if (!entry.cancel()) this.reject(ex, res, 400, CANNOT_CANCEL_BODY);
      else {
        sendBody(res, 200, entry.body());
        this.settle(ex, 'completed', 200);
      }
      return;
    }
    const query = retrieveQuery(req.url ?? '');
    if (!query.ok) {
      this.reject(ex, res, 400, badRequestBody(query.message));
      return;
    }
    ex.record.stream = query.stream;
    const entry = this.responses.get(id);
    if (entry === undefined) {
      this.reject(ex, res, 404, responseNotFoundBody(id));
      return;
    }
    if (!query.stream) {
      sendBody(res, 200, entry.body());
      this.settle(ex, 'completed', 200);
      return;
    }
    const start = query.startingAfter === null ? 0 : query.startingAfter + 1;
    startReplay(res, entry, start, NO_DIRECTIVES.modifiers, {
      onEnd: (end) => this.settle(ex, end === 'completed' ? 'completed' : 'rejected', 200),
    });
  }

  /**
   * vLLM's `count_tokens`: /v1/messages' checks and token estimate (its request, without `max_tokens` and `stream`,
   * which count_tokens does not take), answered at once — the renderer runs, the engine does not.
   */
  private async serveCountTokens(ex: Exchange, req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    const read = await this.readJson(ex, req, res, path, 'Bad Request');
    if (read === null) return;
    const body = typeof read.body === 'object' && read.body !== null && !Array.isArray(read.body) ? { ...read.body, max_tokens: 1, stream: false } : read.body;
    const result = readMessagesRequest(body, this.opts.models, ex.record, this.engineDead);
    if (!result.ok) {
      this.refuse(ex, res, result.refusal);
      return;
    }
    const tokens = result.request.promptTokens;
    ex.record.promptTokens = tokens;
    const fault = this.chooseFault(ex, read, false, false, COUNT_TOKENS_FAULTS);
    if (this.answerFaultAtOnce(ex, req, res, fault, result.request.model, messagesStatusBody)) return;
    sendBody(res, 200, `{"input_tokens":${tokens},"context_management":{"original_input_tokens":${tokens}}}`);
    this.settle(ex, 'completed', 200);
  }

  // ---- /v1/audio/transcriptions and /v1/audio/translations ----

  /**
   * The chat route's checks, timing, faults and stream writer over a multipart form (src/sim/audio.ts): method, auth,
   * the fault header (`reset_before_response` before the body is read), the form (the file part counted, not kept),
   * then vLLM's refusals, then the answer — a `transcription.chunk` / `translation.chunk` stream or one JSON body.
   */
  private async serveAudio(ex: Exchange, req: IncomingMessage, res: ServerResponse, route: AudioRoute, path: string): Promise<void> {
    if (req.method !== 'POST') {
      req.resume();
      this.reject(ex, res, 405, METHOD_NOT_ALLOWED_BODY, { allow: 'POST' });
      return;
    }
    if (!this.isAuthorized(req, path)) {
      req.resume();
      this.reject(ex, res, 401, UNAUTHORIZED_BODY);
      return;
    }
    const header = headerValue(req, 'x-sim-fault');
    const parsed = header === undefined ? ({ ok: true, directives: NO_DIRECTIVES } as const) : parseFaultHeader(header);
    if (parsed.ok && parsed.directives.fault?.kind === 'reset_before_response') {
      this.applyFault(ex, parsed.directives.fault);
      this.settle(ex, 'fault', 0);
      req.socket.resetAndDestroy();
      return;
    }
    const form = await readAudioForm(req);
    if (ex.settled || form.kind === 'gone') return; // the client left; the close handler recorded it
    if (!parsed.ok) {
      this.reject(ex, res, 400, errorBody(errorInfo(400, parsed.message, 'x-sim-fault')));
      return;
    }
    if (form.kind === 'malformed') {
      this.reject(ex, res, 400, FORM_PARSE_ERROR_BODY);
      return;
    }
    const result = readAudioRequest(route, form.values, this.opts.models, ex.record, this.engineDead);
    if (!result.ok) {
      this.refuse(ex, res, result.refusal);
      return;
    }
    const request = result.request;
    ex.record.promptTokens = request.promptTokens;
    const read: ReadJson = { body: null, hasHeader: header !== undefined, directives: parsed.directives };
    const fault = this.chooseFault(ex, read, request.stream);
    if (this.answerFaultAtOnce(ex, req, res, fault, request.model)) return;

    // Timing, token count and finish reason are the chat route's; audio usage never carries cached tokens.
    const { cachedTokens: _cached, ...modifiers } = parsed.directives.modifiers;
    const createdSeconds = Math.floor(Date.now() / 1000);
    const shape = shapeAnswer(
      {
        route: 'chat_completions',
        model: request.model,
        stream: request.stream,
        n: 1,
        includeUsage: request.includeUsage,
        maxTokens: request.maxTokens,
        promptTokens: request.promptTokens,
        prompts: 1,
        promptInputs: [],
        cacheSalt: null,
      },
      modifiers,
      { ...this.opts, promptTokensDetails: false },
      ex.record.requestId,
      createdSeconds,
    );
    const identity = { id: audioResponseId(route, ex.record.requestId), created: createdSeconds, model: request.model };
    const { store } = this;
    const random = createRandom(deriveSeed(this.opts.seed, ex.record.seq));
    const countSuccess = (): void => store.countSuccess([shape.finishReason]);
    const onFirstToken = (): void => this.setPhase(ex, 'running');
    store.addPromptTokens(request.promptTokens);
    this.setPhase(ex, 'waiting');
    if (request.stream) {
      let sent = 0;
      const continuous = shape.sendsUsage && request.continuousUsage
        ? () => ({ promptTokens: request.promptTokens, completionTokens: sent, cachedTokens: null })
        : null;
      const plan = {
        choiceCount: 1,
        tokensPerChoice: shape.tokensPerChoice,
        tokensPerEvent: shape.tokensPerEvent,
        finishReason: shape.finishReason,
        usage: shape.sendsUsage ? shape.usage : null,
        ttftMs: shape.ttftMs,
        itlMs: shape.itlMs,
        jitter: shape.jitter,
        random,
        fault,
        serializer: createAudioSerializer(route, identity, continuous),
        framing: modifiers,
      };
      ex.control = startStream(res, plan, {
        onFirstToken,
        onOutput: (tokens) => {
          sent += tokens;
          this.countOutput(ex, tokens);
        },
        onEnd: ({ end, generationComplete }) => {
          if (generationComplete) countSuccess();
          this.settle(ex, end, 200);
        },
      });
    } else {
      ex.control = startNonStream(
        res,
        {
          outputEvents: Math.ceil(shape.tokensPerChoice / shape.tokensPerEvent),
          completionTokens: shape.tokensPerChoice,
          ttftMs: shape.ttftMs,
          itlMs: shape.itlMs,
          jitter: shape.jitter,
          random,
          fault,
          send: () => sendBody(res, 200, audioBody(request, shape.tokensPerChoice, !modifiers.noUsage)),
        },
        {
          onFirstToken,
          onEnd: ({ end, status, completionTokensSent, generationComplete }) => {
            ex.record.completionTokensSent = completionTokensSent;
            store.addCompletionTokens(completionTokensSent);
            if (generationComplete) countSuccess();
            this.settle(ex, end, status);
          },
        },
      );
    }
    this.events.emit('request-start', { ...ex.record, headers: { ...ex.record.headers } });
  }

  // ---- embeddings, pooling, classify, score, rerank, tokenize, detokenize ----

  private async servePooling(ex: Exchange, req: IncomingMessage, res: ServerResponse, route: PoolingRoute, path: string): Promise<void> {
    const read = await this.readJson(ex, req, res, path, 'Bad Request');
    if (read === null) return;
    const result = readPoolingRequest(route, read.body, this.opts.models, ex.record);
    if (!result.ok) {
      const { status, body, closes } = result.refusal;
      if (closes) this.rejectThenClose(ex, res, status, body);
      else this.reject(ex, res, status, body);
      return;
    }
    const engine = usesEngine(route);
    if (engine && this.engineDead) {
      this.reject(ex, res, 500, ENGINE_DEAD_BODY);
      return;
    }

    const request = result.request;
    const work = poolingWork(request);
    ex.record.promptTokens = work.promptTokens;
    // Tokenize and detokenize never reach the engine: no random engine faults for them, only the header's.
    const fault = this.chooseFault(ex, read, false, engine);
    if (this.answerFaultAtOnce(ex, req, res, fault, request.model)) return;
    this.answerPooling(ex, res, request, work, fault, read.directives);
  }

  /**
   * After the engine's time (pooling routes: the base TTFT plus the prefill of every text it encodes; tokenize and
   * detokenize: none, unless `ttft_ms` asks for it), the answer, or the fault's error, reset or stall.
   */
  private answerPooling(ex: Exchange, res: ServerResponse, request: PoolingRequest, work: PoolingWork, fault: Fault | null, directives: Directives): void {
    const { store } = this;
    const { modifiers } = directives;
    const engine = usesEngine(request.route);
    const identity = {
      id: poolingResponseId(request.route, ex.record.requestId) ?? '',
      created: Math.floor(Date.now() / 1000),
      model: request.model,
    };
    const prefillMs = engine
      ? prefillDelayMs({ promptTokens: work.engineTokens, completionTokens: 0, cachedTokens: null }, modifiers.prefillMsPer1kTokens ?? this.opts.prefillMsPer1kTokens)
      : 0;
    const ttftMs = (modifiers.ttftMs ?? (engine ? this.opts.ttftMs : 0)) + prefillMs;
    const context = { seed: this.opts.seed, dimensions: this.opts.embeddingDimensions, tokenizer: this.tokenizer };
    const plan = {
      outputEvents: 0,
      completionTokens: 0,
      ttftMs,
      itlMs: modifiers.itlMs ?? this.opts.itlMs,
      jitter: this.opts.jitter,
      random: createRandom(deriveSeed(this.opts.seed, ex.record.seq)),
      fault,
      send: (): void => sendPoolingAnswer(res, renderPoolingAnswer(request, work, identity, context)),
    };
    const hooks: NonStreamHooks = {
      onFirstToken: () => {
        if (engine) this.setPhase(ex, 'running');
      },
      onEnd: ({ end, status, generationComplete }) => {
        if (engine && generationComplete) store.countSuccess(new Array<string>(work.engineRequests).fill('stop'));
        this.settle(ex, end, status);
      },
    };
    if (engine) {
      store.addPromptTokens(work.promptTokens ?? 0, work.engineTokens);
      this.setPhase(ex, 'waiting');
    }
    ex.control = startNonStream(res, plan, hooks);
    this.events.emit('request-start', { ...ex.record, headers: { ...ex.record.headers } });
  }
}

/** JSON as Starlette's JSONResponse (content-length); raw bytes as its StreamingResponse (chunked, one write per item). */
function sendPoolingAnswer(res: ServerResponse, answer: PoolingAnswer): void {
  if (answer.kind === 'json') {
    sendBody(res, 200, answer.body);
    return;
  }
  res.writeHead(200, { 'content-type': 'application/octet-stream', ...(answer.metadata === null ? {} : { metadata: answer.metadata }) });
  for (const chunk of answer.chunks) res.write(chunk);
  res.end();
}
