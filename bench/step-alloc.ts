/**
 * Bytes the delivery machine allocates per streamed event — its reducer, `step` (src/delivery/step.ts), through
 * DeliveryMachine.handle, the one call the shell makes: the core's own share of the per-event cost, apart from
 * the framer (events are framed once, before the measurement) and the shell. A request is driven through its whole
 * life — start, admission, an attempt, the head, N token events each followed by the end of its upstream read
 * (`chunk_done`; framed, the block that ends its read, `endOfRead`, as the attempt reports it), `[DONE]`, the stream's
 * end, the client's finish, settlement — the way src/proxy/exchange.ts drives it, and the V8 heap is read around
 * batches of events.
 *
 *   npm run build && node dist/bench/step-alloc.js [--requests 400] [--tokens 64]
 *
 * Method: `process.memoryUsage().heapUsed` before and after each batch of one request's token events; a batch in
 * which a scavenge ran reads lower than it allocated, so batches whose heap shrank are dropped and the median of the
 * others is reported (a batch is ~64 events, a few kB: most batches see no GC). The per-request figure is the same
 * for one request's whole life, settlement included. Deterministic input, so the figure is stable to a few bytes;
 * compare runs of the same Node version. Issue 26 held the phase reducer to the class machine's figure: 237.4 B per
 * event and 26.2 kB per request before it, 237.5 B and 26.3 kB after (node 20.20).
 */
import { promptLenClasses } from '../src/accounting/prompt-len.js';
import { DeliveryMachine, type MachineEvent } from '../src/delivery/machine.js';
import { RetryBudget } from '../src/delivery/retry-budget.js';
import { createFramer, DataLineEvent, type SseEvent } from '../src/sse/framer.js';

interface Options {
  requests: number;
  tokens: number;
  /** Each token event fed through a framer as one upstream read, reported as the attempt reports it (proxy/attempt.ts). */
  framed?: boolean;
}

function parse(argv: string[]): Options {
  const options: Options = { requests: 400, tokens: 64 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = Number(argv[++i]);
    if (!Number.isInteger(value) || value <= 0) throw new Error(`${flag} takes a positive integer`);
    if (flag === '--requests') options.requests = value;
    else if (flag === '--tokens') options.tokens = value;
    else throw new Error(`unknown flag ${flag} (--requests N, --tokens N)`);
  }
  return options;
}

const chunk = (delta: Record<string, unknown>, finish: string | null): string =>
  JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] });

/** One framed event as the framer reports it: the raw block and its event, the `data:` value undecoded in it. */
function framed(data: string): { raw: Buffer; event: SseEvent } {
  const raw = Buffer.from(`data: ${data}\n\n`);
  return { raw, event: new DataLineEvent(raw, 'data: '.length, raw.length - 2) };
}

const ROLE = framed(chunk({ role: 'assistant', content: '' }, null));
const TOKEN = framed(chunk({ content: ' tok' }, null));
const LAST = framed(chunk({}, 'length'));
const USAGE = framed(JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: { prompt_tokens: 12, completion_tokens: 64, total_tokens: 76 } }));
const DONE = framed('[DONE]');

function machine(budget: RetryBudget): DeliveryMachine {
  return new DeliveryMachine(
    {
      info: {
        model: 'm',
        route: 'chat_completions',
        stream: true,
        expectedChoices: 1,
        dropUsageChunk: true,
        slo: { ttftMs: 1000, tpotMs: 50, e2eMs: 60_000, ttftByPromptLenMs: {} },
        promptLenBoundaries: [1024],
        promptLenClasses: promptLenClasses([1024]),
      },
      arrivalAt: 0,
      requestId: 'r',
      gated: false,
    },
    {
      settings: {
        totalMs: 600_000,
        firstOutputMs: 60_000,
        idleMs: 60_000,
        drainGraceMs: 1000,
        maxEventBytes: 1 << 20,
        maxHeldEvents: 64,
        maxAttempts: 2,
        retry: { retryOn500: false, backoffBaseMs: 100, backoffMaxMs: 1000, retryAfterMaxMs: 1000 },
      },
      budget,
      random: () => 0.5,
      onInterTokenGap: () => {},
    },
  );
}

