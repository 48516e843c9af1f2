/**
 * The delivery machine: every decision about one logical request, as a pure state machine. It takes events —
 * upstream facts, timer firings, client events, admission, shutdown — each stamped by the shell with the time it
 * happened, and answers each with the effects to carry out: write the head, write bytes, end, start or abort an
 * attempt, arm or clear a timer, settle. The shell (proxy/exchange.ts) owns sockets, timers and the clock and does
 * nothing but execute the effects; every flag lives here. The ledger stays the accounting inside it.
 *
 * Nothing reaches the client before the upstream's first output-bearing event (or a complete non-stream body), so
 * until then a failed attempt can be retried invisibly. After that, upstream bytes are written as they came, whole
 * events at a time; the ledger decides which are held, forwarded or dropped, and how the response ends. `[DONE]`
 * reaches the client only for a delivered stream.
 *
 * | event | what it means |
 * |---|---|
 * | start | the request was handed over (body read and checked) |
 * | queued / admission | the model's admission gate queued it / answered |
 * | attempt_started / no_upstream | the shell picked an upstream for a `start_attempt` effect / found none |
 * | response_start, protocol_violation, block, chunk_done, body, stream_end, network_failure, attempt_settled | what the current attempt reported (stale attempts are ignored) |
 * | timer | an armed timer fired (a stale or cleared one is ignored) |
 * | client_blocked / client_drain | a write filled the client socket / it drained |
 * | client_finish / client_close | the response reached the client's socket / the client left |
 * | shutdown | the gateway's drain deadline passed |
 * | internal_error | the shell failed carrying out an effect |
 *
 * Invariants (test/machine.property.test.ts): settles exactly once; at most one attempt in flight; nothing written
 * after the end; `[DONE]` reaches the client iff delivered; every timer cleared at settlement; retries only before
 * commit, never to an upstream already tried while another is eligible.
 */
import { crashSettlement, RequestLedger, type AttemptRecord, type Failure, type ProtocolViolation, type RequestInfo, type Settlement, type StreamEnd } from '../accounting/ledger.js';
import type { AnomalyKind, RetryReason } from '../accounting/outcomes.js';
import type { UpstreamError } from '../sse/classify.js';
import type { SseEvent } from '../sse/framer.js';
import { errorBodyFor, type ErrorBody } from './errors.js';
import { failureResponse, refusalResponse, type Refusal } from './failures.js';
import type { RetryBudget } from './retry-budget.js';
import { retryDelay, retryReason, type RetryRules } from './retry-policy.js';
import { classifyStreamEvent, classifyWholeBody, coalesce, SSE_HEADERS, streamErrorEvent } from './wire.js';

export type TimerName = 'total' | 'first_output' | 'idle' | 'drain' | 'retry' | 'linger';

/** Why Waybill itself stops an attempt. */
export type AbortReason = Exclude<StreamEnd, 'eof' | 'reset'> | 'cancelled' | 'drained';

export type NetworkFailure = 'connect_error' | 'reset';

export type MachineEvent =
  | { type: 'start' }
  | { type: 'queued' }
  | { type: 'admission'; admitted: boolean; reason: 'queue_full' | 'queue_timeout' | 'cancelled' | undefined; waitedMs: number }
  | { type: 'attempt_started'; attempt: number; upstream: string }
  | { type: 'no_upstream' }
  | {
      type: 'response_start';
      attempt: number;
      status: number;
      contentType: string | undefined;
      retryAfterMs: number | undefined;
      /** vLLM's `metadata` header (raw-bytes embeddings), relayed with a non-stream answer. */
      metadata?: string | undefined;
    }
  | { type: 'protocol_violation'; attempt: number; violation: ProtocolViolation }
  | { type: 'block'; attempt: number; raw: Buffer; event: SseEvent | null }
  | { type: 'chunk_done'; attempt: number }
  | { type: 'body'; attempt: number; status: number; body: Buffer }
  | { type: 'stream_end'; attempt: number; how: StreamEnd }
  | { type: 'network_failure'; attempt: number; failure: NetworkFailure; message: string }
  | { type: 'attempt_settled'; attempt: number }
  | { type: 'timer'; timer: TimerName }
  | { type: 'client_blocked' }
  | { type: 'client_drain' }
  /** `socketDestroyed`: Node also emits 'finish' when the last write failed on a destroyed socket: the client left. */
  | { type: 'client_finish'; socketDestroyed: boolean }
  | { type: 'client_close' }
  | { type: 'shutdown' }
  | { type: 'internal_error'; error: unknown };

