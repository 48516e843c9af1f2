/**
 * The delivery machine's one state value (step.ts is its reducer): where the request is (`phase`), where the client's
 * side is (`client`), where the current attempt is (`upstream`), whether it holds an admission slot, and the record of
 * facts (accounting/record.ts: plain data the handlers update through its functions, no hooks). Each fact lives once: whether the response is committed is the
 * record's `committedAt`; the client's end is `client` here (its time is the record's); the attempt's end is
 * `upstream` here (its time and result are the record's).
 *
 * The functions below are the reducer's output primitives: they add effects to the step's reused effect buffer and
 * keep the state in step with what the shell was told. The state is updated in place and its arrays are reused: a
 * step for a streamed event must not allocate more than the machine of one class did (bench/step-alloc.ts).
 */
import { createRecord, type RequestRecord } from '../accounting/record.js';
import { chunkScratch, type ChunkScratch } from '../sse/fast-classify.js';
import { errorBodyFor, type ErrorBody } from './errors.js';
import { refusalResponse, type Refusal } from './failures.js';
import type { Effect, MachineDeps, MachineRequest, Observation, TimerName } from './machine.js';
import type { RetryReason } from '../accounting/outcomes.js';
import { coalesce } from './wire.js';

/**
 * - `idle`: handed over, not started yet.
 * - `admitting`: waiting for the model's admission gate.
 * - `attempting`: an attempt is asked for or in flight and nothing has reached the client: a failure can be retried.
 * - `streaming`: committed — the head is out and upstream bytes are written as they come.
 * - `backing_off`: a failed attempt is to be retried when the retry timer fires.
 * - `ending`: the client's response is over (answered, or the client left); the attempt and the client side finish.
 * - `settled`: counted; only what keeps shared state balanced is still done.
 */
export type Phase = 'idle' | 'admitting' | 'attempting' | 'streaming' | 'backing_off' | 'ending' | 'settled';

/** `blocked`: a write filled its socket; `finished`: the response reached its socket; `gone`: it left first. */
export type ClientSide = 'open' | 'blocked' | 'finished' | 'gone';

/** The current attempt: none made yet, in flight (reading, or paused for a slow client), or its end reported. */
export type UpstreamSide = 'none' | 'reading' | 'paused' | 'closed';

/** The model's admission slot: no gate, asked for (or refused), or held until settlement. */
export type AdmissionSide = 'ungated' | 'pending' | 'held';

export interface DeliveryState {
  readonly request: MachineRequest;
  readonly deps: MachineDeps;
  /** The record of facts: attempts, finishes, usage, anomalies, the assembled answer; settled by accounting/settle.ts. */
  readonly record: RequestRecord;
  /** The facts an ordinary streamed delta is classified into (sse/fast-classify.ts), read within its step only. */
  readonly factsScratch: ChunkScratch;
  /** The write effect flush() reuses (one per step at most; see flush). */
  readonly writeEffect: { kind: 'write'; data: Buffer };
  phase: Phase;
  client: ClientSide;
  upstream: UpstreamSide;
  admission: AdmissionSide;
  /** No further attempt whatever the arithmetic says: the total deadline fired (timers may fire a little early), or the gateway's drain deadline passed (the pools are closing). */
  stopped: 'total_deadline' | 'shutdown' | undefined;
  /** A status line went to the client: what the shell was told, apart from the record's commit (an error head too). */
  headSent: boolean;
  /** The linger timer was armed: a client that does not take its ended response is closed once. */
  lingering: boolean;
  /** backing_off: the retry timer fired while the failed attempt was still closing; start the next one when it has. */
  retryDue: boolean;

  /** Attempt number in flight or last made (0: none yet). */
  attempt: number;
  retriedFor: RetryReason | undefined;
  retryAfterMs: number | undefined;
  contentType: string | undefined;
  metadata: string | undefined;
  /** Upstreams this request has been sent to: a retry goes elsewhere while another is eligible. */
  readonly tried: Set<string>;
  held: Buffer[];
  heldBytes: number;
  /** Bytes forwarded since the last write (the end of the upstream read): the first `outCount` entries, reused. */
  readonly out: Buffer[];
  outCount: number;
  /**
   * Where the idle clock last started: the last whole event read, or where it was armed. The idle timer is armed once
   * per idle period, not re-armed per event (an effect and a timer refresh for every event): when it fires with
   * events read meanwhile, it is armed again for what is left of the period since the last one.
   */
  idleFrom: number;
  /** Anomalies of the record already reported as observations. */
  anomaliesSeen: number;

  /**
   * The timers the shell holds armed, one bit each (TIMER_BIT): a number, not a Set, since a request arms two or three
   * of six and a Set's table is a few hundred bytes per request, kept for the request's life (issue 27).
   */
  armed: number;
  /** The current event's time: every decision of one step uses it. */
  at: number;
  /**
   * The current step's effects are its first `effectCount` entries. Reused across steps and never emptied by setting
   * its length to 0, which makes V8 drop the array's backing store: a new one for every step, per event.
   */
  readonly effects: Effect[];
  effectCount: number;
}

export const TIMERS: readonly TimerName[] = ['total', 'first_output', 'idle', 'drain', 'retry', 'linger'];

/** Each timer's bit in DeliveryState.armed. */
const TIMER_BIT: Readonly<Record<TimerName, number>> = { total: 1, first_output: 2, idle: 4, drain: 8, retry: 16, linger: 32 };

export function isArmed(s: DeliveryState, timer: TimerName): boolean {
  return (s.armed & TIMER_BIT[timer]) !== 0;
}

/** Takes `timer` off the armed set; whether it was on it. */
export function disarm(s: DeliveryState, timer: TimerName): boolean {
  const bit = TIMER_BIT[timer];
  if ((s.armed & bit) === 0) return false;
  s.armed &= ~bit;
  return true;
}

