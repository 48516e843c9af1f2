/**
 * A committed stream's ordinary read, taken whole (src/delivery/phases/attempt.ts, ordinaryRead), against the general
 * path it stands in for: the framer's block, the step, its effects. Two machines, each with its own framer, read the
 * same generated stream in the same reads at the same times; one frames every read, the other first offers each read
 * to `ordinaryRead` while its framer is between blocks, as the attempt does (src/proxy/attempt.ts). After every read
 * their records, their effects (a taken read's bytes counting as the write effect it stands for), their inter-token
 * gaps and their phases must be equal, and at the end their settlements. The streams mix what the fast path takes with
 * everything it must decline: events cut across reads or sharing one, CRLF, `data:` without its space, a changed id,
 * empty content, a second choice, an unexpected one, comments, an error event, `[DONE]` in mid-stream, usage, an event
 * of exactly the size limit and one past it; on both routes vLLM streams deltas on, with the client's socket filling
 * and draining between reads, and with an answer to assemble (an output contract, `captureAnswer`) or none.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { DeliveryMachine, type Effect, type MachineEvent } from '../src/delivery/machine.js';
import { RetryBudget } from '../src/delivery/retry-budget.js';
import { createFramer, type Framer } from '../src/sse/framer.js';
import { splitAt } from './fixtures/sse-fixtures.js';
import { requestInfo } from './helpers/ledger-info.js';

/** The size limit both sides read with (streaming.max_event_bytes). */
const MAX_EVENT_BYTES = 4096;

const chunkJson = (id: string, choices: unknown[], extra: Record<string, unknown> = {}, object = 'chat.completion.chunk') =>
  JSON.stringify({ id, object, created: 1, model: 'm', choices, ...extra });

/** The route's ordinary delta for choice `index`: a chat `delta.content`, or a legacy completion's `text`. */
function delta(route: Route, content: string, index = 0, id = 'c'): string {
  if (route === 'completions') return chunkJson(id, [{ index, text: content, logprobs: null, finish_reason: null }], {}, 'text_completion');
  return chunkJson(id, [{ index, delta: { content }, logprobs: null, finish_reason: null }]);
}

function finish(route: Route): string {
  if (route === 'completions') return chunkJson('c', [{ index: 0, text: '', logprobs: null, finish_reason: 'stop' }], {}, 'text_completion');
  return chunkJson('c', [{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }]);
}

/** A whole event of exactly `bytes` bytes: an ordinary delta whose content is padded to it. */
function eventOfSize(route: Route, bytes: number): string {
  const bare = `data: ${delta(route, '')}\n\n`.length;
  return `data: ${delta(route, 'x'.repeat(bytes - bare))}\n\n`;
}

interface Side {
  machine: DeliveryMachine;
  framer: Framer;
  /** Each effect carried out, as text (effects are reused objects). */
  trace: string[];
  gaps: number[];
  settlements: Settlement[];
  taken: number;
  /** The read being framed: its time (its blocks' stamp) and whether its last block so far ended it. */
  at: number;
  readEnded: boolean;
  /** The framer refused an event past the size limit: the attempt aborts ('oversized') after the read. */
  oversized: boolean;
}

type Route = 'chat_completions' | 'completions';
/** What the request asks that makes the record assemble its answer: nothing, an output contract, or the answer captured. */
type Assembly = 'none' | 'contract' | 'capture';

function side(n: number, assembly: Assembly, route: Route): Side {
  const gaps: number[] = [];
  const machine = new DeliveryMachine(
    {
      info: requestInfo({
        route,
        expectedChoices: n,
        ...(assembly === 'contract' && { contract: { content: { kind: 'json_object' }, tools: undefined, toolChoice: 'auto', compile: () => undefined } }),
        ...(assembly === 'capture' && { captureAnswer: true }),
      }),
      arrivalAt: 0,
      requestId: 'r',
      gated: false,
    },
    {
      settings: {
        totalMs: 1e9,
        firstOutputMs: 1e9,
        idleMs: 1e9,
        drainGraceMs: 50,
        maxEventBytes: MAX_EVENT_BYTES,
        maxHeldEvents: 8,
        maxAttempts: 1,
        retry: { retryOn500: true, backoffBaseMs: 10, backoffMaxMs: 20, retryAfterMaxMs: 100 },
      },
      budget: new RetryBudget({ ratio: 1, minPerSecond: 1000, windowMs: 10_000 }),
      random: () => 0.5,
      onInterTokenGap: (ms) => gaps.push(ms),
    },
  );
  const s: Side = { machine, framer: undefined as unknown as Framer, trace: [], gaps, settlements: [], taken: 0, at: 0, readEnded: false, oversized: false };
  s.framer = createFramer(
    {
      // As the attempt reports a block: stamped with its read's time, the read's last one ending it.
      onBlock: (raw, event, endsChunk) => {
        s.readEnded = endsChunk;
        handle(s, { type: 'block', attempt: 1, raw, event, endOfRead: endsChunk }, s.at);
        return true;
      },
      onOversized: () => void (s.oversized = true),
    },
    { maxEventBytes: MAX_EVENT_BYTES },
  );
  return s;
}

