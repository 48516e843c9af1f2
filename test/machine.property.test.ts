/**
 * The delivery machine alone, under random interleavings of everything that can happen to a request: attempts that
 * fail in every way, timers firing early or late (any armed timer may fire at any step), the client leaving in every
 * phase, a slow client, admission, drain. A small model of the shell carries out the effects the way the real one
 * does (only what is armed can fire, only a started attempt can report, an abort ends the attempt later) and checks
 * the machine's invariants on every step, and that its phase moves only along the arrows of the phase table
 * (test/delivery-phases.test.ts has one example of each). No sockets: thousands of interleavings run in a second or two.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { promptLenClasses } from '../src/accounting/prompt-len.js';
import type { Settlement, StreamEnd } from '../src/accounting/ledger.js';
import { DeliveryMachine, type AbortReason, type Effect, type MachineEvent, type TimerName } from '../src/delivery/machine.js';
import { RetryBudget } from '../src/delivery/retry-budget.js';
import type { Phase } from '../src/delivery/state.js';
import type { SseEvent } from '../src/sse/framer.js';

const UPSTREAMS = ['a', 'b', 'c'];

const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) =>
  JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices, ...extra });

/** Upstream events the model can send, as SSE data (null: a comment, '' : blank lines). */
const BLOCKS: Array<string | null> = [
  chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }]),
  chunk([{ index: 0, delta: { content: 'hi' }, finish_reason: null }]),
  chunk([{ index: 1, delta: { content: 'hi' }, finish_reason: null }]),
  chunk([{ index: 0, delta: {}, finish_reason: 'stop' }]),
  chunk([{ index: 1, delta: {}, finish_reason: 'length' }]),
  chunk([{ index: 7, delta: {}, finish_reason: 'stop' }]),
  chunk([], { usage: { prompt_tokens: 5, completion_tokens: 3 } }),
  chunk([], { usage: { prompt_tokens: 1e308, completion_tokens: 3 } }),
  '{"error":{"message":"boom","type":"InternalServerError","code":500}}',
  '{"error":{"message":"bad","type":"BadRequestError","code":400}}',
  '[DONE]',
  '{"id":"broken',
  null,
  '',
];

const ENDS: StreamEnd[] = ['eof', 'reset', 'oversized'];

/** Where each phase may go in one step (itself included): never back before commit, never on from the end. */
const NEXT_PHASES: Record<Phase, readonly Phase[]> = {
  idle: ['idle', 'admitting', 'attempting', 'ending', 'settled'],
  admitting: ['admitting', 'attempting', 'ending', 'settled'],
  attempting: ['attempting', 'streaming', 'backing_off', 'ending', 'settled'],
  streaming: ['streaming', 'ending', 'settled'],
  backing_off: ['backing_off', 'attempting', 'ending', 'settled'],
  ending: ['ending', 'settled'],
  settled: ['settled'],
};
const STATUSES = [200, 200, 200, 302, 400, 429, 500, 503];

interface Run {
  /** Events and effects in order, for a failing case's report. */
  log: string[];
  effects: Effect[];
  settlements: Settlement[];
  written: string;
  violations: string[];
  /** Each effect as it was carried out (kind, timer or status, bytes written): effects are reused objects. */
  trace: string[];
}

/**
 * Drives one machine with a sequence of choices: at each step the enabled actions are listed and `choice % n` picks
 * one. After the choices run out, a close-out phase (the client reads everything, every attempt ends, every timer
 * fires) drives the request to its end, as the real world eventually does.
 */
