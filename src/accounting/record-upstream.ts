/**
 * What the current attempt's upstream sent, added to the request's record (record.ts): each stream event (with the
 * verdict on its bytes: hold, commit, forward, drop), the stream's end, a connection failure, a whole body, a 2xx that
 * cannot be read. Pure, and in place like the rest of the record.
 */
import type { EventFacts } from '../sse/classify.js';
import { failureOf, type Failure, type FailureCause } from '../delivery/failures.js';
import type { AttemptResult, Route } from './outcomes.js';
import {
  anomaly,
  currentAttempt,
  errorOf,
  fail,
  recordAnswer,
  recordFinishes,
  recordUsage,
  unfinishedChoices,
  type AttemptFacts,
  type ProtocolViolation,
  type RequestRecord,
  type StreamEnd,
  type Verdict,
} from './record.js';
import type { RequestInfo } from './request-info.js';

/** One classified upstream SSE event of the current attempt; returns what to do with its bytes. */
export function recordStreamEvent(rec: RequestRecord, info: RequestInfo, at: number, facts: EventFacts): Verdict {
  const attempt = currentAttempt(rec);
  rec.outputGapMs = undefined;
  if (facts.kind === 'chunk' || facts.kind === 'error') {
    if (facts.sequence !== undefined && facts.sequence > rec.lastSequence) rec.lastSequence = facts.sequence;
  }
  if (attempt.sawDone) {
    anomaly(rec, attempt, 'data_after_done');
    return 'drop';
  }
  if (attempt.error !== undefined) {
    if (facts.kind === 'done') {
      attempt.sawDone = true;
      anomaly(rec, attempt, 'done_after_error');
      rec.doneAfterError++;
    }
    return 'drop';
  }
  switch (facts.kind) {
    case 'malformed':
      anomaly(rec, attempt, 'malformed_event');
      return 'drop';
    case 'error': {
      attempt.error = facts;
      anomaly(rec, attempt, 'error_payload');
      if (rec.committedAt !== undefined) {
        rec.ending = { kind: 'upstream_error' };
        return 'forward';
      }
      fail(rec, attempt, 'error_payload', failureOf('error_payload', info.route, { kind: 'event', code: facts.code }, errorOf(facts)));
      return 'drop';
    }
    case 'done':
      return finished(rec, info, at, attempt, false);
    case 'chunk': {
      recordFinishes(rec, info, attempt, facts);
      recordAnswer(rec, info, facts);
      recordUsage(rec, attempt, facts);
      rec.responseId ??= facts.id;
      rec.responseModel ??= facts.model;
      if (facts.usageOnly && info.dropUsageChunk) return 'drop';
      rec.outputEvents += facts.output.length;
      rec.outputChars += facts.outputChars ?? 0;
      let verdict: Verdict;
      if (facts.output.length === 0) {
        verdict = rec.committedAt !== undefined ? 'forward' : 'hold';
      } else {
        recordOutput(rec, attempt, at);
        if (rec.committedAt !== undefined) {
          verdict = 'forward';
        } else {
          rec.committedAt = at;
          rec.firstOutputAt = at;
          verdict = 'commit';
        }
      }
      // Responses' response.completed: the answer is complete with this event, and no [DONE] follows.
      return facts.terminal === true ? finished(rec, info, at, attempt, verdict === 'commit') : verdict;
    }
  }
}

/** An event with output at `at`: the attempt's first, and the gap since the request's last. */
function recordOutput(rec: RequestRecord, attempt: AttemptFacts, at: number): void {
  attempt.firstOutputAt ??= at;
  if (rec.lastOutputAt !== undefined) rec.outputGapMs = at - rec.lastOutputAt;
  rec.lastOutputAt = at;
}

/**
 * `recordStreamEvent` for a committed stream's ordinary delta: output for expected choice `index` (`chars` UTF-16
 * units, more than none) and nothing else — no finish, usage, sequence or parts to assemble — in an attempt that has
 * seen neither `[DONE]` nor an error. The same record; its verdict is always `forward`. The caller checks all that
 * (delivery/phases/attempt.ts, ordinaryRead).
 */
export function recordOrdinaryOutput(rec: RequestRecord, attempt: AttemptFacts, at: number, index: number, chars: number, id: string | undefined, model: string | undefined): void {
  rec.outputGapMs = undefined;
  rec.answered[index] = true;
  rec.responseId ??= id;
  rec.responseModel ??= model;
  rec.outputEvents++;
  rec.outputChars += chars;
  recordOutput(rec, attempt, at);
}

/**
 * The upstream said the answer is complete (`[DONE]`, `message_stop`, `response.completed`). Every choice must have
 * finished; then the answer is delivered, committing it now if nothing was (an answer without output).
 */
function finished(rec: RequestRecord, info: RequestInfo, at: number, attempt: AttemptFacts, committedNow: boolean): Verdict {
  attempt.sawDone = true;
  if (unfinishedChoices(rec, info) > 0) {
    anomaly(rec, attempt, 'missing_finish_reason');
    if (rec.committedAt !== undefined) rec.ending = { kind: 'gateway_error', cause: 'unfinished_choices' };
    else fail(rec, attempt, 'incomplete', failureOf('incomplete', info.route));
    return committedNow ? 'commit' : 'drop';
  }
  rec.ending = { kind: 'complete' };
  if (rec.committedAt !== undefined) return committedNow ? 'commit' : 'forward';
  rec.committedAt = at;
  return 'commit';
}

