import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { classifyDataLine, classifyEventData, classifyEventDataSlow, fastClassify, fastClassifyBytes } from '../src/sse/classify.js';
import { chunkScratch } from '../src/sse/fast-classify.js';
import { DataLineEvent } from '../src/sse/framer.js';
import { generateCorpus } from './fixtures/sse-fixtures.js';

// The fast path must give exactly what JSON.parse gives, or decline. Every check below compares against
// classifyEventDataSlow, the unchanged JSON.parse path.

const HEAD = '{"id":"chatcmpl-3f9a","object":"chat.completion.chunk","created":1779883200,"model":"m"';
const chat = (delta: string, index = 0): string =>
  `${HEAD},"choices":[{"index":${index},"delta":${delta},"logprobs":null,"finish_reason":null}]}`;
const completion = (text: string, index = 0): string =>
  `{"id":"cmpl-7","object":"text_completion","created":1779883200,"model":"Qwen/Qwen3-32B","choices":[{"index":${index},"text":${text},"logprobs":null,"finish_reason":null,"stop_reason":null}]}`;

/**
 * `answers` defaults to `output`: content and text are answers; reasoning is output but not an answer. `chars`: the
 * decoded length of the generated text (EventFacts.outputChars, absent when 0).
 */
function chunkFacts(output: number[], index: number, id: string, model: string, answers = output, chars = 0): unknown {
  return { kind: 'chunk', output, answers, choices: [index], finishes: [], usage: undefined, usageInvalid: false, usageOnly: false, id, model, ...(chars > 0 && { outputChars: chars }) };
}

/** Asserts the fast path takes `data` and agrees with JSON.parse; returns the facts. */
function fastAndAgrees(data: string): unknown {
  const fast = fastClassify(data);
  expect(fast).not.toBeUndefined();
  expect(fast).toStrictEqual(classifyEventDataSlow(data));
  expect(classifyEventData(data)).toStrictEqual(fast);
  return fast;
}

/** Asserts the fast path declines `data` and classifyEventData still equals JSON.parse's answer. */
function declines(data: string): void {
  expect(fastClassify(data)).toBeUndefined();
  expect(classifyEventData(data)).toStrictEqual(classifyEventDataSlow(data));
}