/** What the shell reports to observers (spans, metrics) on the machine's behalf; none of it decides anything. */
export type Observation =
  | { type: 'request_started' }
  | { type: 'queue_waited'; ms: number }
  | { type: 'retry_made'; reason: RetryReason }
  | { type: 'retry_budget_spent' }
  | { type: 'first_output' }
  | { type: 'upstream_error'; attempt: number; error: UpstreamError }
  | { type: 'anomaly'; attempt: number; kind: AnomalyKind }
  | { type: 'retry_scheduled'; reason: RetryReason; delayMs: number }
  | { type: 'client_cancelled' }
  | { type: 'connect_failed'; attempt: number; message: string }
  | { type: 'internal_error'; error: unknown };

export type Effect =
  /** Arm (or re-arm) a timer to fire at `at` on the shell's clock; `ms` is the same, from the event's time. */
  | { kind: 'arm'; timer: TimerName; at: number; ms: number }
  | { kind: 'clear'; timer: TimerName }
  | { kind: 'acquire_admission' }
  | { kind: 'cancel_admission' }
  | { kind: 'release_admission' }
  /** Pick an upstream not in `avoid` while one is eligible, and start attempt `attempt` on it. */
  | { kind: 'start_attempt'; attempt: number; avoid: ReadonlySet<string>; retriedFor: RetryReason | undefined }
  | { kind: 'abort_attempt'; reason: AbortReason }
  | { kind: 'pause_attempt' }
  | { kind: 'resume_attempt' }
  | { kind: 'write_head'; status: number; headers: Record<string, string | number> }
  | { kind: 'write'; data: Buffer }
  | { kind: 'end'; data: Buffer | undefined }
  /** Close the client connection (it did not take its ended response). */
  | { kind: 'destroy_client' }
  /** Attempt `attempt` is over: its record is the upstream's health verdict and its span's end. */
  | { kind: 'attempt_over'; attempt: number; record: AttemptRecord | undefined }
  | { kind: 'observe'; observation: Observation }
  | { kind: 'settle'; settlement: Settlement };

export interface MachineRequest {
  readonly info: RequestInfo;
  readonly arrivalAt: number;
  readonly requestId: string;
  /** The model has an admission gate. */
  readonly gated: boolean;
}

export interface MachineSettings {
  readonly totalMs: number;
  readonly firstOutputMs: number;
  readonly idleMs: number;
  readonly drainGraceMs: number;
  readonly maxEventBytes: number;
  readonly maxHeldEvents: number;
  readonly maxAttempts: number;
  readonly retry: RetryRules;
}

export interface MachineDeps {
  readonly settings: MachineSettings;
  /** The model's retry budget (shared by its requests; pure, time passed in). */
  readonly budget: RetryBudget;
  /** Jitter for retry backoff. */
  readonly random: () => number;
  /** Per event, on the hot path: a plain call rather than an effect. Must not throw (the shell guards it). */
  readonly onInterTokenGap: (ms: number) => void;
}

const EMPTY = Buffer.alloc(0);

/** A step without effects. Not frozen: the shell iterates it where it iterates `effects`, and V8 iterates a frozen array
 *  through a slow, allocating path (and the loop that sees both arrays with it). */
const NO_EFFECTS: readonly Effect[] = [];

const TIMERS: readonly TimerName[] = ['total', 'first_output', 'idle', 'drain', 'retry', 'linger'];

export class DeliveryMachine {
  readonly ledger: RequestLedger;
  /**
   * The current step's effects are its first `effectCount` entries. Reused across steps and never emptied by setting
   * its length to 0, which makes V8 drop the array's backing store: a new one for every step, per event.
   */
  private readonly effects: Effect[] = [];
  private effectCount = 0;
  /** The current event's time: every decision of one step uses it. */
  private at = 0;
  private readonly armed = new Set<TimerName>();

