/**
 * The record of one logical request: what happened to it and to each attempt Waybill made for it, as plain data, and
 * the small functions that add one fact to it. Pure: no I/O, no clock, no hooks — time comes in with each fact, and
 * what an observer wants to know (anomalies, the gap between output events) is read off the record by the caller.
 * Each function updates the record in place: a new record per upstream event would allocate per event, on the path
 * the delivery machine is held to (bench/step-alloc.ts).
 *
 * `recordStreamEvent` also says what to do with the event's bytes — hold (nothing reaches the client before the first
 * output-bearing event), commit (send the held bytes and this one), forward, or drop — because that verdict is a fact
 * of the record (the commit is when `committedAt` is set). How the request is counted is settle.ts's, from the record.
 */
import type { EventFacts, UpstreamError, Usage } from '../sse/classify.js';
import { failureOf, type Failure } from '../delivery/failures.js';
import { ANOMALY_KINDS, type AnomalyKind, type AttemptResult } from './outcomes.js';
import { contractNeedsText, OutputAssembly } from './output-contract.js';
import type { RequestInfo } from './request-info.js';

export type { Failure } from '../delivery/failures.js';
export type { RequestInfo, SloThresholds } from './request-info.js';

/** What the shell does with the bytes of one upstream event. */
export type Verdict = 'hold' | 'commit' | 'forward' | 'drop';

/** Why an attempt's upstream stream stopped, as the shell saw it. */
export type StreamEnd = 'eof' | 'reset' | 'idle_timeout' | 'first_output_timeout' | 'total_timeout' | 'oversized' | 'shutdown';

/** Why Waybill ended a committed stream with its own error event. `internal`: a bug in the gateway, caught. */
export type GatewayErrorCause = StreamEnd | 'unfinished_choices' | 'internal';

/** How the client response must end once the record knows. */
export type Ending =
  /** `[DONE]` was forwarded: end the response. */
  | { kind: 'complete' }
  /** The upstream's error event was forwarded: end the response. */
  | { kind: 'upstream_error' }
  /** After commit the stream broke: write Waybill's own error event naming the cause, then end. */
  | { kind: 'gateway_error'; cause: GatewayErrorCause }
  /** Before commit: answer with a status and an error body. */
  | { kind: 'failure'; failure: Failure };

/** A 2xx response Waybill cannot read, seen at its start. */
export type ProtocolViolation = 'not_event_stream' | 'compressed';

export interface AttemptRecord {
  readonly upstream: string;
  readonly startedAt: number;
  status: number | undefined;
  result: AttemptResult | undefined;
  endedAt: number | undefined;
  /** First output-bearing event seen on this attempt. */
  firstOutputAt: number | undefined;
  failure: Failure | undefined;
}

export interface Anomaly {
  readonly upstream: string;
  readonly kind: AnomalyKind;
}

/** An attempt as the record keeps it: its public record, and what its stream said so far. */
export interface AttemptFacts extends AttemptRecord {
  sawDone: boolean;
  error: UpstreamError | undefined;
  /** Anomaly kinds already recorded for this attempt (a bit per kind): each counts once per attempt. */
  anomalyKinds: number;
}

export interface RequestRecord {
  readonly arrivalAt: number;
  /**
   * The machine's settlement has begun (settle.ts settleRequest): a second one throws, so a settlement that failed
   * half-way is not settled again from the record it left changed — the crash path counts from what the shell was told.
   */
  settling: boolean;
  readonly attempts: AttemptFacts[];
  /** Every anomaly, in the order seen: an observer reads those past its own cursor (anomalies as observations). */
  readonly anomalies: Anomaly[];
  /**
   * The first finish_reason of each expected choice of the current attempt, by choice index (only expected indices,
   * isExpectedChoice, so bounded by the request's choices). Arrays here, not a Map and a Set: a request keeps its record
   * for its whole life, and each collection's table is a few hundred bytes of it (issue 27).
   */
  readonly finishes: (string | undefined)[];
  /** When the response was committed (the first output, or a complete answer without any): no retry after this. */
  committedAt: number | undefined;
  /** When the first output-bearing event went to the client (a stream's TTFT). */
  firstOutputAt: number | undefined;
  lastOutputAt: number | undefined;
  /** The gap since the previous output event, set by the last stream event that carried output; else undefined. */
  outputGapMs: number | undefined;
  usage: Usage | undefined;
  /** The current attempt's relayed output (RelayedOutput). */
  outputEvents: number;
  outputChars: number;
  /** How the client response ends, once known. */
  ending: Ending | undefined;
  clientEndAt: number | undefined;
  cancelledAt: number | undefined;
  /** The status the gateway answered with by itself, without (another) attempt. */
  rejectedWith: number | undefined;
  doneAfterError: number;
  responseId: string | undefined;
  responseModel: string | undefined;
  /** The last sequence number the upstream's events carried (Responses); -1 before any. */
  lastSequence: number;
  /** Expected choices of the current attempt that carried an answer (content, text or a named tool call), by index. */
  readonly answered: (true | undefined)[];
  /** The current attempt's answer text, assembled only when the contract needs it (or the answer is captured). */
  readonly assembly: OutputAssembly | undefined;
  /** In the admission queue now. */
  waiting: boolean;
}

