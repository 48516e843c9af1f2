/**
 * The streaming answer of one request: a scheduler that writes one step per timer tick (one timer per
 * stream), in vLLM's order — role chunks with the first token, interleaved deltas, one finish chunk per
 * choice, usage, [DONE] — with the request's fault applied at its boundary.
 */
import type { ServerResponse } from 'node:http';
import type { Fault } from './faults.js';
import type { Random } from '../util/prng.js';
import { timerPacer, type Pacer } from './pacer.js';
import { after, type CancelTimer } from './timer.js';
import {
  choiceTextJsonInner,
  createEventFramer,
  DONE_DATA,
  errorEventData,
  errorInfo,
  MALFORMED_DATA,
  type ChunkSerializer,
  type FramingStyle,
  type Usage,
} from './wire.js';

/** What every generation plan has, streamed or not. */
export interface GenerationPlan {
  /** Choices in the response: n, or n × prompts for legacy completions (index = choice + prompt_idx × n). */
  readonly choiceCount: number;
  readonly tokensPerChoice: number;
  readonly tokensPerEvent: number;
  /** finish_reason of every choice. */
  readonly finishReason: string;
  /** null: no usage (chunk or field). */
  readonly usage: Usage | null;
  readonly ttftMs: number;
  readonly itlMs: number;
  readonly jitter: number;
  readonly random: Random;
  readonly fault: Fault | null;
  /** When events are due; absent: the timer of ttftMs, itlMs and jitter. */
  readonly pacer?: Pacer | undefined;
}

export interface StreamPlan extends GenerationPlan {
  readonly serializer: ChunkSerializer;
  readonly framing: FramingStyle;
}

/** `generationComplete`: every choice finished (the engine would count a success). */
export type StreamEnd = { readonly end: 'completed' | 'fault'; readonly generationComplete: boolean };

export interface StreamHooks {
  /** The first token is ready (waiting → running). */
  onFirstToken(): void;
  /** One output event (content-carrying chunk of the generation) was written, carrying `tokens` tokens. */
  onOutput(tokens: number): void;
  /** The simulator stopped writing for good. Not called for a stall: that ends when the client leaves. */
  onEnd(result: StreamEnd): void;
}

export interface StreamControl {
  /** Stop timers; the client has gone. */
  abort(): void;
}

