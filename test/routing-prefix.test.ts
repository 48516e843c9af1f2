/**
 * Prefix keys (src/routing/prefix-key.ts): chained block hashes of the rendered prompt, by value — what shares a
 * prefix shares leading blocks, what differs earlier differs from there on, and no body ever throws or costs more
 * than the bounds.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { ProxiedRoute } from '../src/accounting/outcomes.js';
import { prefixBlocks, reusableBlocks } from '../src/routing/prefix-key.js';

const SYSTEM = 'You are a careful assistant. '.repeat(10); // 290 characters: 4 full blocks and a partial one
const chat = (...contents: string[]): Record<string, unknown> => ({
  model: 'm',
  messages: contents.map((content, i) => ({ role: i === 0 ? 'system' : i % 2 === 1 ? 'user' : 'assistant', content })),
});
const text = (n: number, seed = 'x'): string => Array.from({ length: n }, (_, i) => String.fromCharCode(97 + ((i * 7 + seed.charCodeAt(0)) % 26))).join('');

/** How many leading blocks two keys share. */
function shared(a: readonly number[], b: readonly number[]): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

describe('prefixBlocks: chat', () => {
  it('gives the same blocks for the same messages, one per full 64 characters', () => {
    const a = prefixBlocks('chat_completions', chat(SYSTEM, 'What is the capital of France?'));
    const b = prefixBlocks('chat_completions', chat(SYSTEM, 'What is the capital of France?'));
    expect(a.blocks).toEqual(b.blocks);
    expect(a.blocks).toHaveLength(Math.floor((290 + 30) / 64)); // the partial tail is never hashed
    expect(new Set(a.blocks).size).toBe(a.blocks.length);
    for (const h of a.blocks) expect(Number.isSafeInteger(h) && h >= 0).toBe(true);
    expect(a.truncated).toBe(false);
  });

  it('a changed earlier message changes every block from its own on', () => {
    const long = text(640);
    const a = prefixBlocks('chat_completions', chat(SYSTEM, long));
    const b = prefixBlocks('chat_completions', chat(SYSTEM.replace('careful', 'cheerful'), long));
    expect(a.blocks.length).toBe(b.blocks.length);
    // "careful" sits in block 0: from there on every hash differs, though the later text is identical.
    for (let i = 0; i < a.blocks.length; i++) expect(a.blocks[i]).not.toBe(b.blocks[i]);
  });

  it('a changed last message keeps the earlier blocks: a shared system prompt shares its full blocks', () => {
    const a = prefixBlocks('chat_completions', chat(SYSTEM, 'What is the capital of France?'));
    const b = prefixBlocks('chat_completions', chat(SYSTEM, 'Explain the rules of cricket, briefly please.'));
    expect(shared(a.blocks, b.blocks)).toBe(4); // 290 characters of system prompt: 4 full blocks
    expect(a.blocks[4]).not.toBe(b.blocks[4]);
    expect(a.turnEnds).toEqual([4]);
  });

  it('a follow-up turn extends the previous prompt: every earlier full block is shared', () => {
    const turn1 = chat(SYSTEM, 'Tell me about Lisbon.');
    const turn2 = chat(SYSTEM, 'Tell me about Lisbon.', 'Lisbon is the capital of Portugal. '.repeat(4), 'And Porto?');
    const a = prefixBlocks('chat_completions', turn1);
    const b = prefixBlocks('chat_completions', turn2);
    expect(shared(a.blocks, b.blocks)).toBe(a.blocks.length);
    expect(b.turnEnds).toEqual([4, 4, Math.floor((290 + 21 + 140) / 64)]);
    expect(reusableBlocks(b)).toBe(7);
  });

  it('order of messages matters, and where a message ends does not (the rendered text is what counts)', () => {
    const x = text(100, 'a');
    const y = text(100, 'b');
    const ab = prefixBlocks('chat_completions', chat(x, y)).blocks;
    const ba = prefixBlocks('chat_completions', chat(y, x)).blocks;
    expect(ab).toHaveLength(3);
    expect(shared(ab, ba)).toBe(0);
    // The simulator renders the messages' texts concatenated, so the same text split differently is the same prompt.
    const split = prefixBlocks('chat_completions', chat(x.slice(0, 30), x.slice(30) + y)).blocks;
    expect(split).toEqual(ab);
  });

  it('repeated blocks do not cancel (chained, not XOR): AA differs from BB', () => {
    const a = text(64, 'a');
    const b = text(64, 'b');
    const aa = prefixBlocks('chat_completions', chat(a + a)).blocks;
    const bb = prefixBlocks('chat_completions', chat(b + b)).blocks;
    expect(aa[1]).not.toBe(aa[0]);
    expect(aa[1]).not.toBe(bb[1]);
  });

  it('cache_salt and model change the first hash, and so all of them; tools too', () => {
    const body = chat(SYSTEM, 'hello');
    const base = prefixBlocks('chat_completions', body).blocks;
    const variants = [
      { ...body, cache_salt: 'tenant-a' },
      { ...body, model: 'other' },
      { ...body, tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }] },
    ];
    const keys = variants.map((v) => prefixBlocks('chat_completions', v).blocks);
    for (const k of keys) {
      expect(k).toHaveLength(base.length);
      for (let i = 0; i < k.length; i++) expect(k[i]).not.toBe(base[i]);
    }
    expect(prefixBlocks('chat_completions', { ...body, cache_salt: 'tenant-b' }).blocks[0]).not.toBe(keys[0]?.[0]);
    // An empty salt is no salt (vLLM refuses it; the key does not care).
    expect(prefixBlocks('chat_completions', { ...body, cache_salt: '' }).blocks).toEqual(base);
  });

  it('reads text parts, tool calls and tool messages', () => {
    const parts = prefixBlocks('chat_completions', {
      model: 'm',
      messages: [{ role: 'user', content: [{ type: 'text', text: text(40, 'a') }, { type: 'image_url', image_url: { url: 'x' } }, { type: 'text', text: text(40, 'b') }] }],
    });
    const plain = prefixBlocks('chat_completions', chat(text(40, 'a') + text(40, 'b')));
    expect(parts.blocks).toEqual(plain.blocks);
    const withCall = prefixBlocks('chat_completions', {
      model: 'm',
      messages: [
        { role: 'user', content: text(60) },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'lookup', arguments: '{"q":"lisbon"}' } }] },
        { role: 'tool', tool_call_id: 'c', content: text(80, 'z') },
      ],
    });
    expect(withCall.blocks).toEqual(prefixBlocks('chat_completions', chat(text(60) + 'lookup{"q":"lisbon"}' + text(80, 'z'))).blocks);
  });
});

