/**
 * What the simulator saw and sent: SimStats (GET /sim/stats, resettable) and the engine-side counters behind
 * GET /metrics (monotonic for the simulator's life, like a real vLLM process). Never holds prompt text or keys.
 */
import { FAULT_KINDS, type FaultKind } from './faults.js';

/** Every route the simulator counts, in the order SimStats.byRoute lists them. */
export const ROUTE_NAMES = [
  'chat_completions',
  'completions',
  'responses',
  'responses_retrieve',
  'responses_cancel',
  'messages',
  'count_tokens',
  'embeddings',
  'pooling',
  'classify',
  'score',
  'rerank',
  'tokenize',
  'detokenize',
  'transcriptions',
  'translations',
  'other',
] as const;

export type RouteName = (typeof ROUTE_NAMES)[number];

/**
 * vLLM's operational endpoints (docs/vllm-routes.md: not API routes): what a gateway reads for itself — health
 * checks, model discovery, scrapes, load probes — never a client's request sent on. The simulator counts them apart
 * (SimStats.operational), not as requests, so that a gateway's own reads never pass for attempts, however often it
 * makes them. Every other path is an API route (or an unknown one, `other`, which a passthrough would reach).
 */
export const OPERATIONAL_PATHS = ['/health', '/ping', '/version', '/load', '/metrics', '/v1/models'] as const;

export type OperationalPath = (typeof OPERATIONAL_PATHS)[number];

export function isOperationalPath(path: string): path is OperationalPath {
  return (OPERATIONAL_PATHS as readonly string[]).includes(path);
}

/**
 * How a request ended. `fault`: a fault was injected (whether or not [DONE] went out); `rejected`: an error
 * status before any generation (validation, auth, unknown model or route, dead engine), or vLLM's lazy refusal of a
 * replay it cannot give (a 200, then the connection cut);
 * `client_disconnect`: the client closed the connection before the simulator finished its response;
 * `cancelled`: a background response's generation, stopped by `POST /v1/responses/{id}/cancel`.
 */
export type RequestEnd = 'completed' | 'fault' | 'client_disconnect' | 'rejected' | 'cancelled';

export interface RecordedHeaders {
  'x-request-id'?: string;
  traceparent?: string;
  tracestate?: string;
  /** Only whether it was there: keys are never stored. */
  authorization?: 'present';
}

export interface RequestRecord {
  seq: number;
  /** X-Request-Id as received, or generated. */
  requestId: string;
  route: RouteName;
  /** The request path without its query (first 256 chars): tells `/score` from `/v1/score`, `/v2/rerank` from `/rerank`. */
  path: string;
  /** The `model` field as received; null when absent or not read. */
  model: string | null;
  stream: boolean;
  n: number;
  /** stream_options.include_usage as received; null when absent. */
  includeUsage: boolean | null;
  headers: RecordedHeaders;
  fault: FaultKind | null;
  end: RequestEnd;
  /** HTTP status sent; 0 when no status line went out (reset_before_response). */
  status: number;
  outputEventsSent: number;
  completionTokensSent: number;
  /**
   * The `prompt_tokens` the answer's usage reports (generation, embeddings, pooling, classify, score, rerank), known
   * once the request passed validation, whether or not the answer then went out; null before that, and always for
   * tokenize and detokenize, which carry no usage.
   */
  promptTokens: number | null;
  /**
   * The response id: on `/v1/responses`, the answer's once the request passed validation; on the stored-response
   * routes, the id the path names. Absent on every other route.
   */
  responseId?: string;
}

export interface SimStats {
  /** Requests on the API routes (every route but the operational paths): what a gateway's attempts add to. */
  requests: number;
  byRoute: Record<RouteName, number>;
  /** Requests on the operational paths, by path: a gateway's own reads, never counted in `requests`. */
  operational: Record<OperationalPath, number>;
  inflight: number;
  /** Finished normally, [DONE] included, no fault injected. */
  completed: number;
  clientDisconnects: number;
  faultsInjected: Record<FaultKind, number>;
  tokens: { prompt: number; completion: number };
  byStatus: Record<string, number>;
  /** Last RECENT_LIMIT records, oldest first. */
  recent: RequestRecord[];
}

export const RECENT_LIMIT = 200;

/** The engine's finish-reason enum, which labels vllm:request_success_total. */
export const ENGINE_FINISH_REASONS = ['stop', 'length', 'abort', 'error', 'repetition'] as const;
export type EngineFinishReason = (typeof ENGINE_FINISH_REASONS)[number];

/** API finish_reason → engine enum: tool calls (and anything else non-engine) count as `stop`. */
export function engineFinishReason(apiReason: string): EngineFinishReason {
  return (ENGINE_FINISH_REASONS as readonly string[]).includes(apiReason) ? (apiReason as EngineFinishReason) : 'stop';
}

export interface EngineCounters {
  waiting: number;
  running: number;
  promptTokens: number;
  generationTokens: number;
  success: Record<EngineFinishReason, number>;
}

function zeroRoutes(): Record<RouteName, number> {
  const routes = {} as Record<RouteName, number>;
  for (const route of ROUTE_NAMES) routes[route] = 0;
  return routes;
}

function zeroOperational(): Record<OperationalPath, number> {
  const paths = {} as Record<OperationalPath, number>;
  for (const path of OPERATIONAL_PATHS) paths[path] = 0;
  return paths;
}

