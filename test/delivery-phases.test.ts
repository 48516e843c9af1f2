/**
 * The delivery machine's phases (src/delivery/state.ts) as a table: each row is one transition — the phase a request
 * is in, the event, the phase it moves to, and what the shell is told to do — with one example of it, driven through
 * DeliveryMachine.handle. It is the readable model behind test/machine.property.test.ts, which checks the invariants
 * over random interleavings of the same events; step.ts carries the same table in its top comment.
 */
import { describe, expect, it } from 'vitest';
import { promptLenClasses } from '../src/accounting/prompt-len.js';
import { DeliveryMachine, type Effect, type MachineDeps, type MachineEvent, type MachineRequest } from '../src/delivery/machine.js';
import { RetryBudget } from '../src/delivery/retry-budget.js';
import { createState, emit, flush, forward, type Phase } from '../src/delivery/state.js';

interface Options {
  gated?: boolean;
  stream?: boolean;
  maxAttempts?: number;
}

function machine(options: Options = {}): DeliveryMachine {
  const { request, deps } = parts(options);
  return new DeliveryMachine(request, deps);
}

function parts(options: Options = {}): { request: MachineRequest; deps: MachineDeps } {
  return {
    request: {
      info: {
        model: 'm',
        route: 'chat_completions',
        stream: options.stream ?? true,
        expectedChoices: 1,
        dropUsageChunk: true,
        slo: { ttftMs: 1000, tpotMs: 50, e2eMs: 5000, ttftByPromptLenMs: {} },
        promptLenBoundaries: [1024],
        promptLenClasses: promptLenClasses([1024]),
      },
      arrivalAt: 0,
      requestId: 'r',
      gated: options.gated ?? false,
    },
    deps: {
      settings: {
        totalMs: 1000,
        firstOutputMs: 500,
        idleMs: 200,
        drainGraceMs: 50,
        maxEventBytes: 4096,
        maxHeldEvents: 4,
        maxAttempts: options.maxAttempts ?? 2,
        retry: { retryOn500: false, backoffBaseMs: 10, backoffMaxMs: 20, retryAfterMaxMs: 100 },
      },
      budget: new RetryBudget({ ratio: 1, minPerSecond: 1000, windowMs: 10_000 }),
      random: () => 0.5,
      onInterTokenGap: () => undefined,
    },
  };
}

const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] });
const data = (text: string, attempt = 1): MachineEvent => ({ type: 'block', attempt, raw: Buffer.from(`data: ${text}\n\n`), event: { type: 'message', data: text, id: undefined } });
const ROLE = chunk({ role: 'assistant', content: '' });
const TOKEN = chunk({ content: 'hi' });
const LAST = chunk({}, 'stop');

const start: MachineEvent = { type: 'start' };
const started = (attempt = 1, upstream = 'a'): MachineEvent => ({ type: 'attempt_started', attempt, upstream });
const head = (status = 200, attempt = 1): MachineEvent => ({ type: 'response_start', attempt, status, contentType: status === 200 ? 'text/event-stream' : 'application/json', retryAfterMs: undefined });
const body = (status: number, text = '{}', attempt = 1): MachineEvent => ({ type: 'body', attempt, status, body: Buffer.from(text) });
const read = (attempt = 1): MachineEvent => ({ type: 'chunk_done', attempt });
const settled = (attempt = 1): MachineEvent => ({ type: 'attempt_settled', attempt });
const timer = (name: 'total' | 'first_output' | 'idle' | 'retry'): MachineEvent => ({ type: 'timer', timer: name });

/** Into `attempting`: started, upstream picked, its head read. */
const ATTEMPTING: MachineEvent[] = [start, started(), head()];
/** Into `streaming`: the first output committed and written. */
const STREAMING: MachineEvent[] = [...ATTEMPTING, data(ROLE), data(TOKEN), read()];
/** Into `backing_off`: a retryable 503 on the first of two attempts. */
const BACKING_OFF: MachineEvent[] = [start, started(), head(503), body(503)];
/** Into `ending`: a delivered stream whose attempt and client are still finishing. */
const ENDING: MachineEvent[] = [...STREAMING, data(LAST), data('[DONE]'), read()];

