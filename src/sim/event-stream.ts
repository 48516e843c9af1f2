/**
 * The streaming answer of /v1/responses and /v1/messages: named events (`event: <name>` + `data: <JSON>`), one
 * sequence of output tokens, one timer per stream — the same clock, output-event boundaries and faults as the chat
 * stream (stream.ts). What each step writes is the route's (EventWriter): Responses announces itself at once and is
 * cut on an engine error; Messages starts at the first token and ends an engine error with an `error` event.
 */
import type { ServerResponse } from 'node:http';
import type { Fault } from './faults.js';
import type { Random } from '../util/prng.js';
import { timerPacer, type Pacer } from './pacer.js';
import { faultBoundary, type StreamControl, type StreamHooks } from './stream.js';
import { after, type CancelTimer } from './timer.js';
import { createNamedEventFramer, errorInfo, MALFORMED_DATA, type ErrorInfo, type FramingStyle } from './wire.js';

export interface NamedEvent {
  readonly name: string;
  readonly data: string;
}

/** What a route writes at each step. Events are built in the order they go out (Responses numbers them). */
export interface EventWriter {
  /** Written with the 200 headers, before the engine runs (Responses: created, in_progress). */
  opening(): NamedEvent[];
  /** Written with the first output event, before it (Responses: item and part added; Messages: message_start…). */
  first(): NamedEvent[];
  /** The output event carrying `count` tokens from `start`. */
  output(start: number, count: number): NamedEvent;
  /** An extra output event whose JSON is `bytes` long (never shorter than its minimal size). */
  oversized(bytes: number): NamedEvent;
  /** The name the malformed data goes under. */
  readonly malformedName: string;
  /**
   * Everything after the last output event of a complete answer. `dropFinish`: without the event that gives the
   * finish reason; `noTerminal`: without the terminal event.
   */
  finish(variant: { readonly dropFinish: boolean; readonly noTerminal: boolean }): NamedEvent[];
  /** The output event of `data_after_done`: the token after the last, past the terminal event. */
  late(start: number): NamedEvent;
  /** An engine error: the events that end the stream cleanly, or null to cut the connection (no terminator). */
  failure(info: ErrorInfo): NamedEvent[] | null;
}

export interface EventStreamPlan {
  readonly tokens: number;
  readonly tokensPerEvent: number;
  readonly ttftMs: number;
  readonly itlMs: number;
  readonly jitter: number;
  readonly random: Random;
  readonly fault: Fault | null;
  readonly framing: FramingStyle;
  readonly writer: EventWriter;
  /** When events are due; absent: the timer of ttftMs, itlMs and jitter. */
  readonly pacer?: Pacer | undefined;
}

export function startEventStream(res: ServerResponse, plan: EventStreamPlan, hooks: StreamHooks): StreamControl {
  const run = new EventStreamRun(res, plan, hooks);
  run.start();
  return run;
}

/**
 * The engine error of an `error_before_output` (`beforeOutput`) or `error_after` fault with `code`: a 400 before
 * output is vLLM's lazy validation error.
 */
export function engineErrorInfo(code: number, beforeOutput: boolean): ErrorInfo {
  return beforeOutput && code === 400 ? errorInfo(400, 'Token id 151936 is out of vocabulary') : errorInfo(code);
}

function faultErrorInfo(fault: Fault): ErrorInfo {
  if (fault.kind === 'error_before_output') return engineErrorInfo(fault.code, true);
  return engineErrorInfo(fault.kind === 'error_after' ? fault.code : 500, false);
}

class EventStreamRun implements StreamControl {
  private cancelTimer: CancelTimer | undefined;
  private stopped = false;
  private firstTokenSent = false;
  private faultFired = false;
  private eventsFramed = 0;
  private outputEvents = 0;
  private produced = 0;
  private readonly boundary: number | null;
  private readonly frameNamed: (name: string, data: string, isJson: boolean, first: boolean) => string;

  constructor(
    private readonly res: ServerResponse,
    private readonly plan: EventStreamPlan,
    private readonly hooks: StreamHooks,
  ) {
    this.boundary = faultBoundary(plan.fault);
    this.frameNamed = createNamedEventFramer(plan.framing);
    this.pacer = plan.pacer ?? timerPacer(plan);
  }

  private readonly pacer: Pacer;

  start(): void {
    this.res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    const opening = this.plan.writer.opening().map((event) => this.frame(event));
    if (opening.length > 0) this.write(opening);
    else this.res.flushHeaders();
    const fault = this.plan.fault;
    if (fault?.kind === 'reset_after' && fault.after === 0) {
      this.schedule(0, this.reset);
      return;
    }
    this.cancelTimer = this.pacer.first(this.tick);
  }

  abort(): void {
    this.stopped = true;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    this.pacer.release();
  }