function zeroFaults(): Record<FaultKind, number> {
  const faults = {} as Record<FaultKind, number>;
  for (const kind of FAULT_KINDS) faults[kind] = 0;
  return faults;
}

function copyRecord(record: RequestRecord): RequestRecord {
  return { ...record, headers: { ...record.headers } };
}

export class StatsStore {
  private requests = 0;
  private byRoute = zeroRoutes();
  private operational = zeroOperational();
  private inflight = 0;
  private completed = 0;
  private clientDisconnects = 0;
  private faultsInjected = zeroFaults();
  private promptTokens = 0;
  private completionTokens = 0;
  private byStatus: Record<string, number> = {};
  private recent: RequestRecord[] = [];

  readonly engine: EngineCounters = {
    waiting: 0,
    running: 0,
    promptTokens: 0,
    generationTokens: 0,
    success: { stop: 0, length: 0, abort: 0, error: 0, repetition: 0 },
  };

  countRequest(route: RouteName): void {
    this.requests += 1;
    this.byRoute[route] += 1;
  }

  countOperational(path: OperationalPath): void {
    this.operational[path] += 1;
  }

  countStatus(status: number): void {
    const key = String(status);
    this.byStatus[key] = (this.byStatus[key] ?? 0) + 1;
  }

  countFault(kind: FaultKind): void {
    this.faultsInjected[kind] += 1;
  }

  /**
   * `tokens`: what usage reports; `engineTokens`: what the engine computed, which differs for score and rerank
   * (usage counts each pair, query + separator + document; the engine encodes each text once).
   */
  addPromptTokens(tokens: number, engineTokens = tokens): void {
    this.promptTokens += tokens;
    this.engine.promptTokens += engineTokens;
  }

  addCompletionTokens(tokens: number): void {
    this.completionTokens += tokens;
    this.engine.generationTokens += tokens;
  }

  countSuccess(apiReasons: readonly string[]): void {
    for (const reason of apiReasons) this.engine.success[engineFinishReason(reason)] += 1;
  }

  open(): void {
    this.inflight += 1;
  }

  /** Close an opened request: its record joins `recent` and the end counters. */
  close(record: RequestRecord): void {
    this.inflight -= 1;
    if (record.end === 'completed') this.completed += 1;
    if (record.end === 'client_disconnect') this.clientDisconnects += 1;
    this.recent.push(copyRecord(record));
    if (this.recent.length > RECENT_LIMIT) this.recent.shift();
  }

  /** A detached copy: later requests do not change it. */
  snapshot(): SimStats {
    return {
      requests: this.requests,
      byRoute: { ...this.byRoute },
      operational: { ...this.operational },
      inflight: this.inflight,
      completed: this.completed,
      clientDisconnects: this.clientDisconnects,
      faultsInjected: { ...this.faultsInjected },
      tokens: { prompt: this.promptTokens, completion: this.completionTokens },
      byStatus: { ...this.byStatus },
      recent: this.recent.map(copyRecord),
    };
  }

  /** An engine restart: the /metrics counters start again from 0 (the gauges follow the requests still open). */
  restartEngine(): void {
    this.engine.promptTokens = 0;
    this.engine.generationTokens = 0;
    for (const reason of ENGINE_FINISH_REASONS) this.engine.success[reason] = 0;
  }

  /** Zero SimStats. `inflight` and the /metrics counters describe live state and are kept. */
  reset(): void {
    this.requests = 0;
    this.byRoute = zeroRoutes();
    this.operational = zeroOperational();
    this.completed = 0;
    this.clientDisconnects = 0;
    this.faultsInjected = zeroFaults();
    this.promptTokens = 0;
    this.completionTokens = 0;
    this.byStatus = {};
    this.recent = [];
  }
}

/** Prometheus text in vLLM's names (prometheus_client layout: HELP/TYPE, float values, `_total` counters). */
export function renderMetrics(engine: EngineCounters, modelName: string): string {
  const labels = `model_name=${JSON.stringify(modelName)},engine="0"`;
  const float = (value: number): string => (Number.isInteger(value) ? `${value}.0` : String(value));
  const lines: string[] = [
    '# HELP vllm:num_requests_running Number of requests in model execution batches.',
    '# TYPE vllm:num_requests_running gauge',
    `vllm:num_requests_running{${labels}} ${float(engine.running)}`,
    '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
    '# TYPE vllm:num_requests_waiting gauge',
    `vllm:num_requests_waiting{${labels}} ${float(engine.waiting)}`,
    '# HELP vllm:prompt_tokens_total Number of prefill tokens processed.',
    '# TYPE vllm:prompt_tokens_total counter',
    `vllm:prompt_tokens_total{${labels}} ${float(engine.promptTokens)}`,
    '# HELP vllm:generation_tokens_total Number of generation tokens processed.',
    '# TYPE vllm:generation_tokens_total counter',
    `vllm:generation_tokens_total{${labels}} ${float(engine.generationTokens)}`,
    '# HELP vllm:request_success_total Count of successfully processed requests.',
    '# TYPE vllm:request_success_total counter',
  ];
  for (const reason of ENGINE_FINISH_REASONS) {
    lines.push(`vllm:request_success_total{${labels},finished_reason="${reason}"} ${float(engine.success[reason])}`);
  }
  return `${lines.join('\n')}\n`;
}
