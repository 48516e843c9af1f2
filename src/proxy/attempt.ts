/**
 * One attempt: an undici dispatch handler that turns the upstream's response into ledger facts and hands the
 * bytes to the exchange. Bytes flow through untouched; the framer and classifier only watch them.
 */
import type { Dispatcher } from 'undici';
import type { ProtocolViolation } from '../accounting/ledger.js';
import type { AbortReason, MachineEvent, NetworkFailure } from '../delivery/machine.js';
import { createFramer, type Framer } from '../sse/framer.js';
import type { ReadTurns, Yielding } from './read-turns.js';
import { parseRetryAfter } from './retry-after.js';
import type { Upstream } from './upstreams.js';

/** What an attempt reports: the delivery machine's upstream events, each naming the attempt. */
export type AttemptEvent = Extract<MachineEvent, { attempt: number }>;

/**
 * Where the attempt reports to: the logical request that owns it. `attempt_settled` comes exactly once, last. `at`:
 * when it happened, on the shell's clock, when the attempt read the clock for it (an upstream read's events all carry
 * the read's start); otherwise the receiver stamps it. Returns true when the event was taken at once and nothing keeps
 * it (not queued behind a step): the attempt may reuse the object, and what it carried, for a later report.
 */
export type AttemptReport = (event: AttemptEvent, at?: number) => boolean;

type BlockReport = Extract<AttemptEvent, { type: 'block' }>;
const NO_BYTES = Buffer.alloc(0);

const NETWORK_CONNECT_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT']);

function networkFailure(error: Error): NetworkFailure {
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' && NETWORK_CONNECT_CODES.has(code) ? 'connect_error' : 'reset';
}

function isEventStream(headers: Record<string, string | string[] | undefined>): boolean {
  const type = headers['content-type'];
  return typeof type === 'string' && type.toLowerCase().startsWith('text/event-stream');
}

/** Waybill asks for identity encoding; anything else cannot be framed or classified. */
function isCompressed(headers: Record<string, string | string[] | undefined>): boolean {
  const encoding = headers['content-encoding'];
  if (encoding === undefined) return false;
  const value = (Array.isArray(encoding) ? encoding.join(',') : encoding).trim().toLowerCase();
  return value !== '' && value !== 'identity';
}

/** The shared budget of answering streams' reads per event-loop turn (read-turns.ts). */
export interface TurnShare {
  readonly turns: ReadTurns;
  /** `streaming.turn_budget` in milliseconds; 0: never yield. */
  readonly budgetMs: number;
}

export class Attempt implements Dispatcher.DispatchHandler, Yielding {
  private controller: Dispatcher.DispatchController | undefined;
  private framer: Framer | undefined;
  private body: Buffer[] = [];
  private bodyBytes = 0;
  private status = 0;
  private abortReason: AbortReason | undefined;
  private done = false;
  /** The upstream response has started (status line received). */
  started = false;
  private contentType: string | undefined;
  /** Names this attempt to its upstream's circuit breaker. */
  ticket = 0;
  /**
   * Reported after a read of a stream whose last block did not end it (`endOfRead`): one object for all of them (the
   * machine never keeps or changes events).
   */
  private readonly chunkDone: AttemptEvent;
  /** The read being framed has reported its last block with `endOfRead`: no `chunk_done` after it. */
  private readEnded = false;
  /** The client has been written to from this attempt: its reads share the turn budget. */
  answering = false;
  /** Paused because the client's socket is full / because the turn's budget ran out: it reads again when neither is. */
  private clientPaused = false;
  private yieldedTurn = false;
  /** When the upstream read being framed began (the stamp of its blocks); undefined outside a read. */
  private readAt: number | undefined = undefined;
  /** A block report taken and let go: reused for the next block instead of a new object per event. */
  private spareBlock: BlockReport | undefined = undefined;

