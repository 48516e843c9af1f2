/**
 * One request as a client sees it: status, whether the answer was delivered complete (every finish_reason,
 * `[DONE]`, no error event), TTFT on the first output-bearing event, the gaps between output events, TPOT,
 * end-to-end time, usage, and what Waybill's own error events say. It reads the response with its own parser
 * (load/sse.ts), never Waybill's: it is the oracle the reconciliation checks Waybill against.
 */
import { subscribe } from 'node:diagnostics_channel';
import { request, type Dispatcher } from 'undici';
import { createEventReader, readEvent, readJson, type ClientEvent, type Usage } from './sse.js';
import { promptText, type PlannedRequest } from './workload.js';

export type { Usage } from './sse.js';

/** The label values of docs/metrics.md, as the client can tell them. */
export type Outcome = 'delivered' | 'rejected' | 'failed' | 'timeout' | 'stream_error' | 'incomplete' | 'client_cancelled';
export type CancelPhase = 'queued' | 'before_first_token' | 'streaming';
export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'content_filter' | 'function_call' | 'abort' | 'repetition' | 'other' | 'none';

export interface RequestResult {
  readonly plan: PlannedRequest;
  /** Milliseconds since the run started. */
  readonly startedAt: number;
  /**
   * Milliseconds from the start until the request's first byte was written to the socket (undefined if it never
   * was). Waybill's clocks start when it reads the request, so the reconciliation times from here.
   */
  readonly sentMs: number | undefined;
  readonly status: number | undefined;
  /** The outcome and code as the client can tell them (Waybill's labels). */
  readonly outcome: Outcome;
  readonly code: number;
  readonly cancelPhase: CancelPhase | undefined;
  readonly ttftMs: number | undefined;
  readonly tpotMs: number | undefined;
  readonly e2eMs: number;
  readonly itlMs: readonly number[];
  readonly outputEvents: number;
  readonly usage: Usage | undefined;
  /** One per expected choice, when a response was committed (status 200). */
  readonly finishReasons: readonly FinishReason[];
  /** The client left after every choice had finished but before the response ended: Waybill may count either. */
  readonly cancelRacedEnd: boolean;
  /** A problem the client saw that no outcome explains (a bug to report), e.g. `[DONE]` without every finish. */
  readonly anomaly: string | undefined;
  /** A transport error message, when the request failed below HTTP. */
  readonly error: string | undefined;
}

export interface ClientOptions {
  readonly baseUrl: string;
  readonly model: string;
  readonly apiKey: string | undefined;
  readonly dispatcher: Dispatcher;
  readonly runStart: number;
  readonly timeoutMs: number;
  /** The request's x-request-id is `<idPrefix>-<index>`. */
  readonly idPrefix: string;
}

function body(plan: PlannedRequest, model: string): string {
  const prompt = promptText(plan.promptTokens, plan.index);
  const common = { model, max_tokens: plan.maxTokens, n: plan.n, stream: plan.stream };
  const options = plan.includeUsage ? { stream_options: { include_usage: true } } : {};
  return JSON.stringify(
    plan.route === 'chat_completions'
      ? { ...common, ...options, messages: [{ role: 'user', content: prompt }] }
      : { ...common, ...options, prompt },
  );
}

const PATHS = { chat_completions: '/v1/chat/completions', completions: '/v1/completions' } as const;

/**
 * docs/errors.md: the error events Waybill itself writes on a committed stream carry a string `code`; the
 * outcome each is counted as (docs/metrics.md). An upstream's error event (a numeric code) is `stream_error`.
 */
const GATEWAY_STREAM_ERRORS: Readonly<Record<string, Outcome>> = {
  stream_truncated: 'incomplete',
  stream_timeout: 'timeout',
  internal_error: 'incomplete',
};

const FINISH_LABELS: ReadonlySet<string> = new Set(['stop', 'length', 'tool_calls', 'content_filter', 'function_call', 'abort', 'repetition']);

/** docs/metrics.md `finish_reason`: the closed set, `other` for any other value, `none` for a choice without one. */
export function finishLabel(reason: string | undefined): FinishReason {
  if (reason === undefined) return 'none';
  return FINISH_LABELS.has(reason) ? (reason as FinishReason) : 'other';
}

/**
 * The outcome of an error status, as Waybill counts it: a 504 is `timeout` only when Waybill's own deadline fired
 * (its body says `upstream_timeout`); an upstream's error event with code 504, passed through, is `failed`.
 */
export function statusOutcome(status: number, body: string): Outcome {
  if (status < 500) return 'rejected';
  if (status !== 504) return 'failed';
  try {
    return (JSON.parse(body) as { error?: { code?: unknown } }).error?.code === 'upstream_timeout' ? 'timeout' : 'failed';
  } catch {
    return 'failed';
  }
}

