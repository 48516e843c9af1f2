/**
 * A non-streaming answer: the whole body after the time the stream would have taken, or, for the faults that make
 * sense without a stream, an HTTP error, a reset or a stall. The body itself is the caller's (`send`): a chat or
 * legacy completion, or one of the non-generation routes' answers, which have no decode (`outputEvents: 0`).
 */
import type { ServerResponse } from 'node:http';
import { timerPacer } from './pacer.js';
import { after, type CancelTimer } from './timer.js';
import { sendBody } from './respond.js';
import type { PacedPlan, StreamControl } from './stream-engine.js';
import { errorBody, errorInfo } from './wire.js';

export interface NonStreamPlan extends PacedPlan {
  /**
   * Output events a stream of the same answer would carry: the body goes out `itlMs` × (events − 1) after the
   * first token. 0 when there is no decode: the body goes out at the first-token time.
   */
  readonly outputEvents: number;
  /** Completion tokens the 200 body carries. */
  readonly completionTokens: number;
  /** `fault`: only kinds for which appliesToNonStream() holds; the server drops the others. */
  /** Write the 200 answer. */
  send(): void;
  /**
   * The answer to an engine error with `code` (error_before_output: `beforeOutput`): by default that status with the
   * object-shaped body; /v1/messages turns every such error into its 500.
   */
  readonly failure?: ((code: number, beforeOutput: boolean) => { readonly status: number; readonly body: string }) | undefined;
}

export interface NonStreamResult {
  readonly end: 'completed' | 'fault';
  /** 0 when the connection was reset without a status line. */
  readonly status: number;
  readonly completionTokensSent: number;
  readonly generationComplete: boolean;
}

export interface NonStreamHooks {
  onFirstToken(): void;
  /** Called once, just before the response is sent or the socket reset. Not called for a stall. */
  onEnd(result: NonStreamResult): void;
}

export function startNonStream(res: ServerResponse, plan: NonStreamPlan, hooks: NonStreamHooks): StreamControl {
  let cancelTimer: CancelTimer | undefined;
  let stopped = false;
  const totalEvents = plan.outputEvents;
  const { fault } = plan;

  const pacer = plan.pacer ?? timerPacer(plan);
  const guarded = (fn: () => void) => (): void => {
    cancelTimer = undefined;
    if (!stopped) fn();
  };
  const later = (ms: number, fn: () => void): void => {
    cancelTimer = after(ms, guarded(fn));
  };
  /** After the first output event is due. */
  const atFirst = (fn: () => void): void => {
    cancelTimer = pacer.first(guarded(fn));
  };
  /** When `events` more output events are due. */
  const afterEvents = (events: number, fn: () => void): void => {
    cancelTimer = pacer.next(events, guarded(fn));
  };

  const fail = (code: number, beforeOutput = false): void => {
    stopped = true;
    pacer.release();
    const { status, body } = plan.failure?.(code, beforeOutput) ?? { status: code, body: errorBody(errorInfo(code)) };
    hooks.onEnd({ end: 'fault', status, completionTokensSent: 0, generationComplete: false });
    sendBody(res, status, body);
  };
  const reset = (): void => {
    stopped = true;
    pacer.release();
    hooks.onEnd({ end: 'fault', status: 0, completionTokensSent: 0, generationComplete: false });
    res.socket?.resetAndDestroy();
  };
  const succeed = (): void => {
    stopped = true;
    pacer.release();
    hooks.onEnd({ end: 'completed', status: 200, completionTokensSent: plan.completionTokens, generationComplete: true });
    plan.send();
  };

  const afterFirstToken = (): void => {
    hooks.onFirstToken();
    if (fault === null) {
      afterEvents(totalEvents - 1, succeed);
      return;
    }
    if (fault.kind === 'error_after') {
      afterEvents(Math.min(fault.after, totalEvents), () => fail(fault.code));
    } else if (fault.kind === 'reset_after') {
      afterEvents(Math.min(fault.after, totalEvents), reset);
    } else {
      afterEvents(totalEvents - 1, succeed);
    }
  };

  switch (fault?.kind) {
    case 'error_before_output':
      atFirst(() => fail(fault.code, true));
      break;
    case 'error_after':
      if (fault.after === 0) atFirst(() => fail(fault.code));
      else atFirst(afterFirstToken);
      break;
    case 'reset_after':
      if (fault.after === 0) later(0, reset);
      else atFirst(afterFirstToken);
      break;
    case 'stall_after':
      break;
    case undefined:
    case 'status':
    case 'reset_before_response':
    case 'end_after':
    case 'no_done':
    case 'drop_finish':
    case 'malformed_after':
    case 'oversized_after':
    case 'data_after_done':
      atFirst(afterFirstToken);
      break;
  }

  return {
    abort(): void {
      stopped = true;
      cancelTimer?.();
      cancelTimer = undefined;
      pacer.release();
    },
  };
}
