/**
 * The benchmark's load client: a closed loop of N streaming chat completions over one undici Pool, with a handler
 * (the `dispatch` API) that parses only what the timing needs. It shares a core with the simulator, so it is kept
 * cheap: per chunk it counts event boundaries (`\n\n`) and output-bearing events (a `"content":"` followed by a
 * non-empty string: the role chunk's `"content":""` is not output), and stamps the chunk once.
 *
 * A run is: warm-up (streams ramped in evenly over `rampMs`, so they do not tick in lockstep), then the measured
 * window, whose start and end call the caller's hooks (where it reads /proc), then every stream is aborted.
 * Only what arrives inside the window is counted; a TTFT is counted for requests started inside it.
 *
 * With `stream: false` the requests are plain JSON completions: a 200 that ends is a completed request, and the
 * TTFT samples hold the whole request's latency (sent → last byte), since there is no first event to time.
 */
import { performance } from 'node:perf_hooks';
import { Pool, type Dispatcher } from 'undici';
import type { IncomingHttpHeaders } from 'node:http';
import { Samples } from './stats.js';

const LF = 0x0a;
const QUOTE = 0x22;
const EVENT_END = Buffer.from('\n\n');
const CONTENT = Buffer.from('"content":"');
const CONTENT_LEN = CONTENT.length;
const DONE_TAIL = Buffer.from('data: [DONE]\n\n');

export interface LoadSpec {
  /** Origin, e.g. http://127.0.0.1:8000 */
  origin: string;
  path: string;
  body: Buffer;
  /** The body asks for a stream (default true); false: count whole responses, time them end to end. */
  stream?: boolean;
  concurrency: number;
  /** Streams are started evenly over this long at the beginning of the warm-up. */
  rampMs: number;
  warmupMs: number;
  windowMs: number;
  /** Called right before the window opens / after it closes (synchronously; read /proc here). */
  onWindowStart?: () => void;
  onWindowEnd?: () => void;
  /** Called every `sampleEveryMs` inside the window. */
  sampleEveryMs?: number;
  onSample?: () => void;
}

export interface WindowResult {
  windowMs: number;
  /** SSE events (blank-line boundaries) received inside the window, all streams. */
  events: number;
  /** Output-bearing events received inside the window. */
  outputEvents: number;
  bytes: number;
  /** Body chunks handed to the client inside the window (llhttp hands over each HTTP chunk of a chunked response
   *  separately, so this counts the sender's writes): events / reads says how much the sender batched. */
  reads: number;
  /** Requests that ended inside the window, with and without a final `data: [DONE]`. */
  completed: number;
  incomplete: number;
  /** Failed requests (non-200, connection errors) inside the window, and a few messages. */
  errors: number;
  errorMessages: string[];
  /** ms; TTFT of requests started inside the window, ITL gaps ending inside it (0 for events read together).
   *  Non-streaming: `ttft` is each request's latency (sent → response end), for requests started and ended inside. */
  ttft: Samples;
  itl: Samples;
  /** CPU time of the whole bench process (client) inside the window, µs. */
  clientCpuUs: number;
}

class LoadRun {
  readonly ttft = new Samples();
  readonly itl = new Samples();
  windowStart = Number.POSITIVE_INFINITY;
  windowEnd = Number.POSITIVE_INFINITY;
  events = 0;
  outputEvents = 0;
  bytes = 0;
  reads = 0;
  completed = 0;
  incomplete = 0;
  errors = 0;
  errorMessages: string[] = [];
  stopping = false;
  readonly handlers = new Set<StreamHandler>();

  constructor(
    readonly pool: Pool,
    readonly spec: LoadSpec,
  ) {}

  start(): void {
    if (this.stopping) return;
    const handler = new StreamHandler(this);
    this.handlers.add(handler);
    this.pool.dispatch(
      { origin: this.spec.origin, method: 'POST', path: this.spec.path, headers: { 'content-type': 'application/json' }, body: this.spec.body },
      handler,
    );
  }

  inWindow(t: number): boolean {
    return t >= this.windowStart && t < this.windowEnd;
  }

  finished(handler: StreamHandler, error: Error | undefined): void {
    this.handlers.delete(handler);
    if (this.stopping) return;
    const t = performance.now();
    if (this.inWindow(t)) {
      if (error !== undefined || handler.status !== 200) {
        this.errors++;
        if (this.errorMessages.length < 5) this.errorMessages.push(error?.message ?? `HTTP ${handler.status}`);
      } else if (handler.sawDone) {
        this.completed++;
      } else {
        this.incomplete++;
      }
    }
    this.start();
  }
}

class StreamHandler implements Dispatcher.DispatchHandler {
  private readonly startedAt = performance.now();
  private lastOutputAt = -1;
  /** The last bytes of the previous chunk when it did not end on an event boundary (a pattern may span chunks). */
  private carry: Buffer | undefined;
  private controller: Dispatcher.DispatchController | undefined;
  status = 0;
  sawDone = false;
  private ended = false;

  constructor(private readonly run: LoadRun) {}