/** The current attempt's upstream stream stopped (after a 200 event stream). */
export function recordStreamEnd(rec: RequestRecord, info: RequestInfo, at: number, how: StreamEnd): void {
  const attempt = currentAttempt(rec);
  if (attempt.result !== undefined) {
    attempt.endedAt ??= at;
    return;
  }
  attempt.endedAt = at;
  if (attempt.error !== undefined) {
    attempt.result = 'error_payload';
    return;
  }
  if (attempt.sawDone) {
    attempt.result = unfinishedChoices(rec, info) > 0 ? 'incomplete' : 'ok';
    return;
  }
  if (how === 'oversized') anomaly(rec, attempt, 'oversized_event');
  if (how === 'eof') {
    anomaly(rec, attempt, 'missing_done');
    if (unfinishedChoices(rec, info) > 0) anomaly(rec, attempt, 'missing_finish_reason');
  }
  const result = resultForEnd(how);
  if (rec.committedAt !== undefined) {
    attempt.result = result;
    rec.ending ??= { kind: 'gateway_error', cause: how };
    return;
  }
  fail(rec, attempt, result, failureForEnd(how, info.route));
}

/** The current attempt failed before any response (refused, reset, DNS, connect timeout). */
export function recordConnectFailure(rec: RequestRecord, info: RequestInfo, at: number, result: 'connect_error' | 'reset' | 'timeout'): void {
  const attempt = currentAttempt(rec);
  attempt.endedAt = at;
  fail(rec, attempt, result, result === 'timeout' ? failureOf('timeout', info.route, { kind: 'first_output_timeout' }) : failureOf(result, info.route));
}

/** A complete non-event-stream body: an HTTP error, or a whole non-stream response. */
export function recordBody(rec: RequestRecord, info: RequestInfo, at: number, status: number, facts: EventFacts): void {
  const attempt = currentAttempt(rec);
  attempt.status = status;
  attempt.endedAt = at;
  if (status < 200 || status >= 300) {
    const upstreamError = facts.kind === 'error' ? errorOf(facts) : undefined;
    const signal = { kind: 'http', status } as const;
    // A redirect is never followed: from an inference server it is a misconfiguration (a URL missing its path, a
    // login page in front of it), and following it would send the prompt somewhere nobody configured.
    if (status >= 300 && status < 400) fail(rec, attempt, 'http_3xx', failureOf('upstream_3xx', info.route, signal));
    else if (status >= 400 && status < 500) fail(rec, attempt, 'http_4xx', failureOf('upstream_4xx', info.route, signal, upstreamError));
    else fail(rec, attempt, 'http_5xx', failureOf('upstream_5xx', info.route, signal, upstreamError));
    return;
  }
  if (facts.kind === 'error') {
    anomaly(rec, attempt, 'error_payload');
    fail(rec, attempt, 'error_payload', failureOf('error_payload', info.route, { kind: 'event', code: facts.code }, errorOf(facts)));
    return;
  }
  if (facts.kind !== 'chunk' || info.stream) {
    // Not a completion body, or JSON where an event stream was asked for: the upstream broke the protocol.
    anomaly(rec, attempt, 'malformed_event');
    const cause: FailureCause = info.stream ? 'not_event_stream' : 'malformed_body';
    fail(rec, attempt, 'incomplete', failureOf(cause, info.route));
    return;
  }
  recordFinishes(rec, info, attempt, facts);
  recordAnswer(rec, info, facts);
  rec.usage = undefined;
  recordUsage(rec, attempt, facts);
  rec.outputEvents += facts.output.length;
  rec.outputChars += facts.outputChars ?? 0;
  rec.responseId = facts.id;
  rec.responseModel = facts.model;
  rec.committedAt = at;
  if (unfinishedChoices(rec, info) > 0) {
    anomaly(rec, attempt, 'missing_finish_reason');
    attempt.result = 'incomplete';
  } else {
    attempt.result = 'ok';
  }
  rec.ending = { kind: 'complete' };
}

/**
 * A 2xx response that cannot be read (not an event stream where one was asked for, a compressed body): the attempt
 * failed before any output, whatever its body would have said.
 */
export function recordProtocolViolation(rec: RequestRecord, info: RequestInfo, at: number, violation: ProtocolViolation): void {
  const attempt = currentAttempt(rec);
  attempt.endedAt = at;
  anomaly(rec, attempt, 'malformed_event');
  fail(rec, attempt, 'incomplete', failureOf(violation, info.route));
}

function resultForEnd(how: StreamEnd): AttemptResult {
  switch (how) {
    case 'eof':
    case 'oversized':
      return 'incomplete';
    case 'reset':
      return 'reset';
    case 'idle_timeout':
    case 'first_output_timeout':
    case 'total_timeout':
    case 'shutdown':
      return 'timeout';
  }
}

function failureForEnd(how: StreamEnd, route: Route): Failure {
  if (how === 'shutdown' || how === 'oversized') return failureOf(how, route);
  const result = resultForEnd(how);
  if (result === 'timeout') return failureOf('timeout', route, { kind: how === 'total_timeout' ? 'total_timeout' : 'first_output_timeout' });
  return failureOf(result === 'reset' ? 'reset' : 'incomplete', route);
}