  /** Attempt number in flight or last made (0: none yet). */
  private attempt = 0;
  private attemptFinished = true;
  private retryAfterMs: number | undefined;
  private contentType: string | undefined;
  private metadata: string | undefined;
  /** Upstreams this request has been sent to: a retry goes elsewhere while another is eligible. */
  private readonly tried = new Set<string>();
  private held: Buffer[] = [];
  private heldBytes = 0;
  /** Bytes forwarded since the last write (the end of the upstream read): the first `outCount` entries, reused. */
  private readonly out: Buffer[] = [];
  private outCount = 0;

  private headSent = false;
  /** Waybill has ended the client response (or the client left): nothing more is written. */
  private responseEnded = false;
  /** The client side is over: the response reached the socket ('finish'), or the client left ('close'). */
  private clientFinished = false;
  private settled = false;
  private admitted = false;
  private waitingForDrain = false;
  private retriedFor: RetryReason | undefined;
  /** The total deadline fired: no further attempt, whatever the arithmetic says (timers may fire a little early). */
  private pastDeadline = false;
  /** The gateway's drain deadline passed: no further attempt, the upstream pools are closing. */
  private shuttingDown = false;
  private lingering = false;
  /**
   * Where the idle clock last started: the last whole event read, or where it was armed. The idle timer is armed once
   * per idle period, not re-armed per event (an effect and a timer refresh for every event): when it fires with
   * events read meanwhile, it is armed again for what is left of the period since the last one.
   */
  private idleFrom = 0;
  /** The retry timer fired while the failed attempt was still closing: start the next one when it has. */
  private retryDue = false;

  constructor(
    private readonly request: MachineRequest,
    private readonly deps: MachineDeps,
  ) {
    this.ledger = new RequestLedger(request.info, request.arrivalAt, {
      onInterTokenGap: deps.onInterTokenGap,
      onAnomaly: (kind) => this.observe({ type: 'anomaly', attempt: this.attempt, kind }),
    });
  }

  /**
   * One event, at time `at`: returns the effects to carry out, in order. The array is reused by the next call.
   * An error inside a step is this request's bug: the step's effects are discarded (none was carried out yet) and
   * the request is ended from what is certain — see crash().
   */
  handle(event: MachineEvent, at: number): readonly Effect[] {
    this.effectCount = 0;
    if (this.settled) {
      // After settlement only what keeps shared state balanced: an attempt's end (upstream in-flight, health) and an
      // admission slot granted too late (given back).
      if (event.type === 'attempt_settled') this.emit({ kind: 'attempt_over', attempt: event.attempt, record: this.ledger.attemptAt(event.attempt - 1) });
      else if (event.type === 'admission' && event.admitted) this.emit({ kind: 'release_admission' });
      return this.stepEffects();
    }
    this.at = at;
    // What the shell has been told so far: a step that throws is discarded whole, including a settlement it had
    // decided on before throwing (else a throw inside the ledger's settle would leave the request uncounted).
    const headSent = this.headSent;
    const responseEnded = this.responseEnded;
    const settled = this.settled;
    try {
      this.step(event);
    } catch (error) {
      this.effectCount = 0;
      this.headSent = headSent;
      this.responseEnded = responseEnded;
      this.settled = settled;
      this.crash(error);
    }
    return this.stepEffects();
  }

  private stepEffects(): readonly Effect[] {
    if (this.effectCount === 0) return NO_EFFECTS;
    // Shortening keeps the backing store (V8 trims only arrays far larger than their length).
    this.effects.length = this.effectCount;
    return this.effects;
  }

  private step(event: MachineEvent): void {
    switch (event.type) {
      case 'start':
        return this.start();
      case 'queued':
        this.ledger.queued(this.at);
        return;
      case 'admission':
        return this.onAdmission(event);
      case 'attempt_started':
        return this.attemptStarted(event.attempt, event.upstream);
      case 'no_upstream':
        return this.noUpstream();
      case 'internal_error':
        return this.crash(event.error);
      case 'timer':
        if (!this.armed.delete(event.timer)) return;
        return this.onTimer(event.timer);
      case 'client_blocked':
        return this.pauseForClient();
      case 'client_drain':
        return this.onClientDrain();
      case 'client_finish':
        return event.socketDestroyed ? this.onClientClose() : this.onClientFinish();
      case 'client_close':
        return this.onClientClose();
      case 'shutdown':
        return this.shutdown();
      case 'attempt_settled':
        return this.attemptSettled(event.attempt);
      case 'response_start':
      case 'protocol_violation':
      case 'block':
      case 'chunk_done':
      case 'body':
      case 'stream_end':
      case 'network_failure':
        // A replaced attempt's late reports are ignored.
        if (event.attempt !== this.attempt || this.attemptFinished) return;
        return this.upstreamFact(event);
    }
  }

