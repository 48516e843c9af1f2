/**
 * idle → admitting → attempting: the request starts, waits for the model's admission gate if it has one, and asks the
 * shell for attempts; a refusal of the gate or of every upstream ends it with the gateway's own status.
 */
import { finalFailure } from '../../accounting/record.js';
import type { MachineEvent } from '../machine.js';
import { arm, clientDone, emit, observe, refuse, responseEnded, type DeliveryState } from '../state.js';
import { respondFailure, settleIfDone } from './ending.js';

export function start(s: DeliveryState): void {
  const { settings, budget } = s.deps;
  observe(s, { type: 'request_started' });
  const remaining = settings.totalMs - (s.at - s.request.arrivalAt);
  arm(s, 'total', Math.max(0, remaining));
  budget.recordRequest(s.at);
  if (s.request.gated) {
    s.phase = 'admitting';
    emit(s, { kind: 'acquire_admission' });
  } else {
    startAttempt(s);
  }
}

export function admission(s: DeliveryState, event: Extract<MachineEvent, { type: 'admission' }>): void {
  observe(s, { type: 'queue_waited', ms: event.waitedMs });
  if (event.admitted && (clientDone(s) || responseEnded(s))) {
    // Admitted just as the client left, or after the request was answered (shutdown): give the slot back.
    emit(s, { kind: 'release_admission' });
    return settleIfDone(s);
  }
  if (!event.admitted) {
    // 'cancelled': the client left while queued; its close has been recorded.
    if (event.reason !== 'cancelled' && !responseEnded(s)) refuse(s, event.reason === 'queue_full' ? 'queue_full' : 'queue_timeout');
    return settleIfDone(s);
  }
  s.admission = 'held';
  s.record.waiting = false;
  startAttempt(s);
}

/**
 * Asks the shell for the next attempt: the phase is `attempting` from here. The attempt is in flight from here too:
 * whatever happens before the shell reports which upstream it went to (a client leaving, a deadline) aborts it
 * rather than forgetting it.
 */
export function startAttempt(s: DeliveryState): void {
  s.phase = 'attempting';
  s.attempt = s.record.attempts.length + 1;
  s.upstream = 'reading';
  emit(s, { kind: 'start_attempt', attempt: s.attempt, avoid: s.tried, retriedFor: s.retriedFor });
}

export function noUpstream(s: DeliveryState): void {
  s.upstream = 'closed';
  if (responseEnded(s)) return settleIfDone(s);
  const failure = finalFailure(s.record);
  // A retry found nowhere to go: the client gets what the last attempt said.
  if (failure !== undefined) respondFailure(s, failure);
  else refuse(s, 'no_upstream');
  settleIfDone(s);
}
