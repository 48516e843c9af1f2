/**
 * The record of facts (src/accounting/record.ts, record-upstream.ts) and its settlement (settle.ts) driven as a
 * sequence of calls, for the tests that state accounting as "these facts, in this order, settle as this": the
 * ledger's tests and the metrics contract's settlements. It only holds one record and calls the record's own
 * functions, in the order the delivery machine does (src/delivery/phases/); no rule lives here.
 */
import type { EventFacts } from '../../src/sse/classify.js';
import type { AnomalyKind } from '../../src/accounting/outcomes.js';
import {
  createRecord,
  currentAttempt,
  finalFailure,
  nextSequence,
  recordAttemptStart,
  recordCancel,
  recordClientEnd,
  recordInternalError,
  recordRelease,
  wantsParts,
  type AttemptRecord,
  type Ending,
  type Failure,
  type ProtocolViolation,
  type RequestInfo,
  type RequestRecord,
  type StreamEnd,
  type Verdict,
} from '../../src/accounting/record.js';
import { recordBody, recordConnectFailure, recordProtocolViolation, recordStreamEnd, recordStreamEvent } from '../../src/accounting/record-upstream.js';
import { settleRequest, type Settlement } from '../../src/accounting/settle.js';

export interface LedgerHooks {
  /** Called for each gap between consecutive output-bearing events written to the client. */
  onInterTokenGap?(ms: number): void;
  /** Called when an anomaly is seen, as it is seen (traces record it as an event of the attempt). */
  onAnomaly?(kind: AnomalyKind, upstream: string): void;
}

export class RequestLedger {
  readonly record: RequestRecord;
  /** Anomalies already reported to the hook. */
  private reported = 0;

  constructor(
    readonly info: RequestInfo,
    readonly arrivalAt: number,
    private readonly hooks: LedgerHooks = {},
  ) {
    this.record = createRecord(info, arrivalAt);
  }

  /** Events must be classified with their answer's pieces (EventFacts.parts): the contract's checks need the text. */
  get wantsParts(): boolean {
    return wantsParts(this.record);
  }

  /** Has anything been sent to the client? Retries are only possible before this. */
  get committed(): boolean {
    return this.record.committedAt !== undefined;
  }

  /** Set once the client response's end is decided; the shell acts on it. */
  get ending(): Ending | undefined {
    return this.record.ending;
  }

  /** When the first output-bearing event was written to the client. */
  get firstOutputWrittenAt(): number | undefined {
    return this.record.firstOutputAt;
  }

  get attemptCount(): number {
    return this.record.attempts.length;
  }

  get currentAttempt(): AttemptRecord | undefined {
    return this.record.attempts.at(-1);
  }

  /** The sequence number an event Waybill adds to a Responses stream takes: one past the last the upstream sent. */
  get nextSequence(): number {
    return nextSequence(this.record);
  }

  /** The record of attempt `index` (0-based), for reporting an attempt's verdict after a later one started. */
  attemptAt(index: number): AttemptRecord | undefined {
    return this.record.attempts[index];
  }

  /** The gateway answered by itself, without any attempt (bad request, unknown model, body too large, ...). */
  reject(status: number): void {
    this.record.rejectedWith = status;
  }

  /** The request waits in the model's admission queue (time there counts toward TTFT: the clock started at arrival). */
  queued(_at: number): void {
    this.record.waiting = true;
  }

  /** The request left the admission queue with a slot. */
  admitted(_at: number): void {
    this.record.waiting = false;
  }

  startAttempt(at: number, upstream: string): void {
    recordAttemptStart(this.record, at, upstream);
  }

  /** The upstream's response status line arrived. */
  responseStarted(_at: number, status: number): void {
    currentAttempt(this.record).status = status;
  }

  /** One classified upstream SSE event of the current attempt; returns what to do with its bytes. */
  streamEvent(at: number, facts: EventFacts): Verdict {
    const verdict = recordStreamEvent(this.record, this.info, at, facts);
    const gap = this.record.outputGapMs;
    if (gap !== undefined) this.hooks.onInterTokenGap?.(gap);
    this.report();
    return verdict;
  }

  streamEnded(at: number, how: StreamEnd): void {
    recordStreamEnd(this.record, this.info, at, how);
    this.report();
  }

  connectFailed(at: number, result: 'connect_error' | 'reset' | 'timeout'): void {
    recordConnectFailure(this.record, this.info, at, result);
  }

  bodyReceived(at: number, status: number, facts: EventFacts): void {
    recordBody(this.record, this.info, at, status, facts);
    this.report();
  }

  protocolViolation(at: number, violation: ProtocolViolation): void {
    recordProtocolViolation(this.record, this.info, at, violation);
    this.report();
  }

  internalError(at: number): void {
    recordInternalError(this.record, this.info, at);
  }

  /** The failure the client is answered with when no further attempt is made. */
  finalFailure(): Failure | undefined {
    return finalFailure(this.record);
  }

  attemptReleased(at: number): void {
    recordRelease(this.record, this.info, at);
  }

  clientCancelled(at: number): void {
    recordCancel(this.record, at);
  }

  clientEnded(at: number): void {
    recordClientEnd(this.record, at);
  }

  /** Closes the record. Call exactly once; a second call throws (a double count is a bug, not a race to hide). */
  /** The machine's settlement (settleRequest): once; a second call throws. */
  settle(at: number): Settlement {
    return settleRequest(this.record, this.info, at);
  }

  private report(): void {
    const anomalies = this.record.anomalies;
    while (this.reported < anomalies.length) {
      const anomaly = anomalies[this.reported++]!;
      this.hooks.onAnomaly?.(anomaly.kind, anomaly.upstream);
    }
  }
}
