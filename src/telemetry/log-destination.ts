/**
 * Where the JSON log lines of `serve` go: the process's stdout, written asynchronously, never more than
 * `logging.buffer_bytes` held in memory, and never a reason the process cannot exit.
 *
 * pino's own stdout destination (sonic-boom, as pino builds it) holds every line it could not write yet, without a
 * bound: with stdout a pipe whose reader stalls (a log shipper or container runtime that is stuck) the gateway's
 * memory grew by its whole log stream, 118 → 640 MB in 40 s at 5,000 requests/s. At exit it flushed what it held
 * with a loop that retries every 100 ms for as long as the write fails, EPIPE included, so `serve` never exited
 * after SIGTERM once its reader had stalled or gone. And it appends each line to the string it holds and measures
 * that string's byte length again per line, which copies the whole held batch per line (~3.9 KB allocated per
 * request at 1,200 requests/s).
 *
 * Here: lines are kept as they come (each measured once) and joined per write; a line that would take the held bytes
 * past the bound is dropped and counted (`waybill_log_lines_dropped_total`), as is everything held once stdout is
 * gone (EPIPE, or any error but EAGAIN); EAGAIN (a non-blocking stdout that is full) is retried after a short delay.
 * One write is in flight at a time, so the lines stay in order; with none in flight, the request lines (`writeLater`)
 * wait up to COALESCE_MS for others to join their write, unless they fill it (PIPE_WRITE_BYTES, FILE_WRITE_BYTES to a
 * regular file, or half the bound), someone waits, or one of pino's own lines (`write`) comes. `serve` waits up to
 * EXIT_FLUSH_TIMEOUT_MS for what is held before it exits (cli.ts); an exit without that wait (a crash, a second
 * signal) writes the lines held behind the write in flight synchronously, one attempt (flushSync). A terminal is the
 * exception: its fd stays blocking, so a terminal that does not read (^S) blocks one thread-pool thread, and the
 * exit, until it reads again. docs/operations.md, "Logs".
 */
import { fstatSync, write as fsWrite, writeSync } from 'node:fs';
import { isatty } from 'node:tty';

/**
 * The largest single write to a pipe, a socket or a terminal: a batch of held lines is cut here (a line longer than it
 * goes alone). PIPE_BUF on Linux: a write that size or smaller goes into a pipe whole, so the lines of `--workers N`,
 * which share the primary's stdout, never tear into each other (sonic-boom wrote up to 16 KiB at once).
 */
export const PIPE_WRITE_BYTES = 4096;
/**
 * The largest single write to a regular file (or /dev/null). A write to a regular file is whole whatever its size
 * (Linux holds the file's lock for it, and processes that inherited the fd share its offset), so only the batch's
 * size bounds it.
 */
export const FILE_WRITE_BYTES = 65_536;
/**
 * How long a request line may wait for others to join its write, at most, while nothing is in flight. Each write is
 * a trip through libuv's thread pool (a wake-up, a thread switch, the syscall, a callback back on the loop). Written
 * as they came, one or two lines per write, that was 0.2-0.7 writes per request; batched, 0.02-0.18, and 0.89-0.96 of
 * the CPU per non-streaming request, paired. A full batch, a flush, the gateway's own lines and an exit do not wait;
 * a request line is late by this much at most, which no log pipeline notices (docs/performance.md, "Log writes").
 */
export const COALESCE_MS = 50;
/** How long a command that logged waits at its end for stdout to take what is held (cli.ts; docs/operations.md). */
export const EXIT_FLUSH_TIMEOUT_MS = 2000;
/** A full non-blocking stdout is tried again after this long. */
const EAGAIN_RETRY_MS = 10;