interface Row {
  readonly from: Phase;
  /** What happened, in words. */
  readonly event: string;
  readonly to: Phase;
  readonly options?: Options;
  /** Events that bring a fresh request into `from`. */
  readonly setup: readonly MachineEvent[];
  /** The event (or the few events) of the transition. */
  readonly events: readonly MachineEvent[];
  /** Milliseconds that pass before the transition's events (a deadline's worth). */
  readonly after?: number;
  /** Effects the transition must include, by kind, with the status of a head where it matters. */
  readonly effects: readonly string[];
}

const TABLE: readonly Row[] = [
  { from: 'idle', event: 'start, no admission gate', to: 'attempting', setup: [], events: [start], effects: ['arm:total', 'start_attempt'] },
  { from: 'idle', event: 'start, gated', to: 'admitting', options: { gated: true }, setup: [], events: [start], effects: ['acquire_admission'] },
  { from: 'admitting', event: 'admission granted', to: 'attempting', options: { gated: true }, setup: [start], events: [{ type: 'admission', admitted: true, reason: undefined, waitedMs: 3 }], effects: ['start_attempt'] },
  { from: 'admitting', event: 'queue full', to: 'ending', options: { gated: true }, setup: [start], events: [{ type: 'admission', admitted: false, reason: 'queue_full', waitedMs: 0 }], effects: ['write_head:429', 'end'] },
  { from: 'admitting', event: 'total deadline in the queue', to: 'ending', options: { gated: true }, setup: [start], events: [timer('total')], effects: ['cancel_admission', 'write_head:429', 'end', 'arm:linger'] },
  { from: 'admitting', event: 'shutdown', to: 'ending', options: { gated: true }, setup: [start], events: [{ type: 'shutdown' }], effects: ['cancel_admission', 'write_head:503', 'end'] },
  { from: 'admitting', event: 'client leaves (nothing in flight: settled at once)', to: 'settled', options: { gated: true }, setup: [start], events: [{ type: 'client_close' }], effects: ['cancel_admission', 'settle'] },
  { from: 'attempting', event: 'a held event (no output yet)', to: 'attempting', setup: ATTEMPTING, events: [data(ROLE), read()], effects: [] },
  { from: 'attempting', event: 'first output: commit', to: 'streaming', setup: ATTEMPTING, events: [data(TOKEN), read()], effects: ['clear:first_output', 'write_head:200', 'arm:idle', 'write'] },
  { from: 'attempting', event: 'a complete non-stream body', to: 'ending', options: { stream: false }, setup: [start, started(), head(200)], events: [body(200, JSON.stringify({ choices: [{ index: 0, message: { content: 'x' }, finish_reason: 'stop' }] }))], effects: ['write_head:200', 'end'] },
  { from: 'attempting', event: 'a retryable failure (503)', to: 'backing_off', setup: [start, started(), head(503)], events: [body(503)], effects: ['abort_attempt', 'arm:retry'] },
  { from: 'attempting', event: 'a failure not retried (400)', to: 'ending', setup: [start, started(), head(400)], events: [body(400)], effects: ['write_head:400', 'end', 'arm:drain'] },
  { from: 'attempting', event: 'a retryable failure, no attempt left (502)', to: 'ending', options: { maxAttempts: 1 }, setup: [start, started(), head(503)], events: [body(503)], effects: ['write_head:502', 'end'] },
  { from: 'attempting', event: 'no upstream free', to: 'ending', setup: [start], events: [{ type: 'no_upstream' }], effects: ['write_head:503', 'end'] },
  { from: 'attempting', event: 'first-output deadline: the attempt is aborted, its end answers', to: 'ending', options: { maxAttempts: 1 }, setup: ATTEMPTING, events: [timer('first_output'), { type: 'stream_end', attempt: 1, how: 'first_output_timeout' }], effects: ['abort_attempt', 'write_head:504', 'end'] },
  { from: 'attempting', event: 'shutdown: the attempt is aborted, its end answers', to: 'ending', setup: ATTEMPTING, events: [{ type: 'shutdown' }, { type: 'stream_end', attempt: 1, how: 'shutdown' }], effects: ['abort_attempt', 'write_head:503', 'end'] },
  { from: 'attempting', event: 'client leaves', to: 'ending', setup: ATTEMPTING, events: [{ type: 'client_close' }], effects: ['observe', 'abort_attempt'] },
  { from: 'streaming', event: 'an output event, written at the end of the read', to: 'streaming', setup: STREAMING, events: [data(TOKEN), read()], effects: ['write'] },
  { from: 'streaming', event: 'a slow client pauses the attempt', to: 'streaming', setup: STREAMING, events: [{ type: 'client_blocked' }], effects: ['pause_attempt', 'clear:idle'] },
  { from: 'streaming', event: "[DONE] with every choice finished: delivered", to: 'ending', setup: STREAMING, events: [data(LAST), data('[DONE]'), read()], effects: ['write', 'end', 'arm:drain'] },
  { from: 'streaming', event: 'the stream breaks: Waybill\'s error event', to: 'ending', setup: STREAMING, events: [{ type: 'stream_end', attempt: 1, how: 'reset' }], effects: ['end'] },
  { from: 'streaming', event: 'idle deadline: aborted, its end writes the error event', to: 'ending', setup: STREAMING, after: 300, events: [timer('idle'), { type: 'stream_end', attempt: 1, how: 'idle_timeout' }], effects: ['abort_attempt', 'end'] },
  { from: 'backing_off', event: 'retry timer fires before the failed attempt ended: waits', to: 'backing_off', setup: BACKING_OFF, events: [timer('retry')], effects: [] },
  { from: 'backing_off', event: 'retry timer fired, then the failed attempt ended: the next attempt', to: 'attempting', setup: BACKING_OFF, events: [timer('retry'), settled()], effects: ['attempt_over', 'start_attempt'] },
  { from: 'backing_off', event: 'the failed attempt ended, then the retry timer: the next attempt', to: 'attempting', setup: BACKING_OFF, events: [settled(), timer('retry')], effects: ['start_attempt'] },
  { from: 'backing_off', event: 'total deadline: the last failure answers', to: 'ending', setup: [...BACKING_OFF, settled()], events: [timer('total')], effects: ['clear:retry', 'write_head:502', 'end'] },
  { from: 'backing_off', event: 'client leaves', to: 'ending', setup: BACKING_OFF, events: [{ type: 'client_close' }], effects: ['clear:retry', 'abort_attempt'] },
  { from: 'ending', event: 'the attempt ends, the client has not finished', to: 'ending', setup: ENDING, events: [settled()], effects: ['attempt_over', 'clear:drain'] },
  { from: 'ending', event: 'the attempt ended and the client finished: counted', to: 'settled', setup: [...ENDING, settled()], events: [{ type: 'client_finish', socketDestroyed: false }], effects: ['clear:total', 'settle'] },
  { from: 'ending', event: 'the client finished first, then the attempt ended', to: 'settled', setup: [...ENDING, { type: 'client_finish', socketDestroyed: false }], events: [settled()], effects: ['attempt_over', 'settle'] },
  { from: 'attempting', event: 'an internal error before commit: 500', to: 'settled', setup: ATTEMPTING, events: [{ type: 'internal_error', error: new Error('bug') }], effects: ['abort_attempt', 'write_head:500', 'end', 'settle'] },
  { from: 'streaming', event: 'an internal error after commit: its error event', to: 'settled', setup: STREAMING, events: [{ type: 'internal_error', error: new Error('bug') }], effects: ['abort_attempt', 'end', 'settle'] },
  { from: 'settled', event: 'a late attempt end: reported, nothing else', to: 'settled', setup: [...ATTEMPTING, { type: 'internal_error', error: new Error('bug') }], events: [settled()], effects: ['attempt_over'] },
];

