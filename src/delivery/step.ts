/**
 * The delivery machine's reducer: `step(state, event, at)` → the effects to carry out, for one logical request.
 * Pure: the state (state.ts) is updated in place, time comes in with the event, effects go out in the reused buffer.
 *
 * Each event goes to one handler, and each handler decides by the phase (and the client's and the attempt's side) in
 * one place — the table below is its summary; test/delivery-phases.test.ts holds one example of each row.
 *
 * | phase | event | to |
 * |---|---|---|
 * | idle | start: gated / not | admitting / attempting |
 * | admitting | admission granted / refused / total deadline / shutdown | attempting / ending (429) / ending (429) / ending (503) |
 * | admitting | client_close (nothing in flight) | settled |
 * | attempting | block without output (held) | attempting |
 * | attempting | block with the first output, the read's end (chunk_done, or the block's endOfRead) / a complete body | streaming / ending |
 * | attempting | a failure (body, stream_end, network_failure, protocol_violation): retried / not (its status) | backing_off / ending |
 * | attempting | no_upstream / client_close | ending (503, or the status of an earlier attempt's failure) / ending |
 * | attempting | a deadline or shutdown: the attempt is aborted, and its stream_end is the failure | attempting |
 * | streaming | block, the read's end (written); client_blocked, client_drain (pause, resume the attempt) | streaming |
 * | streaming | `[DONE]`, the upstream's error event, a break, a deadline's stream_end | ending |
 * | backing_off | timer retry with the failed attempt ended (else retryDue until attempt_settled) | attempting |
 * | backing_off | total deadline, shutdown (the last failure answers), client_close | ending |
 * | ending | attempt_settled and client_finish / client_close, in either order: both sides over | settled |
 * | any but settled | internal_error, or a handler throws | settled (500 before commit, an error event after) |
 * | settled | attempt_settled (attempt_over), admission granted (released) | settled |
 *
 * The decisions and where they are: whether a request ends 502 (or any pre-commit status) or is retried —
 * phases/ending.ts `decide`, with `retry`; delivered — the record's verdict (accounting/record-upstream.ts) carried
 * out by `decide`; when it is counted — `settleIfDone`.
 */
import { nextSequence, recordInternalError } from '../accounting/record.js';
import { crashSettlement, settleRequest, type Settlement } from '../accounting/settle.js';
import { errorBodyFor } from './errors.js';
import { refusalResponse } from './failures.js';
import type { Effect, MachineEvent } from './machine.js';
import { admission, noUpstream, start } from './phases/admitting.js';
import { attemptSettled, attemptStarted, upstreamFact } from './phases/attempt.js';
import { clientClose, clientDrain, clientFinish, pauseForClient } from './phases/client.js';
import { shutdown, timer } from './phases/deadlines.js';
import { attemptOpen, disarm, emit, observe, responseEnded, TIMERS, type DeliveryState } from './state.js';
import { streamErrorEvent } from './wire.js';

/** A step without effects. Not frozen: the shell iterates it where it iterates `effects`, and V8 iterates a frozen array
 *  through a slow, allocating path (and the loop that sees both arrays with it). */
const NO_EFFECTS: readonly Effect[] = [];

/**
 * One event, at time `at`: returns the effects to carry out, in order. The array is reused by the next call.
 * An error inside a step is this request's bug: the step's effects are discarded (none was carried out yet) and
 * the request is ended from what is certain — see crash().
 */
export function step(s: DeliveryState, event: MachineEvent, at: number): readonly Effect[] {
  s.effectCount = 0;
  if (s.phase === 'settled') {
    // After settlement only what keeps shared state balanced: an attempt's end (upstream in-flight, health) and an
    // admission slot granted too late (given back).
    if (event.type === 'attempt_settled') emit(s, { kind: 'attempt_over', attempt: event.attempt, record: s.record.attempts[event.attempt - 1] });
    if (event.type === 'admission' && event.admitted) emit(s, { kind: 'release_admission' });
    return stepEffects(s);
  }
  s.at = at;
  // What the shell has been told so far: a step that throws is discarded whole, including a settlement it had
  // decided on before throwing (else a throw inside the record's settlement would leave the request uncounted).
  const phase = s.phase;
  const headSent = s.headSent;
  // The commit too: a step that committed and then threw never sent the head, so the ledger must not say it did.
  const committedAt = s.record.committedAt;
  const firstOutputAt = s.record.firstOutputAt;
  try {
    dispatch(s, event);
  } catch (error) {
    s.effectCount = 0;
    s.phase = phase;
    s.headSent = headSent;
    s.record.committedAt = committedAt;
    s.record.firstOutputAt = firstOutputAt;
    crash(s, error);
  }
  return stepEffects(s);
}

