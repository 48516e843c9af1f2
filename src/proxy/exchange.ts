/**
 * One logical request: the ledger, the attempt loop, the commit point, the client response and its clocks.
 *
 * Nothing reaches the client before the upstream's first output-bearing event (or a complete non-stream body).
 * After that, upstream bytes are written as they came, whole events at a time; the ledger decides which are held,
 * forwarded or dropped, and how the response ends. `[DONE]` reaches the client only for a delivered stream.
 */
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { RequestLedger, type Failure, type RequestInfo, type Settlement, type StreamEnd } from '../accounting/ledger.js';
import type { Route } from '../accounting/outcomes.js';
import type { Config } from '../config/load.js';
import { errorBody, failureResponse, type ErrorBody, type ErrorCode } from '../http/errors.js';
import { classifyEventData, classifyJson, type EventFacts } from '../sse/classify.js';
import type { SseEvent } from '../sse/framer.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import { Attempt, type AttemptSink, type NetworkFailure } from './attempt.js';
import type { UpstreamRegistry } from './upstreams.js';

export interface ExchangeDeps {
  readonly config: Config;
  readonly upstreams: UpstreamRegistry;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  /** Monotonic milliseconds. */
  readonly now: () => number;
  /** Called with every settled request (tests and telemetry subscribe here). */
  readonly onSettled?: (settlement: Settlement, requestId: string) => void;
}

export interface CompletionRequest {
  readonly route: Route;
  /** Upstream API path, e.g. /v1/chat/completions. */
  readonly apiPath: string;
  /** The served model name (a key of the upstream registry). */
  readonly model: string;
  readonly stream: boolean;
  /** The body to send upstream (the client's bytes, or re-serialised when usage was injected). */
  readonly body: Buffer;
  readonly expectedChoices: number;
  readonly dropUsageChunk: boolean;
  readonly requestId: string;
  /** Headers for every upstream attempt (see upstreamHeaders). */
  readonly headers: Record<string, string | string[]>;
  readonly arrivalAt: number;
}

const SSE_HEADERS = {
  'cache-control': 'no-cache',
  // Tell buffering reverse proxies in front of Waybill (nginx) to pass events through at once.
  'x-accel-buffering': 'no',
};

function classifyBody(body: Buffer): EventFacts {
  try {
    return classifyJson(JSON.parse(body.toString('utf8')));
  } catch {
    return { kind: 'malformed' };
  }
}

/** Joins the pieces of one write. Consecutive views of one upstream chunk are re-joined without a copy. */
function coalesce(pieces: Buffer[]): Buffer {
  const first = pieces[0] as Buffer;
  if (pieces.length === 1) return first;
  let end = first.byteOffset + first.length;
  for (let i = 1; i < pieces.length; i++) {
    const piece = pieces[i] as Buffer;
    if (piece.buffer !== first.buffer || piece.byteOffset !== end) return Buffer.concat(pieces);
    end += piece.length;
  }
  return Buffer.from(first.buffer, first.byteOffset, end - first.byteOffset);
}

export class Exchange implements AttemptSink {
  private readonly ledger: RequestLedger;
  /** Kept from the start: Node detaches it from the response once the response is done. */
  private readonly socket: Socket | null;
  private attempt: Attempt | undefined;
  private held: Buffer[] = [];
  private heldBytes = 0;
  private out: Buffer[] = [];
  /** Waybill has ended the client response (or the client left): nothing more is written. */
  private responseEnded = false;
  /** The client side is over: the response was flushed to the socket ('finish'), or the client left ('close'). */
  private clientFinished = false;
  private settled = false;
  private totalTimer: NodeJS.Timeout | undefined;
  private firstOutputTimer: NodeJS.Timeout | undefined;
  private idleTimer: NodeJS.Timeout | undefined;
  private drainTimer: NodeJS.Timeout | undefined;
  /** After the total deadline, how long a client that does not read its ended response may hold it. */
  private lingerTimer: NodeJS.Timeout | undefined;
  private waitingForDrain = false;

