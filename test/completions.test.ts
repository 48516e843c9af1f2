import { describe, expect, it } from 'vitest';
import { checkCompletion, withUsageRequested } from '../src/http/completions.js';

describe('withUsageRequested', () => {
  it('splices stream_options in and keeps every other byte, large integers included', () => {
    const raw = Buffer.from(' {"model":"m","stream":true,"seed":12345678901234567891,"messages":[]}');
    const json = JSON.parse(raw.toString()) as Record<string, unknown>;
    const out = withUsageRequested(raw, json).toString();
    expect(out).toBe(' {"stream_options":{"include_usage":true},"model":"m","stream":true,"seed":12345678901234567891,"messages":[]}');
    expect(JSON.parse(out)).toMatchObject({ stream_options: { include_usage: true } });
  });

  it('merges into stream_options the client sent', () => {
    const json = { model: 'm', stream: true, stream_options: { continuous_usage_stats: true } };
    const out = JSON.parse(withUsageRequested(Buffer.from(JSON.stringify(json)), json).toString()) as Record<string, unknown>;
    expect(out['stream_options']).toEqual({ continuous_usage_stats: true, include_usage: true });
  });
});

describe('checkCompletion', () => {
  it('counts n × prompts choices for legacy completions', () => {
    expect(checkCompletion('completions', { model: 'm', prompt: ['a', 'b', 'c'], n: 2 })).toMatchObject({ ok: true, fields: { expectedChoices: 6 } });
    expect(checkCompletion('completions', { model: 'm', prompt: [1, 2, 3] })).toMatchObject({ ok: true, fields: { expectedChoices: 1 } });
    expect(checkCompletion('completions', { model: 'm', prompt: [[1], [2]] })).toMatchObject({ ok: true, fields: { expectedChoices: 2 } });
    expect(checkCompletion('chat_completions', { model: 'm', messages: [], n: 3 })).toMatchObject({ ok: true, fields: { expectedChoices: 3 } });
  });

  it('names the field it rejects', () => {
    expect(checkCompletion('chat_completions', [])).toMatchObject({ ok: false, status: 400, body: { error: { param: null } } });
    expect(checkCompletion('chat_completions', { model: 'm' })).toMatchObject({ ok: false, body: { error: { param: 'messages' } } });
    expect(checkCompletion('completions', { model: 'm' })).toMatchObject({ ok: false, body: { error: { param: 'prompt' } } });
    expect(checkCompletion('chat_completions', { model: 'm', messages: [], n: 1.5, stream: true })).toMatchObject({
      ok: false,
      stream: true,
      body: { error: { param: 'n' } },
    });
  });
});