/** Events are built once and reused: what is measured is the machine's step, not the making of its input. */
const block = (attempt: number, f: { raw: Buffer; event: SseEvent }): MachineEvent => ({ type: 'block', attempt, raw: f.raw, event: f.event });

function heap(): number {
  return process.memoryUsage().heapUsed;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length === 0 ? Number.NaN : sorted[Math.floor(sorted.length / 2)]!;
}

function run(options: Options): { perEvent: number; perRequest: number; batches: number; dropped: number } {
  const budget = new RetryBudget({ ratio: 0.2, minPerSecond: 10, windowMs: 10_000 });
  const token = block(1, TOKEN);
  const chunkDone: MachineEvent = { type: 'chunk_done', attempt: 1 };
  const head: MachineEvent = { type: 'response_start', attempt: 1, status: 200, contentType: 'text/event-stream', retryAfterMs: undefined };
  const perEvent: number[] = [];
  const perRequest: number[] = [];
  let dropped = 0;
  let at = 0;
  for (let r = 0; r < options.requests; r++) {
    const requestFrom = heap();
    const m = machine(budget);
    m.handle({ type: 'start' }, at);
    m.handle({ type: 'attempt_started', attempt: 1, upstream: 'a' }, at);
    m.handle(head, (at += 1));
    m.handle(block(1, ROLE), (at += 1));
    m.handle(chunkDone, at);
    // Framed: one framer per upstream response, as the attempt has, and one block report reused as the attempt reuses
    // it when the exchange takes each event at once (the machine is called synchronously here): both handed back.
    const report: Extract<MachineEvent, { type: 'block' }> = { type: 'block', attempt: 1, raw: TOKEN.raw, event: null, endOfRead: false };
    let readEnded = false;
    const framer = options.framed === true
      ? createFramer({
          onBlock: (raw, event, endsChunk) => {
            report.raw = raw;
            report.event = event;
            report.endOfRead = endsChunk;
            readEnded = endsChunk;
            m.handle(report, at);
            return true;
          },
          onOversized: () => {
            throw new Error('oversized');
          },
        })
      : undefined;
    // The first token is not counted: the stream's first content chunk makes its classifier's templates, once per
    // request (src/sse/stream-head.ts), which the per-request figure holds.
    let from = 0;
    for (let t = -1; t < options.tokens; t++) {
      if (t === 0) from = heap();
      at += 1;
      readEnded = false;
      if (framer === undefined) m.handle(token, at);
      else framer.feed(TOKEN.raw);
      if (!readEnded) m.handle(chunkDone, at);
    }
    const used = heap() - from;
    if (used >= 0) perEvent.push(used / options.tokens);
    else dropped++;
    m.handle(block(1, LAST), (at += 1));
    m.handle(block(1, USAGE), at);
    m.handle(block(1, DONE), at);
    m.handle(chunkDone, at);
    m.handle({ type: 'stream_end', attempt: 1, how: 'eof' }, at);
    m.handle({ type: 'attempt_settled', attempt: 1 }, at);
    const last = m.handle({ type: 'client_finish', socketDestroyed: false }, (at += 1));
    const settle = last.find((effect) => effect.kind === 'settle');
    // What is measured must be the delivered path: a request that failed early would allocate less and read as a gain.
    if (settle?.kind !== 'settle' || settle.settlement.outcome !== 'delivered') throw new Error(`request ${r} did not settle delivered`);
    const whole = heap() - requestFrom;
    if (whole >= 0) perRequest.push(whole);
  }
  return { perEvent: median(perEvent), perRequest: median(perRequest), batches: perEvent.length, dropped };
}

const options = parse(process.argv.slice(2));
console.log(`step-alloc: ${options.requests} requests × ${options.tokens} token events (node ${process.version})`);
for (const framed of [false, true]) {
  const mode = { ...options, framed };
  run({ ...mode, requests: Math.min(100, options.requests) }); // warm up: the JIT's own allocations are not the step's
  const result = run(mode);
  console.log(framed ? '  framer + step (each event one upstream read through a framer):' : '  the step alone (events framed once, beforehand):');
  console.log(`    bytes per streamed event (token + end of read), median: ${result.perEvent.toFixed(1)}`);
  console.log(`    bytes per request, whole life incl. settlement, median: ${Math.round(result.perRequest)}`);
  console.log(`    batches measured ${result.batches}, dropped (a GC ran) ${result.dropped}`);
}