function drive(choices: number[], options: { gated: boolean; stream: boolean; n: number; maxAttempts: number; endOfRead: boolean }): Run {
  const machine = new DeliveryMachine(
    {
      info: {
        model: 'm',
        route: 'chat_completions',
        stream: options.stream,
        expectedChoices: options.n,
        dropUsageChunk: true,
        slo: { ttftMs: 1000, tpotMs: 50, e2eMs: 5000, ttftByPromptLenMs: {} },
        promptLenBoundaries: [1024],
        promptLenClasses: promptLenClasses([1024]),
      },
      arrivalAt: 0,
      requestId: 'r',
      gated: options.gated,
    },
    {
      settings: {
        totalMs: 1000,
        firstOutputMs: 500,
        idleMs: 200,
        drainGraceMs: 50,
        maxEventBytes: 4096,
        maxHeldEvents: 4,
        maxAttempts: options.maxAttempts,
        retry: { retryOn500: true, backoffBaseMs: 10, backoffMaxMs: 20, retryAfterMaxMs: 100 },
      },
      budget: new RetryBudget({ ratio: 1, minPerSecond: 1000, windowMs: 10_000 }),
      random: () => 0.5,
      onInterTokenGap: () => undefined,
    },
  );
  const run: Run = { log: [], effects: [], settlements: [], written: '', violations: [], trace: [] };
  const armed = new Set<TimerName>();
  const tried = new Set<string>();
  let now = 0;
  let pendingStart: { attempt: number; avoid: ReadonlySet<string>; aborted: AbortReason | undefined } | undefined;
  /** The attempt the model's upstream is serving, and why it has been told to stop (if it has). */
  let attempt: { number: number; upstream: string; responded: boolean; aborted: AbortReason | undefined; framing: boolean; ended: boolean } | undefined;
  const closing: number[] = [];
  let inFlight = 0;
  let admissionAsked = false;
  let admissionGiven = false;
  let headSent = false;
  let ended = false;
  let clientGone = false;
  let blocked = false;
  let settled = false;
  const queue: MachineEvent[] = [];

  const violate = (what: string) => run.violations.push(`${what} — after: ${run.log.slice(-12).join(' | ')}`);

  const execute = (effect: Effect) => {
    run.effects.push(effect);
    run.log.push(`  ${effect.kind}${'timer' in effect ? `:${effect.timer}` : ''}${'status' in effect ? `:${effect.status}` : ''}`);
    run.trace.push(`${run.log.at(-1) ?? ''}${'data' in effect && effect.data !== undefined ? `:${effect.data.toString()}` : ''}`);
    if (settled && effect.kind !== 'attempt_over') violate(`effect after settlement: ${effect.kind}`);
    switch (effect.kind) {
      case 'arm':
        armed.add(effect.timer);
        return;
      case 'clear':
        armed.delete(effect.timer);
        return;
      case 'acquire_admission':
        admissionAsked = true;
        return;
      case 'cancel_admission':
      case 'release_admission':
        return;
      case 'start_attempt':
        if (inFlight > 0) violate(`start_attempt ${effect.attempt} with ${inFlight} attempt(s) in flight`);
        if (effect.attempt > 1 && headSent) violate('a retry after commit');
        for (const name of tried) if (!effect.avoid.has(name)) violate(`retry may reuse ${name}, already tried`);
        pendingStart = { attempt: effect.attempt, avoid: new Set(effect.avoid), aborted: undefined };
        inFlight++;
        return;
      case 'abort_attempt':
        // The shell aborts the attempt it created last, also one whose start the machine has not heard of yet.
        if (pendingStart !== undefined) pendingStart.aborted ??= effect.reason;
        else if (attempt !== undefined && !attempt.ended) attempt.aborted ??= effect.reason;
        return;
      case 'pause_attempt':
      case 'resume_attempt':
        return;
      case 'write_head':
        if (ended || clientGone) violate('write_head after the end');
        if (headSent) violate('write_head twice');
        headSent = true;
        return;
      case 'write':
        if (ended || clientGone) violate('write after the end');
        if (!headSent) violate('write before write_head');
        run.written += effect.data.toString();
        return;
      case 'end':
        if (ended || clientGone) violate('end after the end');
        if (!headSent) violate('end before write_head');
        ended = true;
        if (effect.data !== undefined) run.written += effect.data.toString();
        return;
      case 'destroy_client':
        if (!clientGone) queue.push({ type: 'client_close' });
        clientGone = true;
        return;
      case 'attempt_over':
        return;
      case 'observe':
        return;
      case 'settle':
        if (settled) violate('settled twice');
        settled = true;
        run.settlements.push(effect.settlement);
        if (armed.size > 0) violate(`timers still armed at settlement: ${[...armed].join(',')}`);
        if (inFlight > 0) violate('settled with an attempt in flight');
        return;
    }
  };

  const send = (event: MachineEvent) => {
    queue.push(event);
    for (let next = queue.shift(); next !== undefined; next = queue.shift()) {
      run.log.push(`${next.type}${'timer' in next ? `:${next.timer}` : ''}${'status' in next ? `:${next.status}` : ''}${'how' in next ? `:${next.how}` : ''}`);
      const from = machine.phase;
      for (const effect of machine.handle(next, now)) execute(effect);
      checkPhase(from, machine.phase);
    }
  };

  /** The phase moves only along the arrows of test/delivery-phases.test.ts's table, and agrees with what was written. */
  const checkPhase = (from: Phase, to: Phase) => {
    if (!NEXT_PHASES[from].includes(to)) violate(`phase ${from} → ${to}`);
    if ((to === 'settled') !== settled) violate(`phase ${to} with the request ${settled ? '' : 'not '}settled`);
    if (to === 'streaming' && (!headSent || ended)) violate('streaming without a head, or after the end');
    if (to === 'ending' && !ended && !clientGone) violate('ending with the response neither ended nor left');
    if ((to === 'attempting' || to === 'admitting' || to === 'backing_off') && ended) violate(`${to} after the end`);
  };

  /**
   * Every action enabled now, each a thunk. The client leaving and the shutdown end most requests at once, so they
   * are offered on one step in four: otherwise few runs would get past the first events.
   */
  const enabled = (rare: boolean): Array<() => void> => {
    const actions: Array<() => void> = [];
    for (const timer of armed) {
      actions.push(() => {
        armed.delete(timer);
        send({ type: 'timer', timer });
      });
    }
    if (admissionAsked && !admissionGiven) {
      actions.push(() => {
        admissionGiven = true;
        send({ type: 'admission', admitted: true, reason: undefined, waitedMs: 3 });
      });
      actions.push(() => {
        admissionGiven = true;
        send({ type: 'admission', admitted: false, reason: 'queue_full', waitedMs: 0 });
      });
      actions.push(() => send({ type: 'queued' }));
    }
    if (pendingStart !== undefined) {
      const start = pendingStart;
      for (const upstream of UPSTREAMS) {
        actions.push(() => {
          pendingStart = undefined;
          // The shell's picker prefers upstreams not in avoid; when all were tried it reuses one.
          const untried = UPSTREAMS.filter((u) => !start.avoid.has(u));
          const name = untried.length > 0 ? (untried.includes(upstream) ? upstream : (untried[0] as string)) : upstream;
          tried.add(name);
          attempt = { number: start.attempt, upstream: name, responded: false, aborted: start.aborted, framing: false, ended: false };
          send({ type: 'attempt_started', attempt: start.attempt, upstream: name });
        });
      }
      actions.push(() => {
        pendingStart = undefined;
        inFlight--;
        send({ type: 'no_upstream' });
      });
    }
    const current = attempt;
    if (current !== undefined && !current.ended) {
      const number = current.number;
      const finish = () => {
        current.ended = true;
        closing.push(number);
      };
      const aborted = current.aborted;
      if (aborted !== undefined) {
        // As the real attempt does: an abort for a reason of Waybill's own is reported as the stream's end.
        actions.push(() => {
          if (aborted !== 'cancelled' && aborted !== 'drained') send({ type: 'stream_end', attempt: number, how: aborted });
          finish();
        });
      } else if (!current.responded) {
        for (const status of STATUSES) {
          actions.push(() => {
            current.responded = true;
            send({ type: 'response_start', attempt: number, status, contentType: 'text/event-stream', retryAfterMs: status === 429 ? 20 : undefined });
            if (status === 200 && options.stream) current.framing = true;
            else {
              send({ type: 'body', attempt: number, status, body: Buffer.from(status === 200 ? `{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"stop"}]}` : '{"error":{"message":"no","code":500}}') });
              finish();
            }
          });
        }
        actions.push(() => {
          send({ type: 'network_failure', attempt: number, failure: 'connect_error', message: 'ECONNREFUSED' });
          finish();
        });
      } else if (current.framing) {
        for (const data of BLOCKS) {
          actions.push(() => {
            const raw = data === null ? ': ping\n\n' : data === '' ? '\n\n' : `data: ${data}\n\n`;
            const event: SseEvent | null = data === null || data === '' ? null : { type: 'message', data, id: undefined };
            // A read of one block: the block ends the read itself, as the shell sends it, or a chunk_done follows it.
            if (options.endOfRead) {
              send({ type: 'block', attempt: number, raw: Buffer.from(raw), event, endOfRead: true });
            } else {
              send({ type: 'block', attempt: number, raw: Buffer.from(raw), event });
              send({ type: 'chunk_done', attempt: number });
            }
          });
        }
        for (const how of ENDS) {
          actions.push(() => {
            send({ type: 'stream_end', attempt: number, how });
            finish();
          });
        }
      }
    }
    for (const number of closing.splice(0)) {
      // An ended attempt reports its settlement: sometimes now, sometimes after other things happened.
      actions.push(() => {
        inFlight--;
        send({ type: 'attempt_settled', attempt: number });
      });
      closing.push(number);
    }
    if (!clientGone && !settled) {
      if (rare) {
        actions.push(() => {
          clientGone = true;
          send({ type: 'client_close' });
        });
      }
      if (headSent && !blocked && !ended) {
        actions.push(() => {
          blocked = true;
          send({ type: 'client_blocked' });
        });
      }
      if (blocked) {
        actions.push(() => {
          blocked = false;
          send({ type: 'client_drain' });
        });
      }
      if (ended) {
        actions.push(() => {
          clientGone = true;
          send({ type: 'client_finish', socketDestroyed: false });
        });
      }
    }
    if (rare) actions.push(() => send({ type: 'shutdown' }));
    return actions;
  };

  /** Settles the attempts that ended, in order, and removes them from `closing`. */
  const settleClosing = () => {
    for (const number of closing.splice(0)) {
      inFlight--;
      send({ type: 'attempt_settled', attempt: number });
    }
  };

  send({ type: 'start' });
  for (const choice of choices) {
    if (settled) break;
    now += choice % 7;
    const actions = enabled(choice % 4 === 0);
    const action = actions[choice % actions.length];
    action?.();
    // A closing attempt that was not picked stays closing: re-list it once.
    const seen = new Set<number>();
    for (let i = closing.length - 1; i >= 0; i--) {
      const number = closing[i] as number;
      if (seen.has(number)) closing.splice(i, 1);
      seen.add(number);
    }
  }
  // Close-out: the world moves on until the request ends.
  for (let guard = 0; guard < 200 && !settled; guard++) {
    now += 10;
    settleClosing();
    const aborted = attempt?.aborted;
    if (attempt !== undefined && !attempt.ended && aborted !== undefined) {
      if (aborted !== 'cancelled' && aborted !== 'drained') send({ type: 'stream_end', attempt: attempt.number, how: aborted });
      attempt.ended = true;
      closing.push(attempt.number);
      continue;
    }
    if (pendingStart !== undefined) {
      const start = pendingStart;
      pendingStart = undefined;
      const name = UPSTREAMS.find((u) => !start.avoid.has(u)) ?? 'a';
      tried.add(name);
      attempt = { number: start.attempt, upstream: name, responded: false, aborted: start.aborted, framing: false, ended: false };
      send({ type: 'attempt_started', attempt: start.attempt, upstream: name });
      continue;
    }
    if (admissionAsked && !admissionGiven) {
      admissionGiven = true;
      send({ type: 'admission', admitted: true, reason: undefined, waitedMs: 1 });
      continue;
    }
    if (ended && !clientGone) {
      clientGone = true;
      send({ type: 'client_finish', socketDestroyed: false });
      continue;
    }
    const timer = armed.values().next().value;
    if (timer !== undefined) {
      armed.delete(timer);
      send({ type: 'timer', timer });
      continue;
    }
    if (!clientGone) {
      clientGone = true;
      send({ type: 'client_close' });
      continue;
    }
  }
  if (!settled) violate('never settled');
  // [DONE] reaches the client iff the request was delivered (streams).
  const settlement = run.settlements[0];
  if (settlement !== undefined && options.stream) {
    const sawDone = run.written.includes('data: [DONE]');
    const delivered = settlement.outcome === 'delivered';
    if (sawDone !== delivered && !(sawDone && settlement.outcome === 'client_cancelled')) {
      violate(`[DONE] written: ${sawDone}, outcome: ${settlement.outcome}`);
    }
    if (delivered && !run.written.endsWith('data: [DONE]\n\n')) violate('delivered without ending on [DONE]');
  }
  return run;
}

