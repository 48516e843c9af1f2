/**
 * How the request ends, in one place: `decide` carries out the record's ruling on the client's response — delivered
 * (`[DONE]` forwarded), the upstream's error forwarded, Waybill's error event after commit, or before commit a retry
 * (`retry`: attempting → backing_off) or the failure's status (→ ending); `settleIfDone` counts it once both the
 * client's side and the attempt are over (ending → settled).
 */
import { finalFailure, nextSequence } from '../../accounting/record.js';
import { settleRequest } from '../../accounting/settle.js';
import type { Failure } from '../../accounting/ledger.js';
import { failureResponse } from '../failures.js';
import { retryDelay, retryReason } from '../retry-policy.js';
import { arm, attemptOpen, clear, clientDone, emit, endClient, observe, responseEnded, TIMERS, writeError, type DeliveryState } from '../state.js';
import { streamErrorEvent } from '../wire.js';
import { startAttempt } from './admitting.js';

/** Carries out the record's decision about how the client response ends, once it has one. */
export function decide(s: DeliveryState): void {
  const ending = s.record.ending;
  if (ending === undefined || responseEnded(s)) return;
  switch (ending.kind) {
    case 'complete':
    case 'upstream_error':
      endClient(s, undefined);
      break;
    case 'gateway_error':
      endClient(s, streamErrorEvent(ending.cause, s.request.info.route, nextSequence(s.record)));
      break;
    case 'failure':
      if (retry(s)) return;
      respondFailure(s, ending.failure);
      break;
  }
  // Keep reading the upstream briefly after the client's response is over, to count what follows (a `[DONE]` after
  // an error, data after `[DONE]`), then let it go — a slow client does not stop that.
  if (attemptOpen(s)) {
    arm(s, 'drain', s.deps.settings.drainGraceMs);
    if (s.upstream === 'paused') {
      s.upstream = 'reading';
      emit(s, { kind: 'resume_attempt' });
    }
  }
}

/**
 * Schedules another attempt for a failure before commit (attempting → backing_off), when the failure is retryable,
 * attempts remain, the total deadline allows the wait, and the model's retry budget has room. Returns whether it did.
 */
function retry(s: DeliveryState): boolean {
  const { settings, budget, random } = s.deps;
  const record = s.record.attempts.at(-1);
  if (s.attempt === 0 || record === undefined || clientDone(s) || s.stopped !== undefined) return false;
  const reason = retryReason(record, settings.retry);
  if (reason === undefined || s.record.attempts.length >= settings.maxAttempts) return false;
  const delay = retryDelay(reason, s.record.attempts.length, s.retryAfterMs, settings.retry, random);
  if (delay === undefined || s.at + delay >= s.request.arrivalAt + settings.totalMs) return false;
  if (!budget.tryAcquire(s.at)) {
    observe(s, { type: 'retry_budget_spent' });
    return false;
  }
  observe(s, { type: 'retry_scheduled', reason, delayMs: delay });
  s.retriedFor = reason;
  s.phase = 'backing_off';
  // The failed attempt's verdict is in the record; stop reading it so its connection (and GPU slot) is freed.
  if (attemptOpen(s)) emit(s, { kind: 'abort_attempt', reason: 'drained' });
  arm(s, 'retry', delay);
  return true;
}

/** backing_off: the wait is over — the next attempt, unless the request ended or a deadline passed meanwhile. */
export function retryNow(s: DeliveryState): void {
  if (clientDone(s) || responseEnded(s)) return;
  if (s.stopped === undefined) return startAttempt(s);
  const failure = finalFailure(s.record);
  if (failure !== undefined) respondFailure(s, failure);
}

/** Before commit, no (further) attempt: the client gets the failure's status and body (failures.ts). */
export function respondFailure(s: DeliveryState, failure: Failure): void {
  const { status, body } = failureResponse(failure);
  writeError(s, status, body, shouldRetryHeader(s));
}

/**
 * `x-should-retry: false` on an upstream failure the client's SDK should not retry (the OpenAI and Anthropic SDKs
 * retry 408, 409, 429 and every 5xx unless told so): a row of the status table that is not retried (docs/errors.md),
 * the total deadline, or any failure after Waybill itself already made more than one attempt — an SDK retry on top
 * of the gateway's multiplies the load on a failing upstream. Never `true`: otherwise the SDK's own rules stand.
 */
function shouldRetryHeader(s: DeliveryState): Record<string, string> {
  const record = s.record.attempts.at(-1);
  if (record === undefined || s.stopped === 'shutdown') return {};
  const notRetried = s.stopped === 'total_deadline' || retryReason(record, s.deps.settings.retry) === undefined;
  return notRetried || s.record.attempts.length > 1 ? { 'x-should-retry': 'false' } : {};
}

/** ending → settled, once the client's side and the attempt are both over: the request's one settlement. */
export function settleIfDone(s: DeliveryState): void {
  if (s.phase === 'settled' || !clientDone(s) || attemptOpen(s)) return;
  s.phase = 'settled';
  for (const timer of TIMERS) clear(s, timer);
  if (s.admission === 'held') emit(s, { kind: 'release_admission' });
  emit(s, { kind: 'settle', settlement: settleRequest(s.record, s.request.info, s.at) });
}
