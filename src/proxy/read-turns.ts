/**
 * Fair under saturation: a new stream's first token must not wait behind established streams' events.
 *
 * Node reads every socket that is ready in one turn of the event loop and runs all the work of each read before the
 * next. When the gateway is behind, a turn holds many answering streams' reads, each carrying several events, and a
 * new request needs several turns before its first token goes out (its body read and dispatched, the upstream's head,
 * its first events): one turn is an inter-token gap for an answering stream, but three or four are a new stream's
 * time to first token, so new streams fall behind first (issue 15: +34 ms TTFT p50 at saturation where nginx added
 * under 1 ms).
 *
 * So answering streams — those that already wrote to their client — share a budget of CPU per turn
 * (`streaming.turn_budget`). A stream whose read ends past the budget yields: its upstream is paused (the bytes
 * wait in the kernel and in undici, TCP pushes back on the upstream) and it is resumed, in order of yielding, at the
 * end of the turn, while the next turn's budget lasts; one that is still over is left for a later turn. Streams that
 * have not answered yet are never paused and not counted: their work is what the budget keeps room for. Answering
 * streams yield whenever the turn is over budget, not only while a dispatched stream waits for its first token: a new
 * request is invisible until its body has been read and routed — the very turns this keeps short — and counting only
 * dispatched streams lost most of the gain (TTFT p50 at saturation 22.5 ms against 26.8 without any turns in the same
 * run, where the kept design gave 11.0–11.6 ms in others; docs/performance.md). Below
 * saturation nobody yields (a turn's reads take far less than the budget), and the cost is one clock read per read
 * (its start is the read's stamp, read anyway: attempt.ts).
 * The reads are timed on the wall clock (performance.now): time the process spends preempted inside a read counts, so
 * a CPU-starved process yields somewhat more, which is the direction that keeps new streams served.
 *
 * Bookkeeping only: callers measure their reads, and the end of the turn is setImmediate (it runs after the turn's
 * reads, and one scheduled while the immediates run waits for the next turn), injectable for tests.
 */

/** A stream that can be paused for the rest of a turn. */
export interface Yielding {
  /** Resume reading (unless paused for another reason); it may read at once, and yield again. */
  resumeTurn(): void;
  /** The stream is over: nothing to resume. */
  readonly finished: boolean;
}

export class ReadTurns {
  private spentMs = 0;
  private turnOpen = false;
  private readonly waiting: Yielding[] = [];
  /** The budget of the turn in which yielded streams are resumed: the latest a yielding stream was given. */
  private budgetMs = 0;
  private readonly endTurn = () => this.nextTurn();

  constructor(
    private readonly hooks: {
      /** A stream yielded (waybill_turn_yields_total). Must not throw. */
      onYield?: () => void;
      /** Runs the callback once the turn's reads are done: setImmediate. */
      defer?: (callback: () => void) => void;
    } = {},
  ) {}

  /** Streams waiting for a later turn. */
  get yielded(): number {
    return this.waiting.length;
  }

  /**
   * An answering stream's read took `ms` of this turn. Returns whether the turn's budget is spent, so the stream must
   * yield. `budgetMs` 0: never.
   */
  spent(ms: number, budgetMs: number): boolean {
    this.open();
    this.spentMs += ms;
    return budgetMs > 0 && this.spentMs > budgetMs;
  }

  /** The stream paused itself: resume it in a later turn, after the streams that yielded before it. */
  yield(stream: Yielding, budgetMs: number): void {
    this.waiting.push(stream);
    this.budgetMs = budgetMs;
    this.hooks.onYield?.();
    this.open();
  }

  private open(): void {
    if (this.turnOpen) return;
    this.turnOpen = true;
    (this.hooks.defer ?? setImmediate)(this.endTurn);
  }

  private nextTurn(): void {
    this.turnOpen = false;
    this.spentMs = 0;
    try {
      // Each stream resumed reads what it holds at once (counted by spent()); one still over yields again, to the back.
      for (let n = this.waiting.length; n > 0 && this.spentMs <= this.budgetMs; n--) {
        const stream = this.waiting.shift() as Yielding;
        if (!stream.finished) stream.resumeTurn();
      }
    } finally {
      // What is left (the budget ran out, or a resume threw) waits for the end of the next turn: never stranded.
      if (this.waiting.length > 0) this.open();
    }
  }
}