/** `kind`, with the timer or the status where the row names one. */
function label(effect: Effect): string {
  if (effect.kind === 'arm' || effect.kind === 'clear') return `${effect.kind}:${effect.timer}`;
  if (effect.kind === 'write_head') return `write_head:${effect.status}`;
  return effect.kind;
}

describe('the delivery machine, phase by phase (one example per transition)', () => {
  it.each(TABLE.map((row) => [`${row.from} — ${row.event} → ${row.to}`, row] as const))('%s', (_name, row) => {
    const m = machine(row.options);
    let at = 0;
    for (const event of row.setup) m.handle(event, (at += 1));
    expect(m.phase).toBe(row.from);
    at += row.after ?? 0;
    const effects: string[] = [];
    const labels: string[] = [];
    for (const event of row.events) {
      for (const effect of m.handle(event, (at += 1))) {
        effects.push(effect.kind);
        labels.push(label(effect));
      }
    }
    expect(m.phase).toBe(row.to);
    for (const expected of row.effects) expect(expected.includes(':') ? labels : effects).toContain(expected);
    if (row.effects.length === 0) expect(labels).toEqual([]);
  });

  it('the table reaches every phase, and leaves every phase but settled', () => {
    const phases: Phase[] = ['idle', 'admitting', 'attempting', 'streaming', 'backing_off', 'ending', 'settled'];
    expect(new Set(TABLE.map((r) => r.to))).toEqual(new Set(phases.filter((p) => p !== 'idle')));
    expect(new Set(TABLE.filter((r) => r.to !== r.from).map((r) => r.from))).toEqual(new Set(phases.filter((p) => p !== 'settled')));
  });

  it('the client side: blocked while a write waits, finished when it took the answer, gone when it left', () => {
    const m = machine();
    let at = 0;
    for (const event of STREAMING) m.handle(event, (at += 1));
    expect([m.client, m.upstream]).toEqual(['open', 'reading']);
    m.handle({ type: 'client_blocked' }, (at += 1));
    expect([m.client, m.upstream]).toEqual(['blocked', 'paused']);
    expect(m.handle({ type: 'client_drain' }, (at += 1)).map(label)).toEqual(['arm:idle', 'resume_attempt']);
    expect([m.client, m.upstream]).toEqual(['open', 'reading']);
    m.handle({ type: 'client_close' }, (at += 1));
    expect([m.phase, m.client]).toEqual(['ending', 'gone']);
    m.handle(settled(), (at += 1));
    expect([m.phase, m.upstream]).toEqual(['settled', 'closed']);
  });

  it("a write carries its own step's bytes: the request's one write effect is reused from step to step, and a second write within one step gets its own", () => {
    const m = machine();
    let at = 0;
    for (const event of STREAMING) m.handle(event, (at += 1));
    const writes: Array<{ effect: Effect; bytes: string }> = [];
    for (const word of ['a', 'b', 'c']) {
      m.handle(data(chunk({ content: word })), (at += 1));
      for (const effect of m.handle(read(), at)) if (effect.kind === 'write') writes.push({ effect, bytes: effect.data.toString() });
    }
    expect(writes.map((w) => w.bytes)).toEqual(['a', 'b', 'c'].map((word) => `data: ${chunk({ content: word })}\n\n`));
    expect(new Set(writes.map((w) => w.effect)).size).toBe(1);

    const s = createState(parts().request, parts().deps);
    emit(s, { kind: 'observe', observation: { type: 'first_output' } });
    forward(s, Buffer.from('one'));
    flush(s);
    forward(s, Buffer.from('two'));
    flush(s);
    const inStep = s.effects.slice(0, s.effectCount).filter((e) => e.kind === 'write');
    expect(inStep.map((e) => e.data.toString())).toEqual(['one', 'two']);
  });
});

