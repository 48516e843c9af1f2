/**
 * One request as a client sees it: status, whether the answer was delivered complete (every finish reason, the
 * route's end — `[DONE]`, `response.completed`, `message_stop` — no error event; a JSON answer on the routes that
 * have no stream), TTFT on the first output-bearing event, the gaps between output events, TPOT, end-to-end time,
 * usage, and what Waybill's own error events say. It reads the response with its own parser (load/sse.ts,
 * load/load-routes.ts), never Waybill's: it is the oracle the reconciliation checks Waybill against.
 */
import { subscribe } from 'node:diagnostics_channel';
import { request, type Dispatcher } from 'undici';
import { readerOf, requestBody, ROUTE_PATHS, statusOutcome } from './load-routes.js';
import { createEventReader, type ClientEvent, type FinishReason, type Outcome, type Usage } from './sse.js';
import { choicesOf, type PlannedRequest } from './workload.js';

export type { FinishReason, Outcome, Usage } from './sse.js';
export { finishLabel } from './sse.js';
export { statusOutcome } from './load-routes.js';

export type CancelPhase = 'queued' | 'before_first_token' | 'streaming';

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
  /** A multi-turn request's answer text (choice 0) as received: the session's next turn sends it back. */
  readonly answerText?: string;
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

/** What the client makes of one answer's bytes, and the outcome it judges from them (docs/metrics.md). */
export interface Verdict {
  readonly outcome: Outcome;
  readonly code: number;
  readonly cancelPhase: CancelPhase | undefined;
  /** One per expected choice, when a response was committed (status 200). */
  readonly finishReasons: readonly FinishReason[];
  readonly cancelRacedEnd: boolean;
  readonly anomaly: string | undefined;
}

/**
 * Follows one answer as its events (or its whole body) arrive: finish reasons, usage, output events and their
 * times, how it ended. Pure apart from the clock values it is handed, so a literal wire transcript can be judged.
 */
export class AnswerObserver {
  /** Answers (choices) the request expects: n for chat and completions, 1 for Responses and Messages, else 0. */
  readonly expected: number;
  readonly finishes = new Map<number, FinishReason>();
  readonly itl: number[] = [];
  firstOutputAt: number | undefined;
  lastOutputAt: number | undefined;
  outputEvents = 0;
  /** How the response ended, when the client saw it end: the route's end (`done`) or an error event. */
  ending: Extract<ClientEvent, { kind: 'done' | 'error' }> | undefined;
  endedAt: number | undefined;
  usage: Usage | undefined;
  anomaly: string | undefined;
  /** Choice 0's text, kept only for a multi-turn session's turn (bounded by its max_tokens). */
  answerText = '';
  private readonly keepText: boolean;
  /** The last Responses `sequence_number` seen (-1: none yet). */
  private lastSequence = -1;
  private readonly reader;

  constructor(
    readonly plan: PlannedRequest,
    /** Called after each output-bearing event, with how many there were so far. */
    private readonly onOutput: (outputEvents: number) => void = () => {},
  ) {
    this.expected = plan.route === 'chat_completions' || plan.route === 'completions' ? plan.n : choicesOf(plan.route);
    this.reader = readerOf(plan.route);
    this.keepText = plan.fleet?.session !== undefined;
  }

  allFinished(): boolean {
    return this.finishes.size === this.expected;
  }

  private endName(): string {
    switch (this.plan.route) {
      case 'responses':
        return 'response.completed';
      case 'messages':
        return 'message_stop';
      case 'chat_completions':
      case 'completions':
      case 'embeddings':
      case 'rerank':
      case 'tokenize':
        return '[DONE]';
    }
  }