const options = fc.record({
  gated: fc.boolean(),
  stream: fc.boolean(),
  n: fc.integer({ min: 1, max: 2 }),
  maxAttempts: fc.integer({ min: 1, max: 4 }),
  endOfRead: fc.boolean(),
});

describe('the delivery machine under random interleavings', () => {
  it('settles exactly once, one attempt at a time, nothing after the end, [DONE] iff delivered, no timer left, retries only before commit and to untried upstreams', () => {
    fc.assert(
      fc.property(fc.array(fc.nat({ max: 1_000_000 }), { maxLength: 80 }), options, (choices, opts) => {
        const run = drive(choices, opts);
        expect(run.violations).toEqual([]);
        expect(run.settlements).toHaveLength(1);
      }),
      { numRuns: 3000 },
    );
  });

  it("a block that ends its read does what the block and a chunk_done after it do: the same effects, bytes and settlement", () => {
    let streamed = 0;
    let blocks = 0;
    // Streams, ungated: the runs that read blocks.
    const streams = fc.record({ gated: fc.constant(false), stream: fc.constant(true), n: fc.integer({ min: 1, max: 2 }), maxAttempts: fc.integer({ min: 1, max: 4 }) });
    fc.assert(
      fc.property(fc.array(fc.nat({ max: 1_000_000 }), { minLength: 20, maxLength: 120 }), streams, (choices, opts) => {
        const merged = drive(choices, { ...opts, endOfRead: true });
        const split = drive(choices, { ...opts, endOfRead: false });
        blocks += merged.log.filter((line) => line === 'block').length;
        if (merged.log.includes('block')) streamed++;
        expect(merged.violations).toEqual([]);
        expect(merged.trace).toEqual(split.trace);
        expect(merged.written).toBe(split.written);
        expect(merged.settlements).toEqual(split.settlements);
      }),
      { numRuns: 2000 },
    );
    // Not vacuous: about one run in nine reads blocks (the others end before: a refusal, a timer, the client leaving),
    // ~230 of 2000 (binomial: below 150 is more than five standard deviations away).
    expect(streamed).toBeGreaterThan(150);
    expect(blocks).toBeGreaterThan(2 * streamed);
  });

  it('reaches every outcome, so the property above is not vacuous', () => {
    const outcomes = new Set<string>();
    fc.assert(
      fc.property(fc.array(fc.nat({ max: 1_000_000 }), { maxLength: 80 }), options, (choices, opts) => {
        const settlement = drive(choices, opts).settlements[0];
        if (settlement !== undefined) outcomes.add(settlement.outcome);
      }),
      { numRuns: 3000, seed: 42 },
    );
    expect([...outcomes].sort()).toEqual(['client_cancelled', 'delivered', 'failed', 'incomplete', 'rejected', 'stream_error', 'timeout']);
  });

  it('a retry waits for the failed attempt to end: never two attempts in flight', () => {
    const machine = new DeliveryMachine(
      {
        info: { model: 'm', route: 'chat_completions', stream: true, expectedChoices: 1, dropUsageChunk: true, slo: { ttftMs: 1, tpotMs: 1, e2eMs: 1, ttftByPromptLenMs: {} }, promptLenBoundaries: [], promptLenClasses: ['unknown'] },
        arrivalAt: 0,
        requestId: 'r',
        gated: false,
      },
      {
        settings: { totalMs: 1000, firstOutputMs: 500, idleMs: 200, drainGraceMs: 50, maxEventBytes: 4096, maxHeldEvents: 4, maxAttempts: 3, retry: { retryOn500: true, backoffBaseMs: 10, backoffMaxMs: 20, retryAfterMaxMs: 100 } },
        budget: new RetryBudget({ ratio: 1, minPerSecond: 1000, windowMs: 10_000 }),
        random: () => 0.5,
        onInterTokenGap: () => undefined,
      },
    );
    const kinds = (effects: readonly Effect[]) => effects.map((e) => e.kind);
    expect(kinds(machine.handle({ type: 'start' }, 0))).toEqual(['observe', 'arm', 'start_attempt']);
    machine.handle({ type: 'attempt_started', attempt: 1, upstream: 'a' }, 1);
    machine.handle({ type: 'response_start', attempt: 1, status: 503, contentType: 'application/json', retryAfterMs: undefined }, 2);
    const failed = machine.handle({ type: 'body', attempt: 1, status: 503, body: Buffer.from('{}') }, 3);
    expect(kinds(failed)).toEqual(['observe', 'abort_attempt', 'arm']);
    // The retry timer fires before the aborted attempt reported its end: nothing starts yet.
    expect(kinds(machine.handle({ type: 'timer', timer: 'retry' }, 20))).toEqual([]);
    const after = machine.handle({ type: 'attempt_settled', attempt: 1 }, 21);
    expect(after.find((e) => e.kind === 'start_attempt')).toMatchObject({ attempt: 2, avoid: new Set(['a']) });
  });
});

