/**
 * The engine model as a Pacer (src/sim/pacer.ts): a generation's output events are due when the engine's steps have
 * produced their tokens, so the stream engine's faults, framing and backpressure are the same as under the timer.
 */
import type { Pacer } from '../pacer.js';
import { after, type CancelTimer } from '../timer.js';
import type { EngineJob } from './runtime.js';

/** Events due from the engine's progress on one job. */
export class EnginePacer implements Pacer {
  private target = 0;
  private released = false;

  constructor(
    private readonly job: EngineJob,
    private readonly tokensPerEvent: number,
  ) {}

  first(fn: () => void): CancelTimer {
    this.target = 1;
    return this.when(fn);
  }

  next(events: number, fn: () => void): CancelTimer {
    this.target += Math.max(0, events);
    return this.when(fn);
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.job.cancel();
  }

  /** Output events the job's tokens make: the first at the first token, then one per tokensPerEvent, the rest at the end. */
  private dueEvents(): number {
    let due = 0;
    const { generated, finished } = this.job;
    for (let i = 0; i < generated.length; i++) {
      const tokens = generated[i] ?? 0;
      if (tokens === 0) continue;
      due += finished[i] === true ? Math.ceil(tokens / this.tokensPerEvent) : Math.max(1, Math.floor(tokens / this.tokensPerEvent));
    }
    return due;
  }

  private when(fn: () => void): CancelTimer {
    const target = this.target;
    // A job the engine dropped (restart, abort) never makes more tokens: its writer is called so it can end.
    const ready = (): boolean => this.dueEvents() >= target || (this.job.done && this.dueEvents() < target && this.allFinished());
    if (ready()) return after(0, fn);
    let cancelled = false;
    const unwatch = this.job.watch(() => {
      if (cancelled || !ready()) return;
      cancelled = true;
      unwatch();
      fn();
    });
    return () => {
      cancelled = true;
      unwatch();
    };
  }

  private allFinished(): boolean {
    return this.job.finished.every((f) => f);
  }
}
