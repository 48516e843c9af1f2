/**
 * One logical request: admission, the attempt loop with retries before commit, the commit point, the client
 * response and its clocks.
 *
 * Nothing reaches the client before the upstream's first output-bearing event (or a complete non-stream body), so
 * until then a failed attempt can be retried invisibly. After that, upstream bytes are written as they came, whole
 * events at a time; the ledger decides which are held, forwarded or dropped, and how the response ends. `[DONE]`
 * reaches the client only for a delivered stream.
 */
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Logger } from 'pino';
import { crashSettlement, RequestLedger, type Failure, type ProtocolViolation, type RequestInfo, type StreamEnd } from '../accounting/ledger.js';
import type { ProxiedRoute } from '../accounting/outcomes.js';
import type { Config } from '../config/load.js';
import { errorBody, failureResponse, type ErrorBody } from '../http/errors.js';
import { classifyEventData } from '../sse/classify.js';
import type { SseEvent } from '../sse/framer.js';
import type { GatewayMetrics } from '../telemetry/metrics.js';
import type { Admission } from './admission.js';
import { Attempt, type AttemptSink, type NetworkFailure } from './attempt.js';
import { classifyBody, coalesce, SSE_HEADERS, streamErrorEvent } from './client-wire.js';
import { parseRetryAfter } from './retry-after.js';
import { retryDelay, retryReason } from './retry-policy.js';
import type { RequestTrace } from '../telemetry/request-trace.js';
import type { ObserverGuard } from '../telemetry/guard.js';
import type { PublishSettlement } from '../telemetry/settlement.js';
import type { RetryReason } from '../accounting/outcomes.js';
import type { ModelControls, UpstreamRegistry } from './upstreams.js';

export interface ExchangeDeps {
  readonly config: Config;
  readonly upstreams: UpstreamRegistry;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  /** Monotonic milliseconds. */
  readonly now: () => number;
  readonly random: () => number;
  /** Observers of the settled request (span, metrics, log line, hooks), each unable to break the others. */
  readonly publish: PublishSettlement;
  /** Reports errors caught inside the exchange. */
  readonly guard: ObserverGuard;
  /** Called once the exchange holds nothing any more (for the shutdown drain). */
  readonly onDone?: (exchange: Exchange) => void;
}

export interface CompletionRequest {
  readonly route: ProxiedRoute;
  /** Upstream API path, e.g. /v1/chat/completions. */
  readonly apiPath: string;
  /** The served model name (a key of the upstream registry). */
  readonly model: string;
  readonly stream: boolean;
  /** The body to send upstream (the client's bytes, or with usage requested). */
  readonly body: Buffer;
  readonly expectedChoices: number;
  readonly dropUsageChunk: boolean;
  readonly requestId: string;
  /** Headers for every upstream attempt (see upstreamHeaders). */
  readonly headers: Record<string, string | string[]>;
  readonly arrivalAt: number;
  readonly trace: RequestTrace;
}

/** The ledger's facts of a request, with the model's SLO thresholds and the configured prompt-length classes. */
export function ledgerInfo(
  config: Config,
  request: Pick<RequestInfo, 'model' | 'route' | 'stream' | 'expectedChoices' | 'dropUsageChunk'>,
): RequestInfo {
  return {
    ...request,
    slo: config.slo.models[request.model] ?? config.slo.defaults,
    promptLenBoundaries: config.metrics.promptLenBoundaries,
    promptLenClasses: config.metrics.promptLenClasses,
  };
}

/** Retry-After Waybill sends with its own 429: the queue is a second's worth of work for a healthy pool. */
const OVERLOADED_RETRY_AFTER_S = '1';