  constructor(
    private readonly deps: ExchangeDeps,
    private readonly request: CompletionRequest,
    private readonly res: ServerResponse,
  ) {
    const { config } = deps;
    const info: RequestInfo = {
      model: request.model,
      route: request.route,
      stream: request.stream,
      expectedChoices: request.expectedChoices,
      dropUsageChunk: request.dropUsageChunk,
      slo: config.slo.models[request.model] ?? config.slo.defaults,
      promptLenBoundaries: config.metrics.promptLenBoundaries,
      promptLenClasses: config.metrics.promptLenClasses,
    };
    this.socket = res.socket;
    this.ledger = new RequestLedger(info, request.arrivalAt, {
      onInterTokenGap: (ms) => deps.metrics.interTokenGap(request.model, ms),
    });
  }

  start(): void {
    const { config, metrics, now } = this.deps;
    metrics.requestStarted(this.request.model);
    this.res.on('close', this.onClientClose);
    const remaining = config.timeouts.totalMs - (now() - this.request.arrivalAt);
    this.totalTimer = setTimeout(() => this.onTimer('total_timeout'), Math.max(0, remaining));
    this.startAttempt();
  }

  private startAttempt(): void {
    const { upstreams, config, now } = this.deps;
    const upstream = upstreams.pick(this.request.model);
    if (upstream === undefined) {
      this.ledger.reject(503);
      this.writeError(503, errorBody('no_upstream', `no upstream is available for model "${this.request.model}"`));
      this.maybeSettle();
      return;
    }
    const number = this.ledger.attemptCount + 1;
    this.ledger.startAttempt(now(), upstream.name);
    const attempt = new Attempt(upstream, number, this, {
      streaming: this.request.stream,
      maxEventBytes: config.streaming.maxEventBytes,
      maxResponseBytes: config.streaming.maxResponseBytes,
    });
    this.attempt = attempt;
    upstream.inflight++;
    this.firstOutputTimer = setTimeout(() => this.onTimer('first_output_timeout'), config.timeouts.firstOutputMs);
    upstream.dispatcher.dispatch(
      {
        method: 'POST',
        path: upstream.path(this.request.apiPath),
        headers: this.request.headers,
        body: this.request.body,
      },
      attempt,
    );
  }

  // --- AttemptSink: facts from the upstream ---------------------------------------------------------------

  onResponseStart(_attempt: Attempt, status: number): void {
    this.ledger.responseStarted(this.deps.now(), status);
  }

  onBlock(attempt: Attempt, raw: Buffer, event: SseEvent | null): void {
    if (attempt.finished) return;
    if (event === null) {
      // Comments and empty events: keep them with their neighbours (a keep-alive means something to the client).
      if (this.ledger.ending !== undefined) return;
      if (this.ledger.committed) this.out.push(raw);
      else this.hold(raw);
      return;
    }
    const verdict = this.ledger.streamEvent(this.deps.now(), classifyEventData(event.data));
    switch (verdict) {
      case 'hold':
        this.hold(raw);
        return;
      case 'commit':
        this.commit();
        for (const piece of this.held) this.out.push(piece);
        this.held = [];
        this.heldBytes = 0;
        this.out.push(raw);
        return;
      case 'forward':
        if (!this.responseEnded) this.out.push(raw);
        return;
      case 'drop':
        return;
    }
  }

  onChunkDone(_attempt: Attempt): void {
    this.idleTimer?.refresh();
    this.flush();
    this.act();
  }

  onBody(_attempt: Attempt, status: number, body: Buffer): void {
    this.ledger.bodyReceived(this.deps.now(), status, classifyBody(body));
    if (this.ledger.ending?.kind === 'complete' && !this.responseEnded) {
      this.res.writeHead(200, {
        'content-type': this.attempt?.contentType ?? 'application/json',
        'content-length': body.length,
        'x-request-id': this.request.requestId,
      });
      this.endClient(body);
      return;
    }
    this.act();
  }