  abort(): void {
    this.controller?.abort(new Error('bench: window over'));
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.run.stopping) controller.abort(new Error('bench: window over'));
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number, _headers: IncomingHttpHeaders): void {
    this.status = statusCode;
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    const t = performance.now();
    const run = this.run;
    const len = chunk.length;
    if (run.spec.stream === false) {
      // A JSON body holds no events, and its `"content":"` is the whole answer, not an output event.
      if (run.inWindow(t)) {
        run.bytes += len;
        run.reads++;
      }
      return;
    }
    let events = 0;
    let outputs = 0;

    const carry = this.carry;
    if (carry !== undefined) {
      this.carry = undefined;
      if (carry[carry.length - 1] === LF && chunk[0] === LF) events++;
      // A `"content":"` that began in the previous chunk and was not settled there.
      const joined = Buffer.concat([carry, chunk.subarray(0, CONTENT_LEN + 1)]);
      let j = joined.indexOf(CONTENT);
      while (j !== -1 && j < carry.length) {
        const after = j + CONTENT_LEN;
        if (after >= carry.length && after < joined.length && joined[after] !== QUOTE) outputs++;
        j = joined.indexOf(CONTENT, j + 1);
      }
    }

    let i = chunk.indexOf(EVENT_END);
    while (i !== -1) {
      events++;
      i = chunk.indexOf(EVENT_END, i + 2);
    }
    i = chunk.indexOf(CONTENT);
    while (i !== -1) {
      const after = i + CONTENT_LEN;
      if (after < len) {
        if (chunk[after] !== QUOTE) outputs++;
      } // else: settled with the next chunk, through the carry
      i = chunk.indexOf(CONTENT, after);
    }
    if (len < 2 || chunk[len - 1] !== LF || chunk[len - 2] !== LF) {
      this.carry = Buffer.from(chunk.subarray(Math.max(0, len - CONTENT_LEN)));
    } else if (len >= DONE_TAIL.length && chunk.indexOf(DONE_TAIL, len - DONE_TAIL.length) !== -1) {
      this.sawDone = true;
    }

    if (!run.inWindow(t)) {
      if (outputs > 0) this.lastOutputAt = t;
      return;
    }
    run.events += events;
    run.bytes += len;
    run.reads++;
    if (outputs > 0) {
      run.outputEvents += outputs;
      if (this.lastOutputAt < 0) {
        if (this.startedAt >= run.windowStart) run.ttft.push(t - this.startedAt);
      } else {
        run.itl.push(t - this.lastOutputAt);
      }
      for (let k = 1; k < outputs; k++) run.itl.push(0);
      this.lastOutputAt = t;
    }
  }

  onResponseEnd(): void {
    if (this.ended) return;
    this.ended = true;
    const run = this.run;
    if (run.spec.stream === false && this.status === 200) {
      // A whole JSON body is the non-streaming counterpart of a stream that reached [DONE].
      this.sawDone = true;
      const t = performance.now();
      if (this.startedAt >= run.windowStart && run.inWindow(t)) run.ttft.push(t - this.startedAt);
    }
    run.finished(this, undefined);
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.run.finished(this, error);
  }
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Runs one closed-loop load window against `spec.origin`. */
export async function runLoad(spec: LoadSpec): Promise<WindowResult> {
  const pool = new Pool(spec.origin, {
    connections: spec.concurrency,
    pipelining: 1,
    headersTimeout: 30_000,
    bodyTimeout: 30_000,
    keepAliveTimeout: 30_000,
  });
  const run = new LoadRun(pool, spec);
  const ramp: NodeJS.Timeout[] = [];
  const step = spec.concurrency > 1 ? spec.rampMs / spec.concurrency : 0;
  for (let s = 0; s < spec.concurrency; s++) {
    if (step === 0 || s === 0) run.start();
    else ramp.push(setTimeout(() => run.start(), s * step));
  }
  let sampler: NodeJS.Timeout | undefined;
  try {
    await sleep(spec.warmupMs);
    spec.onWindowStart?.();
    const cpuBefore = process.cpuUsage();
    run.windowStart = performance.now();
    if (spec.onSample !== undefined) {
      const onSample = spec.onSample;
      sampler = setInterval(onSample, spec.sampleEveryMs ?? 250);
    }
    await sleep(spec.windowMs);
    const windowEnd = performance.now();
    run.windowEnd = windowEnd;
    spec.onWindowEnd?.();
    const cpu = process.cpuUsage(cpuBefore);
    return {
      windowMs: windowEnd - run.windowStart,
      events: run.events,
      outputEvents: run.outputEvents,
      bytes: run.bytes,
      reads: run.reads,
      completed: run.completed,
      incomplete: run.incomplete,
      errors: run.errors,
      errorMessages: run.errorMessages,
      ttft: run.ttft,
      itl: run.itl,
      clientCpuUs: cpu.user + cpu.system,
    };
  } finally {
    clearInterval(sampler);
    for (const timer of ramp) clearTimeout(timer);
    run.stopping = true;
    for (const handler of run.handlers) handler.abort();
    await pool.destroy().catch(() => undefined);
  }
}