  constructor(
    readonly upstream: Upstream,
    readonly number: number,
    private readonly report: AttemptReport,
    private readonly options: {
      streaming: boolean;
      maxEventBytes: number;
      maxResponseBytes: number;
      maxErrorBodyBytes: number;
      /** Wall-clock milliseconds, to read a Retry-After date. */
      wallNow: () => number;
      /** The shell's clock: monotonic milliseconds, sub-millisecond (performance.now). */
      now: () => number;
      turnShare?: TurnShare | undefined;
      /**
       * Takes a read that may be one whole ordinary delta event without the framer (the delivery machine's
       * ordinaryRead): true when it took the read and wrote it; false, nothing done, and the read is framed.
       */
      ordinaryRead?: ((attempt: number, chunk: Buffer, at: number) => boolean) | undefined;
    },
  ) {
    this.chunkDone = { type: 'chunk_done', attempt: number };
  }

  get finished(): boolean {
    return this.done;
  }

  /** Stops the attempt; its socket is closed, which is how vLLM learns to free the request's GPU slot. */
  abort(reason: AbortReason): void {
    if (this.done) return;
    this.abortReason ??= reason;
    if (this.controller !== undefined) {
      this.controller.abort(new Error(`waybill: ${reason}`));
      return;
    }
    // Still connecting: undici hands out the controller only once a socket is ready, which can take the whole
    // connect timeout. Finish now, so a cancellation or deadline takes effect at once; onRequestStart aborts the
    // request when it comes, and any later callback is ignored.
    if (reason !== 'cancelled' && reason !== 'drained') this.report({ type: 'stream_end', attempt: this.number, how: reason });
    this.settle();
  }

  pause(): void {
    this.clientPaused = true;
    this.controller?.pause();
  }

  resume(): void {
    this.clientPaused = false;
    if (!this.yieldedTurn) this.controller?.resume();
  }

