/**
 * What every route handler of the simulator shares: the options, the stats, the engine model, the response store and
 * the seeded draws, and one request's record from its start to its end (an Exchange). The HTTP server and its dispatch
 * are server.ts; each family's handler is in routes/.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { appliesToNonStream, type Fault, type FaultKind } from './faults.js';
import type { NonStreamHooks } from './nonstream.js';
import type { SimOptions } from './options.js';
import { createRandom, deriveSeed, type Random } from '../util/prng.js';
import { MAX_MODEL_LEN } from './request.js';
import { sendBody } from './respond.js';
import { ResponseStore } from './response-store.js';
import type { EventRouteRefusal, StoreLookup } from './responses.js';
import { SimTokenizer } from './tokens.js';
import { StatsStore, type RecordedHeaders, type RequestRecord, type RouteName } from './stats.js';
import type { StreamControl, StreamHooks } from './stream-engine.js';
import { createEngineCore } from './engine/core.js';
import { EngineMetrics } from './engine/metrics.js';
import { EngineRuntime, type EngineJob } from './engine/runtime.js';
import type { GenerationRoute } from './wire.js';

/** One request, from its acceptance to its record's end. */
export interface Exchange {
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

export const MAX_RECORDED_HEADER = 256;

export function isGenerationRoute(route: RouteName): route is GenerationRoute {
  return route === 'chat_completions' || route === 'completions';
}
/** The separate PRNG stream random faults are drawn from, in arrival order. */
const FAULT_STREAM = 0xfa017;
/** The stream lengthRate draws from: its own, so a share of `length` answers leaves the faults' draws as they were. */
const LENGTH_STREAM = 0x1e9;

/** The prefixes vLLM's --api-key middleware guards (a plain string-prefix test on the path). */
const GUARDED_PREFIXES = ['/v1', '/v2', '/inference'] as const;

export function headerValue(req: IncomingMessage, name: string): string | undefined {
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

export class SimContext {
  readonly store = new StatsStore();
  readonly faultRandom: Random;
  readonly lengthRandom: Random;
  readonly tokenizer = new SimTokenizer();
  readonly nonStreamFaultKinds: readonly FaultKind[];
  /** VLLM_ENABLE_RESPONSES_API_STORE's store: empty for ever when the option is off. */
  readonly responses = new ResponseStore();
  readonly storeLookup: StoreLookup = { contextChars: (id) => this.responses.get(id)?.contextChars };
  /** Background generations still running (close() stops them). */
  readonly backgroundRuns = new Set<StreamControl>();
  engineDead = false;
  private seq = 0;
  /** The engine model, or null (the timer). */
  readonly engine: EngineRuntime | null;
  readonly metrics: EngineMetrics | null;
  /** Requests with sequences in the engine, for a restart to cut. */
  readonly engineExchanges = new Set<Exchange>();

  constructor(
    readonly opts: Readonly<SimOptions>,
    /** 'request-start' and 'request-end' (Simulator.events). */
    readonly events: EventEmitter,
  ) {
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

  /** The seeded draws of one request (jitter, the choice order): its own stream, by arrival. */
  randomOf(ex: Exchange): Random {
    return createRandom(deriveSeed(this.opts.seed, ex.record.seq));
  }

  /**
   * An engine restart: requests the engine is running are cut (connection reset), the prefix cache is emptied, the
   * counters start again.
   */
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

  isAuthorized(req: IncomingMessage, path: string): boolean {
    // vLLM's --api-key middleware guards /v1, /v2 and /inference only: /health, /metrics, /tokenize, /pooling,
    // /score, /rerank… stay open.
    if (this.opts.apiKey === undefined || !GUARDED_PREFIXES.some((prefix) => path.startsWith(prefix))) return true;
    return req.headers.authorization === `Bearer ${this.opts.apiKey}`;
  }

  /** An answer with no record (operational endpoints): only its status is counted. */
  respond(res: ServerResponse, status: number, body: string, contentType?: string | null, headers?: Record<string, string>): void {
    this.store.countStatus(status);
    sendBody(res, status, body, contentType, headers);
  }

  // ---- request records ----

  open(req: IncomingMessage, route: RouteName, path: string): Exchange {
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

  setPhase(ex: Exchange, phase: Exchange['phase']): void {
    const engine = this.store.engine;
    if (ex.phase === 'waiting') engine.waiting -= 1;
    if (ex.phase === 'running') engine.running -= 1;
    if (phase === 'waiting') engine.waiting += 1;
    if (phase === 'running') engine.running += 1;
    ex.phase = phase;
  }

  /** One output event written: on the request's record and in the engine's completion-token counter. */
  countOutput(ex: Exchange, tokens: number): void {
    ex.record.outputEventsSent += 1;
    ex.record.completionTokensSent += tokens;
    this.store.addCompletionTokens(tokens);
  }

  /** `countStatus` false: the status was counted when it went out (a background response's answer). */
  settle(ex: Exchange, end: RequestRecord['end'], status: number, countStatus = true): void {
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

  /** The request is accepted (validated, fault chosen; a stream's 200 headers already sent). */
  emitStart(ex: Exchange): void {
    this.events.emit('request-start', { ...ex.record, headers: { ...ex.record.headers } });
  }

  reject(ex: Exchange, res: ServerResponse, status: number, body: string, headers?: Record<string, string>): void {
    sendBody(res, status, body, 'application/json', headers);
    this.settle(ex, 'rejected', status);
  }

  /**
   * An error a vLLM handler raised: Starlette's ServerErrorMiddleware answers, then re-raises, and uvicorn closes the
   * connection — after the response, with no `connection: close` header to warn the client's pool.
   */
  rejectThenClose(ex: Exchange, res: ServerResponse, status: number, body: string): void {
    const { socket } = res; // detached from the response once it finishes
    res.once('finish', () => socket?.end());
    this.reject(ex, res, status, body);
  }

  refuse(ex: Exchange, res: ServerResponse, refusal: EventRouteRefusal): void {
    if (refusal.closes) this.rejectThenClose(ex, res, refusal.status, refusal.body);
    else this.reject(ex, res, refusal.status, refusal.body);
  }

  applyFault(ex: Exchange, fault: Fault): void {
    ex.record.fault = fault.kind;
    this.store.countFault(fault.kind);
  }

  // ---- the hooks of an answer ----

  /**
   * A generation's stream: running from the first token, each output event counted, settled 200 at its end (a success
   * of `finishReasons` when the generation completed).
   */
  streamHooks(ex: Exchange, finishReasons: () => string[], onOutput?: (tokens: number) => void): StreamHooks {
    return {
      onFirstToken: () => this.setPhase(ex, 'running'),
      onOutput: (tokens) => {
        onOutput?.(tokens);
        this.countOutput(ex, tokens);
      },
      onEnd: ({ end, generationComplete }) => {
        if (generationComplete) this.store.countSuccess(finishReasons());
        this.settle(ex, end, 200);
      },
    };
  }

  /** A generation's whole-body answer: its tokens counted when it goes out, settled with its status. */
  nonStreamHooks(ex: Exchange, finishReasons: () => string[]): NonStreamHooks {
    return {
      onFirstToken: () => this.setPhase(ex, 'running'),
      onEnd: ({ end, status, completionTokensSent, generationComplete }) => {
        ex.record.completionTokensSent = completionTokensSent;
        this.store.addCompletionTokens(completionTokensSent);
        if (generationComplete) this.store.countSuccess(finishReasons());
        this.settle(ex, end, status);
      },
    };
  }
}