describe('a step that throws (a bug in the request handling)', () => {
  it('after it committed: its effects are discarded, so the client gets the 500 and the ledger counts the 500', () => {
    const { request, deps } = parts();
    // Committing arms the idle clock: its setting throws, inside the step whose block committed the answer.
    const settings = Object.defineProperty({ ...deps.settings }, 'idleMs', {
      get(): number {
        throw new Error('bug');
      },
    });
    const m = new DeliveryMachine(request, { ...deps, settings });
    let at = 0;
    for (const event of [...ATTEMPTING, data(ROLE)]) m.handle(event, (at += 1));
    const effects = m.handle({ type: 'block', attempt: 1, raw: Buffer.from(`data: ${TOKEN}\n\n`), event: { type: 'message', data: TOKEN, id: undefined }, endOfRead: true }, (at += 1));
    expect(effects.map((e) => (e.kind === 'write_head' ? `write_head:${e.status}` : e.kind)).filter((k) => k !== 'clear' && k !== 'observe')).toEqual(['abort_attempt', 'write_head:500', 'end', 'settle']);
    const settle = effects.find((e) => e.kind === 'settle');
    expect(settle?.kind === 'settle' && { code: settle.settlement.code, outcome: settle.settlement.outcome }).toEqual({ code: 500, outcome: 'failed' });
  });
});