export class Exchange implements AttemptSink {
  private readonly ledger: RequestLedger;
  private readonly controls: ModelControls;
  /** Kept from the start: Node detaches it from the response once the response is done. */
  private readonly socket: Socket | null;
  private attempt: Attempt | undefined;
  /** Upstreams this request has been sent to: a retry goes elsewhere while another is eligible. */
  private readonly tried = new Set<string>();
  private held: Buffer[] = [];
  private heldBytes = 0;
  private out: Buffer[] = [];
  /** Waybill has ended the client response (or the client left): nothing more is written. */
  private responseEnded = false;
  /** The client side is over: the response was flushed to the socket ('finish'), or the client left ('close'). */
  private clientFinished = false;
  private settled = false;
  /** An error inside the exchange was caught: the request was answered and counted from what was certain. */
  private crashed = false;
  private admission: Admission | undefined;
  /** Aborts a wait in the admission queue when the client leaves. */
  private queueAbort: AbortController | undefined;
  private totalTimer: NodeJS.Timeout | undefined;
  private firstOutputTimer: NodeJS.Timeout | undefined;
  private idleTimer: NodeJS.Timeout | undefined;
  private drainTimer: NodeJS.Timeout | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  /** After the total deadline, how long a client that does not read its ended response may hold it. */
  private lingerTimer: NodeJS.Timeout | undefined;
  private waitingForDrain = false;
  /** Why the attempt about to start is a retry. */
  private retriedFor: RetryReason | undefined;
  /** The total deadline fired: no further attempt, whatever the arithmetic says (timers may fire a little early). */
  private pastDeadline = false;
  /** The gateway's drain deadline passed: no further attempt, the upstream pools are closing. */
  private shuttingDown = false;

  constructor(
    private readonly deps: ExchangeDeps,
    private readonly request: CompletionRequest,
    private readonly res: ServerResponse,
  ) {
    const info = ledgerInfo(deps.config, request);
    this.socket = res.socket;
    this.controls = deps.upstreams.controls(request.model);
    const itl = deps.metrics.interTokenLatency(request.model);
    this.ledger = new RequestLedger(info, request.arrivalAt, {
      onInterTokenGap: (ms) => {
        // Per event: a try block costs nothing in V8 until something throws.
        try {
          itl.observe(ms / 1000);
        } catch (error) {
          deps.guard.report('metrics', error);
        }
      },
      onAnomaly: (kind) => {
        if (this.attempt !== undefined) request.trace.anomaly(this.attempt.number, kind, deps.now());
      },
    });
  }

  start(): void {
    try {
      this.begin();
    } catch (error) {
      this.crash(error);
    }
  }

  private begin(): void {
    const { config, metrics, now } = this.deps;
    this.deps.guard.run('metrics', () => metrics.requestStarted(this.request.model));
    this.res.on('close', this.onClientClose);
    const remaining = config.timeouts.totalMs - (now() - this.request.arrivalAt);
    this.totalTimer = setTimeout(() => this.onTimer('total_timeout'), Math.max(0, remaining));
    this.controls.budget.recordRequest(now());
    const gate = this.controls.gate;
    if (gate === undefined) {
      this.startAttempt();
      return;
    }
    this.queueAbort = new AbortController();
    const admission = gate.acquire(this.queueAbort.signal);
    if (admission instanceof Promise) {
      this.ledger.queued(now());
      admission.then(
        (result) => this.guarded(() => this.onAdmission(result)),
        (error: unknown) => this.crash(error),
      );
    } else {
      this.onAdmission(admission);
    }
  }

  /** The gateway is shutting down and its drain deadline passed: end this request now, and count it. */
  shutdown(): void {
    this.guarded(() => {
      this.shuttingDown = true;
      const attempt = this.attempt;
      if (attempt !== undefined && !attempt.finished) {
        attempt.abort('shutdown');
      } else if (!this.responseEnded && !this.settled) {
        clearTimeout(this.retryTimer);
        this.queueAbort?.abort();
        if (!this.ledger.committed) {
          this.ledger.reject(503);
          this.writeError(503, errorBody('shutting_down', 'the gateway is shutting down; retry the request'));
        }
      }
      // A client that does not take even its ended response must not hold the exit.
      this.closeIfNotTaken();
    });
  }