/** Characters of answer text assembled per response when the request does not say (the config default). */
const DEFAULT_MAX_OUTPUT_CHARS = 1_048_576;

export function createRecord(info: RequestInfo, arrivalAt: number): RequestRecord {
  return {
    arrivalAt,
    settling: false,
    attempts: [],
    anomalies: [],
    finishes: [],
    committedAt: undefined,
    firstOutputAt: undefined,
    lastOutputAt: undefined,
    outputGapMs: undefined,
    usage: undefined,
    outputEvents: 0,
    outputChars: 0,
    ending: undefined,
    clientEndAt: undefined,
    cancelledAt: undefined,
    rejectedWith: undefined,
    doneAfterError: 0,
    responseId: undefined,
    responseModel: undefined,
    lastSequence: -1,
    answered: [],
    assembly: contractNeedsText(info.contract) || info.captureAnswer === true ? new OutputAssembly(info.expectedChoices, info.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS) : undefined,
    waiting: false,
  };
}

/** Events must be classified with their answer's pieces (EventFacts.parts): the contract's checks need the text. */
export function wantsParts(rec: RequestRecord): boolean {
  return rec.assembly !== undefined;
}

/** The sequence number an event Waybill adds to a Responses stream takes: one past the last the upstream sent. */
export function nextSequence(rec: RequestRecord): number {
  return rec.lastSequence + 1;
}

/** The failure the client is answered with when no further attempt is made. */
export function finalFailure(rec: RequestRecord): Failure | undefined {
  return rec.ending?.kind === 'failure' ? rec.ending.failure : undefined;
}

export function currentAttempt(rec: RequestRecord): AttemptFacts {
  const attempt = rec.attempts.at(-1);
  if (attempt === undefined) throw new Error('no attempt started');
  return attempt;
}

/**
 * A new attempt. Before commit, a retry replaces whatever the failed attempt left: its failure no longer decides
 * the response, and finish reasons or usage it reported belong to no answer the client will see.
 */
export function recordAttemptStart(rec: RequestRecord, at: number, upstream: string): void {
  if (rec.committedAt !== undefined) throw new Error('no attempt after commit');
  rec.ending = undefined;
  rec.finishes.length = 0;
  rec.answered.length = 0;
  rec.assembly?.reset();
  rec.usage = undefined;
  rec.outputEvents = 0;
  rec.outputChars = 0;
  rec.responseId = undefined;
  rec.responseModel = undefined;
  rec.attempts.push({ upstream, startedAt: at, status: undefined, result: undefined, endedAt: undefined, firstOutputAt: undefined, failure: undefined, sawDone: false, error: undefined, anomalyKinds: 0 });
}

/** The gateway failed while serving this request (a bug, caught): it ends now, an error event after commit, a 500 before. */
export function recordInternalError(rec: RequestRecord, info: RequestInfo, at: number): void {
  const attempt = rec.attempts.at(-1);
  if (attempt !== undefined && attempt.result === undefined) {
    attempt.result = 'cancelled';
    attempt.endedAt = at;
  }
  rec.ending = rec.committedAt !== undefined ? { kind: 'gateway_error', cause: 'internal' } : { kind: 'failure', failure: failureOf('internal', info.route) };
}

/**
 * The shell stops reading the current attempt once its verdict is known (the drain grace after `[DONE]` or an error
 * event ran out): its result is what it sent.
 */
export function recordRelease(rec: RequestRecord, info: RequestInfo, at: number): void {
  const attempt = rec.attempts.at(-1);
  if (attempt !== undefined && attempt.result === undefined) {
    attempt.result = judgedResult(rec, info, attempt);
    attempt.endedAt ??= at;
  }
}