  private upstreamFact(event: Extract<MachineEvent, { attempt: number }>): void {
    const ledger = this.ledger;
    switch (event.type) {
      case 'response_start':
        this.retryAfterMs = event.retryAfterMs;
        this.contentType = event.contentType;
        this.metadata = event.metadata;
        ledger.responseStarted(this.at, event.status);
        return;
      case 'protocol_violation':
        ledger.protocolViolation(this.at, event.violation);
        return this.act();
      case 'block':
        return this.block(event.raw, event.event);
      case 'chunk_done':
        this.flush();
        return this.act();
      case 'body':
        ledger.bodyReceived(this.at, event.status, classifyWholeBody(this.request.info.route, event.body, this.contentType, ledger.wantsParts));
        if (ledger.ending?.kind === 'complete' && !this.responseEnded) {
          this.writeHead(200, {
            'content-type': this.contentType ?? 'application/json',
            'content-length': event.body.length,
            ...(this.metadata !== undefined ? { metadata: this.metadata } : {}),
          });
          return this.endClient(event.body);
        }
        return this.act();
      case 'stream_end':
        ledger.streamEnded(this.at, event.how);
        return this.act();
      case 'network_failure':
        this.observe({ type: 'connect_failed', attempt: event.attempt, message: event.message });
        ledger.connectFailed(this.at, event.failure);
        return this.act();
      case 'attempt_started':
      case 'attempt_settled':
        return;
    }
  }

  // --- Admission and attempts -----------------------------------------------------------------------------------

  private start(): void {
    this.observe({ type: 'request_started' });
    const remaining = this.deps.settings.totalMs - (this.at - this.request.arrivalAt);
    this.arm('total', Math.max(0, remaining));
    this.deps.budget.recordRequest(this.at);
    if (this.request.gated) this.emit({ kind: 'acquire_admission' });
    else this.startAttempt();
  }

  private onAdmission(event: Extract<MachineEvent, { type: 'admission' }>): void {
    this.observe({ type: 'queue_waited', ms: event.waitedMs });
    if (event.admitted && (this.clientFinished || this.responseEnded)) {
      // Admitted just as the client left, or after the request was answered (shutdown): give the slot back.
      this.emit({ kind: 'release_admission' });
      return this.maybeSettle();
    }
    if (!event.admitted) {
      // 'cancelled': the client left while queued; its close has been recorded.
      if (event.reason !== 'cancelled' && !this.responseEnded) {
        this.refuse(event.reason === 'queue_full' ? 'queue_full' : 'queue_timeout');
      }
      return this.maybeSettle();
    }
    this.admitted = true;
    this.ledger.admitted(this.at);
    this.startAttempt();
  }

  /**
   * Asks the shell for the next attempt. It is in flight from here: whatever happens before the shell reports which
   * upstream it went to (a client leaving, a deadline) aborts it rather than forgetting it.
   */
  private startAttempt(): void {
    this.attempt = this.ledger.attemptCount + 1;
    this.attemptFinished = false;
    this.emit({ kind: 'start_attempt', attempt: this.attempt, avoid: this.tried, retriedFor: this.retriedFor });
  }

  private attemptStarted(attempt: number, upstream: string): void {
    if (attempt !== this.attempt) return;
    this.tried.add(upstream);
    this.held = [];
    this.heldBytes = 0;
    this.dropOut();
    this.attempt = attempt;
    this.attemptFinished = false;
    this.retryAfterMs = undefined;
    this.contentType = undefined;
    this.metadata = undefined;
    this.ledger.startAttempt(this.at, upstream);
    // Counted when the retry is made, not when scheduled: retries_total = attempts - requests, exactly.
    if (this.retriedFor !== undefined) this.observe({ type: 'retry_made', reason: this.retriedFor });
    this.arm('first_output', this.deps.settings.firstOutputMs);
  }