  private onAdmission(admission: Admission): void {
    this.deps.guard.run('metrics', () => this.deps.metrics.queueWaited(this.request.model, admission.waitedMs));
    if (admission.admitted && (this.clientFinished || this.responseEnded)) {
      // Admitted just as the client left, or after the request was answered (shutdown): give the slot back.
      admission.release();
      this.maybeSettle();
      return;
    }
    if (!admission.admitted) {
      // 'cancelled': the client left while queued; onClientClose has recorded it.
      if (admission.reason !== 'cancelled' && !this.responseEnded) {
        this.ledger.reject(429);
        const message =
          admission.reason === 'queue_full'
            ? `model "${this.request.model}" is at capacity and its queue is full; retry later`
            : `model "${this.request.model}" is at capacity; the request waited its queue timeout`;
        this.res.setHeader('retry-after', OVERLOADED_RETRY_AFTER_S);
        this.writeError(429, errorBody('overloaded', message));
      }
      this.maybeSettle();
      return;
    }
    this.admission = admission;
    this.ledger.admitted(this.deps.now());
    this.startAttempt();
  }

  private startAttempt(): void {
    const { upstreams, config, now } = this.deps;
    const at = now();
    const upstream = upstreams.pick(this.request.model, this.tried, at);
    if (upstream === undefined) {
      const failure = this.ledger.finalFailure();
      if (failure !== undefined) {
        // A retry found nowhere to go: the client gets what the last attempt said.
        this.respondFailure(failure);
      } else {
        this.ledger.reject(503);
        this.writeError(503, errorBody('no_upstream', `every upstream of model "${this.request.model}" is at its max_inflight`));
      }
      this.maybeSettle();
      return;
    }
    this.tried.add(upstream.name);
    this.held = [];
    this.heldBytes = 0;
    this.out = [];
    const number = this.ledger.attemptCount + 1;
    this.ledger.startAttempt(at, upstream.name);
    const attempt = new Attempt(upstream, number, this, {
      streaming: this.request.stream,
      maxEventBytes: config.streaming.maxEventBytes,
      maxResponseBytes: config.streaming.maxResponseBytes,
      maxErrorBodyBytes: config.streaming.maxErrorBodyBytes,
    });
    this.attempt = attempt;
    // Counted when the retry is made, not when scheduled: retries_total = attempts - requests, exactly.
    const retriedFor = this.retriedFor;
    if (retriedFor !== undefined) this.deps.guard.run('metrics', () => this.deps.metrics.retryMade(this.request.model, retriedFor));
    attempt.ticket = upstreams.sent(upstream, at);
    const traceHeaders = this.request.trace.attemptStarted(number, upstream, at, this.retriedFor);
    const headers = traceHeaders === undefined ? this.request.headers : { ...this.request.headers, ...traceHeaders };
    this.firstOutputTimer = setTimeout(() => this.onTimer('first_output_timeout'), config.timeouts.firstOutputMs);
    upstream.dispatcher.dispatch(
      {
        method: 'POST',
        path: upstream.path(this.request.apiPath),
        headers: upstream.withCredentials(headers),
        body: this.request.body,
      },
      attempt,
    );
  }

  // --- AttemptSink: facts from the upstream. A replaced attempt's late reports are ignored. Each is guarded: an
  // error inside the exchange must end in an answer and a count, not in undici's hands. -------------------------