  onStreamEnd(_attempt: Attempt, how: StreamEnd): void {
    this.ledger.streamEnded(this.deps.now(), how);
    this.act();
  }

  onNetworkFailure(_attempt: Attempt, failure: NetworkFailure, error: Error): void {
    this.deps.logger.debug({ requestId: this.request.requestId, err: error.message }, 'upstream connection failed');
    this.ledger.connectFailed(this.deps.now(), failure);
    this.act();
  }

  onSettled(attempt: Attempt): void {
    attempt.upstream.inflight--;
    this.clearAttemptClocks();
    if (!this.responseEnded && this.ledger.ending === undefined) {
      // The attempt stopped without the ledger deciding how the client's response ends (cannot happen with the
      // handler's reporting; kept so a future gap shows up as a counted incomplete request, not a hang).
      this.ledger.streamEnded(this.deps.now(), 'eof');
      this.act();
    }
    this.maybeSettle();
  }

  // --- Client side ------------------------------------------------------------------------------------------

  /** Carries out the ledger's decision about how the client response ends, once it has one. */
  private act(): void {
    const ending = this.ledger.ending;
    if (ending === undefined || this.responseEnded) return;
    switch (ending.kind) {
      case 'complete':
      case 'upstream_error':
        this.endClient();
        break;
      case 'gateway_error':
        this.endClient(this.gatewayErrorEvent(ending.cause));
        break;
      case 'failure':
        this.respondFailure(ending.failure);
        break;
    }
    // Keep reading the upstream briefly after the client's response is over, to count what follows (a `[DONE]`
    // after an error, data after `[DONE]`), then let it go.
    const attempt = this.attempt;
    if (attempt !== undefined && !attempt.finished) {
      this.drainTimer = setTimeout(() => attempt.abort('drained'), this.deps.config.streaming.drainGraceMs);
      if (this.waitingForDrain) attempt.resume();
    }
  }

  private commit(): void {
    clearTimeout(this.firstOutputTimer);
    const attempt = this.attempt;
    this.res.writeHead(200, {
      'content-type': attempt?.contentType ?? 'text/event-stream; charset=utf-8',
      ...SSE_HEADERS,
      'x-request-id': this.request.requestId,
    });
    this.armIdleTimer();
  }

  /** The idle clock measures the upstream: it runs only while Waybill is reading it, not while a slow client has
   *  paused the stream (the total deadline still bounds that). */
  private armIdleTimer(): void {
    clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(() => this.onTimer('idle_timeout'), this.deps.config.timeouts.idleMs);
  }

  private hold(raw: Buffer): void {
    this.held.push(raw);
    this.heldBytes += raw.length;
    // Bytes before the first output (role chunks, comments) are bounded like one event.
    if (this.heldBytes > this.deps.config.streaming.maxEventBytes) this.attempt?.abort('oversized');
  }

  private gatewayErrorEvent(cause: StreamEnd | 'unfinished_choices'): Buffer {
    let code: ErrorCode = 'stream_truncated';
    let message: string;
    switch (cause) {
      case 'eof':
        message = 'the upstream ended the stream before it was complete';
        break;
      case 'reset':
        message = 'the upstream connection was reset mid-stream';
        break;
      case 'oversized':
        message = 'the upstream sent an event larger than the configured limit';
        break;
      case 'unfinished_choices':
        message = 'the upstream finished the stream without a finish_reason for every choice';
        break;
      case 'idle_timeout':
        code = 'stream_timeout';
        message = 'the upstream sent nothing within the idle timeout';
        break;
      case 'first_output_timeout':
      case 'total_timeout':
        code = 'stream_timeout';
        message = 'the request exceeded its time limit';
        break;
    }
    return Buffer.from(`data: ${JSON.stringify(errorBody(code, message))}\n\n`);
  }

  private respondFailure(failure: Failure): void {
    const { status, body } = failureResponse(failure);
    this.writeError(status, body);
  }