function handle(s: Side, event: MachineEvent, at: number): void {
  for (const effect of s.machine.handle(event, at)) carry(s, effect);
}

function carry(s: Side, effect: Effect): void {
  if (effect.kind === 'settle') s.settlements.push(effect.settlement);
  const detail = effect.kind === 'write' || effect.kind === 'end' ? (effect.data?.toString('latin1') ?? '') : JSON.stringify(effect, (key, value: unknown) => (key === 'settlement' || key === 'record' ? undefined : value));
  s.trace.push(`${effect.kind}:${detail}`);
}

/** One upstream read, at `at`: offered whole to the machine first when `fast`, as the attempt does, else framed. */
function read(s: Side, chunk: Buffer, at: number, fast: boolean, attempt = 1): void {
  if (fast && s.framer.idle) {
    const data = s.machine.ordinaryRead(attempt, chunk, at);
    if (data !== undefined) {
      s.taken++;
      s.trace.push(`write:${data.toString('latin1')}`);
      return;
    }
  }
  s.at = at;
  s.readEnded = false;
  s.framer.feed(chunk);
  // The read's last block ended it (endOfRead), or a chunk_done does (src/proxy/attempt.ts).
  if (!s.readEnded) handle(s, { type: 'chunk_done', attempt: 1 }, at);
  // An event past the limit: the attempt aborts, and its end is reported as the abort's reason.
  if (s.oversized) handle(s, { type: 'stream_end', attempt: 1, how: 'oversized' }, at);
}

/**
 * The machine's state after a read: the record, the idle clock's start, the phase and every other field, but what a
 * step leaves behind for its own reuse (its effect buffer and write effect) and what never changes (request, deps).
 */
function stateOf(s: Side): unknown {
  const { request: _request, deps: _deps, effects: _effects, effectCount: _count, writeEffect: _write, ...state } = Reflect.get(s.machine, 'state') as Record<string, unknown>;
  return structuredClone(state);
}

/** An event of the generated stream on `route`, as the bytes vLLM (or a stranger upstream) would send. */
function eventOf(route: Route): fc.Arbitrary<string> {
  const line = (data: string) => `data: ${data}\n\n`;
  return fc.oneof(
    // Choices 0 and 1 (the second unexpected when n is 1) and 2, whose content may be empty (a template without output).
    {
      weight: 24,
      arbitrary: fc.tuple(fc.string({ unit: 'binary', maxLength: 12 }), fc.constantFrom(0, 0, 0, 0, 1, 1, 2)).map(([text, index]) => line(delta(route, text, index))),
    },
    { weight: 6, arbitrary: fc.constantFrom('hi', ' the', 'é', '"', '\\n').map((text) => line(delta(route, text))) },
    { weight: 2, arbitrary: fc.constantFrom(0, 1).map((index) => line(delta(route, '', index))) },
    { weight: 1, arbitrary: fc.constant(line(delta(route, 'x', 5))) },
    { weight: 1, arbitrary: fc.constant(line(delta(route, 'x', 0, 'other'))) },
    { weight: 1, arbitrary: fc.constant(`data:${delta(route, 'x')}\n\n`) },
    { weight: 1, arbitrary: fc.constant(`data: ${delta(route, 'x')}\r\n\r\n`) },
    { weight: 1, arbitrary: fc.constant(`event: message\n${line(delta(route, 'x'))}`) },
    { weight: 2, arbitrary: fc.constantFrom(MAX_EVENT_BYTES, MAX_EVENT_BYTES + 1).map((bytes) => eventOfSize(route, bytes)) },
    { weight: 1, arbitrary: fc.constant(`: keep-alive\n\n`) },
    { weight: 1, arbitrary: fc.constant(`\n`) },
    { weight: 1, arbitrary: fc.constant(line(finish(route))) },
    { weight: 1, arbitrary: fc.constant(line(chunkJson('c', [], { usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 } }))) },
    { weight: 1, arbitrary: fc.constant(line('{"error":{"message":"boom","type":"InternalServerError","code":500}}')) },
    { weight: 1, arbitrary: fc.constant(line('[DONE]')) },
    { weight: 1, arbitrary: fc.constant(line('{"id":"broken')) },
  );
}