  private noUpstream(): void {
    this.attemptFinished = true;
    if (this.responseEnded) return this.maybeSettle();
    const failure = this.ledger.finalFailure();
    if (failure !== undefined) {
      // A retry found nowhere to go: the client gets what the last attempt said.
      this.respondFailure(failure);
    } else {
      this.refuse('no_upstream');
    }
    this.maybeSettle();
  }

  private attemptSettled(attempt: number): void {
    this.emit({ kind: 'attempt_over', attempt, record: this.ledger.attemptAt(attempt - 1) });
    if (attempt !== this.attempt) return;
    this.attemptFinished = true;
    this.clearAttemptClocks();
    if (this.retryDue) {
      this.retryDue = false;
      this.retryNow();
    }
    if (!this.responseEnded && this.ledger.ending === undefined) {
      // The attempt stopped without the ledger deciding how the client's response ends (cannot happen with the
      // attempt's reporting; kept so a future gap shows up as a counted incomplete request, not a hang).
      this.ledger.streamEnded(this.at, 'eof');
      this.act();
    }
    this.maybeSettle();
  }

  // --- Upstream events ------------------------------------------------------------------------------------------

  private block(raw: Buffer, event: SseEvent | null): void {
    const ledger = this.ledger;
    if (event === null) {
      // Blank lines alone are not events: never held (one Buffer per blank line is how a drip of them filled memory),
      // and they do not keep the idle clock going. Comments do: they are the upstream's keep-alives.
      if (isBlankLines(raw)) {
        if (ledger.committed && ledger.ending === undefined) this.forward(raw);
        return;
      }
      this.refreshIdle();
      // Comments: keep them with their neighbours (a keep-alive means something to the client).
      if (ledger.ending !== undefined) return;
      if (ledger.committed) this.forward(raw);
      else this.hold(raw);
      return;
    }
    // The idle clock runs on whole events, not bytes: an upstream dripping bytes without an event boundary is idle.
    this.refreshIdle();
    const facts = classifyStreamEvent(this.request.info.route, event, ledger.wantsParts);
    if (facts.kind === 'error') this.observe({ type: 'upstream_error', attempt: this.attempt, error: facts });
    switch (ledger.streamEvent(this.at, facts)) {
      case 'hold':
        return this.hold(raw);
      case 'commit':
        this.commit();
        if (ledger.firstOutputWrittenAt !== undefined) this.observe({ type: 'first_output' });
        for (const piece of this.held) this.forward(piece);
        this.held = [];
        this.heldBytes = 0;
        this.forward(raw);
        return;
      case 'forward':
        if (!this.responseEnded) this.forward(raw);
        return;
      case 'drop':
        return;
    }
  }

  /**
   * Bytes before the first output are bounded in bytes and in pieces: one role chunk per expected choice (vLLM sends
   * them before any content), plus maxHeldEvents more (comments, empty deltas).
   */
  private hold(raw: Buffer): void {
    this.held.push(raw);
    this.heldBytes += raw.length;
    const settings = this.deps.settings;
    if (this.heldBytes > settings.maxEventBytes || this.held.length > settings.maxHeldEvents + this.request.info.expectedChoices) {
      this.emit({ kind: 'abort_attempt', reason: 'oversized' });
    }
  }

  private commit(): void {
    this.clear('first_output');
    this.writeHead(200, { 'content-type': this.contentType ?? 'text/event-stream; charset=utf-8', ...SSE_HEADERS });
    this.armIdle();
  }

  private armIdle(): void {
    this.idleFrom = this.at;
    this.arm('idle', this.deps.settings.idleMs);
  }

  private refreshIdle(): void {
    if (this.armed.has('idle')) this.idleFrom = this.at;
  }

  // --- Deciding and ending --------------------------------------------------------------------------------------