export interface LogDestinationOptions {
  fd: number;
  /** The most bytes held while stdout does not take them; a line past it is dropped. */
  bufferBytes: number;
  /** Lines were dropped (how many). */
  onDrop?: (lines: number) => void;
  /** Writes: fs.write / fs.writeSync, injectable for tests. */
  write?: typeof fsWrite;
  writeSync?: typeof writeSync;
  /** A synchronous write to the fd can wait indefinitely (a terminal): flushSync then skips while a write is in flight. */
  mayBlock?: boolean;
  /** The largest single write (default PIPE_WRITE_BYTES). */
  maxWriteBytes?: number;
  /** How long held lines wait for more to join their write while nothing is in flight (default 0: not at all). */
  coalesceMs?: number;
  /** Schedules an EAGAIN retry or the end of a coalescing wait: setTimeout, unref'd; injectable for tests. */
  later?: (callback: () => void, ms: number) => void;
}

export class LogDestination {
  /** Lines held, oldest first, with each one's bytes; heldBytes is their sum plus the write in flight's. */
  private readonly lines: string[] = [];
  private readonly sizes: number[] = [];
  private heldBytes = 0;
  /** The write in flight: its bytes, what they count in heldBytes, and how many went out already. */
  private inFlight: Buffer | undefined;
  private inFlightBytes = 0;
  private written = 0;
  /** stdout is gone: nothing more is written. */
  private broken = false;
  private droppedLines = 0;
  private inDropHook = false;
  private droppedInHook = 0;
  /** Callers of whenWritten and flush waiting for heldBytes to reach 0. */
  private readonly waiters: (() => void)[] = [];
  private readonly fsWrite: typeof fsWrite;
  private readonly fsWriteSync: typeof writeSync;
  private readonly later: (callback: () => void, ms: number) => void;
  private readonly maxWriteBytes: number;
  private readonly coalesceMs: number;
  /**
   * Held bytes that start a write without waiting: a full write, or half the bound, whichever is less (a bound no
   * larger than a write would otherwise be reached, and lines dropped, before a write ever counted as full).
   */
  private readonly fullBytes: number;
  /** The coalescing wait in progress (its number), or 0: a wait that ends after a write started is stale. */
  private waiting = 0;
  private waits = 0;
  /** A line held was written with `write`: what is held goes without a coalescing wait, until nothing is. */
  private urgent = false;
  private readonly afterWrite = (error: NodeJS.ErrnoException | null, bytes: number) => this.wrote(error, bytes);

  constructor(private readonly options: LogDestinationOptions) {
    this.fsWrite = options.write ?? fsWrite;
    this.fsWriteSync = options.writeSync ?? writeSync;
    this.later = options.later ?? ((callback, ms) => setTimeout(callback, ms).unref());
    this.maxWriteBytes = options.maxWriteBytes ?? PIPE_WRITE_BYTES;
    this.coalesceMs = options.coalesceMs ?? 0;
    this.fullBytes = Math.min(this.maxWriteBytes, options.bufferBytes / 2);
  }

  /** Lines dropped so far: past the bound, or held when stdout went away. */
  get dropped(): number {
    return this.droppedLines;
  }

  /** A write is in flight (or waits to be tried again after EAGAIN). */
  get writing(): boolean {
    return this.inFlight !== undefined;
  }

  /** Bytes held, the write in flight included. */
  get held(): number {
    return this.heldBytes;
  }

  /**
   * pino's stream interface: one or more whole lines, to go out without a coalescing wait (with what is held before
   * them): the gateway's own lines (start-up, reloads, errors), which an operator or a script may be waiting for.
   * Returns false once the bound is reached (never blocks).
   */
  write(line: string): boolean {
    return this.add(line, true);
  }

  /** A line that may wait up to the coalescing wait for others to join its write: the request lines, the volume. */
  writeLater(line: string): boolean {
    return this.add(line, false);
  }

  private add(line: string, now: boolean): boolean {
    const bytes = Buffer.byteLength(line);
    if (this.broken || this.heldBytes + bytes > this.options.bufferBytes) {
      this.drop(1);
      return false;
    }
    this.lines.push(line);
    this.sizes.push(bytes);
    this.heldBytes += bytes;
    if (now) this.urgent = true;
    if (this.inFlight === undefined) this.schedule();
    return true;
  }