  private writeError(status: number, body: ErrorBody): void {
    if (this.responseEnded) return;
    const payload = Buffer.from(JSON.stringify(body));
    if (!this.res.headersSent) {
      this.res.writeHead(status, {
        'content-type': 'application/json',
        'content-length': payload.length,
        'x-request-id': this.request.requestId,
      });
    }
    this.endClient(payload);
  }

  /** Writes the events forwarded so far, in one write. */
  private flush(): void {
    if (this.out.length === 0) return;
    const data = coalesce(this.out);
    this.out = [];
    if (!this.responseEnded && !this.res.write(data)) this.pauseForClient();
  }

  /**
   * Ends the response. The client counts as served only once the last byte has left for its socket ('finish'):
   * a client that stops reading and leaves before that is a cancellation, not a delivery.
   */
  private endClient(last?: Buffer): void {
    if (this.responseEnded) return;
    // Events forwarded in the same upstream read as the one that ended the stream (an abort from inside the
    // framer runs synchronously) go out before the end.
    this.flush();
    this.responseEnded = true;
    this.res.once('finish', this.onClientFinish);
    if (last !== undefined) this.res.end(last);
    else this.res.end();
  }

  private readonly onClientFinish = (): void => {
    // Node also emits 'finish' when the last write fails because the client's socket was destroyed (the write
    // callback runs with the error): that is the client leaving, not a delivery.
    if (this.socket?.destroyed === true) {
      this.onClientClose();
      return;
    }
    if (this.clientFinished) return;
    this.clientFinished = true;
    this.res.off('close', this.onClientClose);
    this.ledger.clientEnded(this.deps.now());
    this.maybeSettle();
  };

  private pauseForClient(): void {
    if (this.waitingForDrain) return;
    this.waitingForDrain = true;
    this.attempt?.pause();
    clearTimeout(this.idleTimer);
    this.res.once('drain', () => {
      this.waitingForDrain = false;
      const attempt = this.attempt;
      if (attempt === undefined || attempt.finished) return;
      if (!this.responseEnded) this.armIdleTimer();
      attempt.resume();
    });
  }

  private readonly onClientClose = (): void => {
    if (this.clientFinished) return;
    this.clientFinished = true;
    this.responseEnded = true;
    this.res.off('finish', this.onClientFinish);
    this.ledger.clientCancelled(this.deps.now());
    const attempt = this.attempt;
    if (attempt !== undefined && !attempt.finished) attempt.abort('cancelled');
    this.maybeSettle();
  };

  private onTimer(reason: 'first_output_timeout' | 'idle_timeout' | 'total_timeout'): void {
    const attempt = this.attempt;
    if (attempt !== undefined && !attempt.finished) attempt.abort(reason);
    else if (!this.responseEnded && !this.settled) {
      // No attempt in flight (between attempts): the deadline ends the request with what the last one said.
      const failure = this.ledger.finalFailure();
      if (failure !== undefined) this.respondFailure(failure);
    }
    if (reason === 'total_timeout' && !this.clientFinished) {
      // A client that does not read even its ended response would hold it forever: give it the drain grace to
      // take the last bytes (Waybill's error event), then close the connection; that counts as the client leaving.
      this.lingerTimer = setTimeout(() => {
        if (!this.clientFinished) this.res.destroy();
      }, this.deps.config.streaming.drainGraceMs);
    }
  }

  /** Stops the clocks of the attempt in flight; the request's total deadline keeps running. */
  private clearAttemptClocks(): void {
    clearTimeout(this.firstOutputTimer);
    clearTimeout(this.idleTimer);
    clearTimeout(this.drainTimer);
  }

  private maybeSettle(): void {
    if (this.settled || !this.clientFinished) return;
    if (this.attempt !== undefined && !this.attempt.finished) return;
    this.settled = true;
    clearTimeout(this.totalTimer);
    clearTimeout(this.lingerTimer);
    const settlement = this.ledger.settle(this.deps.now());
    this.deps.metrics.record(settlement, true);
    this.deps.onSettled?.(settlement, this.request.requestId);
  }
}