  /** Carries out the ledger's decision about how the client response ends, once it has one. */
  private act(): void {
    const ending = this.ledger.ending;
    if (ending === undefined || this.responseEnded) return;
    switch (ending.kind) {
      case 'complete':
      case 'upstream_error':
        this.endClient(undefined);
        break;
      case 'gateway_error':
        this.endClient(streamErrorEvent(ending.cause, this.request.info.route, this.ledger.nextSequence));
        break;
      case 'failure':
        if (this.retry()) return;
        this.respondFailure(ending.failure);
        break;
    }
    // Keep reading the upstream briefly after the client's response is over, to count what follows (a `[DONE]`
    // after an error, data after `[DONE]`), then let it go.
    if (!this.attemptFinished) {
      this.arm('drain', this.deps.settings.drainGraceMs);
      if (this.waitingForDrain) this.emit({ kind: 'resume_attempt' });
    }
  }

  /**
   * Schedules another attempt for a failure before commit, when the failure is retryable, attempts remain, the
   * total deadline allows the wait, and the model's retry budget has room. Returns whether it did.
   */
  private retry(): boolean {
    const { settings, budget, random } = this.deps;
    const record = this.ledger.currentAttempt;
    if (this.attempt === 0 || record === undefined || this.clientFinished || this.pastDeadline || this.shuttingDown) return false;
    const reason = retryReason(record, settings.retry);
    if (reason === undefined || this.ledger.attemptCount >= settings.maxAttempts) return false;
    const delay = retryDelay(reason, this.ledger.attemptCount, this.retryAfterMs, settings.retry, random);
    if (delay === undefined || this.at + delay >= this.request.arrivalAt + settings.totalMs) return false;
    if (!budget.tryAcquire(this.at)) {
      this.observe({ type: 'retry_budget_spent' });
      return false;
    }
    this.observe({ type: 'retry_scheduled', reason, delayMs: delay });
    this.retriedFor = reason;
    // The failed attempt's verdict is in the ledger; stop reading it so its connection (and GPU slot) is freed.
    if (!this.attemptFinished) this.emit({ kind: 'abort_attempt', reason: 'drained' });
    this.arm('retry', delay);
    return true;
  }

  /** The retry's wait is over: the next attempt, unless the request ended or a deadline passed meanwhile. */
  private retryNow(): void {
    if (this.clientFinished || this.responseEnded) return;
    if (!this.pastDeadline && !this.shuttingDown) return this.startAttempt();
    const failure = this.ledger.finalFailure();
    if (failure !== undefined) this.respondFailure(failure);
  }

  private respondFailure(failure: Failure): void {
    const { status, body } = failureResponse(failure);
    this.writeError(status, body, this.shouldRetryHeader());
  }

  /**
   * `x-should-retry: false` on an upstream failure the client's SDK should not retry (the OpenAI and Anthropic SDKs
   * retry 408, 409, 429 and every 5xx unless told so): a row of the status table that is not retried (docs/errors.md),
   * the total deadline, or any failure after Waybill itself already made more than one attempt — an SDK retry on top
   * of the gateway's multiplies the load on a failing upstream. Never `true`: otherwise the SDK's own rules stand.
   */
  private shouldRetryHeader(): Record<string, string> {
    const record = this.ledger.currentAttempt;
    if (record === undefined || this.shuttingDown) return {};
    const notRetried = this.pastDeadline || retryReason(record, this.deps.settings.retry) === undefined;
    return notRetried || this.ledger.attemptCount > 1 ? { 'x-should-retry': 'false' } : {};
  }

  /** The gateway answers the request itself (failures.ts REFUSALS), counted by the status it answered with. */
  private refuse(refusal: Refusal): void {
    const { status, body, headers } = refusalResponse(refusal, this.request.info.model);
    this.ledger.reject(status);
    this.writeError(status, body, headers);
  }

  private writeError(status: number, body: ErrorBody, headers: Record<string, string> = {}): void {
    if (this.responseEnded) return;
    const payload = Buffer.from(JSON.stringify(errorBodyFor(this.request.info.route, status, body)));
    if (!this.headSent) this.writeHead(status, { ...headers, 'content-type': 'application/json', 'content-length': payload.length });
    this.endClient(payload);
  }

  private writeHead(status: number, headers: Record<string, string | number>): void {
    // Nothing is written once the response is over (the client left while an attempt was still reporting).
    if (this.responseEnded || this.headSent) return;
    this.headSent = true;
    this.emit({ kind: 'write_head', status, headers: { ...headers, 'x-request-id': this.request.requestId } });
  }