  /** Resolves once everything held is written (or stdout is gone), or after `timeoutMs`, whichever comes first. */
  whenWritten(timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      // Not unref'd: it keeps the process alive for the retries of a full stdout (EAGAIN), whose timers are.
      let timer: NodeJS.Timeout | undefined;
      let settled = false;
      const cancel = this.whenSettled(() => {
        settled = true;
        clearTimeout(timer);
        resolve();
      });
      // (Settled already, should a waiter ever be called back at once: no timer left holding the process.)
      if (cancel !== undefined && !settled)
        timer = setTimeout(() => {
          cancel();
          resolve();
        }, timeoutMs);
    });
  }

  /** pino's `logger.flush(cb)`: `cb` once everything held is written or stdout is gone (no timeout). */
  flush(cb?: (error?: Error) => void): void {
    this.whenSettled(() => cb?.());
  }

  /** Calls `callback` once nothing is held (at once if nothing is); returns how to stop waiting, while it waits. */
  private whenSettled(callback: () => void): (() => void) | undefined {
    if (this.heldBytes === 0 || this.broken) {
      callback();
      return undefined;
    }
    this.waiters.push(callback);
    // Someone waits: held lines go out now, not at the end of a coalescing wait.
    if (this.inFlight === undefined) this.schedule();
    return () => {
      const at = this.waiters.indexOf(callback);
      if (at >= 0) this.waiters.splice(at, 1);
    };
  }

  /**
   * At exit (a crash's `process.exit`, a second signal), with no event loop left: the lines held behind the write in
   * flight are written synchronously, one attempt each, so the last lines (a fatal error's) are not lost. They can
   * land before the batch in flight if the thread pool has not written it yet. Not when a write could block the exit
   * (`mayBlock`: a terminal, whose fd stays blocking) while one is in flight: that one may be blocked already.
   */
  flushSync(): void {
    if (this.broken || (this.inFlight !== undefined && this.options.mayBlock === true)) return;
    while (this.lines.length > 0) {
      const [batch, counted] = this.take();
      let at = 0;
      try {
        while (at < batch.length) at += this.fsWriteSync(this.options.fd, batch, at);
      } catch {
        // EAGAIN (full) or gone: what is left cannot be written without waiting, and the process is ending.
        this.fail(lineCount(batch.subarray(at)));
        return;
      }
      this.heldBytes -= counted;
    }
  }

  /** stdout will not take lines again: the lines held (and `extra` taken out of them) are dropped. */
  private fail(extra: number): void {
    this.broken = true;
    const lines = this.lines.length + extra;
    this.lines.length = 0;
    this.urgent = false;
    this.sizes.length = 0;
    this.heldBytes = 0;
    this.inFlight = undefined;
    this.inFlightBytes = 0;
    this.drop(lines);
    this.settled();
  }

  /** Nothing is held: whoever waits (whenWritten, flush) goes on. */
  private settled(): void {
    for (const waiter of this.waiters.splice(0)) waiter();
  }

  private drop(lines: number): void {
    this.droppedLines += lines;
    // A hook that logs (an observer's error report) drops again while stdout is full: those lines are reported with
    // the next drop, not by calling the hook again from inside itself (one that always logs would never end).
    if (this.inDropHook) {
      this.droppedInHook += lines;
      return;
    }
    const report = lines + this.droppedInHook;
    this.droppedInHook = 0;
    this.inDropHook = true;
    try {
      this.options.onDrop?.(report);
    } finally {
      this.inDropHook = false;
    }
  }

  /**
   * With no write in flight: writes what is held now if it is full (fullBytes), if someone waits for it (whenWritten,
   * flush), if a line of it came through `write`, or if lines are not to wait at all; otherwise starts a coalescing
   * wait, unless one is in progress. With nothing held, tells the waiters.
   */
  private schedule(): void {
    const wait = this.lines.length > 0 && !this.broken && this.coalesceMs > 0 && this.heldBytes < this.fullBytes;
    if (wait && this.waiters.length === 0 && !this.urgent) {
      if (this.waiting !== 0) return;
      const number = ++this.waits;
      this.waiting = number;
      this.later(() => {
        if (this.waiting !== number) return;
        this.waiting = 0;
        if (this.inFlight === undefined) this.next();
      }, this.coalesceMs);
      return;
    }
    this.waiting = 0;
    this.next();
  }

  /** Joins held lines, oldest first, up to maxWriteBytes (at least one line); with the bytes they counted. */
  private take(): [Buffer, number] {
    let count = 0;
    let bytes = 0;
    while (count < this.lines.length) {
      const size = this.sizes[count] as number;
      if (count > 0 && bytes + size > this.maxWriteBytes) break;
      bytes += size;
      count++;
    }
    const text = count === 1 ? (this.lines[0] as string) : this.lines.slice(0, count).join('');
    this.lines.splice(0, count);
    this.sizes.splice(0, count);
    if (this.lines.length === 0) this.urgent = false;
    return [Buffer.from(text, 'utf8'), bytes];
  }

  private next(): void {
    if (this.lines.length === 0 || this.broken) {
      this.settled();
      return;
    }
    [this.inFlight, this.inFlightBytes] = this.take();
    this.written = 0;
    this.send();
  }

  private send(): void {
    const buffer = this.inFlight as Buffer;
    this.fsWrite(this.options.fd, buffer, this.written, buffer.length - this.written, null, this.afterWrite);
  }

  private wrote(error: NodeJS.ErrnoException | null, bytes: number): void {
    const buffer = this.inFlight as Buffer;
    if (error !== null) {
      if (error.code === 'EAGAIN') {
        this.later(() => this.send(), EAGAIN_RETRY_MS);
        return;
      }
      // EPIPE (the reader is gone), EBADF, ...: stdout will not take lines again. What is left of the batch in
      // flight counts one line per line end.
      this.fail(lineCount(buffer.subarray(this.written)));
      return;
    }
    this.written += bytes;
    if (this.written < buffer.length) {
      this.send();
      return;
    }
    this.heldBytes -= this.inFlightBytes;
    this.inFlight = undefined;
    this.inFlightBytes = 0;
    this.schedule();
  }
}