function stepEffects(s: DeliveryState): readonly Effect[] {
  if (s.effectCount === 0) return NO_EFFECTS;
  // Shortening keeps the backing store (V8 trims only arrays far larger than their length). A store to an array's
  // length is a call into V8's runtime even from optimised code, so it is made only when the length changes (a
  // stream's reads give one effect each, step after step).
  if (s.effects.length !== s.effectCount) s.effects.length = s.effectCount;
  return s.effects;
}

function dispatch(s: DeliveryState, event: MachineEvent): void {
  switch (event.type) {
    case 'start':
      return start(s);
    case 'queued':
      s.record.waiting = true;
      return;
    case 'admission':
      return admission(s, event);
    case 'attempt_started':
      return attemptStarted(s, event.attempt, event.upstream);
    case 'no_upstream':
      return noUpstream(s);
    case 'internal_error':
      return crash(s, event.error);
    case 'timer':
      if (!disarm(s, event.timer)) return;
      return timer(s, event.timer);
    case 'client_blocked':
      return pauseForClient(s);
    case 'client_drain':
      return clientDrain(s);
    case 'client_finish':
      return event.socketDestroyed ? clientClose(s) : clientFinish(s);
    case 'client_close':
      return clientClose(s);
    case 'shutdown':
      return shutdown(s);
    case 'attempt_settled':
      return attemptSettled(s, event.attempt);
    case 'response_start':
    case 'protocol_violation':
    case 'block':
    case 'chunk_done':
    case 'body':
    case 'stream_end':
    case 'network_failure':
      // A replaced attempt's late reports are ignored.
      if (event.attempt !== s.attempt || !attemptOpen(s)) return;
      return upstreamFact(s, event);
  }
}

/**
 * An error inside this request's handling (a bug): its state can no longer be trusted, so it is ended from what is
 * certain — the client gets a 500 before commit or Waybill's error event after, the upstream is let go, and the
 * request is counted once, as failed (or incomplete once committed), with the error reported.
 */
function crash(s: DeliveryState, error: unknown): void {
  const { request } = s;
  observe(s, { type: 'internal_error', error });
  // Every timer, not only those armed by the machine's count: the discarded step may have cleared some the shell
  // still holds.
  s.armed = 0;
  for (const timer of TIMERS) emit(s, { kind: 'clear', timer });
  if (s.admission === 'pending') emit(s, { kind: 'cancel_admission' });
  if (attemptOpen(s)) emit(s, { kind: 'abort_attempt', reason: 'cancelled' });
  const committed = s.headSent;
  if (!responseEnded(s)) {
    if (committed) {
      emit(s, { kind: 'end', data: streamErrorEvent('internal', request.info.route, nextSequence(s.record)) });
    } else {
      const { status, body } = refusalResponse('internal', request.info.model);
      const payload = Buffer.from(JSON.stringify(errorBodyFor(request.info.route, status, body)));
      emit(s, { kind: 'write_head', status, headers: { 'content-type': 'application/json', 'content-length': payload.length, 'x-request-id': request.requestId } });
      emit(s, { kind: 'end', data: payload });
    }
  }
  s.phase = 'settled';
  if (s.admission === 'held') emit(s, { kind: 'release_admission' });
  let settlement: Settlement;
  try {
    recordInternalError(s.record, request.info, s.at);
    settlement = settleRequest(s.record, s.request.info, s.at);
  } catch {
    settlement = crashSettlement(request.info, request.arrivalAt, committed, s.at);
  }
  emit(s, { kind: 'settle', settlement });
}