// When each request's first byte is written: undici publishes it on a diagnostics channel, with the request's
// origin and headers (so requests other clients in the process send, e.g. a gateway's upstream requests carrying
// the same x-request-id, are told apart).
interface SentSocket {
  readonly writableLength: number;
}
const sendWatchers = new Map<string, (socket: SentSocket | undefined) => void>();
subscribe('undici:client:sendHeaders', (message) => {
  const { request: sent, socket } = message as { request?: { origin?: unknown; headers?: unknown }; socket?: SentSocket };
  if (socket !== undefined) for (const watch of connectionWatches) if (watch.sockets.has(socket)) watch.sockets.set(socket, true);
  const headers = sent?.headers;
  if (!Array.isArray(headers)) return;
  for (let i = 0; i + 1 < headers.length; i += 2) {
    if (String(headers[i]).toLowerCase() !== 'x-request-id') continue;
    const key = `${String(sent?.origin)} ${String(headers[i + 1])}`;
    const watcher = sendWatchers.get(key);
    sendWatchers.delete(key);
    watcher?.(socket);
    return;
  }
});

// Connections the HTTP client opens and never sends a request on: undici's pool does that now and then around
// aborted requests. Waybill answers such a connection with a 408 (`_other`, counted) if it stays open past its
// `server.headers_timeout`; the client cannot know whether it did, so the reconciliation bounds it (docs/load.md).
interface ConnectionWatch {
  readonly origin: string;
  /** Each connection opened to the origin while watched: whether a request was sent on it. */
  readonly sockets: Map<object, boolean>;
}
const connectionWatches = new Set<ConnectionWatch>();
subscribe('undici:client:connected', (message) => {
  const { connectParams, socket } = message as { connectParams?: { protocol?: unknown; host?: unknown }; socket?: object };
  if (socket === undefined) return;
  const origin = `${String(connectParams?.protocol)}//${String(connectParams?.host)}`;
  for (const watch of connectionWatches) if (watch.origin === origin) watch.sockets.set(socket, false);
});

/** Watches the connections any HTTP client in the process opens to `baseUrl`; the returned function stops and
 * returns how many carried no request. */
export function watchEmptyConnections(baseUrl: string): () => number {
  const watch: ConnectionWatch = { origin: new URL(baseUrl).origin, sockets: new Map() };
  connectionWatches.add(watch);
  return () => {
    connectionWatches.delete(watch);
    return [...watch.sockets.values()].filter((used) => !used).length;
  };
}

