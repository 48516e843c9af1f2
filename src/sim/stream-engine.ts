/**
 * The one stream engine of the simulator: paces a generation's output events (one timer per stream), applies the
 * request's fault at its output-event boundary and ends the stream — for every family that streams (chat and legacy
 * completions and audio in stream.ts, /v1/responses and /v1/messages in event-stream.ts, background responses in
 * background.ts). A family supplies two things only:
 *
 * - a StreamRenderer: what the events are (a role chunk, a delta, a finish chunk, an error event, usage, [DONE]…);
 * - a StreamSink: where they go (an HTTP response, framed as the request asked; or a background task's store).
 *
 * The order of one tick is vLLM's: a boundary fault fires before the next output event; the first output event is
 * preceded by the family's first events; after the last output event a boundary at or past it fires, else the closing
 * events go out. Each tick is one write, and a full socket buffer holds the next tick until 'drain'.
 */
import type { Fault } from './faults.js';
import { timerPacer, type Pacer, type TimerPacing } from './pacer.js';
import { after, type CancelTimer } from './timer.js';
import { errorInfo, type ErrorInfo } from './wire.js';

/** One event of a stream before framing: `name` for the named-event routes, none for chat's `data:`-only events. */
export interface StreamEvent {
  readonly name?: string;
  readonly data: string;
  /** False: not JSON (`[DONE]`, malformed data), which the multi-line framing leaves on one line. Default true. */
  readonly isJson?: boolean;
}

/** The fault variants that change what a complete answer's events are, not when the stream stops. */
export interface StreamVariant {
  /** `drop_finish`: the event that gives the finish reason goes without it. */
  readonly dropFinish: boolean;
  /** `no_done`: no terminal event. */
  readonly noTerminal: boolean;
}

/** A family's events. Built in the order they go out (Responses numbers them). */
export interface StreamRenderer<E extends StreamEvent = StreamEvent> {
  /** Sent with the 200 headers, before the engine runs (Responses: created, in_progress). */
  opening(): E[];
  /** Sent with the first output event, before it (chat: the role chunks; Messages: message_start…). */
  first(): E[];
  /** The output event of `choice` carrying `count` tokens from `start`; `last`: the choice's final tokens. */
  output(choice: number, start: number, count: number, last: boolean, variant: StreamVariant): E;
  /** An extra output event of `choice` whose JSON is `bytes` long (never shorter than its minimal size). */
  oversized(choice: number, bytes: number): E;
  /** What `malformed_after` sends. */
  malformed(): E;
  /** An engine error: the events that end the stream cleanly, or null to cut the connection (no terminator). */
  failure(info: ErrorInfo): E[] | null;
  /** Everything after the last output event of a complete answer (usage, the finish and terminal events). */
  finish(variant: StreamVariant): E[];
  /** `data_after_done`: choice 0's token after the last (`start`), past the terminal event. */
  late(start: number): E;
}

/** Where a stream's events go. */
export interface StreamSink<E extends StreamEvent = StreamEvent> {
  /** The start of the answer (HTTP: the 200 headers), with the opening events. */
  open(events: readonly E[]): void;
  /** One tick's events; false when the next tick must wait for onDrain. */
  write(events: readonly E[]): boolean;
  onDrain(fn: () => void): void;
  /** The answer is complete (HTTP: the chunked terminator). */
  end(): void;
  /** TCP RST, no terminator: what a crashed or killed upstream looks like mid-body. */
  reset(): void;
  /** FIN after the bytes written, no terminator: an exception escaping a started response. */
  cut(): void;
}

/** When a generation's events are due, and its fault: what every writer of an answer (streamed or not) is given. */
export interface PacedPlan extends TimerPacing {
  readonly fault: Fault | null;
  /** When events are due; absent: the timer of ttftMs, itlMs and jitter. */
  readonly pacer?: Pacer | undefined;
}

