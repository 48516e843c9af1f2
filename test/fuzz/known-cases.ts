/**
 * Counterexamples the fuzzer found, written out by hand in their smallest form and replayed on every test run, so a
 * fix is checked at once and a regression names its case. Each must keep every invariant (invariants.ts).
 */
import type { BodyPlan, ClientPlan, JsonBodyPlan } from './client-grammar.js';
import type { FuzzCase } from './harness.js';
import type { Placed, Transcript, UpEvent, UsageValues } from './upstream-grammar.js';

function body(overrides: Partial<JsonBodyPlan> = {}): BodyPlan {
  return { kind: 'json', model: 'm', stream: true, n: null, streamOptions: 'absent', prompt: { kind: 'string' }, nestDepth: 0, nestShape: 'array', padBytes: 0, ...overrides };
}

function client(overrides: Partial<ClientPlan> = {}): ClientPlan {
  return {
    route: 'chat_completions',
    body: body(),
    contentType: 'application/json',
    headerBytes: 0,
    chunked: false,
    send: { kind: 'whole' },
    read: { kind: 'all' },
    startMs: 0,
    ...overrides,
  };
}

function sse(events: UpEvent[]): Transcript {
  const placed: Placed[] = events.map((ev) => ({ ev, unterminated: false }));
  return {
    kind: 'sse',
    status: 200,
    contentType: 'text/event-stream; charset=utf-8',
    gzip: 'none',
    events: placed,
    lineEnds: ['lf'],
    split: { kind: 'whole' },
    delays: { kind: 'none' },
    end: { kind: 'end' },
  };
}

/** A one-choice chat answer: role chunk, one delta, finish chunk. */
const ANSWER: UpEvent[] = [
  { t: 'role', index: 0 },
  { t: 'content', index: 0, text: 'Hi' },
  { t: 'finish', index: 0, reason: 'stop', text: '' },
];
const DONE: UpEvent = { t: 'done' };
const usage = (u: UsageValues): UpEvent => ({ t: 'usage', ...u });
const one = (c: ClientPlan, t: Transcript): FuzzCase => ({ random: 0, requests: [{ client: c, transcripts: [t] }] });

export const KNOWN_CASES: ReadonlyArray<{ name: string; c: FuzzCase }> = [
  {
    name: 'a finish_reason for choice index 5000 of a one-choice stream',
    c: one(client(), sse([...ANSWER, { t: 'finish', index: 5000, reason: 'stop', text: '' }, DONE])),
  },
  {
    name: 'a finish_reason for choice index 1.5 of a one-choice stream',
    c: one(client(), sse([...ANSWER, { t: 'finish', index: 1.5, reason: 'length', text: '' }, DONE])),
  },
  {
    name: 'usage with fractional token counts',
    c: one(client(), sse([...ANSWER, usage({ prompt: 10.5, completion: 12.75, cached: undefined }), DONE])),
  },
  {
    name: 'usage of 1e308 tokens, twice',
    c: {
      random: 0,
      requests: [0, 1].map(() => ({ client: client(), transcripts: [sse([...ANSWER, usage({ prompt: 1e308, completion: 1e308, cached: 1e308 }), DONE])] })),
    },
  },
  {
    name: 'cached_tokens greater than prompt_tokens',
    c: one(client(), sse([...ANSWER, usage({ prompt: 10, completion: 3, cached: 11 }), DONE])),
  },
  {
    name: 'headers over 16 KiB (Node answers 431 before the gateway sees the request)',
    c: one(client({ headerBytes: 20_000 }), sse([...ANSWER, DONE])),
  },
  {
    name: 'an unrelated field nested 10,000 deep with stream_options that Waybill re-serialises',
    c: one(client({ body: body({ nestDepth: 10_000, streamOptions: 'exclude_usage' }) }), sse([...ANSWER, DONE])),
  },
  {
    name: 'a client that leaves half-way through sending its body',
    c: one(client({ send: { kind: 'abort', percent: 50, afterMs: 0 } }), sse([...ANSWER, DONE])),
  },
  {
    name: 'a request body that stops half-way and never completes',
    c: one(client({ send: { kind: 'stall', percent: 50 } }), sse([...ANSWER, DONE])),
  },
];
