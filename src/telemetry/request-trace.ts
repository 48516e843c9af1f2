/**
 * The span contract: one SERVER span per logical request, one CLIENT span per upstream attempt (its child), and the
 * W3C `traceparent` sent upstream naming the attempt span, so vLLM's own `llm_request` span nests under the attempt
 * that produced it. Attribute names follow the HTTP and GenAI semantic conventions; Waybill's delivery facts are
 * under `waybill.*`. docs/observability.md lists every attribute and event; test/tracing.test.ts checks them.
 *
 * Prompts and completions are never recorded. Upstream error messages only with `tracing.capture_content`.
 */
import {
  context,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Span,
  type Tracer,
} from '@opentelemetry/api';
import {
  ATTR_ERROR_TYPE,
  ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_RESPONSE_STATUS_CODE,
  ATTR_HTTP_ROUTE,
  ATTR_SERVER_ADDRESS,
  ATTR_SERVER_PORT,
  ATTR_URL_PATH,
} from '@opentelemetry/semantic-conventions';
import type { AttemptRecord, Settlement } from '../accounting/ledger.js';
import { OUTPUT_CHECKS, type AnomalyKind, type ProxiedRoute, type RetryReason } from '../accounting/outcomes.js';
import type { EvaluationSample } from './evaluation.js';
import type { UpstreamError } from '../sse/classify.js';

/** GenAI semantic-convention names (incubating upstream, so kept here rather than imported). */
export const GEN_AI = {
  operationName: 'gen_ai.operation.name',
  providerName: 'gen_ai.provider.name',
  requestModel: 'gen_ai.request.model',
  requestMaxTokens: 'gen_ai.request.max_tokens',
  requestChoiceCount: 'gen_ai.request.choice.count',
  requestTemperature: 'gen_ai.request.temperature',
  requestTopP: 'gen_ai.request.top_p',
  requestSeed: 'gen_ai.request.seed',
  requestStream: 'gen_ai.request.stream',
  responseModel: 'gen_ai.response.model',
  responseId: 'gen_ai.response.id',
  responseFinishReasons: 'gen_ai.response.finish_reasons',
  usageInputTokens: 'gen_ai.usage.input_tokens',
  usageOutputTokens: 'gen_ai.usage.output_tokens',
  usageCacheReadInputTokens: 'gen_ai.usage.cache_read.input_tokens',
} as const;

/** Waybill's own attributes. */
export const WAYBILL = {
  requestId: 'waybill.request_id',
  tenant: 'waybill.tenant',
  outcome: 'waybill.outcome',
  attempts: 'waybill.attempts',
  ttftMs: 'waybill.ttft_ms',
  tpotMs: 'waybill.tpot_ms',
  slo: 'waybill.slo',
  promptLen: 'waybill.prompt_len',
  anomalies: 'waybill.anomalies',
  cancelPhase: 'waybill.cancel_phase',
  upstream: 'waybill.upstream',
  attempt: 'waybill.attempt',
  attemptResult: 'waybill.attempt.result',
  attemptFirstOutputMs: 'waybill.attempt.first_output_ms',
  retryReason: 'waybill.retry_reason',
  accepted: 'waybill.accepted',
  checksFailed: 'waybill.checks.failed',
  routingReason: 'waybill.routing.reason',
  routingPolicy: 'waybill.routing.policy',
  routingPredictedCachedTokens: 'waybill.routing.predicted_cached_tokens',
} as const;

/** Span event names. */
export const EVENTS = {
  firstOutput: 'first_output_written',
  upstreamError: 'upstream_error',
  anomaly: 'stream_anomaly',
  retryScheduled: 'retry_scheduled',
  clientCancelled: 'client_cancelled',
  evaluationSample: 'waybill.evaluation_sample',
} as const;

/** What is known of a request when it starts. */
export interface RequestStart {
  readonly route: ProxiedRoute;
  readonly path: string;
  readonly model: string;
  readonly stream: boolean;
  readonly requestId: string;
  readonly arrivalAt: number;
  /** The client's body, for request parameters (numbers only are read). */
  readonly body: Record<string, unknown>;
}