describe('prefixBlocks: chained, by property', () => {
  it('a one-character change keeps every block before it and changes every block from its own on', () => {
    const messages = fc.array(fc.string({ unit: 'binary', maxLength: 150 }), { minLength: 1, maxLength: 6 });
    fc.assert(
      fc.property(messages, fc.nat(), fc.nat(), (contents, pick, at) => {
        const k = pick % contents.length;
        const original = contents[k] ?? '';
        if (original.length === 0) return;
        const p = at % original.length;
        const changed = contents.slice();
        changed[k] = original.slice(0, p) + String.fromCharCode((original.charCodeAt(p) + 1) % 0x10000) + original.slice(p + 1);
        const a = prefixBlocks('chat_completions', chat(...contents)).blocks;
        const b = prefixBlocks('chat_completions', chat(...changed)).blocks;
        const offset = contents.slice(0, k).reduce((sum, c) => sum + c.length, 0) + p;
        const first = Math.floor(offset / 64);
        expect(b.length).toBe(a.length);
        for (let i = 0; i < a.length; i++) {
          if (i < first) expect(b[i]).toBe(a[i]);
          else expect(b[i]).not.toBe(a[i]);
        }
      }),
      { numRuns: 500 },
    );
  });
});

describe('prefixBlocks: bounds', () => {
  it('maxBlocks bounds the work: the start only, flagged truncated', () => {
    const huge = text(1_000_000);
    const t0 = performance.now();
    const key = prefixBlocks('chat_completions', chat(huge), { maxBlocks: 8 });
    const elapsed = performance.now() - t0;
    expect(key.blocks).toHaveLength(8);
    expect(key.truncated).toBe(true);
    expect(key.blocks).toEqual(prefixBlocks('chat_completions', chat(huge.slice(0, 8 * 64 + 1)), { maxBlocks: 8 }).blocks);
    expect(elapsed).toBeLessThan(50); // hashing a million characters would take several ms at least
    // Exactly maxBlocks of text is not truncated; a character more is.
    expect(prefixBlocks('chat_completions', chat(huge.slice(0, 512)), { maxBlocks: 8 }).truncated).toBe(false);
    expect(prefixBlocks('chat_completions', chat(huge.slice(0, 512), 'x'), { maxBlocks: 8 }).truncated).toBe(true);
    expect(prefixBlocks('chat_completions', chat(huge), {}).blocks).toHaveLength(256);
  });

  it('blockChars sets the block size', () => {
    expect(prefixBlocks('chat_completions', chat(text(256)), { blockChars: 32 }).blocks).toHaveLength(8);
    expect(prefixBlocks('chat_completions', chat(text(256)), { blockChars: 0 }).blocks).toHaveLength(4); // invalid → default
  });

  it('a million empty parts stop at maxParts', () => {
    const messages = Array.from({ length: 1_000_000 }, () => ({ role: 'user', content: '' }));
    const key = prefixBlocks('chat_completions', { model: 'm', messages });
    expect(key.blocks).toEqual([]);
    expect(key.truncated).toBe(true);
    expect(key.turnEnds.length).toBeLessThanOrEqual(4096);
  });

  it('garbage bodies never throw and give bounded results', () => {
    const routes: ProxiedRoute[] = ['chat_completions', 'completions', 'responses', 'messages', 'embeddings', 'passthrough'];
    fc.assert(
      fc.property(fc.constantFrom(...routes), fc.anything({ maxDepth: 4 }), (route, body) => {
        const key = prefixBlocks(route, body, { maxBlocks: 16 });
        expect(key.blocks.length).toBeLessThanOrEqual(16);
        expect(key.turnEnds.every((e, i, all) => e <= key.blocks.length && (i === 0 || (all[i - 1] ?? 0) <= e))).toBe(true);
        // Inside a body's field too.
        prefixBlocks(route, { model: body, messages: body, prompt: body, input: body, instructions: body, system: body, tools: body, cache_salt: body });
      }),
      { numRuns: 500 },
    );
    for (const body of [null, undefined, 42, 'text', [], [{ content: 'x' }], { messages: 'nope' }, { messages: [null, 3, 'x', { content: 7 }] }]) {
      expect(prefixBlocks('chat_completions', body).blocks).toEqual([]);
    }
  });

  it('deeply nested tools are bounded', () => {
    let nested: unknown = 'leaf';
    for (let i = 0; i < 10_000; i++) nested = { a: [nested] };
    expect(() => prefixBlocks('chat_completions', { model: 'm', tools: nested, messages: [{ role: 'user', content: text(64) }] })).not.toThrow();
  });
});