describe('fastClassify on representative vLLM events', () => {
  it('role chunk: named, no output', () => {
    expect(fastAndAgrees(chat('{"role":"assistant","content":""}'))).toStrictEqual(chunkFacts([], 0, 'chatcmpl-3f9a', 'm'));
  });

  it('content delta, empty, null, escaped', () => {
    expect(fastAndAgrees(chat('{"content":"Hel"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [0], 3));
    expect(fastAndAgrees(chat('{"content":""}'))).toStrictEqual(chunkFacts([], 0, 'chatcmpl-3f9a', 'm'));
    expect(fastAndAgrees(chat('{"content":null}'))).toStrictEqual(chunkFacts([], 0, 'chatcmpl-3f9a', 'm'));
    expect(fastAndAgrees(chat('{"content":"\\n"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [0], 1));
    expect(fastAndAgrees(chat('{"content":"\\u0000"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [0], 1));
    expect(fastAndAgrees(chat('{"content":"\\"error\\": \\"usage\\" }]}"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [0], 20));
    expect(fastAndAgrees(chat('{"content":"👍🏽 東京"}', 3))).toStrictEqual(chunkFacts([3], 3, 'chatcmpl-3f9a', 'm', [3], 7));
    expect(fastAndAgrees(chat('{}'))).toStrictEqual(chunkFacts([], 0, 'chatcmpl-3f9a', 'm'));
  });

  it('reasoning and reasoning_content deltas', () => {
    expect(fastAndAgrees(chat('{"reasoning":"hm"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [], 2));
    expect(fastAndAgrees(chat('{"reasoning_content":"hm"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [], 2));
    expect(fastAndAgrees(chat('{"reasoning":""}'))).toStrictEqual(chunkFacts([], 0, 'chatcmpl-3f9a', 'm'));
    expect(fastAndAgrees(chat('{"content":null,"reasoning":"x"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [], 1));
    expect(fastAndAgrees(chat('{"content":"a","reasoning":"x"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [0], 2));
    // Both names with the same text (a server sending both): the reasoning is counted once.
    expect(fastAndAgrees(chat('{"reasoning":"hmm","reasoning_content":"hmm"}'))).toStrictEqual(chunkFacts([0], 0, 'chatcmpl-3f9a', 'm', [], 3));
    expect(fastAndAgrees(chat('{"role":"assistant","content":"","reasoning_content":null}'))).toStrictEqual(
      chunkFacts([], 0, 'chatcmpl-3f9a', 'm'),
    );
  });

  it('completions text delta', () => {
    expect(fastAndAgrees(completion('"ab"', 2))).toStrictEqual(chunkFacts([2], 2, 'cmpl-7', 'Qwen/Qwen3-32B', [2], 2));
    expect(fastAndAgrees(completion('""', 1))).toStrictEqual(chunkFacts([], 1, 'cmpl-7', 'Qwen/Qwen3-32B'));
    expect(fastAndAgrees(completion('"\\\\"'))).toStrictEqual(chunkFacts([0], 0, 'cmpl-7', 'Qwen/Qwen3-32B', [0], 1));
  });

  it('declines everything outside the narrow shape', () => {
    const finish = `${HEAD},"choices":[{"index":0,"delta":{"content":"lo!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`;
    const cases = [
      '[DONE]',
      '',
      finish,
      chat('{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}'),
      chat('{"content":"a","content":""}'), // duplicate key: JSON.parse keeps the last
      chat('{"content":"a"},'),
      chat('{"content":"a",}'),
      chat('{"content":"a\\x"}'), // invalid escape
      chat('{"content":"a\\u12G4"}'),
      chat('{"content":"a\nb"}'), // raw control character
      chat('{"content":1}'),
      chat('{"role":null}'),
      chat('{"content":"a"}', 1).replace('"index":1', '"index":01'),
      chat('{"content":"a"}').replace('"index":0', '"index":-1'),
      chat('{"content":"a"}').replace('"index":0', '"index":1234567890123456789'), // beyond the exact-integer digits
      chat('{"content":"a"}').replace('1779883200', '01779883200'),
      chat('{"content":"a"}').replace('"index":0', '"index":0.0'),
      chat('{"content":"a"}').replace('1779883200', '1779883200.5'),
      chat('{"content":"a"}').replace('chatcmpl-3f9a', 'chat\\u0063mpl'),
      chat('{"content":"a"}').replace('"model":"m"', '"model":"m\\"x"'),
      chat('{"content":"a"}').replace('"model":"m"', '"model":null'),
      chat('{"content":"a"}') + ' ',
      ' ' + chat('{"content":"a"}'),
      chat('{"content":"a"}').replace('"delta":', '"delta": '),
      chat('{"content":"a"}').replace('}]}', '}],"usage":{"prompt_tokens":1,"completion_tokens":2}}'),
      chat('{"content":"a"}').replace('}]}', '}],"usage":null}'),
      chat('{"content":"a"}').replace('}]}', '}],"error":{"message":"x","code":500}}'),
      chat('{"content":"a"}').replace('}]}', '},{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":null}]}'),
      chat('{"content":"a"}').replace('"finish_reason":null', '"finish_reason":null,"usage":{"prompt_tokens":1}'),
      chat('{"content":"a"}').replace('"logprobs":null', '"logprobs":{"content":[]}'),
      chat('{"content":"a"}').slice(0, -1),
      `{"object":"chat.completion.chunk","id":"x","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`,
      completion('null'),
      completion('"a"').replace('"finish_reason":null', '"finish_reason":"length"'),
    ];
    for (const data of cases) declines(data);
  });

  it('agrees with JSON.parse on the whole benchmark corpus', () => {
    let events = 0;
    let fast = 0;
    for (const stream of generateCorpus(7, 200)) {
      for (const payload of stream.payloads) {
        events++;
        const facts = fastClassify(payload);
        if (facts !== undefined) fast++;
        expect(classifyEventData(payload)).toStrictEqual(classifyEventDataSlow(payload));
        if (facts !== undefined) expect(facts).toStrictEqual(classifyEventDataSlow(payload));
      }
    }
    expect(fast / events).toBeGreaterThan(0.8);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Generated events: vLLM-like chunks, then serialised compactly in vLLM's key order, or with keys shuffled,
// whitespace, and hand mutations that may leave the text invalid JSON.
// ---------------------------------------------------------------------------------------------------------------

const TRICKY = ['"', '\\', '\\"', '"error"', '"usage"', '\\"error\\"', '}', ']', '}]}', '{', ',', ':', 'null', '\n', '\u0000', '\u001f', '\u2028', '\uD800', '\uDC00', '😀', '\uFEFF', ' '];

const contentString = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 12 }),
  fc.array(fc.oneof(fc.constantFrom(...TRICKY), fc.string({ unit: 'grapheme', maxLength: 4 })), { maxLength: 6 }).map((parts) => parts.join('')),
  fc.constant(''),
);
const plainName = fc.stringMatching(/^[A-Za-z0-9/._-]{0,24}$/);
const nameString = fc.oneof({ weight: 4, arbitrary: plainName }, { weight: 1, arbitrary: contentString });
const nullableContent = fc.oneof({ weight: 4, arbitrary: contentString }, { weight: 1, arbitrary: fc.constant(null) });

const delta = fc.oneof(
  fc.constant({ role: 'assistant', content: '' }),
  nullableContent.map((content) => ({ content })),
  contentString.map((reasoning) => ({ reasoning })),
  contentString.map((reasoning_content) => ({ reasoning_content })),
  fc.record({ content: nullableContent, reasoning: nullableContent }, { requiredKeys: [] }),
  fc.constant({}),
  contentString.map((args) => ({ tool_calls: [{ index: 0, function: { arguments: args } }] })),
  fc.constant({ tool_calls: [] }),
);
const finishReason = fc.oneof({ weight: 4, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.constantFrom('stop', 'length', 'tool_calls', '') });

const choice = (chatShape: boolean) =>
  fc.record({
    index: fc.integer({ min: 0, max: 3 }),
    payload: chatShape ? delta : contentString,
    finish: finishReason,
    stopReason: fc.boolean(),
  }).map(({ index, payload, finish, stopReason }): Record<string, unknown> => {
    const out: Record<string, unknown> = chatShape ? { index, delta: payload } : { index, text: payload };
    out['logprobs'] = null;
    out['finish_reason'] = finish;
    if (stopReason) out['stop_reason'] = null;
    return out;
  });

const usage = fc.oneof(
  fc.constant(null),
  fc.record({ prompt_tokens: fc.nat(5000), total_tokens: fc.nat(9000), completion_tokens: fc.nat(4000) }),
  fc.record({ prompt_tokens: fc.nat(9), completion_tokens: fc.nat(9), prompt_tokens_details: fc.record({ cached_tokens: fc.nat(9) }) }),
);
const error = fc.oneof(
  fc.constant(null),
  fc.constant('Unauthorized'),
  fc.record({ message: contentString, type: fc.constant('InternalServerError'), param: fc.constant(null), code: fc.constantFrom(400, 500) }),
);

const event = fc.boolean().chain((chatShape) =>
  fc.record(
    {
      id: nameString,
      created: fc.oneof(fc.nat(), fc.constant(1779883200)),
      model: nameString,
      choices: fc.oneof({ weight: 6, arbitrary: fc.array(choice(chatShape), { minLength: 1, maxLength: 1 }) }, { weight: 1, arbitrary: fc.array(choice(chatShape), { maxLength: 3 }) }),
      // Absent most of the time, so that a good share of the events fit the fast path's shape.
      usage: fc.oneof({ weight: 3, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: usage }),
      error: fc.oneof({ weight: 3, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: error }),
    },
  ).map((e): Record<string, unknown> => ({
    id: e.id,
    object: chatShape ? 'chat.completion.chunk' : 'text_completion',
    created: e.created,
    model: e.model,
    choices: e.choices,
    ...(e.usage === undefined ? {} : { usage: e.usage }),
    ...(e.error === undefined ? {} : { error: e.error }),
  })),
);

function shuffleKeys(value: unknown, rng: () => number): unknown {
  if (Array.isArray(value)) return value.map((v) => shuffleKeys(v, rng));
  if (typeof value !== 'object' || value === null) return value;
  const entries = Object.entries(value).map(([k, v]) => [k, shuffleKeys(v, rng)] as const);
  for (let i = entries.length - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    const a = entries[i];
    const b = entries[j];
    if (a !== undefined && b !== undefined) [entries[i], entries[j]] = [b, a];
  }
  return Object.fromEntries(entries);
}

/** Rewrites some characters of a serialised string as \uXXXX escapes (still valid JSON, same value). */
function escapeSome(text: string, rng: () => number): string {
  let out = '';
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i] ?? '';
    if (ch === '\\') {
      out += ch + (text[i + 1] ?? '');
      i++;
      continue;
    }
    if (ch === '"') inString = !inString;
    else if (inString && rng() < 0.3) {
      out += '\\u' + ch.charCodeAt(0).toString(16).padStart(4, '0');
      continue;
    }
    out += ch;
  }
  return out;
}

const MUTATIONS = [' ', '\n', '\t', '"', '\\', ',', '}', ']', '{', '0', '-', 'x', '\u0001', '"usage":1,', '"error":1,', '\\u00', '\\q'];

const serialised = fc
  .record({
    value: event,
    style: fc.constantFrom('compact', 'compact', 'compact', 'compact', 'compact', 'shuffled', 'indented', 'escaped', 'mutated', 'deleted', 'truncated'),
    seed: fc.integer(),
    at: fc.nat(),
    insert: fc.constantFrom(...MUTATIONS),
  })
  .map(({ value, style, seed, at, insert }) => {
    let state = seed >>> 0;
    const rng = (): number => {
      state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
      return state / 4294967296;
    };
    const compact = JSON.stringify(value);
    const where = compact.length === 0 ? 0 : at % compact.length;
    switch (style) {
      case 'shuffled':
        return JSON.stringify(shuffleKeys(value, rng));
      case 'indented':
        return JSON.stringify(value, null, rng() < 0.5 ? 1 : '\t');
      case 'escaped':
        return escapeSome(compact, rng);
      case 'mutated':
        return compact.slice(0, where) + insert + compact.slice(where);
      case 'deleted':
        return compact.slice(0, where) + compact.slice(where + 1);
      case 'truncated':
        return compact.slice(0, where);
      case 'compact':
        return compact;
    }
  });

describe('fastClassify agrees with JSON.parse on generated events', () => {
  it('classifyEventData equals the JSON.parse path; the fast path, when taken, equals it too', () => {
    let taken = 0;
    let runs = 0;
    fc.assert(
      fc.property(serialised, (data) => {
        runs++;
        const slow = classifyEventDataSlow(data);
        expect(classifyEventData(data)).toStrictEqual(slow);
        const fast = fastClassify(data);
        if (fast !== undefined) {
          taken++;
          expect(fast).toStrictEqual(slow);
        }
      }),
      { numRuns: 5000 },
    );
    // The property would be vacuous if the generated events never took the fast path.
    expect(taken).toBeGreaterThan(runs / 20);
  });

  it('a canonical vLLM delta (one choice, finish_reason null, no usage/error, plain id and model) always takes it', () => {
    fc.assert(
      fc.property(fc.boolean(), plainName, plainName, fc.nat(), fc.integer({ min: 0, max: 3 }), fc.oneof(delta, contentString), (isChat, id, model, created, index, payload) => {
        if (isChat && (typeof payload === 'string' || 'tool_calls' in payload)) return;
        if (!isChat && typeof payload !== 'string') return;
        const body = isChat ? { index, delta: payload, logprobs: null, finish_reason: null } : { index, text: payload, logprobs: null, finish_reason: null, stop_reason: null };
        const data = JSON.stringify({ id, object: isChat ? 'chat.completion.chunk' : 'text_completion', created, model, choices: [body] });
        const fast = fastClassify(data);
        expect(fast).not.toBeUndefined();
        expect(fast).toStrictEqual(classifyEventDataSlow(data));
      }),
      { numRuns: 2000 },
    );
  });

  it('into a scratch: the same facts filled in place (outputChars 0 for none), and the scratch untouched when the fast path declines', () => {
    const into = chunkScratch();
    let filled = 0;
    fc.assert(
      fc.property(serialised, (data) => {
        const before = { ...into };
        const facts = fastClassify(data, undefined, undefined, into);
        const slow = classifyEventDataSlow(data);
        if (facts === undefined) {
          expect(into).toStrictEqual(before);
          return;
        }
        filled++;
        expect(facts).toBe(into);
        if (slow.kind !== 'chunk') throw new Error(`the fast path took what JSON.parse reads as ${slow.kind}`);
        // The kept head is the scratch's own (checked below), not a fact.
        const { outputChars, head, ...rest } = into;
        expect(head).toBeDefined();
        const { outputChars: slowChars = 0, ...slowRest } = slow;
        expect(rest).toStrictEqual(slowRest);
        expect(outputChars).toBe(slowChars);
        expect(classifyEventData(data, false, undefined, undefined, into)).toBe(into);
      }),
      { numRuns: 3000 },
    );
    expect(filled).toBeGreaterThan(100);
  });

  it("into one scratch over a stream: the kept head and template change no answer (the same facts, or a decline, as a fresh scratch's)", () => {
    // Events share a few heads, as a stream's chunks do, and some are cut or mutated anywhere (in the head too), so
    // a head that matches the kept one is followed by bodies the fast path must still decline.
    const head = fc.record({ chat: fc.boolean(), id: plainName, model: plainName, created: fc.nat() });
    // Mostly as vLLM streams (choice 0, no role after the first, one tail), so chunks share a template; not always.
    const body = fc.record({
      index: fc.oneof({ weight: 3, arbitrary: fc.constant(0) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 12 }) }),
      text: fc.oneof({ weight: 4, arbitrary: contentString }, { weight: 1, arbitrary: fc.constant(null) }),
      role: fc.constantFrom(false, false, false, true),
      stopReason: fc.constantFrom(false, false, false, true),
    });
    const edit = fc.option(fc.record({ at: fc.nat(), cut: fc.boolean(), with: fc.constantFrom(...MUTATIONS) }), { freq: 3 });
    const streamOf = fc.array(head, { minLength: 1, maxLength: 3 }).chain((heads) =>
      fc.array(fc.record({ head: fc.nat({ max: heads.length - 1 }), body, edit }), { minLength: 1, maxLength: 12 }).map((events) => ({ heads, events })),
    );
    let kept = 0;
    let templated = 0;
    fc.assert(
      fc.property(streamOf, ({ heads, events }) => {
        const into = chunkScratch();
        for (const event of events) {
          const h = heads[event.head] as { chat: boolean; id: string; model: string; created: number };
          const { index, text, role, stopReason } = event.body;
          const choice = h.chat
            ? { index, delta: role ? { role: 'assistant', content: text } : { content: text }, logprobs: null, finish_reason: null }
            : { index, text: text ?? '', logprobs: null, finish_reason: null };
          if (stopReason) Object.assign(choice, { stop_reason: null });
          let data = JSON.stringify({ id: h.id, object: h.chat ? 'chat.completion.chunk' : 'text_completion', created: h.created, model: h.model, choices: [choice] });
          if (event.edit !== null) {
            const at = event.edit.at % (data.length + 1);
            data = event.edit.cut ? data.slice(0, at) : data.slice(0, at) + event.edit.with + data.slice(at);
          }
          const bytes = Buffer.from(`data: ${data}\n\n`);
          const hadHead = into.head.bytes.length > 0 && bytes.subarray(6).indexOf(into.head.bytes) === 0;
          // A kept template's prefix and suffix around this chunk's bytes (whether its string is valid is the path's).
          const inner = bytes.subarray(6, bytes.length - 2);
          const hadTemplate = into.head.templates.some(
            ({ prefix, suffix }) =>
              prefix.length > 0 && inner.length >= prefix.length + suffix.length && inner.subarray(0, prefix.length).equals(prefix) && inner.subarray(inner.length - suffix.length).equals(suffix),
          );
          const alone = fastClassifyBytes(bytes, 6, bytes.length - 2);
          const facts = fastClassifyBytes(bytes, 6, bytes.length - 2, undefined, undefined, into);
          if (alone === undefined) {
            expect(facts).toBeUndefined();
            continue;
          }
          if (hadHead) kept++;
          if (hadTemplate) templated++;
          expect(facts).toBe(into);
          const { outputChars, head: _kept, ...rest } = into;
          const { outputChars: aloneChars = 0, ...aloneRest } = alone as typeof into;
          expect(rest).toStrictEqual(aloneRest);
          expect(outputChars).toBe(aloneChars);
          expect(alone).toStrictEqual(classifyEventDataSlow(data));
        }
      }),
      { numRuns: 1500 },
    );
    // The kept head and template were matched, not only kept: a stream's later chunks took them.
    expect(kept).toBeGreaterThan(500);
    expect(templated).toBeGreaterThan(300);
  });

  it("a chunk around the kept template whose string is broken (a quote, a backslash, a control byte inside it) declines as a fresh scan does", () => {
    const prefix = (chat: boolean) =>
      chat
        ? '{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"'
        : '{"id":"cmpl-7","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"';
    const suffix = (chat: boolean) => (chat ? '"},"logprobs":null,"finish_reason":null}]}' : '","logprobs":null,"finish_reason":null}]}');
    const line = (data: string) => Buffer.from(`data: ${data}\n\n`);
    let declined = 0;
    fc.assert(
      fc.property(fc.boolean(), contentString, contentString, fc.nat(), fc.constantFrom(...MUTATIONS), (chat, first, text, at, insert) => {
        const into = chunkScratch();
        const opening = line(prefix(chat) + JSON.stringify(first).slice(1, -1) + suffix(chat));
        expect(fastClassifyBytes(opening, 6, opening.length - 2, undefined, undefined, into)).toBe(into);
        expect(into.head.templates[0]?.prefix.length).toBeGreaterThan(0);
        const inner = JSON.stringify(text).slice(1, -1);
        const cut = at % (inner.length + 1);
        const data = prefix(chat) + inner.slice(0, cut) + insert + inner.slice(cut) + suffix(chat);
        const bytes = line(data);
        const alone = fastClassifyBytes(bytes, 6, bytes.length - 2);
        const facts = fastClassifyBytes(bytes, 6, bytes.length - 2, undefined, undefined, into);
        if (alone === undefined) {
          declined++;
          expect(facts).toBeUndefined();
          return;
        }
        const { outputChars, head: _kept, ...rest } = facts as typeof into;
        const { outputChars: aloneChars = 0, ...aloneRest } = alone as typeof into;
        expect(rest).toStrictEqual(aloneRest);
        expect(outputChars).toBe(aloneChars);
      }),
      { numRuns: 1000 },
    );
    expect(declined).toBeGreaterThan(200);
  });

  it('a stream of interleaved choices keeps a template per choice (the first four): their chunks match without replacing each other', () => {
    const into = chunkScratch();
    const line = (index: number, text: string) =>
      Buffer.from(`data: {"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":${index},"delta":{"content":"${text}"},"logprobs":null,"finish_reason":null}]}\n\n`);
    const classify = (bytes: Buffer) => fastClassifyBytes(bytes, 6, bytes.length - 2, undefined, undefined, into);
    classify(line(0, 'a'));
    classify(line(1, 'b'));
    const kept = into.head.templates.map((t) => t.prefix);
    expect(kept[0]?.length).toBeGreaterThan(0);
    expect(kept[1]?.length).toBeGreaterThan(0);
    for (let k = 0; k < 6; k++) {
      const index = k % 2;
      const bytes = line(index, `t${k}`);
      const facts = classify(bytes);
      expect(facts).toBe(into);
      const { outputChars, head: _kept, ...rest } = into;
      const { outputChars: aloneChars = 0, ...aloneRest } = fastClassifyBytes(bytes, 6, bytes.length - 2) as typeof into;
      expect(rest).toStrictEqual(aloneRest);
      expect(outputChars).toBe(aloneChars);
    }
    // Choices past the templated ones, and one whose index begins with another's digit (10 and 11 against 1):
    // scanned, the same facts, no template kept or replaced for them.
    for (const index of [10, 11, 5, 1]) {
      const bytes = line(index, `i${index}`);
      const facts = classify(bytes);
      expect(facts).toBe(into);
      expect(into.choices).toEqual([index]);
      const { outputChars, head: _kept, ...rest } = into;
      const { outputChars: aloneChars = 0, ...aloneRest } = fastClassifyBytes(bytes, 6, bytes.length - 2) as typeof into;
      expect(rest).toStrictEqual(aloneRest);
      expect(outputChars).toBe(aloneChars);
    }
    // Matched, not kept again: each choice's template is the buffer kept from its first chunk.
    expect(into.head.templates.map((t) => t.prefix)).toEqual(kept);
    expect(into.head.templates[0]?.prefix).toBe(kept[0]);
    expect(into.head.templates[1]?.prefix).toBe(kept[1]);
    expect(into.head.templates[2]?.prefix.length).toBe(0);
  });

  // Whether the known strings are reused (not sliced again) is not observable from JavaScript: bench/step-alloc.ts
  // measures it, as bytes per event. What is checked here is that passing them never changes the facts.
  it("with the stream's id and model passed as known, matching or not: the same facts as without", () => {
    fc.assert(
      fc.property(plainName, plainName, plainName, fc.boolean(), fc.boolean(), (id, model, other, sameId, sameModel) => {
        const data = JSON.stringify({ id, object: 'chat.completion.chunk', created: 1, model, choices: [{ index: 0, delta: { content: 'x' }, logprobs: null, finish_reason: null }] });
        const knownId = sameId ? [...id].join('') : other;
        const knownModel = sameModel ? [...model].join('') : other;
        const facts = fastClassify(data, knownId, knownModel);
        expect(facts).toStrictEqual(classifyEventDataSlow(data));
        expect(classifyEventData(data, false, knownId, knownModel)).toStrictEqual(classifyEventDataSlow(data));
        if (facts?.kind !== 'chunk') throw new Error('the fast path declined a canonical delta');
        expect(facts.id).toBe(id);
        expect(facts.model).toBe(model);
      }),
      { numRuns: 1000 },
    );
  });
});

// ---------------------------------------------------------------------------------------------------------------
// The fast path on bytes (a framer's undecoded data line): the facts JSON.parse finds in the bytes decoded, or none.
// ---------------------------------------------------------------------------------------------------------------

/** Byte sequences UTF-8 forbids (RFC 3629), cut ones, and well-formed ones of each length. */
const ILL_FORMED = [[0x80], [0xbf], [0xc0, 0xaf], [0xc1, 0xbf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf0, 0x80, 0x80, 0xaf], [0xf4, 0x90, 0x80, 0x80], [0xf5, 0x80, 0x80, 0x80], [0xff], [0xe4, 0xb8], [0xf0, 0x9f, 0x98], [0xc3], [0xe0, 0x9f, 0xbf], [0xf0, 0x8f, 0xbf, 0xbf], [0xc3, 0xc0], [0xe4, 0xc0, 0x80]];
/** The lowest and highest values of each length's ranges too, where a bound one off would show. */
const WELL_FORMED = [[0xc3, 0xa9], [0xe4, 0xb8, 0xad], [0xf0, 0x9f, 0x8e, 0x89], [0xed, 0x9f, 0xbf], [0xee, 0x80, 0x80], [0xf4, 0x8f, 0xbf, 0xbf], [0xc2, 0x80], [0xe0, 0xa0, 0x80], [0xef, 0xbf, 0xbf], [0xf0, 0x90, 0x80, 0x80], [0xdf, 0xbf]];

/** `data` as a framer's data line: after `data: ` in the block, followed by its line ends and more bytes (never read). */
function asDataLine(data: Buffer, after = '\n\n'): DataLineEvent {
  const raw = Buffer.concat([Buffer.from('data: '), data, Buffer.from(after)]);
  return new DataLineEvent(raw, 6, 6 + data.length);
}

/** Asserts the byte path and the decoded path agree on `data`'s bytes; returns whether the fast path took them. */
function bytesAgree(data: Buffer, after?: string): boolean {
  const line = asDataLine(data, after);
  const slow = classifyEventDataSlow(data.toString('utf8'));
  const fast = fastClassifyBytes(line.raw, line.start, line.end);
  if (fast !== undefined) expect(fast).toStrictEqual(slow);
  expect(classifyDataLine(line)).toStrictEqual(slow);
  return fast !== undefined;
}

const chatBytes = (content: Buffer, id = Buffer.from('chatcmpl-3f9a')): Buffer =>
  Buffer.concat([Buffer.from('{"id":"'), id, Buffer.from('","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"'), content, Buffer.from('"},"logprobs":null,"finish_reason":null}]}')]);

describe('fastClassifyBytes: the fast path on a data line left undecoded', () => {
  it('takes well-formed UTF-8 of every length, counting UTF-16 units (four bytes are two)', () => {
    const content = Buffer.from(WELL_FORMED.flat());
    expect(bytesAgree(chatBytes(content))).toBe(true);
    const line = asDataLine(chatBytes(content));
    // 1 + 1 + 2 + 1 + 1 + 2, then 1 + 1 + 1 + 2 + 1: counted here by hand, not by the decoder the oracle uses.
    expect(fastClassifyBytes(line.raw, line.start, line.end)).toMatchObject({ output: [0], outputChars: 14 });
    for (const seq of WELL_FORMED) {
      const one = asDataLine(chatBytes(Buffer.from(seq)));
      expect(fastClassifyBytes(one.raw, one.start, one.end), Buffer.from(seq).toString('hex')).toMatchObject({ outputChars: seq.length === 4 ? 2 : 1 });
    }
  });

  it.each(ILL_FORMED.map((seq) => [Buffer.from(seq).toString('hex'), seq] as const))('declines ill-formed %s in a string, and the data line still classifies as decoded', (_hex, seq) => {
    const bad = Buffer.from(seq);
    expect(bytesAgree(chatBytes(Buffer.concat([Buffer.from('a'), bad, Buffer.from('b')])))).toBe(false);
    // Where the same string with a well-formed character in its place is taken: the decline is the UTF-8 check's.
    expect(bytesAgree(chatBytes(Buffer.from('a\u00e9b')))).toBe(true);
    expect(bytesAgree(chatBytes(Buffer.concat([bad, Buffer.from('\\"')])))).toBe(false);
    expect(bytesAgree(chatBytes(Buffer.from('x'), Buffer.concat([Buffer.from('id'), bad])))).toBe(false);
  });

  it('reads nothing at or past the end it is given', () => {
    const whole = chatBytes(Buffer.from('hi'));
    // Cut before the last brace, the bytes after the end complete the grammar: still declined.
    const cut = whole.subarray(0, whole.length - 1);
    expect(fastClassifyBytes(Buffer.concat([cut, Buffer.from('}\n\n')]), 0, cut.length)).toBeUndefined();
    expect(bytesAgree(cut, '}\n\n')).toBe(false);
    // A four-byte sequence cut by the end, its last byte after it.
    const emoji = chatBytes(Buffer.from([0xf0, 0x9f, 0x8e, 0x89]));
    const at = emoji.indexOf(0x89);
    expect(fastClassifyBytes(emoji, 0, at)).toBeUndefined();
  });

  it("reuses a known id only when it is ASCII spelled by the bytes: \"Ã©\" has the units of \"é\"'s bytes", () => {
    const line = asDataLine(chatBytes(Buffer.from('x'), Buffer.from('é')));
    const facts = fastClassifyBytes(line.raw, line.start, line.end, 'Ã©', 'm');
    expect(facts).toMatchObject({ id: 'é', model: 'm' });
    const plain = asDataLine(chatBytes(Buffer.from('x')));
    expect(fastClassifyBytes(plain.raw, plain.start, plain.end, 'chatcmpl-3f9a')).toMatchObject({ id: 'chatcmpl-3f9a' });
  });

  it('a string with a lone surrogate declines on the string path (its UTF-8 would read U+FFFD where JSON.parse keeps it)', () => {
    const data = `{"id":"a\uD800","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}`;
    expect(fastClassify(data)).toBeUndefined();
    expect(classifyEventData(data)).toStrictEqual(classifyEventDataSlow(data));
    expect((classifyEventData(data) as { id: string }).id).toBe('a\uD800');
  });

  it('agrees with JSON.parse of the decoded bytes on generated events with bytes inserted anywhere', () => {
    let taken = 0;
    let runs = 0;
    const insert = fc.oneof(fc.constantFrom(...ILL_FORMED, ...WELL_FORMED), fc.uint8Array({ minLength: 1, maxLength: 3 }).map((a) => [...a]));
    fc.assert(
      fc.property(serialised, fc.option(fc.tuple(fc.nat(), insert), { freq: 2 }), fc.constantFrom('\n\n', '\r\n\r\n', '}]}\n\n', '\u00e9\n\n'), (data, mutation, after) => {
        runs++;
        let bytes = Buffer.from(data, 'utf8');
        if (mutation !== null) {
          const [at, seq] = mutation;
          const where = at % (bytes.length + 1);
          bytes = Buffer.concat([bytes.subarray(0, where), Buffer.from(seq), bytes.subarray(where)]);
        }
        if (bytesAgree(bytes, after)) taken++;
      }),
      { numRuns: 5000 },
    );
    expect(taken).toBeGreaterThan(runs / 20);
  });
});
