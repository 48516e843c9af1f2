/**
 * The client's side (state.ts ClientSide): a slow client pauses the attempt instead of filling gateway memory; its
 * socket taking the last byte (`finished`) or the client leaving (`gone`) is one half of settling.
 */
import { recordCancel, recordClientEnd } from '../../accounting/record.js';
import { attemptOpen, clear, clientDone, emit, observe, responseEnded, type DeliveryState } from '../state.js';
import { armIdle } from './attempt.js';
import { settleIfDone } from './ending.js';

export function pauseForClient(s: DeliveryState): void {
  if (s.client === 'open') s.client = 'blocked';
  // Once the response is over the upstream is read only for accounting (the drain grace): a slow client must not
  // stop that.
  if (s.upstream !== 'reading' || responseEnded(s)) return;
  s.upstream = 'paused';
  emit(s, { kind: 'pause_attempt' });
  // The idle clock measures the upstream: it runs only while Waybill is reading it, not while a slow client has
  // paused the stream (the total deadline still bounds that).
  clear(s, 'idle');
}

export function clientDrain(s: DeliveryState): void {
  if (s.client === 'blocked') s.client = 'open';
  if (s.upstream !== 'paused') return;
  s.upstream = 'reading';
  if (!responseEnded(s)) armIdle(s);
  emit(s, { kind: 'resume_attempt' });
}

export function clientFinish(s: DeliveryState): void {
  if (clientDone(s)) return;
  s.client = 'finished';
  recordClientEnd(s.record, s.at);
  settleIfDone(s);
}

/** The client left: its response is over whatever the phase (→ ending), and the attempt is let go. */
export function clientClose(s: DeliveryState): void {
  if (clientDone(s)) return;
  s.client = 'gone';
  if (!responseEnded(s)) s.phase = 'ending';
  recordCancel(s.record, s.at);
  observe(s, { type: 'client_cancelled' });
  clear(s, 'retry');
  if (s.admission === 'pending') emit(s, { kind: 'cancel_admission' });
  if (attemptOpen(s)) emit(s, { kind: 'abort_attempt', reason: 'cancelled' });
  settleIfDone(s);
}