function lineCount(buffer: Buffer): number {
  let lines = 0;
  for (let at = buffer.indexOf(0x0a); at >= 0; at = buffer.indexOf(0x0a, at + 1)) lines++;
  return Math.max(lines, 1);
}

let stdout: LogDestination | undefined;
let dropHook: ((lines: number) => void) | undefined;

/**
 * The process's stdout destination, one per process whatever the number of loggers writing to it, made on first use
 * with the bound of the first configuration that asks (a reload does not change it). Flushed at exit.
 */
export function stdoutDestination(bufferBytes: number): LogDestination {
  if (stdout !== undefined) return stdout;
  // A terminal's fd stays blocking (Node's tty.WriteStream); a pipe's is made non-blocking by process.stdout.
  const terminal = isatty(1);
  const destination = new LogDestination({
    fd: 1,
    bufferBytes,
    mayBlock: terminal,
    maxWriteBytes: terminal ? PIPE_WRITE_BYTES : maxWriteBytesFor(1),
    coalesceMs: COALESCE_MS,
    onDrop: (lines) => dropHook?.(lines),
  });
  stdout = destination;
  process.on('exit', () => destination.flushSync());
  return destination;
}

/**
 * FILE_WRITE_BYTES for a regular file or a character device that is not a terminal (/dev/null), whose writes never
 * tear; else PIPE_WRITE_BYTES. (A short write to a full disk is finished by a second one, which another worker's can
 * come between, whatever the size.)
 */
export function maxWriteBytesFor(fd: number): number {
  try {
    const stat = fstatSync(fd);
    return stat.isFile() || stat.isCharacterDevice() ? FILE_WRITE_BYTES : PIPE_WRITE_BYTES;
  } catch {
    return PIPE_WRITE_BYTES;
  }
}

/** Waits up to `timeoutMs` for stdout to take the lines held (none held, or no destination: at once). */
export function flushStdout(timeoutMs: number): Promise<void> {
  return stdout?.whenWritten(timeoutMs) ?? Promise.resolve();
}

/** Counts stdout's dropped lines from now on, after the ones dropped before (one counter per process: the last set). */
export function onStdoutDrops(count: (lines: number) => void): void {
  dropHook = count;
  const before = stdout?.dropped ?? 0;
  if (before > 0) count(before);
}
