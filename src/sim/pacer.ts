/**
 * When a generation's output events are due. Two sources: the timer (a fixed TTFT and inter-token delay, jittered —
 * the simulator without its engine model, and every request whose x-sim-fault header sets a timing) and the engine
 * model (src/sim/engine/runtime.ts: events are due when the engine's steps have produced their tokens). The writers
 * (the stream engine, stream-engine.ts, and nonstream.ts) ask only "call me when the next events are due", so faults,
 * framing and backpressure are the same under both.
 */
import { jittered, type Random } from '../util/prng.js';
import { after, type CancelTimer } from './timer.js';

export interface Pacer {
  /** Call `fn` when the first output event is due (the engine: the first token exists). */
  first(fn: () => void): CancelTimer;
  /** Call `fn` when `events` more output events are due after the last one waited for (0: at once, or one ITL of 0). */
  next(events: number, fn: () => void): CancelTimer;
  /** The writer is done with this generation (ended, failed, reset or abandoned): free what it holds. Idempotent. */
  release(): void;
}

export interface TimerPacing {
  readonly ttftMs: number;
  readonly itlMs: number;
  readonly jitter: number;
  readonly random: Random;
}

/**
 * The timer: the first event `ttftMs` after asking, each next batch `itlMs × events` after asking, each delay jittered
 * by one seeded draw (none when the delay or the jitter is 0), in the order the writer asks.
 */
export function timerPacer(pacing: TimerPacing): Pacer {
  return {
    first: (fn) => after(jittered(pacing.random, pacing.ttftMs, pacing.jitter), fn),
    next: (events, fn) => after(jittered(pacing.random, pacing.itlMs * Math.max(0, events), pacing.jitter), fn),
    release: () => undefined,
  };
}