const STREAM = fc.constantFrom<Route>('chat_completions', 'completions').chain((route) =>
  fc.record({
    route: fc.constant(route),
    n: fc.constantFrom(1, 2),
    assembly: fc.constantFrom<Assembly>('none', 'none', 'none', 'none', 'none', 'none', 'contract', 'capture'),
    events: fc.array(eventOf(route), { minLength: 1, maxLength: 30 }),
    /** How the stream's bytes are cut into reads: one event a read, or cuts anywhere. */
    cuts: fc.option(fc.array(fc.nat(), { maxLength: 12 }), { freq: 3 }),
    /** Milliseconds between reads (0: reads at the same time). */
    steps: fc.array(fc.constantFrom(0, 0.25, 1, 7), { minLength: 1, maxLength: 8 }),
    /** After which reads the client's socket fills, and after which it drains (pausing and resuming the attempt). */
    blockedAfter: fc.array(fc.nat({ max: 40 }), { maxLength: 4 }),
    drainedAfter: fc.array(fc.nat({ max: 40 }), { maxLength: 4 }),
  }),
);

function readsOf(route: Route, events: string[], cuts: number[] | null): Buffer[] {
  // vLLM opens a chat stream with the role; a legacy completion's first text is its first event.
  const opening = route === 'chat_completions' ? [`data: ${chunkJson('c', [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }])}\n\n`] : [];
  const all = [...opening, ...events, `data: [DONE]\n\n`];
  if (cuts === null) return all.map((event) => Buffer.from(event));
  const bytes = Buffer.from(all.join(''));
  return splitAt(bytes, [...new Set(cuts.map((cut) => cut % bytes.length))].filter((cut) => cut > 0).sort((a, b) => a - b));
}

interface Script {
  reads: Buffer[];
  steps: number[];
  blockedAfter?: number[];
  drainedAfter?: number[];
}

/** Runs a side over the script's reads, the client's socket filling and draining between them; then both ends. */
function run(s: Side, fast: boolean, script: Script, afterEach: (s: Side) => void = () => undefined): Side {
  handle(s, { type: 'start' }, 0);
  handle(s, { type: 'attempt_started', attempt: 1, upstream: 'a' }, 0);
  handle(s, { type: 'response_start', attempt: 1, status: 200, contentType: 'text/event-stream', retryAfterMs: undefined }, 1);
  let at = 1;
  script.reads.forEach((chunk, i) => {
    at += script.steps[i % script.steps.length] as number;
    if (!s.oversized) read(s, chunk, at, fast);
    if (script.blockedAfter?.includes(i) === true) handle(s, { type: 'client_blocked' }, at);
    if (script.drainedAfter?.includes(i) === true) handle(s, { type: 'client_drain' }, at);
    afterEach(s);
  });
  if (!s.oversized) handle(s, { type: 'stream_end', attempt: 1, how: 'eof' }, at);
  handle(s, { type: 'attempt_settled', attempt: 1 }, at);
  handle(s, { type: 'client_drain' }, at);
  handle(s, { type: 'client_finish', socketDestroyed: false }, at + 1);
  return s;
}

const answered = (s: Side): unknown[] => (Reflect.get(s.machine, 'state') as { record: { answered: unknown[] } }).record.answered;