/** At settlement: every attempt still open is judged by what it sent (one the shell stopped watching without telling why). */
export function recordJudged(rec: RequestRecord, info: RequestInfo, at: number): void {
  for (const attempt of rec.attempts) {
    if (attempt.result !== undefined) continue;
    attempt.result = judgedResult(rec, info, attempt);
    attempt.endedAt ??= at;
  }
}

/** The result of an attempt the shell stopped watching without telling why: what it sent. */
export function judgedResult(rec: RequestRecord, info: RequestInfo, attempt: AttemptFacts): AttemptResult {
  if (attempt.result !== undefined) return attempt.result;
  if (attempt.error !== undefined) return 'error_payload';
  if (attempt.sawDone) return unfinishedChoices(rec, info) > 0 ? 'incomplete' : 'ok';
  return rec.committedAt !== undefined ? 'incomplete' : 'cancelled';
}

/** The client went away before its response ended. Ends the current attempt as cancelled. */
export function recordCancel(rec: RequestRecord, at: number): void {
  if (rec.cancelledAt !== undefined || rec.clientEndAt !== undefined) return;
  rec.cancelledAt = at;
  const attempt = rec.attempts.at(-1);
  if (attempt !== undefined && attempt.result === undefined) {
    attempt.result = 'cancelled';
    attempt.endedAt = at;
  }
}

/** The client response has been fully written and ended. */
export function recordClientEnd(rec: RequestRecord, at: number): void {
  rec.clientEndAt ??= at;
}

export function unfinishedChoices(rec: RequestRecord, info: RequestInfo): number {
  let missing = 0;
  for (let index = 0; index < info.expectedChoices; index++) if (rec.finishes[index] === undefined) missing++;
  return missing;
}

export function isExpectedChoice(info: RequestInfo, index: number): boolean {
  return Number.isInteger(index) && index >= 0 && index < info.expectedChoices;
}

/**
 * Keeps the first finish_reason of each expected choice. An index outside 0..expectedChoices-1 (or not an integer)
 * is an anomaly and never a finish reason: counted, it would inflate the finish-reason shares, and stored, it would
 * let an upstream grow the map with every distinct index it names.
 */
export function recordFinishes(rec: RequestRecord, info: RequestInfo, attempt: AttemptFacts, facts: Extract<EventFacts, { kind: 'chunk' }>): void {
  for (const index of facts.choices) {
    if (!isExpectedChoice(info, index)) anomaly(rec, attempt, 'unexpected_choice');
  }
  for (const finish of facts.finishes) {
    if (!isExpectedChoice(info, finish.index)) continue;
    rec.finishes[finish.index] ??= finish.reason;
  }
}

export function recordAnswer(rec: RequestRecord, info: RequestInfo, facts: Extract<EventFacts, { kind: 'chunk' }>): void {
  for (const index of facts.answers) if (isExpectedChoice(info, index)) rec.answered[index] = true;
  if (facts.parts !== undefined) rec.assembly?.add(facts.parts);
}

/** Usage whose numbers cannot be counted is missing usage, plus an anomaly; the latest usage seen wins. */
export function recordUsage(rec: RequestRecord, attempt: AttemptFacts, facts: Extract<EventFacts, { kind: 'chunk' }>): void {
  if (facts.usageInvalid) {
    anomaly(rec, attempt, 'invalid_usage');
    rec.usage = undefined;
  } else if (facts.usage !== undefined) {
    rec.usage = facts.usage;
  }
}

export function fail(rec: RequestRecord, attempt: AttemptFacts, result: AttemptResult, failure: Failure): void {
  attempt.result = result;
  attempt.failure = failure;
  rec.ending = { kind: 'failure', failure };
}

const ANOMALY_BIT = new Map<AnomalyKind, number>(ANOMALY_KINDS.map((kind, i) => [kind, 1 << i]));

/** Records an anomaly once per attempt and kind, so what a request keeps is bounded whatever the upstream sends. */
export function anomaly(rec: RequestRecord, attempt: AttemptFacts, kind: AnomalyKind): void {
  const bit = ANOMALY_BIT.get(kind) ?? 0;
  if ((attempt.anomalyKinds & bit) !== 0) return;
  attempt.anomalyKinds |= bit;
  rec.anomalies.push({ upstream: attempt.upstream, kind });
}

export function errorOf(facts: Extract<EventFacts, { kind: 'error' }>): UpstreamError {
  return { code: facts.code, type: facts.type, message: facts.message, param: facts.param };
}