const EMPTY = Buffer.alloc(0);

export function createState(request: MachineRequest, deps: MachineDeps): DeliveryState {
  return {
    request,
    deps,
    // No hooks: anomalies are read off the record after each step of it (reportAnomalies), the output gap likewise.
    record: createRecord(request.info, request.arrivalAt),
    factsScratch: chunkScratch(),
    writeEffect: { kind: 'write', data: EMPTY },
    phase: 'idle',
    client: 'open',
    upstream: 'none',
    admission: request.gated ? 'pending' : 'ungated',
    stopped: undefined,
    headSent: false,
    lingering: false,
    retryDue: false,
    attempt: 0,
    retriedFor: undefined,
    retryAfterMs: undefined,
    contentType: undefined,
    metadata: undefined,
    tried: new Set(),
    held: [],
    heldBytes: 0,
    out: [],
    outCount: 0,
    idleFrom: 0,
    anomaliesSeen: 0,
    armed: 0,
    at: 0,
    effects: [],
    effectCount: 0,
  };
}

/** The client's response is over: Waybill ended it, or the client left. Nothing more is written. */
export function responseEnded(s: DeliveryState): boolean {
  return s.phase === 'ending' || s.phase === 'settled';
}

/** The current attempt is in flight (asked for, or reading): at most one is. */
export function attemptOpen(s: DeliveryState): boolean {
  return s.upstream === 'reading' || s.upstream === 'paused';
}

export function clientDone(s: DeliveryState): boolean {
  return s.client === 'finished' || s.client === 'gone';
}

// --- Effects ----------------------------------------------------------------------------------------------------

export function emit(s: DeliveryState, effect: Effect): void {
  s.effects[s.effectCount++] = effect;
}

export function observe(s: DeliveryState, observation: Observation): void {
  s.effects[s.effectCount++] = { kind: 'observe', observation };
}

export function arm(s: DeliveryState, timer: TimerName, ms: number): void {
  s.armed |= TIMER_BIT[timer];
  emit(s, { kind: 'arm', timer, at: s.at + ms, ms });
}

export function clear(s: DeliveryState, timer: TimerName): void {
  if (disarm(s, timer)) emit(s, { kind: 'clear', timer });
}

/** The anomalies the record saw in this step, as observations of the current attempt (in the order seen). */
export function reportAnomalies(s: DeliveryState): void {
  const anomalies = s.record.anomalies;
  while (s.anomaliesSeen < anomalies.length) observe(s, { type: 'anomaly', attempt: s.attempt, kind: anomalies[s.anomaliesSeen++]!.kind });
}

// --- The client's wire ------------------------------------------------------------------------------------------

/**
 * Sends the head. `headers` is a fresh object of the caller's, which this completes with the request's id rather than
 * copies: a copy by spread, with its shape differing by caller, took V8's slow path for the id's property on every
 * request (and Node's for-in over the copy another), ~2% of a non-streaming request's CPU.
 */
export function writeHead(s: DeliveryState, status: number, headers: Record<string, string | number>): void {
  // Nothing is written once the response is over (the client left while an attempt was still reporting).
  if (responseEnded(s) || s.headSent) return;
  s.headSent = true;
  headers['x-request-id'] = s.request.requestId;
  emit(s, { kind: 'write_head', status, headers });
}

export function forward(s: DeliveryState, raw: Buffer): void {
  s.out[s.outCount++] = raw;
}

/** Forgets the forwarded bytes (written, or never to be), keeping the array's storage. */
export function dropOut(s: DeliveryState): void {
  for (let i = 0; i < s.outCount; i++) s.out[i] = EMPTY;
  s.outCount = 0;
}

/**
 * Writes the events forwarded so far, in one write. The write effect is the request's one reused object (a write per
 * upstream read, most of a stream's steps): the shell carries out a step's effects before the next step, so only a
 * second write within one step needs an object of its own.
 */
export function flush(s: DeliveryState): void {
  if (s.outCount === 0) return;
  const data = s.outCount === 1 ? (s.out[0] as Buffer) : coalesce(s.out.slice(0, s.outCount));
  dropOut(s);
  if (responseEnded(s)) return;
  let effect = s.writeEffect;
  for (let i = 0; i < s.effectCount; i++) {
    if (s.effects[i] === effect) {
      effect = { kind: 'write', data };
      break;
    }
  }
  effect.data = data;
  emit(s, effect);
}

/**
 * Ends the response: the phase becomes `ending`. The client counts as served only once the last byte has left for
 * its socket ('finish'): a client that stops reading and leaves before that is a cancellation, not a delivery.
 */
export function endClient(s: DeliveryState, last: Buffer | undefined): void {
  if (responseEnded(s)) return;
  // Events forwarded in the same upstream read as the one that ended the stream go out before the end.
  flush(s);
  s.phase = 'ending';
  emit(s, { kind: 'end', data: last });
}

export function writeError(s: DeliveryState, status: number, body: ErrorBody, headers: Record<string, string> = {}): void {
  if (responseEnded(s)) return;
  const payload = Buffer.from(JSON.stringify(errorBodyFor(s.request.info.route, status, body)));
  if (!s.headSent) writeHead(s, status, { ...headers, 'content-type': 'application/json', 'content-length': payload.length });
  endClient(s, payload);
}

/** The gateway answers the request itself (failures.ts REFUSALS), counted by the status it answered with. */
export function refuse(s: DeliveryState, refusal: Refusal): void {
  const { status, body, headers } = refusalResponse(refusal, s.request.info.model);
  s.record.rejectedWith = status;
  writeError(s, status, body, headers);
}
