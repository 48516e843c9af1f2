/**
 * Background responses (`background: true`, with the store on): the generation runs with no client attached, its
 * events go to the store (vLLM's `event_store`), and any number of HTTP streams replay them —
 * `responses_background_stream_generator`, `vllm/entrypoints/openai/responses/serving.py`. Two pieces:
 *
 * - startBackground(): the engine side. The same clock, output-event boundaries and engine faults as a stream
 *   (event-stream.ts), but its events are handed over, not written. An engine error kills the task (vLLM's
 *   GenerationError escapes the task: no event, no final response); `stall_after` freezes it.
 * - startReplay(): one HTTP stream over the buffered events, from an index on. It ends only after writing
 *   `response.completed`; when the task died or was cancelled it stays open and idle until the client leaves.
 */
import type { ServerResponse } from 'node:http';
import type { EventWriter, NamedEvent } from './event-stream.js';
import type { Fault } from './faults.js';
import type { Random } from '../util/prng.js';
import { timerPacer, type Pacer } from './pacer.js';
import type { StoredResponse } from './response-store.js';
import { faultBoundary, type StreamControl } from './stream.js';
import type { CancelTimer } from './timer.js';
import { createNamedEventFramer, type FramingStyle } from './wire.js';

// ---- the task ----

export interface BackgroundPlan {
  readonly tokens: number;
  readonly tokensPerEvent: number;
  readonly ttftMs: number;
  readonly itlMs: number;
  readonly jitter: number;
  readonly random: Random;
  /** `error_before_output`, `error_after`, `stall_after` or null (others are ignored). */
  readonly fault: Fault | null;
  readonly writer: EventWriter;
  /** When events are due; absent: the timer of ttftMs, itlMs and jitter. */
  readonly pacer?: Pacer | undefined;
}

export interface BackgroundHooks {
  /** Events the task produced, in order (the writer's, untouched). */
  onEvents(events: readonly NamedEvent[]): void;
  onFirstToken(): void;
  onOutput(tokens: number): void;
  /**
   * Once: `completed` after the last events (response.completed included) were handed over; `died` when an engine
   * error killed the task. Never for a stall, nor after abort().
   */
  onEnd(end: 'completed' | 'died'): void;
}

/**
 * The faults a background request honours: `status` and `reset_before_response` on the request itself,
 * `error_before_output`, `error_after` and `stall_after` on its task. The others alter a connection's stream, which a
 * background generation does not have.
 */
export function appliesToBackground(kind: Fault['kind']): boolean {
  return kind === 'error_before_output' || kind === 'error_after' || kind === 'stall_after' || kind === 'status' || kind === 'reset_before_response';
}

export function startBackground(plan: BackgroundPlan, hooks: BackgroundHooks): StreamControl {
  const run = new BackgroundRun(plan, hooks);
  run.start();
  return run;
}

class BackgroundRun implements StreamControl {
  private cancelTimer: CancelTimer | undefined;
  private stopped = false;
  private firstTokenSent = false;
  private faultFired = false;
  private outputEvents = 0;
  private produced = 0;
  private readonly boundary: number | null;

  constructor(
    private readonly plan: BackgroundPlan,
    private readonly hooks: BackgroundHooks,
  ) {
    this.boundary = faultBoundary(plan.fault);
    this.pacer = plan.pacer ?? timerPacer(plan);
  }

  private readonly pacer: Pacer;

  start(): void {
    this.hooks.onEvents(this.plan.writer.opening());
    this.cancelTimer = this.pacer.first(this.tick);
  }

  abort(): void {
    this.stopped = true;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    this.pacer.release();
  }

  private get remaining(): number {
    return this.plan.tokens - this.produced;
  }