export function startStream(res: ServerResponse, plan: StreamPlan, hooks: StreamHooks): StreamControl {
  const run = new StreamRun(res, plan, hooks);
  run.start();
  return run;
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

class StreamRun implements StreamControl {
  private cancelTimer: CancelTimer | undefined;
  private stopped = false;
  private firstTokenSent = false;
  private faultFired = false;
  private eventsFramed = 0;
  private outputEvents = 0;
  /** Choice indices that still have tokens, in index order; the seeded draw picks among them. */
  private readonly open: number[];
  private readonly produced: number[];
  private readonly boundary: number | null;
  private readonly frameEvent: (data: string, isJson: boolean, first: boolean) => string;
  private readonly pacer: Pacer;

  constructor(
    private readonly res: ServerResponse,
    private readonly plan: StreamPlan,
    private readonly hooks: StreamHooks,
  ) {
    this.open = Array.from({ length: plan.choiceCount }, (_, i) => i);
    this.produced = new Array<number>(plan.choiceCount).fill(0);
    this.boundary = faultBoundary(plan.fault);
    this.frameEvent = createEventFramer(plan.framing);
    this.pacer = plan.pacer ?? timerPacer(plan);
  }

  start(): void {
    // vLLM sends the 200 before the engine has accepted the request, then nothing until the first token.
    this.res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    this.res.flushHeaders();
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

  private readonly tick = (): void => {
    this.cancelTimer = undefined;
    if (this.stopped) return;
    const out: string[] = [];
    if (this.isAtBoundary() && this.fireFault(out)) return;
    if (this.open.length > 0) {
      if (!this.firstTokenSent) this.sendFirstToken(out);
      out.push(this.nextOutputEvent());
    }
    if (this.open.length === 0) {
      // A boundary at or past the last output event fires here, after the finish chunks.
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
    return !this.faultFired && this.boundary !== null && (this.outputEvents >= this.boundary || this.open.length === 0);
  }

  private sendFirstToken(out: string[]): void {
    this.firstTokenSent = true;
    this.hooks.onFirstToken();
    for (let index = 0; index < this.plan.choiceCount; index++) {
      const role = this.plan.serializer.role(index);
      if (role !== null) out.push(this.frame(role));
    }
  }

  private nextOutputEvent(): string {
    const { plan } = this;
    const slot = this.open.length === 1 ? 0 : Math.floor(plan.random() * this.open.length);
    const index = this.open[slot] ?? 0;
    const start = this.produced[index] ?? 0;
    const count = Math.min(plan.tokensPerEvent, plan.tokensPerChoice - start);
    this.produced[index] = start + count;
    const isLast = start + count >= plan.tokensPerChoice;
    if (isLast) this.open.splice(slot, 1);
    this.outputEvents += 1;
    this.hooks.onOutput(count);
    const dropsFinish = plan.fault?.kind === 'drop_finish' && index === 0;
    const finishReason = isLast && !dropsFinish ? plan.finishReason : null;
    return this.frame(plan.serializer.output(index, choiceTextJsonInner(index, start, count), finishReason));
  }

  /** Apply the boundary fault. True when it ended (or froze) the stream. */
  private fireFault(out: string[]): boolean {
    this.faultFired = true;
    const fault = this.plan.fault;
    if (fault === null) return false;
    switch (fault.kind) {
      case 'error_before_output':
      case 'error_after': {
        const info = fault.kind === 'error_before_output' && fault.code === 400
          ? errorInfo(400, 'Token id 151936 is out of vocabulary')
          : errorInfo(fault.code);
        out.push(this.frame(errorEventData(info)), this.frame(DONE_DATA, false));
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
        out.push(this.frame(MALFORMED_DATA, false));
        return false;
      case 'oversized_after':
        out.push(this.frame(this.oversizedChunk(fault.bytes)));
        return false;
      case 'status':
      case 'reset_before_response':
      case 'no_done':
      case 'drop_finish':
      case 'data_after_done':
        return false;
    }
  }

  /**
   * A content chunk padded with 'x' so its JSON is `bytes` long (or its minimum size), for the lowest
   * unfinished choice, so the only anomaly is its size.
   */
  private oversizedChunk(bytes: number): string {
    const index = this.open[0] ?? 0;
    const base = Buffer.byteLength(this.plan.serializer.output(index, '', null));
    return this.plan.serializer.output(index, 'x'.repeat(Math.max(0, bytes - base)), null);
  }

  private finish(out: string[]): void {
    const { plan } = this;
    const kind = plan.fault?.kind;
    if (plan.usage !== null) out.push(this.frame(plan.serializer.usage(plan.usage)));
    if (kind !== 'no_done') out.push(this.frame(DONE_DATA, false));
    if (kind === 'data_after_done') {
      const late = this.produced[0] ?? 0;
      out.push(this.frame(plan.serializer.output(0, choiceTextJsonInner(0, late, 1), null)));
    }
    this.write(out);
    this.end({ end: plan.fault === null ? 'completed' : 'fault', generationComplete: true });
  }

  private frame(data: string, isJson = true): string {
    const framed = this.frameEvent(data, isJson, this.eventsFramed === 0);
    this.eventsFramed += 1;
    return framed;
  }

  /** One write per tick; false when the socket buffer is full (wait for 'drain' before the next tick). */
  private write(out: string[]): boolean {
    if (out.length === 0) return true;
    return this.res.write(out.length === 1 ? (out[0] ?? '') : out.join(''));
  }

  private end(result: StreamEnd): void {
    this.stopped = true;
    this.pacer.release();
    this.res.end();
    this.hooks.onEnd(result);
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