  event(event: ClientEvent, at: number): void {
    if (this.ending !== undefined) {
      // Waybill drops what follows the end, and the `[DONE]` vLLM sends after an error event.
      this.anomaly ??= this.ending.kind === 'done' ? `an event after ${this.endName()} reached the client` : 'an event after an error event reached the client';
      return;
    }
    if (event.kind !== 'malformed' && event.kind !== 'done' && this.plan.route === 'responses' && this.plan.stream) {
      // docs/routes.md: sequence numbers start at 0 and rise by one per event; Waybill's own error event takes the
      // next one.
      if (event.sequence !== this.lastSequence + 1) this.anomaly ??= 'a Responses sequence_number out of order reached the client';
      if (event.sequence !== undefined) this.lastSequence = event.sequence;
    }
    switch (event.kind) {
      case 'done':
      case 'error':
        this.ending = event;
        this.endedAt = at;
        return;
      case 'malformed':
        this.anomaly ??= 'malformed event reached the client';
        return;
      case 'chunk':
        for (const [index, reason] of event.finishes) {
          if (Number.isInteger(index) && index >= 0 && index < this.expected && !this.finishes.has(index)) this.finishes.set(index, reason);
        }
        if (event.usage !== undefined) this.usage = event.usage;
        if (this.keepText && event.text !== undefined) this.answerText += event.text;
        if (event.output.length > 0) {
          this.outputEvents++;
          if (this.lastOutputAt !== undefined) this.itl.push(at - this.lastOutputAt);
          this.firstOutputAt ??= at;
          this.lastOutputAt = at;
          this.onOutput(this.outputEvents);
        }
        if (event.terminal === true && this.ending === undefined) {
          this.ending = { kind: 'done' };
          this.endedAt = at;
        }
        return;
    }
  }

  /** A reader for an event-stream body; each event is observed at `now()`. */
  streamReader(now: () => number) {
    return createEventReader(
      (data, name) => this.event(this.reader.event(data, name), now()),
      () => (this.anomaly ??= 'oversized event reached the client'),
    );
  }

  /** A whole 200 body (a non-stream answer). */
  wholeBody(text: string, at: number): void {
    let event: ClientEvent;
    try {
      event = this.reader.body(JSON.parse(text));
    } catch {
      event = { kind: 'malformed' };
    }
    if (event.kind !== 'chunk') {
      // Waybill answers an error body under 200 with a status of its own: one reaching the client is a bug.
      this.anomaly ??= 'a 200 body that is not an answer reached the client';
      return;
    }
    this.event(event, at);
    this.ending = { kind: 'done' };
    this.endedAt = at;
  }

  /**
   * The outcome and code Waybill counts, as the client can tell them. `cancelled`: the client left (before it saw
   * the end); `errorBody`: the body of a non-200 answer.
   */
  verdict(status: number | undefined, errorBody: string, cancelled: boolean, transportError?: string): Verdict {
    let outcome: Outcome;
    let code = status ?? 0;
    let cancelPhase: CancelPhase | undefined;
    const ending = this.ending;
    // A response that ended (its end or error event arrived) before the client left was not cancelled: the bytes
    // were written, and Waybill had ended the response, before the client's close reached it.
    if (cancelled && ending === undefined) {
      outcome = 'client_cancelled';
      cancelPhase = this.firstOutputAt === undefined ? 'before_first_token' : 'streaming';
      code = status ?? 499;
    } else if (status === undefined) {
      outcome = 'failed';
      this.anomaly ??= `no response: ${transportError ?? 'unknown'}`;
    } else if (status !== 200) {
      outcome = statusOutcome(status, errorBody, this.plan.route);
    } else if (!this.plan.stream) {
      outcome = ending?.kind === 'done' && this.allFinished() ? 'delivered' : 'incomplete';
    } else if (ending?.kind === 'done') {
      outcome = 'delivered';
      if (!this.allFinished()) this.anomaly ??= `${this.endName()} arrived without a finish reason for every choice`;
    } else if (ending?.kind === 'error') {
      outcome = ending.outcome;
    } else {
      outcome = 'incomplete';
      this.anomaly ??= `the stream ended with neither ${this.endName()} nor an error event`;
    }
    return {
      outcome,
      code,
      cancelPhase,
      finishReasons: status === 200 ? Array.from({ length: this.expected }, (_, i) => this.finishes.get(i) ?? 'none') : [],
      cancelRacedEnd: outcome === 'client_cancelled' && this.expected > 0 && this.allFinished(),
      anomaly: this.anomaly,
    };
  }
}