describe('prefixBlocks: other routes', () => {
  it('completions: a prompt string, the first of a list, token ids in 16-id blocks', () => {
    const prompt = text(200);
    const one = prefixBlocks('completions', { model: 'm', prompt });
    expect(one.blocks).toHaveLength(3);
    expect(prefixBlocks('completions', { model: 'm', prompt: [prompt, 'other'] }).blocks).toEqual(one.blocks);
    // A raw prompt is not a chat-templated one: the same text on the chat route is a different prompt.
    expect(shared(prefixBlocks('chat_completions', chat(prompt)).blocks, one.blocks)).toBe(0);

    const ids = Array.from({ length: 50 }, (_, i) => i * 1000 + 7);
    const tokens = prefixBlocks('completions', { model: 'm', prompt: ids });
    expect(tokens.blocks).toHaveLength(3);
    expect(prefixBlocks('completions', { model: 'm', prompt: [ids] }).blocks).toEqual(tokens.blocks);
    const changed = prefixBlocks('completions', { model: 'm', prompt: [...ids.slice(0, 20), 1, ...ids.slice(21)] });
    expect(shared(changed.blocks, tokens.blocks)).toBe(1);
    expect(prefixBlocks('completions', { model: 'm', prompt: ids.map((i) => i + 2 ** 40) }).blocks[0]).not.toBe(tokens.blocks[0]);
    expect(prefixBlocks('completions', { model: 'm', prompt: ids }, { maxBlocks: 2 }).truncated).toBe(true);
    expect(prefixBlocks('completions', { model: 'm', prompt: ids.slice(0, 32) }, { maxBlocks: 2 }).truncated).toBe(false);
    expect(prefixBlocks('completions', { model: 'm', prompt: [1.5, 2] }).blocks).toEqual([]);
  });

  it('responses: instructions then input, string or items', () => {
    const instructions = SYSTEM;
    const a = prefixBlocks('responses', { model: 'm', instructions, input: 'What is the capital of France?' });
    const b = prefixBlocks('responses', { model: 'm', instructions, input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is the capital of France?' }] }] });
    expect(a.blocks).toEqual(b.blocks);
    expect(a.turnEnds).toEqual([4]);
    // Rendered like the chat prompt with the instructions as its system message.
    expect(a.blocks).toEqual(prefixBlocks('chat_completions', chat(SYSTEM, 'What is the capital of France?')).blocks);
    const items = prefixBlocks('responses', {
      model: 'm',
      input: [text(30), { type: 'function_call', name: 'f', arguments: text(40, 'q') }, { type: 'function_call_output', output: text(70, 'r') }],
    });
    expect(items.blocks).toEqual(prefixBlocks('responses', { model: 'm', input: text(30) + text(40, 'q') + text(70, 'r') }).blocks);
    expect(prefixBlocks('responses', { model: 'm', input: 5 }).blocks).toEqual([]);
  });

  it('messages (Anthropic): system then messages, text blocks and tool results', () => {
    const a = prefixBlocks('messages', { model: 'm', system: SYSTEM, messages: [{ role: 'user', content: 'What is the capital of France?' }] });
    const b = prefixBlocks('messages', {
      model: 'm',
      system: [{ type: 'text', text: SYSTEM }],
      messages: [{ role: 'user', content: [{ type: 'text', text: 'What is the capital of France?' }] }],
    });
    expect(a.blocks).toEqual(b.blocks);
    expect(a.turnEnds).toEqual([4]);
    expect(a.blocks).toEqual(prefixBlocks('chat_completions', chat(SYSTEM, 'What is the capital of France?')).blocks);
    const tool = prefixBlocks('messages', {
      model: 'm',
      messages: [
        { role: 'user', content: text(50) },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', content: text(50, 'k') }, { type: 'tool_result', tool_use_id: 'u', content: [{ type: 'text', text: text(50, 'j') }] }] },
      ],
    });
    expect(tool.blocks).toEqual(prefixBlocks('messages', { model: 'm', messages: [{ role: 'user', content: text(50) + text(50, 'k') + text(50, 'j') }] }).blocks);
  });

  it('routes without a cached prompt give nothing', () => {
    expect(prefixBlocks('embeddings', { model: 'm', input: text(500) }).blocks).toEqual([]);
    expect(prefixBlocks('passthrough', { model: 'm', messages: [{ content: text(500) }] }).blocks).toEqual([]);
  });
});
