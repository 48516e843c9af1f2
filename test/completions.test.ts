import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { checkCompletion, estimatePromptTokens, withUsageRequested } from '../src/http/completions.js';
import { memberValueSpan } from '../src/http/json-bytes.js';

const usage = (raw: Buffer) => {
  const out = withUsageRequested(raw, JSON.parse(raw.toString()) as Record<string, unknown>);
  return out?.toString();
};

describe('withUsageRequested', () => {
  it('splices stream_options in and keeps every other byte, large integers included', () => {
    const raw = Buffer.from(' {"model":"m","stream":true,"seed":12345678901234567891,"messages":[]}');
    const out = usage(raw);
    expect(out).toBe(' {"stream_options":{"include_usage":true},"model":"m","stream":true,"seed":12345678901234567891,"messages":[]}');
    expect(JSON.parse(out ?? '')).toMatchObject({ stream_options: { include_usage: true } });
  });

  it('merges into stream_options the client sent, and leaves every byte outside it alone', () => {
    const raw = Buffer.from('{"model":"m", "seed":12345678901234567891, "stream_options" : {"continuous_usage_stats":true,"include_usage":false} ,"stream":true}');
    const out = usage(raw);
    expect(out).toBe('{"model":"m", "seed":12345678901234567891, "stream_options" : {"continuous_usage_stats":true,"include_usage":true} ,"stream":true}');
  });

  it('replaces a null stream_options, and leaves a non-object one for the upstream to refuse', () => {
    expect(usage(Buffer.from('{"model":"m","stream_options":null,"stream":true}'))).toBe('{"model":"m","stream_options":{"include_usage":true},"stream":true}');
    expect(usage(Buffer.from('{"model":"m","stream_options":"yes","stream":true}'))).toBeUndefined();
  });

  it('edits the last of duplicate keys (the one JSON.parse keeps), found by its decoded name', () => {
    const raw = Buffer.from('{"stream_options":{"a":1},"x":[{"stream_options":2}],"stream\\u005foptions":{}}');
    expect(usage(raw)).toBe('{"stream_options":{"a":1},"x":[{"stream_options":2}],"stream\\u005foptions":{"include_usage":true}}');
  });

  it('works on a body nested thousands of levels deep elsewhere (no re-serialisation of the body)', () => {
    const deep = '['.repeat(5000) + ']'.repeat(5000);
    const raw = Buffer.from(`{"model":"m","stream":true,"stream_options":{},"junk":${deep}}`);
    expect(usage(raw)).toBe(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"junk":${deep}}`);
  });

  it('property: the result parses to the client object with include_usage set, for any top-level object', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.jsonValue({ maxDepth: 3 })), fc.option(fc.dictionary(fc.string(), fc.boolean()), { nil: undefined }), (rest, options) => {
        const json: Record<string, unknown> = { model: 'm', ...rest };
        delete json['stream_options'];
        if (options !== undefined) json['stream_options'] = options;
        const raw = Buffer.from(JSON.stringify(json, null, 1));
        const out = withUsageRequested(raw, JSON.parse(raw.toString()) as Record<string, unknown>);
        expect(out).toBeDefined();
        const expected = { ...(JSON.parse(raw.toString()) as Record<string, unknown>) };
        expected['stream_options'] = { ...options, include_usage: true };
        expect(JSON.parse(out?.toString() ?? '')).toEqual(expected);
      }),
      { numRuns: 300 },
    );
  });

  it('memberValueSpan finds only top-level members', () => {
    const raw = Buffer.from('{"a":{"k":1},"k":"v"}');
    const span = memberValueSpan(raw, 'k');
    expect(span && raw.toString('utf8', span.start, span.end)).toBe('"v"');
    expect(memberValueSpan(Buffer.from('{"a":{"k":1}}'), 'k')).toBeUndefined();
  });
});

describe('checkCompletion', () => {
  it('counts n × prompts choices for legacy completions', () => {
    expect(checkCompletion('completions', { model: 'm', prompt: ['a', 'b', 'c'], n: 2 }, 128)).toMatchObject({ ok: true, fields: { expectedChoices: 6 } });
    expect(checkCompletion('completions', { model: 'm', prompt: [1, 2, 3] }, 128)).toMatchObject({ ok: true, fields: { expectedChoices: 1 } });
    expect(checkCompletion('completions', { model: 'm', prompt: [[1], [2]] }, 128)).toMatchObject({ ok: true, fields: { expectedChoices: 2 } });
    expect(checkCompletion('chat_completions', { model: 'm', messages: [], n: 3 }, 128)).toMatchObject({ ok: true, fields: { expectedChoices: 3 } });
  });

  it('refuses more choices than server.max_choices with too_many_choices', () => {
    const prompts = Array.from({ length: 100_000 }, () => 'x');
    expect(checkCompletion('completions', { model: 'm', prompt: prompts, n: 128 }, 128)).toMatchObject({
      ok: false,
      status: 400,
      body: { error: { code: 'too_many_choices', param: 'n' } },
    });
    expect(checkCompletion('completions', { model: 'm', prompt: ['a', 'b'], n: 64 }, 128)).toMatchObject({ ok: true });
    expect(checkCompletion('completions', { model: 'm', prompt: ['a', 'b'], n: 65 }, 128)).toMatchObject({ ok: false });
  });

  it('names the field it rejects', () => {
    expect(checkCompletion('chat_completions', [], 128)).toMatchObject({ ok: false, status: 400, body: { error: { param: null } } });
    expect(checkCompletion('chat_completions', { model: 'm' }, 128)).toMatchObject({ ok: false, body: { error: { param: 'messages' } } });
    expect(checkCompletion('completions', { model: 'm' }, 128)).toMatchObject({ ok: false, body: { error: { param: 'prompt' } } });
    expect(checkCompletion('chat_completions', { model: 'm', messages: [], n: 1.5, stream: true }, 128)).toMatchObject({
      ok: false,
      stream: true,
      body: { error: { param: 'n' } },
    });
  });
});

describe('estimatePromptTokens', () => {
  it('counts token ids exactly and text by characters per token, summing several prompts', () => {
    expect(estimatePromptTokens('completions', { prompt: [1, 2, 3, 4, 5] }, 4)).toBe(5);
    expect(estimatePromptTokens('completions', { prompt: [[1, 2], [3]] }, 4)).toBe(3);
    expect(estimatePromptTokens('completions', { prompt: 'x'.repeat(400) }, 4)).toBe(100);
    expect(estimatePromptTokens('completions', { prompt: ['abcd', 'abcdefgh'] }, 4)).toBe(3);
    expect(estimatePromptTokens('completions', { prompt: 42 }, 4)).toBeUndefined();
  });

  it('reads chat messages: string content and text parts, nothing else', () => {
    const messages = [
      { role: 'system', content: 'x'.repeat(40) },
      { role: 'user', content: [{ type: 'text', text: 'y'.repeat(40) }, { type: 'image_url', image_url: { url: 'z'.repeat(1000) } }] },
      { role: 'assistant', content: null, tool_calls: [] },
    ];
    expect(estimatePromptTokens('chat_completions', { messages }, 4)).toBe(20);
    expect(estimatePromptTokens('chat_completions', { messages }, 2)).toBe(40);
    expect(estimatePromptTokens('chat_completions', { messages: [] }, 4)).toBeUndefined();
  });

  it('checkCompletion carries the estimate', () => {
    const checked = checkCompletion('chat_completions', { model: 'm', messages: [{ role: 'user', content: 'x'.repeat(80_000) }] }, 128, 4);
    expect(checked).toMatchObject({ ok: true, fields: { promptTokensEstimate: 20_000 } });
  });
});