/** One sequence of `tokens` output tokens (the event routes, background responses). */
export interface SequencePlan extends PacedPlan {
  readonly tokens: number;
  readonly tokensPerEvent: number;
}

export interface StreamEnginePlan extends PacedPlan {
  /** Choices in the response; the seeded draw picks which one each output event advances. */
  readonly choiceCount: number;
  readonly tokensPerChoice: number;
  readonly tokensPerEvent: number;
}

/** `generationComplete`: every choice finished (the engine would count a success). */
export type StreamEnd = { readonly end: 'completed' | 'fault'; readonly generationComplete: boolean };

export interface StreamHooks {
  /** The first token is ready (waiting → running). */
  onFirstToken(): void;
  /** One output event (content-carrying event of the generation) is being sent, carrying `tokens` tokens. */
  onOutput(tokens: number): void;
  /** The simulator stopped sending for good. Not called for a stall: that ends when the client leaves. */
  onEnd(result: StreamEnd): void;
}

export interface StreamControl {
  /** Stop timers; the client has gone. */
  abort(): void;
}

/** The output-event count at which a boundary fault fires, or null for faults without a boundary. */
export function faultBoundary(fault: Fault | null): number | null {
  if (fault === null) return null;
  switch (fault.kind) {
    case 'error_before_output':
      return 0;
    case 'error_after':
    case 'reset_after':
    case 'stall_after':
    case 'end_after':
    case 'malformed_after':
    case 'oversized_after':
      return fault.after;
    case 'status':
    case 'reset_before_response':
    case 'no_done':
    case 'drop_finish':
    case 'data_after_done':
      return null;
  }
}

/**
 * The engine error of an `error_before_output` (`beforeOutput`) or `error_after` fault with `code`: a 400 before
 * output is vLLM's lazy validation error.
 */
export function engineErrorInfo(code: number, beforeOutput: boolean): ErrorInfo {
  return beforeOutput && code === 400 ? errorInfo(400, 'Token id 151936 is out of vocabulary') : errorInfo(code);
}

export function runStream<E extends StreamEvent>(
  plan: StreamEnginePlan,
  renderer: StreamRenderer<E>,
  sink: StreamSink<E>,
  hooks: StreamHooks,
): StreamControl {
  const run = new StreamRun(plan, renderer, sink, hooks);
  run.start();
  return run;
}

class StreamRun<E extends StreamEvent> implements StreamControl {
  private cancelTimer: CancelTimer | undefined;
  private stopped = false;
  private firstTokenSent = false;
  private faultFired = false;
  private outputEvents = 0;
  /** Choice indices that still have tokens, in index order; the seeded draw picks among them. */
  private readonly open: number[];
  private readonly produced: number[];
  private readonly boundary: number | null;
  private readonly variant: StreamVariant;
  private readonly pacer: Pacer;

  constructor(
    private readonly plan: StreamEnginePlan,
    private readonly renderer: StreamRenderer<E>,
    private readonly sink: StreamSink<E>,
    private readonly hooks: StreamHooks,
  ) {
    this.open = Array.from({ length: plan.choiceCount }, (_, i) => i);
    this.produced = new Array<number>(plan.choiceCount).fill(0);
    this.boundary = faultBoundary(plan.fault);
    const kind = plan.fault?.kind;
    this.variant = { dropFinish: kind === 'drop_finish', noTerminal: kind === 'no_done' };
    this.pacer = plan.pacer ?? timerPacer(plan);
  }