/** Per-request tracing as the exchange uses it. The disabled variant costs nothing. */
export interface RequestTrace {
  /** The trace id when the request is sampled (for exemplars and logs). */
  readonly traceId: string | undefined;
  /** Starts the attempt's CLIENT span; returns the trace-context headers to send upstream (undefined: none). */
  attemptStarted(number: number, upstream: { name: string; url: URL }, at: number, retriedFor: RetryReason | undefined): Record<string, string> | undefined;
  attemptEnded(number: number, record: AttemptRecord | undefined, at: number): void;
  firstOutput(at: number): void;
  upstreamError(number: number, error: UpstreamError, at: number): void;
  anomaly(number: number, kind: AnomalyKind, at: number): void;
  retryScheduled(reason: RetryReason, delayMs: number, at: number): void;
  clientCancelled(at: number): void;
  /** Ends the request's span; a response sampled for evaluation gets the sample as an event. */
  settle(settlement: Settlement, at: number, sample?: EvaluationSample): void;
}

export const NO_TRACE: RequestTrace = {
  traceId: undefined,
  attemptStarted: () => undefined,
  attemptEnded: () => undefined,
  firstOutput: () => undefined,
  upstreamError: () => undefined,
  anomaly: () => undefined,
  retryScheduled: () => undefined,
  clientCancelled: () => undefined,
  settle: () => undefined,
};

/** gen_ai.operation.name: the semantic conventions' names where they have one, else the route's own. */
const OPERATION: Record<ProxiedRoute, string> = {
  chat_completions: 'chat',
  completions: 'text_completion',
  responses: 'chat',
  messages: 'chat',
  embeddings: 'embeddings',
  pooling: 'pooling',
  classify: 'classify',
  score: 'score',
  rerank: 'rerank',
  tokenize: 'tokenize',
  detokenize: 'detokenize',
  transcriptions: 'transcription',
  translations: 'translation',
  responses_retrieve: 'retrieve_response',
  responses_cancel: 'cancel_response',
  count_tokens: 'count_tokens',
  passthrough: 'passthrough',
};

const PARAMS: Array<[string, string]> = [
  ['max_tokens', GEN_AI.requestMaxTokens],
  ['max_completion_tokens', GEN_AI.requestMaxTokens],
  ['n', GEN_AI.requestChoiceCount],
  ['temperature', GEN_AI.requestTemperature],
  ['top_p', GEN_AI.requestTopP],
  ['seed', GEN_AI.requestSeed],
];

/** Reads the `traceparent`/`tracestate` the client sent. */
const headerGetter = {
  keys: (carrier: Record<string, string | string[] | undefined>) => Object.keys(carrier),
  get: (carrier: Record<string, string | string[] | undefined>, key: string) => carrier[key],
};

class SpanTrace implements RequestTrace {
  private readonly span: Span;
  private readonly context: Context;
  private readonly attempts = new Map<number, Span>();
  private readonly arrivalAt: number;

  constructor(
    private readonly tracer: Tracer,
    clientHeaders: Record<string, string | string[] | undefined>,
    start: RequestStart,
    private readonly captureContent: boolean,
  ) {
    this.arrivalAt = start.arrivalAt;
    const parent = propagation.extract(ROOT_CONTEXT, clientHeaders, headerGetter);
    const attributes: Attributes = {
      [ATTR_HTTP_REQUEST_METHOD]: 'POST',
      [ATTR_HTTP_ROUTE]: start.path,
      [ATTR_URL_PATH]: start.path,
      [GEN_AI.operationName]: OPERATION[start.route],
      // The API the upstream speaks on this route: vLLM serves Anthropic's Messages API too.
      [GEN_AI.providerName]: start.route === 'messages' ? 'anthropic' : 'openai',
      [GEN_AI.requestModel]: start.model,
      [GEN_AI.requestStream]: start.stream,
      [WAYBILL.requestId]: start.requestId,
    };
    for (const [field, name] of PARAMS) {
      const value = start.body[field];
      if (typeof value === 'number' && Number.isFinite(value)) attributes[name] = value;
    }
    this.span = tracer.startSpan(`POST ${start.path}`, { kind: SpanKind.SERVER, startTime: start.arrivalAt, attributes }, parent);
    this.context = trace.setSpan(parent, this.span);
    this.traceId = this.span.isRecording() ? this.span.spanContext().traceId : undefined;
  }

