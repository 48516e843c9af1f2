/**
 * stdout's JSON log destination (src/telemetry/log-destination.ts): bounded while stdout does not take lines, every
 * line either written once, in order, or dropped and counted, and never a reason the process cannot exit.
 *
 * - a property over writes that complete in any order with the lines, partial writes, EAGAIN, flushes and a failure,
 *   with lines written at once or held for a coalescing wait: the bytes written are the accepted lines in order, each
 *   once; accepted + dropped = lines given; held never past the bound; no write past the write size (but a lone
 *   line); lines someone waits for are being written; every flush called back;
 * - batching: one write for the lines of a wait, at once when full (the write size, or half a small bound) or flushed;
 *   64 KiB writes to a file or /dev/null, 4 KiB (PIPE_BUF) to a FIFO;
 * - `waybill serve` with its stdout a socket the test stops reading: requests still answered, the lines past
 *   `logging.buffer_bytes` counted in waybill_log_lines_dropped_total, and lines read + dropped = lines logged;
 * - the same with stdout never read again: SIGTERM ends the process (pino's own destination retried forever).
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { request } from 'undici';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.js';
import { FILE_WRITE_BYTES, LogDestination, maxWriteBytesFor, PIPE_WRITE_BYTES } from '../src/telemetry/log-destination.js';
import { metricValue } from './helpers/stack.js';
import { startScripted, type Scripted } from './helpers/scripted.js';

type WriteCallback = (error: NodeJS.ErrnoException | null, bytes: number) => void;
interface PendingWrite {
  bytes: Buffer;
  callback: WriteCallback;
}

/** A destination over a fake fd: writes wait in `pending` until the test completes them. */
function rig(bufferBytes: number, options: { mayBlock?: boolean; onDrop?: (lines: number) => void; maxWriteBytes?: number; coalesceMs?: number } = {}) {
  const pending: PendingWrite[] = [];
  const out: Buffer[] = [];
  const retries: Array<() => void> = [];
  let dropped = 0;
  const write = ((_fd: number, buffer: Buffer, offset: number, length: number, _position: null, callback: WriteCallback) => {
    pending.push({ bytes: buffer.subarray(offset, offset + length), callback });
  }) as unknown as typeof import('node:fs').write;
  const destination = new LogDestination({
    fd: 99,
    bufferBytes,
    onDrop: (lines) => {
      dropped += lines;
      options.onDrop?.(lines);
    },
    mayBlock: options.mayBlock ?? false,
    write,
    writeSync: ((_fd: number, buffer: Buffer, offset: number) => {
      out.push(buffer.subarray(offset));
      return buffer.length - offset;
    }) as unknown as typeof import('node:fs').writeSync,
    later: (callback) => retries.push(callback),
    ...(options.maxWriteBytes !== undefined && { maxWriteBytes: options.maxWriteBytes }),
    ...(options.coalesceMs !== undefined && { coalesceMs: options.coalesceMs }),
  });
  return { destination, pending, out, retries, dropped: () => dropped };
}