describe('the delivery machine, found in review', () => {
  const machine = (gated: boolean) =>
    new DeliveryMachine(
      {
        info: { model: 'm', route: 'chat_completions', stream: true, expectedChoices: 1, dropUsageChunk: true, slo: { ttftMs: 1, tpotMs: 1, e2eMs: 1, ttftByPromptLenMs: {} }, promptLenBoundaries: [], promptLenClasses: ['unknown'] },
        arrivalAt: 0,
        requestId: 'r',
        gated,
      },
      {
        settings: { totalMs: 1000, firstOutputMs: 500, idleMs: 200, drainGraceMs: 50, maxEventBytes: 4096, maxHeldEvents: 4, maxAttempts: 3, retry: { retryOn500: true, backoffBaseMs: 10, backoffMaxMs: 20, retryAfterMaxMs: 100 } },
        budget: new RetryBudget({ ratio: 1, minPerSecond: 1000, windowMs: 10_000 }),
        random: () => 0.5,
        onInterTokenGap: () => undefined,
      },
    );
  const kinds = (effects: readonly Effect[]) => effects.map((e) => e.kind);
  const data = (text: string): MachineEvent => ({ type: 'block', attempt: 1, raw: Buffer.from(`data: ${text}\n\n`), event: { type: 'message', data: text, id: undefined } });

  it('a slow client does not pause the upstream once the response is over (the drain grace reads on)', () => {
    const m = machine(false);
    m.handle({ type: 'start' }, 0);
    m.handle({ type: 'attempt_started', attempt: 1, upstream: 'a' }, 0);
    m.handle({ type: 'response_start', attempt: 1, status: 200, contentType: 'text/event-stream', retryAfterMs: undefined }, 1);
    m.handle(data(chunk([{ index: 0, delta: { content: 'hi' }, finish_reason: 'stop' }])), 2);
    m.handle(data('[DONE]'), 3);
    expect(kinds(m.handle({ type: 'chunk_done', attempt: 1 }, 3))).toContain('end');
    expect(kinds(m.handle({ type: 'client_blocked' }, 4))).toEqual([]);
  });

  it('the idle clock runs from the last whole event: armed once per period, re-armed for what is left when it fires', () => {
    const m = machine(false);
    const token = (content: string) => data(chunk([{ index: 0, delta: { content }, finish_reason: null }]));
    const arms = (effects: readonly Effect[]) => effects.filter((e) => e.kind === 'arm' && e.timer === 'idle');
    m.handle({ type: 'start' }, 0);
    m.handle({ type: 'attempt_started', attempt: 1, upstream: 'a' }, 0);
    m.handle({ type: 'response_start', attempt: 1, status: 200, contentType: 'text/event-stream', retryAfterMs: undefined }, 1);
    expect(arms(m.handle(token('a'), 10))).toEqual([{ kind: 'arm', timer: 'idle', at: 210, ms: 200 }]);
    // Later events move the deadline without an effect of their own.
    expect(arms(m.handle(token('b'), 100))).toEqual([]);
    expect(arms(m.handle(token('c'), 150))).toEqual([]);
    // Fired at 210, 60 ms after the last event: armed again for the 140 ms left, nothing else.
    expect(m.handle({ type: 'timer', timer: 'idle' }, 210)).toEqual([{ kind: 'arm', timer: 'idle', at: 350, ms: 140 }]);
    // At 350, 200 ms after the last event: the stream is idle.
    expect(m.handle({ type: 'timer', timer: 'idle' }, 350)).toContainEqual({ kind: 'abort_attempt', reason: 'idle_timeout' });
  });

  it('an admission granted after the request settled is given back', () => {
    const m = machine(true);
    m.handle({ type: 'start' }, 0);
    m.handle({ type: 'queued' }, 0);
    expect(kinds(m.handle({ type: 'client_close' }, 5))).toContain('settle');
    expect(kinds(m.handle({ type: 'admission', admitted: true, reason: undefined, waitedMs: 6 }, 6))).toEqual(['release_admission']);
  });

  it('holds one role chunk per expected choice beyond max_held_events', () => {
    const wide = new DeliveryMachine(
      { info: { model: 'm', route: 'chat_completions', stream: true, expectedChoices: 100, dropUsageChunk: true, slo: { ttftMs: 1, tpotMs: 1, e2eMs: 1, ttftByPromptLenMs: {} }, promptLenBoundaries: [], promptLenClasses: ['unknown'] }, arrivalAt: 0, requestId: 'r', gated: false },
      { settings: { totalMs: 1000, firstOutputMs: 500, idleMs: 200, drainGraceMs: 50, maxEventBytes: 1 << 20, maxHeldEvents: 4, maxAttempts: 1, retry: { retryOn500: false, backoffBaseMs: 10, backoffMaxMs: 20, retryAfterMaxMs: 100 } }, budget: new RetryBudget({ ratio: 1, minPerSecond: 1000, windowMs: 10_000 }), random: () => 0.5, onInterTokenGap: () => undefined },
    );
    wide.handle({ type: 'start' }, 0);
    wide.handle({ type: 'attempt_started', attempt: 1, upstream: 'a' }, 0);
    wide.handle({ type: 'response_start', attempt: 1, status: 200, contentType: 'text/event-stream', retryAfterMs: undefined }, 1);
    for (let index = 0; index < 100; index++) {
      expect(kinds(wide.handle(data(chunk([{ index, delta: { role: 'assistant', content: '' }, finish_reason: null }])), 2))).toEqual([]);
    }
    for (let i = 0; i < 4; i++) expect(kinds(wide.handle({ type: 'block', attempt: 1, raw: Buffer.from(': ping\n\n'), event: null }, 3))).toEqual([]);
    expect(kinds(wide.handle({ type: 'block', attempt: 1, raw: Buffer.from(': ping\n\n'), event: null }, 3))).toEqual(['abort_attempt']);
  });
});