  /** Read at the start: a span stops recording when it ends, and the id is wanted after that (logs, exemplars). */
  readonly traceId: string | undefined;

  attemptStarted(number: number, upstream: { name: string; url: URL }, at: number, retriedFor: RetryReason | undefined): Record<string, string> {
    const port = Number(upstream.url.port) || (upstream.url.protocol === 'https:' ? 443 : 80);
    const attributes: Attributes = {
      [WAYBILL.upstream]: upstream.name,
      [WAYBILL.attempt]: number,
      [ATTR_SERVER_ADDRESS]: upstream.url.hostname,
      [ATTR_SERVER_PORT]: port,
      [ATTR_HTTP_REQUEST_METHOD]: 'POST',
    };
    if (retriedFor !== undefined) attributes[WAYBILL.retryReason] = retriedFor;
    const span = this.tracer.startSpan(`attempt ${number} ${upstream.name}`, { kind: SpanKind.CLIENT, startTime: at, attributes }, this.context);
    this.attempts.set(number, span);
    const headers: Record<string, string> = {};
    propagation.inject(trace.setSpan(context.active(), span), headers);
    return headers;
  }

  attemptEnded(number: number, record: AttemptRecord | undefined, at: number): void {
    const span = this.attempts.get(number);
    if (span === undefined) return;
    this.attempts.delete(number);
    if (record !== undefined) {
      const result = record.result ?? 'cancelled';
      span.setAttribute(WAYBILL.attemptResult, result);
      if (record.status !== undefined) span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, record.status);
      if (record.firstOutputAt !== undefined) span.setAttribute(WAYBILL.attemptFirstOutputMs, record.firstOutputAt - record.startedAt);
      if (result !== 'ok' && result !== 'cancelled' && result !== 'http_4xx') {
        span.setAttribute(ATTR_ERROR_TYPE, result);
        span.setStatus({ code: SpanStatusCode.ERROR });
      }
    }
    span.end(at);
  }

  firstOutput(at: number): void {
    this.span.addEvent(EVENTS.firstOutput, at);
  }

  upstreamError(number: number, error: UpstreamError, at: number): void {
    const attributes: Attributes = {};
    if (error.type !== undefined) attributes['error.type'] = error.type;
    if (error.code !== undefined) attributes['error.code'] = error.code;
    if (this.captureContent && error.message !== undefined) attributes['error.message'] = error.message;
    this.attempts.get(number)?.addEvent(EVENTS.upstreamError, attributes, at);
  }

  anomaly(number: number, kind: AnomalyKind, at: number): void {
    this.attempts.get(number)?.addEvent(EVENTS.anomaly, { 'waybill.anomaly': kind }, at);
  }

  retryScheduled(reason: RetryReason, delayMs: number, at: number): void {
    this.span.addEvent(EVENTS.retryScheduled, { [WAYBILL.retryReason]: reason, 'waybill.retry_delay_ms': delayMs }, at);
  }

  clientCancelled(at: number): void {
    this.span.addEvent(EVENTS.clientCancelled, at);
  }

  settle(s: Settlement, at: number, sample?: EvaluationSample): void {
    const span = this.span;
    const attributes: Attributes = {
      [ATTR_HTTP_RESPONSE_STATUS_CODE]: s.code,
      [WAYBILL.outcome]: s.outcome,
      [WAYBILL.tenant]: s.tenant,
      [WAYBILL.attempts]: s.attempts.length,
      [WAYBILL.slo]: s.slo,
      [WAYBILL.promptLen]: s.promptLen,
    };
    if (s.responseModel !== undefined) attributes[GEN_AI.responseModel] = s.responseModel;
    if (s.responseId !== undefined) attributes[GEN_AI.responseId] = s.responseId;
    if (s.finishReasons.length > 0) attributes[GEN_AI.responseFinishReasons] = [...s.finishReasons];
    if (s.usage?.promptTokens !== undefined) attributes[GEN_AI.usageInputTokens] = s.usage.promptTokens;
    if (s.usage?.completionTokens !== undefined) attributes[GEN_AI.usageOutputTokens] = s.usage.completionTokens;
    if (s.usage?.cachedTokens !== undefined) attributes[GEN_AI.usageCacheReadInputTokens] = s.usage.cachedTokens;
    if (s.ttftMs !== undefined) attributes[WAYBILL.ttftMs] = s.ttftMs;
    if (s.tpotMs !== undefined) attributes[WAYBILL.tpotMs] = s.tpotMs;
    if (s.cancelPhase !== undefined) attributes[WAYBILL.cancelPhase] = s.cancelPhase;
    if (s.routing !== undefined) {
      attributes[WAYBILL.routingPolicy] = s.routing.policy;
      attributes[WAYBILL.routingReason] = s.routing.reason;
      attributes[WAYBILL.routingPredictedCachedTokens] = s.routing.predictedCachedTokens;
    }
    if (s.anomalies.length > 0) attributes[WAYBILL.anomalies] = s.anomalies.map((a) => a.kind);
    attributes[WAYBILL.accepted] = s.accepted;
    if (s.failedChecks.length > 0) attributes[WAYBILL.checksFailed] = [...s.failedChecks];
    span.setAttributes(attributes);
    if (sample !== undefined) span.addEvent(EVENTS.evaluationSample, sampleAttributes(sample), at);
    // A failure of the gateway or the upstream is an error; a client's own mistake (4xx) or leaving is not.
    const failed = s.outcome === 'failed' || s.outcome === 'timeout' || s.outcome === 'stream_error' || s.outcome === 'incomplete';
    if (failed) {
      span.setAttribute(ATTR_ERROR_TYPE, s.outcome === 'failed' ? String(s.code) : s.outcome);
      span.setStatus({ code: SpanStatusCode.ERROR });
    }
    // Attempts still open (the drain grace cut them) end with the request.
    for (const [number] of this.attempts) this.attemptEnded(number, s.attempts[number - 1], at);
    // The request ends for the client when its response ended (or it left), not when the drain grace ran out.
    span.end(this.arrivalAt + s.durationMs);
  }
}

/** A sample as span-event attributes: flat, with per-choice checks as arrays in choice order. */
function sampleAttributes(sample: EvaluationSample): Attributes {
  const attributes: Attributes = {
    [WAYBILL.requestId]: sample.request_id,
    'waybill.evaluation.inclusion_probability': sample.inclusion_probability,
    [WAYBILL.accepted]: sample.accepted,
    [GEN_AI.responseFinishReasons]: [...sample.finish_reasons],
  };
  for (const check of OUTPUT_CHECKS) attributes[`waybill.check.${check}`] = sample.checks.map((c) => c[check]);
  // Content only when the operator turned capture on (evaluation.capture_content).
  if (sample.answers !== undefined) attributes['waybill.evaluation.answers'] = sample.answers.map((a) => a ?? '');
  return attributes;
}

/** Creates the trace of one logical request, or the no-op trace when tracing is off. */
export function startRequestTrace(
  tracer: Tracer | undefined,
  clientHeaders: Record<string, string | string[] | undefined>,
  start: RequestStart,
  captureContent: boolean,
): RequestTrace {
  return tracer === undefined ? NO_TRACE : new SpanTrace(tracer, clientHeaders, start, captureContent);
}