  private forward(raw: Buffer): void {
    this.out[this.outCount++] = raw;
  }

  /** Forgets the forwarded bytes (written, or never to be), keeping the array's storage. */
  private dropOut(): void {
    for (let i = 0; i < this.outCount; i++) this.out[i] = EMPTY;
    this.outCount = 0;
  }

  /** Writes the events forwarded so far, in one write. */
  private flush(): void {
    if (this.outCount === 0) return;
    const data = this.outCount === 1 ? (this.out[0] as Buffer) : coalesce(this.out.slice(0, this.outCount));
    this.dropOut();
    if (!this.responseEnded) this.emit({ kind: 'write', data });
  }

  /**
   * Ends the response. The client counts as served only once the last byte has left for its socket ('finish'):
   * a client that stops reading and leaves before that is a cancellation, not a delivery.
   */
  private endClient(last: Buffer | undefined): void {
    if (this.responseEnded) return;
    // Events forwarded in the same upstream read as the one that ended the stream go out before the end.
    this.flush();
    this.responseEnded = true;
    this.emit({ kind: 'end', data: last });
  }

  private pauseForClient(): void {
    // Once the response is over the upstream is read only for accounting (the drain grace): a slow client must not
    // stop that.
    if (this.waitingForDrain || this.attemptFinished || this.responseEnded) return;
    this.waitingForDrain = true;
    this.emit({ kind: 'pause_attempt' });
    // The idle clock measures the upstream: it runs only while Waybill is reading it, not while a slow client has
    // paused the stream (the total deadline still bounds that).
    this.clear('idle');
  }

  private onClientDrain(): void {
    if (!this.waitingForDrain) return;
    this.waitingForDrain = false;
    if (this.attemptFinished) return;
    if (!this.responseEnded) this.armIdle();
    this.emit({ kind: 'resume_attempt' });
  }

  private onClientFinish(): void {
    if (this.clientFinished) return;
    this.clientFinished = true;
    this.ledger.clientEnded(this.at);
    this.maybeSettle();
  }

  private onClientClose(): void {
    if (this.clientFinished) return;
    this.clientFinished = true;
    this.responseEnded = true;
    this.ledger.clientCancelled(this.at);
    this.observe({ type: 'client_cancelled' });
    this.clear('retry');
    if (this.request.gated && !this.admitted) this.emit({ kind: 'cancel_admission' });
    if (!this.attemptFinished) this.emit({ kind: 'abort_attempt', reason: 'cancelled' });
    this.maybeSettle();
  }

  private onTimer(timer: TimerName): void {
    switch (timer) {
      case 'idle': {
        const left = this.idleFrom + this.deps.settings.idleMs - this.at;
        if (left > 0) return this.arm('idle', left);
        return this.onDeadline(timer);
      }
      case 'total':
      case 'first_output':
        return this.onDeadline(timer);
      case 'drain':
        this.ledger.attemptReleased(this.at);
        if (!this.attemptFinished) this.emit({ kind: 'abort_attempt', reason: 'drained' });
        return;
      case 'retry':
        // At most one attempt in flight: the failed one was aborted, but its end may not have been reported yet.
        if (!this.attemptFinished) this.retryDue = true;
        else this.retryNow();
        return;
      case 'linger':
        if (!this.clientFinished) this.emit({ kind: 'destroy_client' });
        return;
    }
  }

  private onDeadline(timer: 'total' | 'first_output' | 'idle'): void {
    if (timer === 'total') this.pastDeadline = true;
    const reason = timer === 'total' ? 'total_timeout' : timer === 'idle' ? 'idle_timeout' : 'first_output_timeout';
    if (!this.attemptFinished) {
      this.emit({ kind: 'abort_attempt', reason });
    } else if (!this.responseEnded && !this.settled) {
      this.clear('retry');
      const failure = this.ledger.finalFailure();
      if (failure !== undefined) {
        // Between attempts: the deadline ends the request with what the last attempt said.
        this.respondFailure(failure);
      } else if (timer === 'total' && this.attempt === 0) {
        // Still queued for admission at the deadline.
        this.emit({ kind: 'cancel_admission' });
        this.refuse('queue_deadline');
      }
      this.maybeSettle();
    }
    if (timer === 'total') this.closeIfNotTaken();
  }