/**
 * Judges a whole answer from its wire transcript: status, content type and body bytes (for tests: the same
 * observer the client runs, fed at once).
 */
export function judgeTranscript(plan: PlannedRequest, status: number, contentType: string, body: string | Uint8Array): Verdict & { usage: Usage | undefined; outputEvents: number } {
  const observer = new AnswerObserver(plan);
  const bytes = typeof body === 'string' ? Buffer.from(body) : body;
  let errorBody = '';
  if (status === 200 && contentType.startsWith('text/event-stream')) {
    const reader = observer.streamReader(() => 0);
    reader.feed(bytes);
    reader.end();
  } else if (status === 200) {
    observer.wholeBody(Buffer.from(bytes).toString('utf8'), 0);
  } else {
    errorBody = Buffer.from(bytes).toString('utf8');
  }
  return { ...observer.verdict(status, errorBody, false), usage: observer.usage, outputEvents: observer.outputEvents };
}

export async function runRequest(plan: PlannedRequest, options: ClientOptions): Promise<RequestResult> {
  const started = performance.now();
  const abort = new AbortController();
  let status: number | undefined;
  let sentAt: number | undefined;
  let cancelledAt: number | undefined;
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
  const plannedCancel = plan.cancel;
  const observer = new AnswerObserver(plan, (outputEvents) => {
    if (plannedCancel?.phase === 'streaming' && outputEvents >= plannedCancel.afterEvents) cancel();
  });
  const cancel = () => {
    if (cancelledAt !== undefined || observer.ending !== undefined) return;
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
  if (plannedCancel?.phase === 'before_first_token') {
    cancelTimer = setTimeout(() => (sentAt === undefined ? (cancelWhenSent = true) : cancelOnceWritten()), plannedCancel.afterMs);
  }
  const deadline = setTimeout(() => abort.abort(), options.timeoutMs);

  try {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-request-id': requestId };
    if (plan.simHeader !== undefined) headers['x-sim-fault'] = plan.simHeader;
    for (const [name, value] of Object.entries(plan.headers ?? {})) headers[name.toLowerCase()] = value;
    if (options.apiKey !== undefined) headers['authorization'] = `Bearer ${options.apiKey}`;
    const response = await request(`${options.baseUrl}${ROUTE_PATHS[plan.route]}`, {
      method: 'POST',
      headers,
      body: requestBody(plan, options.model),
      signal: abort.signal,
      dispatcher: options.dispatcher,
    });
    status = response.statusCode;
    const isStream = String(response.headers['content-type'] ?? '').startsWith('text/event-stream');
    if (status === 200 && isStream) {
      const reader = observer.streamReader(() => performance.now());
      for await (const chunk of response.body) reader.feed(chunk as Uint8Array);
      reader.end();
    } else {
      errorBody = await response.body.text();
      if (status === 200) observer.wholeBody(errorBody, performance.now());
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

  const verdict = observer.verdict(status, errorBody, cancelledAt !== undefined, error);
  const { outcome } = verdict;
  const { usage, firstOutputAt, lastOutputAt } = observer;
  const perChoice = usage?.completionTokens !== undefined ? usage.completionTokens / Math.max(1, observer.expected) : undefined;
  const tpotMs =
    outcome === 'delivered' && plan.stream && firstOutputAt !== undefined && lastOutputAt !== undefined && perChoice !== undefined && perChoice >= 2
      ? (lastOutputAt - firstOutputAt) / (perChoice - 1)
      : undefined;
  return {
    plan,
    startedAt: started - options.runStart,
    sentMs: sentAt === undefined ? undefined : sentAt - started,
    status,
    ...verdict,
    ttftMs: plan.stream && firstOutputAt !== undefined ? firstOutputAt - started : undefined,
    tpotMs,
    // A delivered answer ends at its end event (or body), a cancellation when the client left.
    e2eMs: ((outcome === 'client_cancelled' ? cancelledAt : observer.endedAt) ?? finished) - started,
    itlMs: observer.itl,
    outputEvents: observer.outputEvents,
    usage,
    error,
    ...(plan.fleet?.session === undefined ? {} : { answerText: observer.answerText }),
  };
}