  private readonly tick = (): void => {
    this.cancelTimer = undefined;
    if (this.stopped) return;
    const out: NamedEvent[] = [];
    if (this.isAtBoundary() && this.fireFault(out)) return;
    if (this.remaining > 0) {
      if (!this.firstTokenSent) {
        this.firstTokenSent = true;
        this.hooks.onFirstToken();
        out.push(...this.plan.writer.first());
      }
      const count = Math.min(this.plan.tokensPerEvent, this.remaining);
      out.push(this.plan.writer.output(this.produced, count));
      this.produced += count;
      this.outputEvents += 1;
      this.hooks.onOutput(count);
    }
    if (this.remaining === 0) {
      if (this.isAtBoundary() && this.fireFault(out)) return;
      out.push(...this.plan.writer.finish({ dropFinish: false, noTerminal: false }));
      this.stopped = true;
      this.pacer.release();
      this.hooks.onEvents(out);
      this.hooks.onEnd('completed');
      return;
    }
    this.hooks.onEvents(out);
    this.cancelTimer = this.pacer.next(1, this.tick);
  };

  private isAtBoundary(): boolean {
    return !this.faultFired && this.boundary !== null && (this.outputEvents >= this.boundary || this.remaining === 0);
  }

  /** Apply the boundary fault: true when it ended (or froze) the task. */
  private fireFault(out: NamedEvent[]): boolean {
    this.faultFired = true;
    const kind = this.plan.fault?.kind;
    if (kind !== 'error_before_output' && kind !== 'error_after' && kind !== 'stall_after') return false;
    this.stopped = true;
    if (kind !== 'stall_after') this.pacer.release();
    this.hooks.onEvents(out);
    if (kind !== 'stall_after') this.hooks.onEnd('died');
    return true;
  }
}

// ---- the replay ----

export interface ReplayHooks {
  /**
   * Once: `completed` after `response.completed` was written and the body ended; `refused` when vLLM's generator
   * raised after the 200 (no buffered events for this response, or an index past the buffer's start) and the
   * connection was cut. Not called when the client leaves first.
   */
  onEnd(end: 'completed' | 'refused'): void;
}

/**
 * Replay `entry`'s buffered events from index `start` (`starting_after + 1`; 0 from the beginning), then each new one
 * as it comes, as vLLM's loop does — including its Python indexing: a negative index counts from the end of the
 * buffer as it is at that moment, and one before its start raises (the stream is cut). Headers go out at once; a
 * response without buffered events is refused lazily, after the 200. Honours backpressure.
 */
export function startReplay(res: ServerResponse, entry: StoredResponse, start: number, framing: FramingStyle, hooks: ReplayHooks): void {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
  res.flushHeaders();
  const events = entry.events;
  if (events === null) {
    cut(res);
    hooks.onEnd('refused');
    return;
  }
  const frame = createNamedEventFramer(framing);
  let index = start;
  let framed = 0;
  let waitingForDrain = false;
  let done = false;
  const finish = (): void => {
    done = true;
    unsubscribe();
  };
  const pump = (): void => {
    if (done || waitingForDrain) return;
    while (index < events.length) {
      const actual = index < 0 ? events.length + index : index;
      const event = actual < 0 ? undefined : events[actual];
      if (event === undefined) {
        // deque[i] for i < -len: IndexError escapes the generator after the 200.
        finish();
        cut(res);
        hooks.onEnd('refused');
        return;
      }
      const ok = res.write(frame(event.name, event.data, true, framed === 0));
      framed += 1;
      if (event.name === 'response.completed') {
        finish();
        res.end();
        hooks.onEnd('completed');
        return;
      }
      index += 1;
      if (!ok) {
        waitingForDrain = true;
        res.once('drain', () => {
          waitingForDrain = false;
          pump();
        });
        return;
      }
    }
  };
  const unsubscribe = entry.subscribe(pump);
  res.once('close', finish);
  pump();
}

/** What uvicorn does when the generator raises after the response started: flush, then FIN, no chunked terminator. */
function cut(res: ServerResponse): void {
  const socket = res.socket;
  if (socket === null) return;
  socket.once('finish', () => socket.destroy());
  socket.end();
}