  resumeTurn(): void {
    this.yieldedTurn = false;
    if (!this.clientPaused && !this.done) this.controller?.resume();
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.abortReason !== undefined) controller.abort(new Error(`waybill: ${this.abortReason}`));
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: Record<string, string | string[] | undefined>,
  ): void {
    this.started = true;
    this.status = statusCode;
    const type = headers['content-type'];
    this.contentType = typeof type === 'string' ? type : undefined;
    const retryAfter = headers['retry-after'];
    // vLLM's raw-bytes embeddings carry their id, offsets and usage in this header: the client needs it.
    const metadata = headers['metadata'];
    const start: AttemptEvent = {
      type: 'response_start',
      attempt: this.number,
      status: statusCode,
      contentType: this.contentType,
      metadata: typeof metadata === 'string' ? metadata : undefined,
      retryAfterMs: parseRetryAfter(typeof retryAfter === 'string' ? retryAfter : undefined, this.options.wallNow()),
    };
    if (statusCode >= 200 && statusCode < 300) {
      const violation: ProtocolViolation | undefined = isCompressed(headers)
        ? 'compressed'
        : this.options.streaming && !isEventStream(headers)
          ? 'not_event_stream'
          : undefined;
      if (violation !== undefined) {
        // Judged at once, without reading a body that could be anything (an HTML page, an endless gzip stream).
        this.report(start);
        this.report({ type: 'protocol_violation', attempt: this.number, violation });
        this.abort('drained');
        return;
      }
    }
    if (this.options.streaming && statusCode === 200 && isEventStream(headers)) {
      this.framer = createFramer(
        {
          onBlock: (raw, event, endsChunk) => {
            if (this.done || this.abortReason !== undefined) return false;
            let report = this.spareBlock;
            this.spareBlock = undefined;
            if (report === undefined) {
              report = { type: 'block', attempt: this.number, raw, event, endOfRead: endsChunk };
            } else {
              report.raw = raw;
              report.event = event;
              report.endOfRead = endsChunk;
            }
            // The read's last block ends the read itself: the machine writes the read's bytes in the same step.
            this.readEnded = endsChunk;
            // Taken at once: the machine keeps neither the report nor the event (it reads them within its step), so
            // both go back for the next block. Queued behind a step: both stay as they are until it is handled.
            if (!this.report(report, this.readAt)) return false;
            report.raw = NO_BYTES;
            report.event = null;
            this.spareBlock = report;
            return true;
          },
          onOversized: () => this.abort('oversized'),
        },
        { maxEventBytes: this.options.maxEventBytes },
      );
    }
    this.report(start);
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.done || this.abortReason !== undefined) return;
    if (this.framer !== undefined) {
      // One clock read stamps the read's events and starts its turn's measure: each costs ~50 ns (a brand check and
      // the system clock), and a stream's reads are most of what the gateway does.
      // Only a stream that was answering when the read began is charged: the read that carries its first token (whose
      // write makes it answering) is what the budget keeps room for.
      const share = this.answering ? this.options.turnShare : undefined;
      const start = this.options.now();
      // A committed stream's ordinary delta, alone in its read (vLLM's usual), is taken whole: nothing to frame, report
      // or step. Only between blocks: a read that continues an earlier one's block is framed.
      const ordinary = this.options.ordinaryRead;
      if (ordinary === undefined || !this.framer.idle || !ordinary(this.number, chunk, start)) this.frame(chunk, start);
      if (share !== undefined && share.turns.spent(this.options.now() - start, share.budgetMs) && !this.done && !this.yieldedTurn) {
        this.yieldedTurn = true;
        this.controller?.pause();
        share.turns.yield(this, share.budgetMs);
      }
      return;
    }
    const isError = this.status < 200 || this.status >= 300;
    const limit = isError ? this.options.maxErrorBodyBytes : this.options.maxResponseBytes;
    if (this.bodyBytes + chunk.length > limit) {
      if (isError) {
        // An error body is read for its message; past the limit the rest is not ours to buffer or relay.
        this.body.push(chunk.subarray(0, limit - this.bodyBytes));
        this.reportBody();
        this.abort('drained');
        return;
      }
      this.body = [];
      this.abort('oversized');
      return;
    }
    this.bodyBytes += chunk.length;
    this.body.push(chunk);
  }

  /** Frames a stream's read and reports its blocks, each stamped `start`, and the read's end. */
  private frame(chunk: Buffer, start: number): void {
    // A read inside a read (a report's effects resuming the upstream) keeps its own stamp and end.
    const outer = this.readAt;
    const outerEnded = this.readEnded;
    this.readAt = start;
    this.readEnded = false;
    let ended: boolean;
    try {
      (this.framer as Framer).feed(chunk);
    } finally {
      ended = this.readEnded;
      this.readAt = outer;
      this.readEnded = outerEnded;
    }
    if (!ended) this.report(this.chunkDone, start);
  }

  onResponseEnd(): void {
    if (this.done) return;
    if (this.framer !== undefined) {
      // end() may still dispatch a block: one whose last line ended in a CR that could have begun a CRLF.
      this.readEnded = false;
      this.framer.end();
      if (!this.readEnded) this.report(this.chunkDone);
      this.report({ type: 'stream_end', attempt: this.number, how: 'eof' });
    } else {
      this.reportBody();
    }
    this.settle();
  }

  private reportBody(): void {
    const body = this.body.length === 1 ? (this.body[0] as Buffer) : Buffer.concat(this.body);
    this.body = [];
    this.report({ type: 'body', attempt: this.number, status: this.status, body });
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    if (this.done) return;
    const reason = this.abortReason;
    if (reason === 'cancelled' || reason === 'drained') {
      // The exchange already knows why it stopped listening; nothing to report.
    } else if (reason !== undefined) {
      this.report({ type: 'stream_end', attempt: this.number, how: reason });
    } else if (!this.started) {
      this.report({ type: 'network_failure', attempt: this.number, failure: networkFailure(error), message: error.message });
    } else {
      this.report({ type: 'stream_end', attempt: this.number, how: 'reset' });
    }
    this.settle();
  }

  /**
   * Once only: an abort from inside this attempt's own report (a retry scheduled from onNetworkFailure, say) settles
   * it before the reporting path returns and would settle it again.
   */
  private settle(): void {
    if (this.done) return;
    this.done = true;
    this.report({ type: 'attempt_settled', attempt: this.number });
  }
}