  onResponseStart(attempt: Attempt, status: number): void {
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.ledger.responseStarted(this.deps.now(), status);
    } catch (error) {
      this.crash(error);
    }
  }

  onProtocolViolation(attempt: Attempt, violation: ProtocolViolation): void {
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.ledger.protocolViolation(this.deps.now(), violation);
      this.act();
    } catch (error) {
      this.crash(error);
    }
  }

  onBlock(attempt: Attempt, raw: Buffer, event: SseEvent | null): void {
    if (attempt !== this.attempt || attempt.finished || this.crashed) return;
    try {
      this.block(attempt, raw, event);
    } catch (error) {
      this.crash(error);
    }
  }

  private block(attempt: Attempt, raw: Buffer, event: SseEvent | null): void {
    if (event === null) {
      // Blank lines alone are not events: never held (one Buffer per blank line is how a drip of them filled memory),
      // and they do not keep the idle clock going. Comments do: they are the upstream's keep-alives.
      if (isBlankLines(raw)) {
        if (this.ledger.committed && this.ledger.ending === undefined) this.out.push(raw);
        return;
      }
      this.idleTimer?.refresh();
      // Comments: keep them with their neighbours (a keep-alive means something to the client).
      if (this.ledger.ending !== undefined) return;
      if (this.ledger.committed) this.out.push(raw);
      else this.hold(raw);
      return;
    }
    // The idle clock runs on whole events, not bytes: an upstream dripping bytes without an event boundary is idle.
    this.idleTimer?.refresh();
    const at = this.deps.now();
    const facts = classifyEventData(event.data);
    if (facts.kind === 'error') this.request.trace.upstreamError(attempt.number, facts, at);
    const verdict = this.ledger.streamEvent(at, facts);
    switch (verdict) {
      case 'hold':
        this.hold(raw);
        return;
      case 'commit':
        this.commit();
        if (this.ledger.firstOutputWrittenAt !== undefined) this.request.trace.firstOutput(at);
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

  onChunkDone(attempt: Attempt): void {
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.flush();
      this.act();
    } catch (error) {
      this.crash(error);
    }
  }

  onBody(attempt: Attempt, status: number, body: Buffer): void {
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.ledger.bodyReceived(this.deps.now(), status, classifyBody(body));
      if (this.ledger.ending?.kind === 'complete' && !this.responseEnded) {
        this.res.writeHead(200, {
          'content-type': attempt.contentType ?? 'application/json',
          'content-length': body.length,
          'x-request-id': this.request.requestId,
        });
        this.endClient(body);
        return;
      }
      this.act();
    } catch (error) {
      this.crash(error);
    }
  }

  onStreamEnd(attempt: Attempt, how: StreamEnd): void {
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.ledger.streamEnded(this.deps.now(), how);
      this.act();
    } catch (error) {
      this.crash(error);
    }
  }

  onNetworkFailure(attempt: Attempt, failure: NetworkFailure, error: Error): void {
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.deps.logger.debug({ requestId: this.request.requestId, upstream: attempt.upstream.name, err: error.message }, 'upstream connection failed');
      this.ledger.connectFailed(this.deps.now(), failure);
      this.act();
    } catch (caught) {
      this.crash(caught);
    }
  }

  onSettled(attempt: Attempt): void {
    const at = this.deps.now();
    // The upstream's in-flight count and health are the pool's, not this request's: kept right even after a crash.
    const record = this.deps.guard.run('exchange', () => this.ledger.attemptAt(attempt.number - 1), undefined);
    this.deps.guard.run('exchange', () => this.deps.upstreams.settled(attempt.upstream, attempt.ticket, record, at));
    this.request.trace.attemptEnded(attempt.number, record, at);
    if (attempt !== this.attempt || this.crashed) return;
    try {
      this.clearAttemptClocks();
      if (!this.responseEnded && this.ledger.ending === undefined) {
        // The attempt stopped without the ledger deciding how the client's response ends (cannot happen with the
        // handler's reporting; kept so a future gap shows up as a counted incomplete request, not a hang).
        this.ledger.streamEnded(this.deps.now(), 'eof');
        this.act();
      }
      this.maybeSettle();
    } catch (error) {
      this.crash(error);
    }
  }

  // --- Deciding and ending --------------------------------------------------------------------------------------

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
        this.endClient(streamErrorEvent(ending.cause));
        break;
      case 'failure':
        if (this.retry()) return;
        this.respondFailure(ending.failure);
        break;
    }
    // Keep reading the upstream briefly after the client's response is over, to count what follows (a `[DONE]`
    // after an error, data after `[DONE]`), then let it go.
    const attempt = this.attempt;
    if (attempt !== undefined && !attempt.finished) {
      this.drainTimer = setTimeout(
        () =>
          this.guarded(() => {
            this.ledger.attemptReleased(this.deps.now());
            attempt.abort('drained');
          }),
        this.deps.config.streaming.drainGraceMs,
      );
      if (this.waitingForDrain) attempt.resume();
    }
  }

  /**
   * Schedules another attempt for a failure before commit, when the failure is retryable, attempts remain, the
   * total deadline allows the wait, and the model's retry budget has room. Returns whether it did.
   */
  private retry(): boolean {
    const { config, metrics, now, random } = this.deps;
    const attempt = this.attempt;
    const record = this.ledger.currentAttempt;
    if (attempt === undefined || record === undefined || this.clientFinished || this.pastDeadline || this.shuttingDown) return false;
    const reason = retryReason(record, config.retries);
    if (reason === undefined || this.ledger.attemptCount >= config.retries.maxAttempts) return false;
    const retryAfter = parseRetryAfter(attempt.retryAfter, Date.now());
    const delay = retryDelay(reason, this.ledger.attemptCount, retryAfter, config.retries, random);
    const at = now();
    if (delay === undefined || at + delay >= this.request.arrivalAt + config.timeouts.totalMs) return false;
    if (!this.controls.budget.tryAcquire(at)) {
      this.deps.guard.run('metrics', () => metrics.retryBudgetSpent(this.request.model));
      return false;
    }
    this.request.trace.retryScheduled(reason, delay, at);
    this.retriedFor = reason;
    // The failed attempt's verdict is in the ledger; stop reading it so its connection (and GPU slot) is freed.
    attempt.abort('drained');
    this.retryTimer = setTimeout(
      () =>
        this.guarded(() => {
          if (!this.clientFinished && !this.responseEnded) this.startAttempt();
        }),
      delay,
    );
    return true;
  }

  private commit(): void {
    clearTimeout(this.firstOutputTimer);
    this.res.writeHead(200, {
      'content-type': this.attempt?.contentType ?? 'text/event-stream; charset=utf-8',
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

  /** Bytes before the first output (role chunks, comments) are bounded in bytes and in pieces. */
  private hold(raw: Buffer): void {
    this.held.push(raw);
    this.heldBytes += raw.length;
    const limits = this.deps.config.streaming;
    if (this.heldBytes > limits.maxEventBytes || this.held.length > limits.maxHeldEvents) this.attempt?.abort('oversized');
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

  private readonly onClientFinish = (): void =>
    this.guarded(() => {
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
    });

  private pauseForClient(): void {
    if (this.waitingForDrain) return;
    this.waitingForDrain = true;
    this.attempt?.pause();
    clearTimeout(this.idleTimer);
    this.res.once('drain', () =>
      this.guarded(() => {
        this.waitingForDrain = false;
        const attempt = this.attempt;
        if (attempt === undefined || attempt.finished) return;
        if (!this.responseEnded) this.armIdleTimer();
        attempt.resume();
      }),
    );
  }

  private readonly onClientClose = (): void =>
    this.guarded(() => {
      if (this.clientFinished) return;
      this.clientFinished = true;
      this.responseEnded = true;
      this.res.off('finish', this.onClientFinish);
      const at = this.deps.now();
      this.ledger.clientCancelled(at);
      this.request.trace.clientCancelled(at);
      clearTimeout(this.retryTimer);
      this.queueAbort?.abort();
      const attempt = this.attempt;
      if (attempt !== undefined && !attempt.finished) attempt.abort('cancelled');
      this.maybeSettle();
    });

  private onTimer(reason: 'first_output_timeout' | 'idle_timeout' | 'total_timeout'): void {
    this.guarded(() => {
      if (reason === 'total_timeout') this.pastDeadline = true;
      const attempt = this.attempt;
      if (attempt !== undefined && !attempt.finished) attempt.abort(reason);
      else if (!this.responseEnded && !this.settled) {
        clearTimeout(this.retryTimer);
        const failure = this.ledger.finalFailure();
        if (failure !== undefined) {
          // Between attempts: the deadline ends the request with what the last attempt said.
          this.respondFailure(failure);
        } else if (reason === 'total_timeout' && this.attempt === undefined) {
          // Still queued for admission at the deadline.
          this.queueAbort?.abort();
          this.ledger.reject(429);
          this.res.setHeader('retry-after', OVERLOADED_RETRY_AFTER_S);
          this.writeError(429, errorBody('overloaded', `model "${this.request.model}" is at capacity; the request reached its time limit in the queue`));
        }
        this.maybeSettle();
      }
      if (reason === 'total_timeout') this.closeIfNotTaken();
    });
  }

  /**
   * A client that does not read even its ended response would hold it forever: give it the drain grace to take the
   * last bytes (Waybill's error event), then close the connection; that counts as the client leaving.
   */
  private closeIfNotTaken(): void {
    if (this.clientFinished || this.lingerTimer !== undefined) return;
    this.lingerTimer = setTimeout(() => {
      if (!this.clientFinished) this.res.destroy();
    }, this.deps.config.streaming.drainGraceMs);
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
    this.clearTimers();
    if (this.admission?.admitted === true) this.admission.release();
    const at = this.deps.now();
    this.deps.publish(this.ledger.settle(at), this.request.requestId, this.request.trace, true, at);
    this.deps.onDone?.(this);
  }

  private clearTimers(): void {
    clearTimeout(this.totalTimer);
    clearTimeout(this.lingerTimer);
    clearTimeout(this.retryTimer);
    this.clearAttemptClocks();
  }

  /** Runs a callback from a timer or a socket event; an error inside ends the request as a crash. */
  private guarded(fn: () => void): void {
    if (this.crashed) return;
    try {
      fn();
    } catch (error) {
      this.crash(error);
    }
  }

  /**
   * An error inside the exchange (a bug): the request's state can no longer be trusted, so it is ended from what is
   * certain — the client gets a 500 before commit or Waybill's error event after, the upstream is let go, and the
   * request is counted once, as failed (or incomplete once committed), with the error logged and counted.
   */
  private crash(error: unknown): void {
    if (this.crashed) return;
    this.crashed = true;
    const { guard, now } = this.deps;
    guard.report('exchange', error);
    this.clearTimers();
    this.queueAbort?.abort();
    const attempt = this.attempt;
    if (attempt !== undefined && !attempt.finished) guard.run('exchange', () => attempt.abort('cancelled'));
    const committed = this.res.headersSent;
    if (!this.responseEnded) {
      this.responseEnded = true;
      guard.run('exchange', () => {
        if (committed) {
          this.res.end(streamErrorEvent('internal'));
        } else {
          const payload = Buffer.from(JSON.stringify(errorBody('internal_error', 'internal error')));
          this.res.writeHead(500, { 'content-type': 'application/json', 'content-length': payload.length, 'x-request-id': this.request.requestId });
          this.res.end(payload);
        }
      });
    }
    if (!this.settled) {
      this.settled = true;
      const admission = this.admission;
      if (admission?.admitted === true) guard.run('exchange', () => admission.release());
      const at = now();
      const settlement = guard.run(
        'exchange',
        () => {
          this.ledger.internalError(at);
          return this.ledger.settle(at);
        },
        undefined,
      );
      this.deps.publish(settlement ?? crashSettlement(this.ledger.info, this.request.arrivalAt, committed, at), this.request.requestId, this.request.trace, true, at);
      this.deps.onDone?.(this);
    }
  }
}

/** CR and LF only: a block of blank lines, which dispatches nothing and carries nothing. */
function isBlankLines(raw: Buffer): boolean {
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i];
    if (c !== 0x0a && c !== 0x0d) return false;
  }
  return true;
}