describe('a committed stream’s ordinary read, taken whole, against framing it', () => {
  it('gives the same state, effects, inter-token gaps and settlement, read by read', () => {
    let taken = 0;
    fc.assert(
      fc.property(STREAM, ({ route, n, assembly, events, cuts, steps, blockedAfter, drainedAfter }) => {
        const script = { reads: readsOf(route, events, cuts), steps, blockedAfter, drainedAfter };
        // The general side's state after each read is the oracle of the fast side's after the same read.
        const states: unknown[] = [];
        const traced: number[] = [];
        const general = run(side(n, assembly, route), false, script, (s) => {
          states.push(stateOf(s));
          traced.push(s.trace.length);
        });
        let i = 0;
        const fast = run(side(n, assembly, route), true, script, (s) => {
          expect(stateOf(s)).toStrictEqual(states[i]);
          expect(s.trace).toEqual(general.trace.slice(0, traced[i]));
          i++;
        });
        expect(fast.trace).toEqual(general.trace);
        expect(fast.gaps).toEqual(general.gaps);
        expect(fast.machine.phase).toBe(general.machine.phase);
        expect(fast.settlements).toHaveLength(1);
        expect(fast.settlements).toStrictEqual(general.settlements);
        // An answer to assemble is assembled on the general path only.
        if (assembly !== 'none') expect(fast.taken).toBe(0);
        taken += fast.taken;
      }),
      { numRuns: 400 },
    );
    // The streams are mostly whole ordinary deltas: the fast path must have been taken, or this compared nothing.
    expect(taken).toBeGreaterThan(100);
  });

  it('takes every ordinary delta after the one that commits, and nothing else, in vLLM’s usual stream, on both routes', () => {
    for (const route of ['chat_completions', 'completions'] as const) {
      const events = Array.from({ length: 20 }, (_, k) => `data: ${delta(route, `t${k}`)}\n\n`);
      events.push(`data: ${finish(route)}\n\n`);
      const script = { reads: readsOf(route, events, null), steps: [10] };
      const general = run(side(1, 'none', route), false, script);
      const fast = run(side(1, 'none', route), true, script);
      // The first content commits and keeps the template: the other 19 deltas are taken whole.
      expect(fast.taken).toBe(19);
      expect(general.taken).toBe(0);
      expect(fast.gaps).toEqual(Array.from({ length: 19 }, () => 10));
      expect(fast.trace).toEqual(general.trace);
      expect(fast.settlements[0]?.outcome).toBe('delivered');
      expect(fast.settlements).toStrictEqual(general.settlements);
    }
  });

  it('marks a choice answered when its first output is taken whole, after a template kept from its empty content', () => {
    // Choice 0's template comes from a delta without output; choice 1's first output commits; choice 0's first output
    // then matches its template and is taken whole: it must still answer choice 0.
    const route = 'chat_completions';
    const events = [`data: ${delta(route, '', 0)}\n\n`, `data: ${delta(route, 'a', 1)}\n\n`, `data: ${delta(route, 'b', 0)}\n\n`];
    const script = { reads: readsOf(route, events, null), steps: [1] };
    const general = run(side(2, 'none', route), false, script);
    const fast = run(side(2, 'none', route), true, script);
    expect(fast.taken).toBe(1);
    expect(stateOf(fast)).toStrictEqual(stateOf(general));
    expect(answered(fast)).toEqual([true, true]);
  });

  it('takes an event of exactly the size limit, and declines one a byte past it, which the framer refuses', () => {
    const route = 'chat_completions';
    const events = [`data: ${delta(route, 'a')}\n\n`, eventOfSize(route, MAX_EVENT_BYTES), eventOfSize(route, MAX_EVENT_BYTES + 1)];
    const script = { reads: readsOf(route, events, null), steps: [1] };
    const general = run(side(1, 'none', route), false, script);
    const fast = run(side(1, 'none', route), true, script);
    expect(fast.taken).toBe(1);
    expect(fast.settlements).toStrictEqual(general.settlements);
    expect(fast.settlements[0]?.anomalies.map((a) => a.kind)).toContain('oversized_event');
  });

  it('declines, with nothing changed, a read of an attempt that is not the current one or before the stream commits', () => {
    const route = 'chat_completions';
    const s = side(1, 'none', route);
    handle(s, { type: 'start' }, 0);
    handle(s, { type: 'attempt_started', attempt: 1, upstream: 'a' }, 0);
    handle(s, { type: 'response_start', attempt: 1, status: 200, contentType: 'text/event-stream', retryAfterMs: undefined }, 1);
    const ordinary = Buffer.from(`data: ${delta(route, 'b')}\n\n`);
    read(s, Buffer.from(`data: ${delta(route, '')}\n\n`), 2, false);
    // A template is kept (from the empty delta), but nothing is committed yet.
    const before = stateOf(s);
    expect(s.machine.ordinaryRead(1, ordinary, 3)).toBeUndefined();
    expect(stateOf(s)).toStrictEqual(before);
    read(s, Buffer.from(`data: ${delta(route, 'a')}\n\n`), 4, false);
    expect(s.machine.phase).toBe('streaming');
    const committed = stateOf(s);
    expect(s.machine.ordinaryRead(2, ordinary, 5)).toBeUndefined();
    expect(stateOf(s)).toStrictEqual(committed);
    expect(s.machine.ordinaryRead(1, ordinary, 5)).toBe(ordinary);
  });
});