  /** The gateway is shutting down and its drain deadline passed: end this request now, and count it. */
  private shutdown(): void {
    this.shuttingDown = true;
    if (!this.attemptFinished) {
      this.emit({ kind: 'abort_attempt', reason: 'shutdown' });
    } else if (!this.responseEnded && !this.settled) {
      this.clear('retry');
      if (this.request.gated && !this.admitted) this.emit({ kind: 'cancel_admission' });
      if (!this.ledger.committed) {
        this.refuse('shutting_down');
      }
    }
    // A client that does not take even its ended response must not hold the exit.
    this.closeIfNotTaken();
  }

  /**
   * A client that does not read even its ended response would hold it forever: give it the drain grace to take the
   * last bytes (Waybill's error event), then close the connection; that counts as the client leaving.
   */
  private closeIfNotTaken(): void {
    if (this.clientFinished || this.lingering) return;
    this.lingering = true;
    this.arm('linger', this.deps.settings.drainGraceMs);
  }

  /** Stops the clocks of the attempt in flight; the request's total deadline keeps running. */
  private clearAttemptClocks(): void {
    this.clear('first_output');
    this.clear('idle');
    this.clear('drain');
  }

  private maybeSettle(): void {
    if (this.settled || !this.clientFinished || !this.attemptFinished) return;
    this.settled = true;
    this.clearTimers();
    if (this.admitted) this.emit({ kind: 'release_admission' });
    this.emit({ kind: 'settle', settlement: this.ledger.settle(this.at) });
  }

  private clearTimers(): void {
    for (const timer of TIMERS) this.clear(timer);
  }

  /**
   * An error inside this request's handling (a bug): its state can no longer be trusted, so it is ended from what is
   * certain — the client gets a 500 before commit or Waybill's error event after, the upstream is let go, and the
   * request is counted once, as failed (or incomplete once committed), with the error reported.
   */
  private crash(error: unknown): void {
    this.observe({ type: 'internal_error', error });
    // Every timer, not only those armed by the machine's count: the discarded step may have cleared some the shell
    // still holds.
    for (const timer of TIMERS) {
      this.armed.delete(timer);
      this.emit({ kind: 'clear', timer });
    }
    if (this.request.gated && !this.admitted) this.emit({ kind: 'cancel_admission' });
    if (!this.attemptFinished) this.emit({ kind: 'abort_attempt', reason: 'cancelled' });
    const committed = this.headSent;
    if (!this.responseEnded) {
      this.responseEnded = true;
      if (committed) {
        this.emit({ kind: 'end', data: streamErrorEvent('internal', this.request.info.route, this.ledger.nextSequence) });
      } else {
        const { status, body } = refusalResponse('internal', this.request.info.model);
        const payload = Buffer.from(JSON.stringify(errorBodyFor(this.request.info.route, status, body)));
        this.emit({ kind: 'write_head', status, headers: { 'content-type': 'application/json', 'content-length': payload.length, 'x-request-id': this.request.requestId } });
        this.emit({ kind: 'end', data: payload });
      }
    }
    this.settled = true;
    if (this.admitted) this.emit({ kind: 'release_admission' });
    let settlement: Settlement;
    try {
      this.ledger.internalError(this.at);
      settlement = this.ledger.settle(this.at);
    } catch {
      settlement = crashSettlement(this.request.info, this.request.arrivalAt, committed, this.at);
    }
    this.emit({ kind: 'settle', settlement });
  }

  // --- Effects --------------------------------------------------------------------------------------------------

  private emit(effect: Effect): void {
    this.effects[this.effectCount++] = effect;
  }

  private observe(observation: Observation): void {
    this.effects[this.effectCount++] = { kind: 'observe', observation };
  }

  private arm(timer: TimerName, ms: number): void {
    this.armed.add(timer);
    this.emit({ kind: 'arm', timer, at: this.at + ms, ms });
  }

  private clear(timer: TimerName): void {
    if (this.armed.delete(timer)) this.emit({ kind: 'clear', timer });
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
