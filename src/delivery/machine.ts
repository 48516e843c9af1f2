/**
 * The delivery machine's vocabulary — the events it takes and the effects it answers with — and the object the shell
 * holds per logical request. Events are upstream facts, timer firings, client events, admission, shutdown, each
 * stamped by the shell with the time it happened; effects are what to carry out: write the head, write bytes, end,
 * start or abort an attempt, arm or clear a timer, settle. The shell (proxy/exchange.ts) owns sockets, timers and the
 * clock and does nothing but execute the effects. The decisions are a pure reducer: one state value with explicit
 * phases (state.ts), `step` (step.ts, with the phase × event table) and one handler file per part of the request's
 * life (phases/); the record of facts and the settlement are accounting/record.ts and settle.ts.
 *
 * Nothing reaches the client before the upstream's first output-bearing event (or a complete non-stream body), so
 * until then a failed attempt can be retried invisibly. After that, upstream bytes are written as they came, whole
 * events at a time; the record rules which are held, forwarded or dropped, and how the response ends. `[DONE]`
 * reaches the client only for a delivered stream.
 *
 * | event | what it means |
 * |---|---|
 * | start | the request was handed over (body read and checked) |
 * | queued / admission | the model's admission gate queued it / answered |
 * | attempt_started / no_upstream | the shell picked an upstream for a `start_attempt` effect / found none |
 * | response_start, protocol_violation, block, chunk_done, body, stream_end, network_failure, attempt_settled | what the current attempt reported (stale attempts are ignored); a read's bytes are written at its end: `chunk_done`, or its last block's `endOfRead` |
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
import type { AttemptRecord, ProtocolViolation, RequestInfo, Settlement, StreamEnd } from '../accounting/ledger.js';
import type { AnomalyKind, RetryReason } from '../accounting/outcomes.js';
import type { UpstreamError } from '../sse/classify.js';
import type { SseEvent } from '../sse/framer.js';
import type { RetryBudget } from './retry-budget.js';
import type { RetryRules } from './retry-policy.js';
import { createState, type ClientSide, type DeliveryState, type Phase, type UpstreamSide } from './state.js';
import { ordinaryRead } from './phases/attempt.js';
import { step } from './step.js';

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
  /** `endOfRead`: the last block of its upstream read, which ends the read as `chunk_done` would (one step, not two). */
  | { type: 'block'; attempt: number; raw: Buffer; event: SseEvent | null; endOfRead?: boolean }
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

/**
 * One logical request's delivery machine: its state (state.ts) and its reducer (step.ts) behind the one call the
 * shell makes. The state is the machine's alone: the shell sees events in and effects out, tests also its sides.
 */
export class DeliveryMachine {
  private readonly state: DeliveryState;

  constructor(request: MachineRequest, deps: MachineDeps) {
    this.state = createState(request, deps);
  }

  /** Where the request is (read-only: for tests and debugging; the shell acts on effects alone). */
  get phase(): Phase {
    return this.state.phase;
  }

  get client(): ClientSide {
    return this.state.client;
  }

  get upstream(): UpstreamSide {
    return this.state.upstream;
  }

  /** One event, at time `at`: the effects to carry out, in order. The array is reused by the next call. */
  handle(event: MachineEvent, at: number): readonly Effect[] {
    return step(this.state, event, at);
  }

  /**
   * A committed stream's read that is one ordinary delta event, taken whole (phases/attempt.ts, ordinaryRead): the
   * bytes to write — the step's one effect for it — or undefined, nothing a later step reads changed, for any other
   * read (frame it and hand its events to `handle`).
   */
  ordinaryRead(attempt: number, chunk: Buffer, at: number): Buffer | undefined {
    return ordinaryRead(this.state, attempt, chunk, at);
  }
}