  start(): void {
    // vLLM sends the 200 before the engine has accepted the request, then nothing until the first token.
    this.sink.open(this.renderer.opening());
    const fault = this.plan.fault;
    if (fault?.kind === 'reset_after' && fault.after === 0) {
      this.cancelTimer = after(0, this.reset);
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

  private readonly tick = (): void => {
    this.cancelTimer = undefined;
    if (this.stopped) return;
    const out: E[] = [];
    if (this.isAtBoundary() && this.fireFault(out)) return;
    if (this.open.length > 0) {
      if (!this.firstTokenSent) {
        this.firstTokenSent = true;
        this.hooks.onFirstToken();
        for (const event of this.renderer.first()) out.push(event);
      }
      out.push(this.nextOutputEvent());
    }
    if (this.open.length === 0) {
      // A boundary at or past the last output event fires here, in place of the closing events.
      if (this.isAtBoundary() && this.fireFault(out)) return;
      this.finish(out);
      return;
    }
    if (this.sink.write(out)) this.scheduleNext();
    else this.sink.onDrain(() => { if (!this.stopped) this.scheduleNext(); });
  };

  private scheduleNext(): void {
    this.cancelTimer = this.pacer.next(1, this.tick);
  }

  private isAtBoundary(): boolean {
    return !this.faultFired && this.boundary !== null && (this.outputEvents >= this.boundary || this.open.length === 0);
  }

  private nextOutputEvent(): E {
    const { plan } = this;
    const slot = this.open.length === 1 ? 0 : Math.floor(plan.random() * this.open.length);
    const choice = this.open[slot] ?? 0;
    const start = this.produced[choice] ?? 0;
    const count = Math.min(plan.tokensPerEvent, plan.tokensPerChoice - start);
    this.produced[choice] = start + count;
    const last = start + count >= plan.tokensPerChoice;
    if (last) this.open.splice(slot, 1);
    this.outputEvents += 1;
    // Before rendering: audio's continuous usage counts the event being rendered.
    this.hooks.onOutput(count);
    return this.renderer.output(choice, start, count, last, this.variant);
  }

  /** Apply the boundary fault. True when it ended (or froze) the stream. */
  private fireFault(out: E[]): boolean {
    this.faultFired = true;
    const fault = this.plan.fault;
    if (fault === null) return false;
    switch (fault.kind) {
      case 'error_before_output':
      case 'error_after': {
        const events = this.renderer.failure(engineErrorInfo(fault.code, fault.kind === 'error_before_output'));
        if (events === null) {
          this.sink.write(out);
          this.stop();
          this.sink.cut();
          return true;
        }
        for (const event of events) out.push(event);
        this.sink.write(out);
        this.end({ end: 'fault', generationComplete: false });
        return true;
      }
      case 'stall_after':
        this.sink.write(out);
        this.stopped = true;
        return true;
      case 'end_after':
        this.sink.write(out);
        this.end({ end: 'fault', generationComplete: false });
        return true;
      case 'reset_after':
        this.sink.write(out);
        this.reset();
        return true;
      case 'malformed_after':
        out.push(this.renderer.malformed());
        return false;
      case 'oversized_after':
        // The lowest unfinished choice, so the only anomaly is its size.
        out.push(this.renderer.oversized(this.open[0] ?? 0, fault.bytes));
        return false;
      case 'status':
      case 'reset_before_response':
      case 'no_done':
      case 'drop_finish':
      case 'data_after_done':
        return false;
    }
  }

  private finish(out: E[]): void {
    for (const event of this.renderer.finish(this.variant)) out.push(event);
    if (this.plan.fault?.kind === 'data_after_done') out.push(this.renderer.late(this.produced[0] ?? 0));
    this.sink.write(out);
    this.end({ end: this.plan.fault === null ? 'completed' : 'fault', generationComplete: true });
  }

  private end(result: StreamEnd): void {
    this.stopped = true;
    this.pacer.release();
    this.sink.end();
    this.hooks.onEnd(result);
  }

  /** Stopped for good by a fault that breaks the connection: told before the socket goes. */
  private stop(): void {
    this.stopped = true;
    this.pacer.release();
    this.hooks.onEnd({ end: 'fault', generationComplete: false });
  }

  private readonly reset = (): void => {
    this.cancelTimer = undefined;
    if (this.stopped) return;
    this.stop();
    this.sink.reset();
  };
}
