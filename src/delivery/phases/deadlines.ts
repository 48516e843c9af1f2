/**
 * Timers and the gateway's shutdown: the deadlines (`total`, `first_output`, `idle`) abort the attempt in flight —
 * its end then answers the client — or, between attempts and in the admission queue, end the request at once; the
 * drain grace lets an attempt go; the retry timer ends `backing_off`; the linger timer closes a client that does not
 * take its ended response.
 */
import { finalFailure, recordRelease } from '../../accounting/record.js';
import type { TimerName } from '../machine.js';
import { arm, attemptOpen, clear, clientDone, emit, refuse, responseEnded, type DeliveryState } from '../state.js';
import { respondFailure, retryNow, settleIfDone } from './ending.js';

export function timer(s: DeliveryState, timer: TimerName): void {
  switch (timer) {
    case 'idle': {
      const left = s.idleFrom + s.deps.settings.idleMs - s.at;
      if (left > 0) return arm(s, 'idle', left);
      return deadline(s, timer);
    }
    case 'total':
    case 'first_output':
      return deadline(s, timer);
    case 'drain':
      recordRelease(s.record, s.request.info, s.at);
      if (attemptOpen(s)) emit(s, { kind: 'abort_attempt', reason: 'drained' });
      return;
    case 'retry':
      // At most one attempt in flight: the failed one was aborted, but its end may not have been reported yet.
      if (attemptOpen(s)) s.retryDue = true;
      else retryNow(s);
      return;
    case 'linger':
      if (!clientDone(s)) emit(s, { kind: 'destroy_client' });
      return;
  }
}

function deadline(s: DeliveryState, timer: 'total' | 'first_output' | 'idle'): void {
  if (timer === 'total') s.stopped ??= 'total_deadline';
  const reason = timer === 'total' ? 'total_timeout' : timer === 'idle' ? 'idle_timeout' : 'first_output_timeout';
  if (attemptOpen(s)) {
    emit(s, { kind: 'abort_attempt', reason });
  } else if (!responseEnded(s)) {
    clear(s, 'retry');
    const failure = finalFailure(s.record);
    if (failure !== undefined) {
      // Between attempts: the deadline ends the request with what the last attempt said.
      respondFailure(s, failure);
    } else if (timer === 'total' && s.attempt === 0) {
      // Still queued for admission at the deadline.
      emit(s, { kind: 'cancel_admission' });
      refuse(s, 'queue_deadline');
    }
    settleIfDone(s);
  }
  if (timer === 'total') closeIfNotTaken(s);
}

/** The gateway is shutting down and its drain deadline passed: end this request now, and count it. */
export function shutdown(s: DeliveryState): void {
  s.stopped = 'shutdown';
  if (attemptOpen(s)) {
    emit(s, { kind: 'abort_attempt', reason: 'shutdown' });
  } else if (!responseEnded(s)) {
    clear(s, 'retry');
    if (s.admission === 'pending') emit(s, { kind: 'cancel_admission' });
    if (!(s.record.committedAt !== undefined)) refuse(s, 'shutting_down');
  }
  // A client that does not take even its ended response must not hold the exit.
  closeIfNotTaken(s);
}

/**
 * A client that does not read even its ended response would hold it forever: give it the drain grace to take the
 * last bytes (Waybill's error event), then close the connection; that counts as the client leaving.
 */
function closeIfNotTaken(s: DeliveryState): void {
  if (clientDone(s) || s.lingering) return;
  s.lingering = true;
  arm(s, 'linger', s.deps.settings.drainGraceMs);
}