  private schedule(ms: number, fn: () => void): void {
    this.cancelTimer = after(ms, fn);
  }

  private get remaining(): number {
    return this.plan.tokens - this.produced;
  }

  private readonly tick = (): void => {
    this.cancelTimer = undefined;
    if (this.stopped) return;
    const out: string[] = [];
    if (this.isAtBoundary() && this.fireFault(out)) return;
    if (this.remaining > 0) {
      if (!this.firstTokenSent) {
        this.firstTokenSent = true;
        this.hooks.onFirstToken();
        for (const event of this.plan.writer.first()) out.push(this.frame(event));
      }
      const count = Math.min(this.plan.tokensPerEvent, this.remaining);
      out.push(this.frame(this.plan.writer.output(this.produced, count)));
      this.produced += count;
      this.outputEvents += 1;
      this.hooks.onOutput(count);
    }
    if (this.remaining === 0) {
      // A boundary at or past the last output event fires here, in place of the closing events.
      if (this.isAtBoundary() && this.fireFault(out)) return;
      this.finish(out);
      return;
    }
    if (this.write(out)) this.scheduleNext();
    else this.res.once('drain', () => { if (!this.stopped) this.scheduleNext(); });
  };

  private scheduleNext(): void {
    this.cancelTimer = this.pacer.next(1, this.tick);
  }

  private isAtBoundary(): boolean {
    return !this.faultFired && this.boundary !== null && (this.outputEvents >= this.boundary || this.remaining === 0);
  }

  /** Apply the boundary fault. True when it ended (or froze) the stream. */
  private fireFault(out: string[]): boolean {
    this.faultFired = true;
    const fault = this.plan.fault;
    if (fault === null) return false;
    switch (fault.kind) {
      case 'error_before_output':
      case 'error_after': {
        const events = this.plan.writer.failure(faultErrorInfo(fault));
        if (events === null) {
          this.write(out);
          this.cut();
          return true;
        }
        for (const event of events) out.push(this.frame(event));
        this.write(out);
        this.end({ end: 'fault', generationComplete: false });
        return true;
      }
      case 'stall_after':
        this.write(out);
        this.stopped = true;
        return true;
      case 'end_after':
        this.write(out);
        this.end({ end: 'fault', generationComplete: false });
        return true;
      case 'reset_after':
        this.write(out);
        this.reset();
        return true;
      case 'malformed_after':
        out.push(this.frameNamed(this.plan.writer.malformedName, MALFORMED_DATA, false, this.eventsFramed++ === 0));
        return false;
      case 'oversized_after':
        out.push(this.frame(this.plan.writer.oversized(fault.bytes)));
        return false;
      case 'status':
      case 'reset_before_response':
      case 'no_done':
      case 'drop_finish':
      case 'data_after_done':
        return false;
    }
  }

  private finish(out: string[]): void {
    const { plan } = this;
    const kind = plan.fault?.kind;
    for (const event of plan.writer.finish({ dropFinish: kind === 'drop_finish', noTerminal: kind === 'no_done' })) {
      out.push(this.frame(event));
    }
    if (kind === 'data_after_done') out.push(this.frame(plan.writer.late(this.produced)));
    this.write(out);
    this.end({ end: plan.fault === null ? 'completed' : 'fault', generationComplete: true });
  }

  private frame(event: NamedEvent): string {
    const framed = this.frameNamed(event.name, event.data, true, this.eventsFramed === 0);
    this.eventsFramed += 1;
    return framed;
  }

  /** One write per tick; false when the socket buffer is full (wait for 'drain' before the next tick). */
  private write(out: string[]): boolean {
    if (out.length === 0) return true;
    return this.res.write(out.length === 1 ? (out[0] ?? '') : out.join(''));
  }

  private end(result: { readonly end: 'completed' | 'fault'; readonly generationComplete: boolean }): void {
    this.stopped = true;
    this.pacer.release();
    this.res.end();
    this.hooks.onEnd(result);
  }

  /**
   * What uvicorn does when the exception escapes a started response: `transport.close()` — the bytes already written
   * are flushed, then FIN, with no chunked terminator. The client sees a truncated body (undici: `terminated`).
   */
  private cut(): void {
    this.stopped = true;
    this.pacer.release();
    this.hooks.onEnd({ end: 'fault', generationComplete: false });
    const socket = this.res.socket;
    if (socket === null) return;
    socket.once('finish', () => socket.destroy());
    socket.end();
  }

  /** TCP RST, no chunked terminator: what a crashed or killed upstream looks like mid-body. */
  private readonly reset = (): void => {
    this.cancelTimer = undefined;
    if (this.stopped) return;
    this.stopped = true;
    this.pacer.release();
    this.hooks.onEnd({ end: 'fault', generationComplete: false });
    this.res.socket?.resetAndDestroy();
  };
}