describe('LogDestination', () => {
  it('writes accepted lines once and in order, drops and counts the rest, never holds past its bound', () => {
    const line = fc.string({ unit: 'grapheme', maxLength: 40 }).map((text) => `${JSON.stringify({ msg: text })}\n`);
    const step = fc.oneof(
      // A line to go at once (pino's own), or one that may wait for others (a request line).
      fc.record({ kind: fc.constant('log' as const), line, later: fc.boolean() }),
      fc.record({ kind: fc.constant('complete' as const), part: fc.double({ min: 0, max: 1, noNaN: true }) }),
      fc.record({ kind: fc.constant('eagain' as const) }),
      fc.record({ kind: fc.constant('retry' as const) }),
      fc.record({ kind: fc.constant('flush' as const) }),
    );
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 300 }),
        fc.array(step, { maxLength: 80 }),
        fc.boolean(),
        // Writes cut at a few lines or at many; lines written at once or held for a coalescing wait ('retry' ends it).
        fc.constantFrom(24, 64, 4096),
        fc.boolean(),
        (bound, steps, failAtEnd, maxWriteBytes, coalesce) => {
          const r = rig(bound, { maxWriteBytes, coalesceMs: coalesce ? 10 : 0 });
          const accepted: string[] = [];
          let given = 0;
          let flushes = 0;
          let flushed = 0;
          const written: Buffer[] = [];
          for (const s of steps) {
            if (s.kind === 'log') {
              given++;
              if (s.later ? r.destination.writeLater(s.line) : r.destination.write(s.line)) accepted.push(s.line);
            } else if (s.kind === 'complete' || s.kind === 'eagain') {
              const write = r.pending.shift();
              if (write === undefined) continue;
              if (s.kind === 'eagain') {
                write.callback(Object.assign(new Error('EAGAIN'), { code: 'EAGAIN' }), 0);
                continue;
              }
              // Part of the bytes, at least one: the destination must write the rest.
              const n = Math.max(1, Math.floor(write.bytes.length * s.part));
              written.push(write.bytes.subarray(0, n));
              write.callback(null, n);
            } else if (s.kind === 'flush') {
              flushes++;
              r.destination.flush(() => flushed++);
            } else {
              r.retries.shift()?.();
            }
            expect(r.destination.held).toBeLessThanOrEqual(bound);
            expect(r.pending.length).toBeLessThanOrEqual(1);
            // A write is never larger than the write size, unless it is one line alone (PIPE_BUF: lines never tear).
            for (const write of r.pending) {
              const text = write.bytes.toString('utf8');
              if (write.bytes.length > maxWriteBytes) expect(text.indexOf('\n')).toBe(text.length - 1);
            }
            // Someone waits for lines held: they are being written, not left to a coalescing wait.
            if (flushed < flushes && r.destination.held > 0) expect(r.destination.writing).toBe(true);
          }
          // Drain: complete everything, or fail the write in flight (EPIPE: the rest is dropped). A write may wait on a
          // retry or a coalescing wait: those are ended too.
          for (let guard = 0; guard < 10_000; guard++) {
            if (r.pending.length === 0 && r.retries.length > 0) {
              r.retries.shift()?.();
              continue;
            }
            const write = r.pending.shift();
            if (write === undefined) break;
            if (failAtEnd) {
              write.callback(Object.assign(new Error('EPIPE'), { code: 'EPIPE' }), 0);
              break;
            }
            written.push(write.bytes);
            write.callback(null, write.bytes.length);
          }
          const text = Buffer.concat(written).toString('utf8');
          const writtenLines = text === '' ? [] : text.split(/(?<=\n)/);
          if (!failAtEnd) {
            expect(writtenLines).toEqual(accepted);
            expect(r.destination.held).toBe(0);
          } else {
            // Whatever went out is a prefix of the accepted lines (a line cut by the failure counts as dropped).
            const whole = writtenLines.filter((l) => l.endsWith('\n'));
            expect(whole).toEqual(accepted.slice(0, whole.length));
            expect(whole.length + r.dropped() - (given - accepted.length)).toBe(accepted.length);
          }
          if (!failAtEnd) expect(r.dropped()).toBe(given - accepted.length);
          expect(r.destination.dropped).toBe(r.dropped());
          // Every flush called back: once written, or once stdout was gone.
          expect(flushed).toBe(flushes);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('holds request lines for one coalescing wait and writes them together; a full batch, someone waiting, or a line that may not wait goes at once', async () => {
    const r = rig(1 << 20, { coalesceMs: 10, maxWriteBytes: 40 });
    r.destination.writeLater('{"a":1}\n');
    r.destination.writeLater('{"a":2}\n');
    r.destination.writeLater('{"a":3}\n');
    // One wait for the three, nothing written yet.
    expect(r.pending).toHaveLength(0);
    expect(r.retries).toHaveLength(1);
    r.retries.shift()?.();
    expect(r.pending.map((w) => w.bytes.toString())).toEqual(['{"a":1}\n{"a":2}\n{"a":3}\n']);
    (r.pending.shift() as PendingWrite).callback(null, 24);
    expect(r.destination.held).toBe(0);
    // 5 lines of 8 bytes fill a 40-byte write: it starts without waiting, and the wait begun by the first ends idle.
    for (let i = 0; i < 5; i++) r.destination.writeLater(`{"b":${i}}\n`);
    expect(r.pending).toHaveLength(1);
    expect((r.pending[0] as PendingWrite).bytes.length).toBe(40);
    r.retries.shift()?.();
    expect(r.pending).toHaveLength(1);
    (r.pending.shift() as PendingWrite).callback(null, 40);
    expect(r.pending).toHaveLength(0);
    // A line written behind a wait goes out as soon as someone waits for it.
    r.destination.writeLater('{"c":1}\n');
    expect(r.pending).toHaveLength(0);
    const flushed = r.destination.whenWritten(60_000);
    expect(r.pending.map((w) => w.bytes.toString())).toEqual(['{"c":1}\n']);
    (r.pending.shift() as PendingWrite).callback(null, 8);
    await flushed;
    expect(r.destination.held).toBe(0);
    // A line through write (pino's: start-up, reloads, errors) does not wait, and takes the waiting ones with it.
    r.destination.writeLater('{"d":1}\n');
    expect(r.pending).toHaveLength(0);
    r.destination.write('{"d":2}\n');
    expect(r.pending.map((w) => w.bytes.toString())).toEqual(['{"d":1}\n{"d":2}\n']);
    (r.pending.shift() as PendingWrite).callback(null, 16);
    // Nothing held that asked to go at once: the next request line waits again.
    r.destination.writeLater('{"d":3}\n');
    expect(r.pending).toHaveLength(0);
  });

  it("the request lines (dataRecordWriter) wait for others; pino's own lines go at once", async () => {
    const r = rig(1 << 20, { coalesceMs: 10 });
    const { pino } = await import('pino');
    const { dataRecordWriter } = await import('../src/telemetry/logger.js');
    const logger = pino({ base: null, timestamp: false }, r.destination);
    dataRecordWriter(logger)({ request_id: 'r1' }, 'request');
    expect(r.pending).toHaveLength(0);
    logger.warn('configuration reload rejected');
    expect(r.pending.map((w) => w.bytes.toString())).toEqual(['{"level":30,"request_id":"r1","msg":"request"}\n{"level":40,"msg":"configuration reload rejected"}\n']);
  });

  it('with a bound no larger than a write, writes at half the bound instead of waiting until lines are dropped', () => {
    const r = rig(64, { coalesceMs: 10, maxWriteBytes: 64 });
    for (let i = 0; i < 3; i++) r.destination.writeLater(`{"a":${i}}\n`);
    expect(r.pending).toHaveLength(0);
    // 32 bytes held: half the bound.
    r.destination.writeLater('{"a":3}\n');
    expect(r.pending.map((w) => w.bytes.length)).toEqual([32]);
    expect(r.destination.dropped).toBe(0);
  });

  it('writes up to 64 KiB at once to a regular file or /dev/null, and only PIPE_BUF to a pipe', () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-logfd-'));
    const fds: number[] = [];
    try {
      const file = openSync(join(dir, 'out.log'), 'w');
      const devNull = openSync('/dev/null', 'w');
      execFileSync('mkfifo', [join(dir, 'fifo')]);
      // O_RDWR: Linux opens a FIFO without waiting for a reader.
      const fifo = openSync(join(dir, 'fifo'), 'r+');
      fds.push(file, devNull, fifo);
      expect([maxWriteBytesFor(file), maxWriteBytesFor(devNull), maxWriteBytesFor(fifo)]).toEqual([FILE_WRITE_BYTES, FILE_WRITE_BYTES, PIPE_WRITE_BYTES]);
      expect([FILE_WRITE_BYTES, PIPE_WRITE_BYTES]).toEqual([65_536, 4096]);
    } finally {
      for (const fd of fds) closeSync(fd);
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('after stdout is gone, drops and counts every line; flush resolves at once', async () => {
    const r = rig(1 << 20);
    r.destination.write('{"a":1}\n');
    r.destination.write('{"a":2}\n');
    r.pending.shift()?.callback(Object.assign(new Error('EPIPE'), { code: 'EPIPE' }), 0);
    expect(r.dropped()).toBe(2);
    expect(r.destination.write('{"a":3}\n')).toBe(false);
    expect(r.dropped()).toBe(3);
    expect(r.pending).toHaveLength(0);
    await r.destination.whenWritten(60_000);
  });

  it('flush waits for the held lines to be written, and gives up after its timeout while a write hangs', async () => {
    const r = rig(1 << 20);
    r.destination.write('{"a":1}\n');
    r.destination.write('{"a":2}\n');
    let flushed = false;
    const flushing = r.destination.whenWritten(60_000).then(() => (flushed = true));
    const first = r.pending.shift() as PendingWrite;
    first.callback(null, first.bytes.length);
    expect(flushed).toBe(false);
    const second = r.pending.shift() as PendingWrite;
    expect(second.bytes.toString()).toBe('{"a":2}\n');
    second.callback(null, second.bytes.length);
    await flushing;
    expect(flushed).toBe(true);
    // A write that never completes: the flush ends on its timeout, with the line still held.
    r.destination.write('{"a":3}\n');
    await r.destination.whenWritten(5);
    expect(r.destination.held).toBe(8);
  });

  it('at exit writes the lines held behind the write in flight, unless a write could block (a terminal)', () => {
    const r = rig(1 << 20);
    r.destination.write('{"a":1}\n');
    r.destination.write('{"a":2}\n');
    r.destination.write('{"a":3}\n');
    expect(r.pending).toHaveLength(1);
    r.destination.flushSync();
    // The batch in flight is the thread pool's; the two held behind it go out now, in order.
    expect(Buffer.concat(r.out).toString()).toBe('{"a":2}\n{"a":3}\n');
    expect(r.destination.held).toBe(8);
    const terminal = rig(1 << 20, { mayBlock: true });
    terminal.destination.write('{"a":1}\n');
    terminal.destination.write('{"a":2}\n');
    terminal.destination.flushSync();
    expect(terminal.out).toHaveLength(0);
  });

  it("answers pino's logger.flush(cb) once what is held is written", async () => {
    const r = rig(1 << 20);
    const { pino } = await import('pino');
    const logger = pino({ base: null, timestamp: false }, r.destination);
    logger.info('one');
    let called = 0;
    logger.flush(() => called++);
    expect(called).toBe(0);
    const write = r.pending.shift() as PendingWrite;
    write.callback(null, write.bytes.length);
    expect(called).toBe(1);
    expect(write.bytes.toString()).toBe('{"level":30,"msg":"one"}\n');
  });

  it('counts the lines a drop hook itself drops (an observer that logs while stdout is full) with the next drop', () => {
    const seen: number[] = [];
    // A hook that logs every time it is called, as an observer failing on every call would: no loop, nothing lost.
    const r = rig(10, {
      onDrop: (lines) => {
        seen.push(lines);
        r.destination.write('{"inside":"the hook"}\n');
      },
    });
    r.destination.write('{"too":"long for ten bytes"}\n');
    expect(seen).toEqual([1]);
    expect(r.destination.dropped).toBe(2);
    r.destination.write('{"too":"long for ten bytes"}\n');
    expect(seen).toEqual([1, 2]);
    expect(r.destination.dropped).toBe(4);
  });
});

const COMPLETION = JSON.stringify({
  id: 'c',
  object: 'chat.completion',
  created: 1,
  model: 'sim-model',
  choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
});
const CHAT = JSON.stringify({ model: 'sim-model', messages: [{ role: 'user', content: 'hi' }] });
const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;

describe('waybill serve with a stdout nobody reads', () => {
  let upstream: Scripted;
  let dir: string;
  beforeAll(async () => {
    upstream = await startScripted((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(COMPLETION);
    });
    dir = mkdtempSync(join(tmpdir(), 'waybill-logdest-'));
  });
  afterAll(async () => {
    await upstream.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Starts serve with stdout a socket; reads its lines until it listens, then stops reading. */
  async function start(
    name: string,
    workers = 1,
  ): Promise<{ child: ChildProcess; base: string; lines: string[]; resume: () => void; requestLinesRead: (count: number) => Promise<void> }> {
    const config: ConfigInput = {
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'p', models: ['sim-model'], upstreams: [{ name: 'u', url: upstream.url }] }],
      health: { interval: '1h' },
      engine_signals: { enabled: false },
      shutdown: { grace: '0s', drain_timeout: '1s' },
      logging: { buffer_bytes: 65536 },
    };
    const file = join(dir, `${name}.yaml`);
    writeFileSync(file, stringify(config));
    const child = spawn(process.execPath, [BIN, 'serve', '--config', file, '--workers', String(workers)], { stdio: ['ignore', 'pipe', 'inherit'] });
    const stdout = child.stdout;
    const lines: string[] = [];
    let rest = '';
    let paused = false;
    let listening: (url: string) => void = () => undefined;
    let requestLines = 0;
    let reading: { count: number; done: () => void } | undefined;
    const url = new Promise<string>((resolve) => (listening = resolve));
    stdout.setEncoding('utf8');
    stdout.on('data', (text: string) => {
      const parts = (rest + text).split('\n');
      rest = parts.pop() as string;
      for (const part of parts) {
        lines.push(part);
        const record = JSON.parse(part) as { msg?: string; url?: string };
        if (record.msg === 'request') requestLines++;
        if (reading !== undefined && requestLines >= reading.count) {
          reading.done();
          reading = undefined;
        }
        if (record.msg === 'waybill listening' && !paused) {
          // Nothing read from here on until resume(): the socket fills, then the gateway's writes wait.
          paused = true;
          stdout.pause();
          listening(record.url ?? '');
        }
      }
    });
    const requestLinesRead = (count: number) =>
      new Promise<void>((done) => {
        if (requestLines >= count) done();
        else reading = { count, done };
      });
    return { child, base: await url, lines, resume: () => stdout.resume(), requestLinesRead };
  }

  async function send(base: string, count: number): Promise<void> {
    let next = 0;
    const worker = async () => {
      while (next < count) {
        next++;
        const response = await request(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: CHAT });
        expect(response.statusCode).toBe(200);
        await response.body.text();
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
  }

  const REQUESTS = 3000;

  it.each([1, 2])('answers every request, counts the lines past logging.buffer_bytes, and every request line is read or counted (--workers %i)', async (workers) => {
    // With 2 workers both write to the primary's stdout: every line read must still be whole (start() parses each).
    // This does not force a tear (64 KiB writes passed here too); the 4 KiB write size is argued from PIPE_BUF.
    const { child, base, lines, resume, requestLinesRead } = await start(`count-${workers}`, workers);
    try {
      await send(base, REQUESTS);
      const dropped = metricValue(await (await request(`${base}/metrics`)).body.text(), 'waybill_log_lines_dropped_total');
      // ~3000 lines of several hundred bytes against 64 KiB held and a socket's buffer: most cannot be held.
      expect(dropped).toBeGreaterThan(0);
      const metrics = await (await request(`${base}/metrics`)).body.text();
      expect(metricValue(metrics, 'waybill_requests_total', { outcome: 'delivered' })).toBe(REQUESTS);
      // SIGTERM once at most HELD request lines are left unread: then no process holds more than those (~13 KB against
      // a 64 KiB bound), so the shutdown's own lines fit (sent at once, they could find the bound still full and be
      // dropped after the count above was read), and what is still held then is written before the exit. (Reading
      // only after resume() is not enough: the socket's stream had buffered ~16 KiB of old lines while paused.)
      const HELD = 20;
      resume();
      await requestLinesRead(REQUESTS - dropped - HELD);
      child.kill('SIGTERM');
      // 'close': the process exited and its stdout was read to the end.
      expect((await once(child, 'close'))[0]).toBe(0);
      const requestLines = lines.filter((line) => (JSON.parse(line) as { msg?: string }).msg === 'request').length;
      // Only request lines were logged while stdout was not read (health checks hourly, engine signals off); the
      // lines held when SIGTERM came were written before the exit (the shutdown's own lines after them).
      expect(requestLines + dropped).toBe(REQUESTS);
      const shutdown = workers === 1 ? 'shutting down' : 'worker shutting down';
      expect(lines.some((line) => (JSON.parse(line) as { msg?: string }).msg === shutdown)).toBe(true);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 120_000);

  it('exits on SIGTERM while stdout is still not read (within drain_timeout + the 2 s log flush + 20 s of margin)', async () => {
    const { child, base } = await start('exit');
    try {
      await send(base, REQUESTS);
      child.kill('SIGTERM');
      const exited = once(child, 'exit');
      const deadline = new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), 23_000).unref());
      const result = await Promise.race([exited, deadline]);
      expect(result).not.toBe('hung');
      expect((result as unknown[])[0]).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  }, 120_000);
});