export async function runRequest(plan: PlannedRequest, options: ClientOptions): Promise<RequestResult> {
  const started = performance.now();
  const abort = new AbortController();
  // One prompt per request: n choices.
  const expected = plan.n;
  const finishes = new Map<number, string>();
  const itl: number[] = [];
  let firstOutputAt: number | undefined;
  let lastOutputAt: number | undefined;
  let outputEvents = 0;
  /** How the response ended, when the client saw it end: `[DONE]` or an error event. */
  let ending: Extract<ClientEvent, { kind: 'done' | 'error' }> | undefined;
  let endedAt: number | undefined;
  let usage: Usage | undefined;
  let status: number | undefined;
  let sentAt: number | undefined;
  let cancelledAt: number | undefined;
  let anomaly: string | undefined;
  let error: string | undefined;
  let errorBody = '';

  const requestId = `${options.idPrefix}-${plan.index}`;
  const sendKey = `${new URL(options.baseUrl).origin} ${requestId}`;
  let socket: SentSocket | undefined;
  let cancelWhenSent = false;
  sendWatchers.set(sendKey, (sentOn) => {
    sentAt = performance.now();
    socket = sentOn;
    // Published just before the bytes are written: leave after the write, not inside it.
    if (cancelWhenSent) setImmediate(cancelOnceWritten);
  });
  const allFinished = () => finishes.size === expected;
  const cancel = () => {
    if (cancelledAt !== undefined || ending !== undefined) return;
    cancelledAt = performance.now();
    abort.abort();
  };
  // Leaving before the whole request is on the wire leaves Waybill a connection without a request (or nothing at
  // all), which no client can tell apart: a planned early cancellation waits until the request was written and
  // handed to the kernel. Against the simulator the first token is held back long after either moment.
  let cancelTimer: NodeJS.Timeout | undefined;
  let over = false;
  const cancelOnceWritten = () => {
    if (over) return;
    if (socket === undefined || socket.writableLength === 0) cancel();
    else cancelTimer = setTimeout(cancelOnceWritten, 1);
  };
  const plannedCancel = plan.cancel;
  if (plannedCancel?.phase === 'before_first_token') {
    cancelTimer = setTimeout(() => (sentAt === undefined ? (cancelWhenSent = true) : cancelOnceWritten()), plannedCancel.afterMs);
  }
  const deadline = setTimeout(() => abort.abort(), options.timeoutMs);

  const onEvent = (event: ClientEvent, at: number) => {
    if (ending !== undefined) {
      // Waybill drops what follows `[DONE]`, and the `[DONE]` vLLM sends after an error event.
      anomaly ??= ending.kind === 'done' ? 'an event after [DONE] reached the client' : 'an event after an error event reached the client';
      return;
    }
    switch (event.kind) {
      case 'done':
      case 'error':
        ending = event;
        endedAt = at;
        return;
      case 'malformed':
        anomaly ??= 'malformed event reached the client';
        return;
      case 'chunk':
        for (const [index, reason] of event.finishes) {
          if (Number.isInteger(index) && index >= 0 && index < expected && !finishes.has(index)) finishes.set(index, reason);
        }
        if (event.usage !== undefined) usage = event.usage;
        if (event.output.length > 0) {
          outputEvents++;
          if (lastOutputAt !== undefined) itl.push(at - lastOutputAt);
          firstOutputAt ??= at;
          lastOutputAt = at;
          if (plannedCancel?.phase === 'streaming' && outputEvents >= plannedCancel.afterEvents) cancel();
        }
        return;
    }
  };

  try {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-request-id': requestId };
    if (plan.simHeader !== undefined) headers['x-sim-fault'] = plan.simHeader;
    if (options.apiKey !== undefined) headers['authorization'] = `Bearer ${options.apiKey}`;
    const response = await request(`${options.baseUrl}${PATHS[plan.route]}`, {
      method: 'POST',
      headers,
      body: body(plan, options.model),
      signal: abort.signal,
      dispatcher: options.dispatcher,
    });
    status = response.statusCode;
    const isStream = String(response.headers['content-type'] ?? '').startsWith('text/event-stream');
    if (status === 200 && isStream) {
      const reader = createEventReader(
        (data) => onEvent(readEvent(data), performance.now()),
        () => (anomaly ??= 'oversized event reached the client'),
      );
      for await (const chunk of response.body) reader.feed(chunk as Uint8Array);
      reader.end();
    } else {
      errorBody = await response.body.text();
      if (status === 200) {
        let event: ClientEvent;
        try {
          event = readJson(JSON.parse(errorBody));
        } catch {
          event = { kind: 'malformed' };
        }
        onEvent(event, performance.now());
        if (event.kind === 'chunk') {
          ending = { kind: 'done' };
          endedAt = performance.now();
        }
      }
    }
  } catch (err) {
    if (cancelledAt === undefined) error = (err as Error).message;
  } finally {
    over = true;
    clearTimeout(cancelTimer);
    clearTimeout(deadline);
    sendWatchers.delete(sendKey);
  }
  const finished = performance.now();

  let outcome: Outcome;
  let code = status ?? 0;
  let cancelPhase: CancelPhase | undefined;
  // A response that ended (its `[DONE]` or error event arrived) before the client left was not cancelled: the
  // bytes were written, and Waybill had ended the response, before the client's close reached it.
  if (cancelledAt !== undefined && ending === undefined) {
    outcome = 'client_cancelled';
    cancelPhase = firstOutputAt === undefined ? 'before_first_token' : 'streaming';
    code = status ?? 499;
  } else if (status === undefined) {
    outcome = 'failed';
    anomaly ??= `no response: ${error ?? 'unknown'}`;
  } else if (status !== 200) {
    outcome = statusOutcome(status, errorBody);
  } else if (!plan.stream) {
    outcome = allFinished() ? 'delivered' : 'incomplete';
  } else if (ending?.kind === 'done') {
    outcome = 'delivered';
    if (!allFinished()) anomaly ??= '[DONE] arrived without a finish_reason for every choice';
  } else if (ending?.kind === 'error') {
    outcome = (ending.code === undefined ? undefined : GATEWAY_STREAM_ERRORS[ending.code]) ?? 'stream_error';
  } else {
    outcome = 'incomplete';
    anomaly ??= 'the stream ended with neither [DONE] nor an error event';
  }

  const perChoice = usage?.completionTokens !== undefined ? usage.completionTokens / Math.max(1, expected) : undefined;
  const tpotMs =
    outcome === 'delivered' && plan.stream && firstOutputAt !== undefined && lastOutputAt !== undefined && perChoice !== undefined && perChoice >= 2
      ? (lastOutputAt - firstOutputAt) / (perChoice - 1)
      : undefined;
  const committed = status === 200;
  return {
    plan,
    startedAt: started - options.runStart,
    sentMs: sentAt === undefined ? undefined : sentAt - started,
    status,
    outcome,
    code,
    cancelPhase,
    ttftMs: plan.stream && firstOutputAt !== undefined ? firstOutputAt - started : undefined,
    tpotMs,
    // A delivered answer ends at its `[DONE]` (or body), a cancellation when the client left.
    e2eMs: ((outcome === 'client_cancelled' ? cancelledAt : endedAt) ?? finished) - started,
    itlMs: itl,
    outputEvents,
    usage,
    finishReasons: committed ? Array.from({ length: expected }, (_, i) => finishLabel(finishes.get(i))) : [],
    cancelRacedEnd: outcome === 'client_cancelled' && allFinished(),
    anomaly,
    error,
  };
}
