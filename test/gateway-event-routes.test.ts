/**
 * `/v1/responses` and `/v1/messages` through the gateway over real sockets, against a scripted upstream that sends
 * what vLLM sends on these routes (docs/routes.md): the Responses stream that is cut rather than failed, the
 * Messages error event followed by a clean end. Read back through the official SDKs (openai 6, @anthropic-ai/sdk 1):
 * a delivered answer iterates cleanly, every failure after commit raises.
 */
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useCleanups } from './helpers/cleanups.js';
import { startScripted } from './helpers/scripted.js';
import { settledAfter } from './helpers/settle.js';
import { eventData, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const SSE = { 'content-type': 'text/event-stream; charset=utf-8' };
const named = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ ...data, type })}\n\n`;

// --- Responses, as vLLM's simple (non-Harmony) path writes it ----------------------------------------------------

function responseObject(status: string, text: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    id: 'resp_1',
    created_at: 1,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    model: 'sim-model',
    object: 'response',
    output: text === '' ? [] : [{ id: 'm1', content: [{ annotations: [], text, type: 'output_text', logprobs: null }], role: 'assistant', status: 'completed', type: 'message' }],
    status,
    usage: status === 'in_progress' ? null : { input_tokens: 5, input_tokens_details: { cached_tokens: 2 }, output_tokens: 3, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 8 },
    ...extra,
  };
}

/** created, in_progress, item and part added, then `pieces` as text deltas: sequence numbers 0…3+n. */
function responsesHead(pieces: string[]): { text: string; next: number } {
  let seq = 0;
  let text =
    named('response.created', { response: responseObject('in_progress', ''), sequence_number: seq++ }) +
    named('response.in_progress', { response: responseObject('in_progress', ''), sequence_number: seq++ }) +
    named('response.output_item.added', { item: { id: 'i1', content: [], role: 'assistant', status: 'in_progress', type: 'message' }, output_index: 0, sequence_number: seq++ }) +
    named('response.content_part.added', { content_index: 0, item_id: 'i1', output_index: 0, part: { annotations: [], text: '', type: 'output_text', logprobs: [] }, sequence_number: seq++ });
  for (const delta of pieces) {
    text += named('response.output_text.delta', { content_index: 0, delta, item_id: 'i1', logprobs: [], output_index: 0, sequence_number: seq++ });
  }
  return { text, next: seq };
}

function responsesComplete(status = 'completed', pieces = ['Hel', 'lo', '!']): string {
  const head = responsesHead(pieces);
  return head.text + named('response.completed', { response: responseObject(status, pieces.join('')), sequence_number: head.next });
}

// --- Messages, as vLLM's converter writes it ---------------------------------------------------------------------

function messagesHead(pieces: string[]): string {
  let text =
    named('message_start', { message: { id: 'chatcmpl-1', content: [], model: 'sim-model', stop_reason: null, stop_sequence: null, usage: { input_tokens: 5, output_tokens: 0 } } }) +
    named('content_block_start', { content_block: { type: 'text', text: '' }, index: 0 });
  for (const piece of pieces) text += named('content_block_delta', { delta: { type: 'text_delta', text: piece }, index: 0 });
  return text;
}

function messagesComplete(stopReason: string | null = 'end_turn'): string {
  return (
    messagesHead(['Hel', 'lo']) +
    named('content_block_stop', { index: 0 }) +
    named('message_delta', { delta: { stop_reason: stopReason }, usage: { input_tokens: 5, output_tokens: 2 } }) +
    named('message_stop', {})
  );
}

const MESSAGES_ERROR = named('error', { error: { type: 'internal_error', message: '1 validation error for ChatCompletionStreamResponse' } });

type Script = (res: import('node:http').ServerResponse) => void;

const SCRIPTS: Record<string, Script> = {
  // Responses
  r_ok: (res) => (res.writeHead(200, SSE), res.end(responsesComplete())),
  r_incomplete: (res) => (res.writeHead(200, SSE), res.end(responsesComplete('incomplete'))),
  r_cut_before_output: (res) => {
    res.writeHead(200, SSE);
    res.write(responsesHead([]).text);
    setImmediate(() => res.socket?.destroy());
  },
  r_cut_mid: (res) => {
    res.writeHead(200, SSE);
    res.write(responsesHead(['Hel', 'lo']).text);
    setImmediate(() => res.socket?.destroy());
  },
  r_clean_eof_mid: (res) => (res.writeHead(200, SSE), res.end(responsesHead(['Hel']).text)),
  r_failed: (res) => {
    const head = responsesHead(['Hel']);
    res.writeHead(200, SSE);
    res.end(head.text + named('response.failed', { response: responseObject('failed', 'Hel', { error: { code: 'server_error', message: 'engine died' } }), sequence_number: head.next }));
  },
  r_hang: (res) => (res.writeHead(200, SSE), res.write(responsesHead(['Hel']).text)),
  r_json: (res) => (res.writeHead(200, { 'content-type': 'application/json' }), res.end(JSON.stringify(responseObject('completed', 'Hello!')))),
  r_schema: (res) => (res.writeHead(200, SSE), res.end(responsesComplete('completed', ['{"name":', '"Ada"}']))),
  // Messages
  m_ok: (res) => (res.writeHead(200, SSE), res.end(messagesComplete())),
  m_max_tokens: (res) => (res.writeHead(200, SSE), res.end(messagesComplete('max_tokens'))),
  m_null_stop: (res) => (res.writeHead(200, SSE), res.end(messagesComplete(null))),
  m_error_mid: (res) => (res.writeHead(200, SSE), res.end(messagesHead(['Hel']) + MESSAGES_ERROR)),
  m_error_first: (res) => (res.writeHead(200, SSE), res.end(MESSAGES_ERROR)),
  m_clean_eof_mid: (res) => (res.writeHead(200, SSE), res.end(messagesHead(['Hel']))),
  m_500: (res) => {
    res.writeHead(500, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ type: 'error', error: { type: 'internal_error', message: 'prompt is too long' } }));
  },
  m_json: (res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({ id: 'chatcmpl-1', type: 'message', role: 'assistant', content: [{ type: 'text', text: 'Hello' }], model: 'sim-model', stop_reason: 'end_turn', usage: { input_tokens: 5, output_tokens: 2 } }),
    );
  },
};

async function gateway(config: Record<string, unknown> = {}): Promise<Stack> {
  const upstream = await startScripted((req, res) => {
    const script = SCRIPTS[String(req.headers['x-case'])];
    if (script === undefined) {
      res.writeHead(500);
      res.end();
      return;
    }
    script(res);
  });
  cleanups.push(() => upstream.close());
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [{ name: 'scripted', url: upstream.url }],
    config: { health: { interval: '1h' }, retries: { max_attempts: 1 }, ...config },
  });
  cleanups.push(() => stack.close());
  return stack;
}

const RESPONSES_BODY = { model: 'sim-model', input: 'Say hello', stream: true };
const MESSAGES_BODY = { model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'Say hello' }], stream: true };

describe('/v1/responses', () => {
  const client = (stack: Stack, name: string) => new OpenAI({ baseURL: `${stack.base}/v1`, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-case': name } });

  it('a completed stream is delivered: the SDK iterates to response.completed; usage and finish counted', async () => {
    const stack = await gateway();
    const stream = await client(stack, 'r_ok').responses.create({ model: 'sim-model', input: 'Say hello', stream: true });
    const types: string[] = [];
    let text = '';
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
    expect(text).toBe('Hello!');
    expect(types.at(0)).toBe('response.created');
    expect(types.at(-1)).toBe('response.completed');
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ route: 'responses', outcome: 'delivered', code: 200, finishReasons: ['stop'], accepted: true, usage: { promptTokens: 5, completionTokens: 3, cachedTokens: 2 } });
    expect(s.ttftMs).toBeDefined();
    expect(await stack.metric('waybill_requests_total', { route: 'responses', outcome: 'delivered', stream: 'true' })).toBe(1);
    expect(await stack.metric('waybill_cached_prompt_tokens_total')).toBe(2);
  });

  it('status incomplete is delivered with finish reason length (not_truncated fails)', async () => {
    const stack = await gateway();
    await post(stack.base, '/v1/responses', RESPONSES_BODY, { 'x-case': 'r_incomplete' });
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ outcome: 'delivered', finishReasons: ['length'], accepted: false, failedChecks: ['not_truncated'] });
  });

  it('cut before any output (vLLM fails lazily after response.created): a real 502, never a 200, and the SDK raises', async () => {
    const stack = await gateway();
    const result = await post(stack.base, '/v1/responses', RESPONSES_BODY, { 'x-case': 'r_cut_before_output' });
    expect(result.status).toBe(502);
    expect(JSON.parse(result.body)).toHaveProperty('error.code');
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ route: 'responses', outcome: 'failed', code: 502 });
    await expect(client(stack, 'r_cut_before_output').responses.create({ model: 'sim-model', input: 'x', stream: true })).rejects.toMatchObject({ status: 502 });
  });

  it.each(['r_cut_mid', 'r_clean_eof_mid'])('%s after commit: Waybill ends with an error event the SDK raises on, numbered after the last', async (name) => {
    const stack = await gateway();
    const raw = await post(stack.base, '/v1/responses', RESPONSES_BODY, { 'x-case': name });
    const last = JSON.parse(eventData(raw.body).at(-1) ?? '{}') as Record<string, unknown>;
    const sent = name === 'r_cut_mid' ? 6 : 5;
    expect(last).toMatchObject({ type: 'error', error: { code: 'stream_truncated' }, sequence_number: sent });
    expect(raw.body).toContain('event: error\n');
    expect((await settledAfter(stack, 1)).outcome).toBe('incomplete');

    const stream = await client(stack, name).responses.create({ model: 'sim-model', input: 'x', stream: true });
    await expect(
      (async () => {
        for await (const _event of stream) void _event;
      })(),
    ).rejects.toThrow();
  });

  it('response.failed (a newer server) is forwarded and counted as a stream error', async () => {
    const stack = await gateway();
    const raw = await post(stack.base, '/v1/responses', RESPONSES_BODY, { 'x-case': 'r_failed' });
    expect(raw.body).toContain('event: response.failed');
    expect((await settledAfter(stack, 1)).outcome).toBe('stream_error');
  });

  it('a stream that hangs open after output is ended by the idle timeout and counted', async () => {
    const stack = await gateway({ timeouts: { idle: '200ms' } });
    const raw = await post(stack.base, '/v1/responses', RESPONSES_BODY, { 'x-case': 'r_hang' });
    expect(JSON.parse(eventData(raw.body).at(-1) ?? '{}')).toMatchObject({ type: 'error', error: { code: 'stream_timeout' } });
    expect((await settledAfter(stack, 1)).outcome).toBe('timeout');
  });

  it('non-stream: the response object is delivered, with usage', async () => {
    const stack = await gateway();
    const response = await client(stack, 'r_json').responses.create({ model: 'sim-model', input: 'x' });
    expect(response.output_text).toBe('Hello!');
    expect(await settledAfter(stack, 1)).toMatchObject({ outcome: 'delivered', stream: false, finishReasons: ['stop'], usage: { promptTokens: 5 } });
  });

  it('text.format json_schema is an output contract checked on the streamed text', async () => {
    const stack = await gateway();
    const schema = { type: 'object', properties: { name: { type: 'string' } }, required: ['name', 'age'] };
    await post(stack.base, '/v1/responses', { ...RESPONSES_BODY, text: { format: { type: 'json_schema', name: 'p', schema } } }, { 'x-case': 'r_schema' });
    const s = await settledAfter(stack, 1);
    expect(s.checks).toEqual([{ answer_present: 'pass', not_truncated: 'pass', format_valid: 'fail' }]);
  });
});

describe('/v1/messages', () => {
  const client = (stack: Stack, name: string) => new Anthropic({ baseURL: stack.base, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-case': name } });

  it('a stream ending in message_stop is delivered: the Anthropic SDK iterates cleanly', async () => {
    const stack = await gateway();
    const stream = await client(stack, 'm_ok').messages.create({ model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    const types: string[] = [];
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
    }
    expect(text).toBe('Hello');
    expect(types.at(-1)).toBe('message_stop');
    const s = await settledAfter(stack, 1);
    expect(s).toMatchObject({ route: 'messages', outcome: 'delivered', finishReasons: ['stop'], accepted: true, usage: { promptTokens: 5, completionTokens: 2 } });
  });

  it.each([
    ['m_max_tokens', 'length'],
    ['m_null_stop', 'abort_or_repetition'],
  ])('%s: stop reason mapped to %s', async (name, reason) => {
    const stack = await gateway();
    await post(stack.base, '/v1/messages', MESSAGES_BODY, { 'x-case': name });
    expect(await settledAfter(stack, 1)).toMatchObject({ outcome: 'delivered', finishReasons: [reason] });
  });

  it('stop_reason null (vLLM: abort or repetition) is delivered with finish reason abort_or_repetition, never none, and not accepted', async () => {
    const stack = await gateway();
    const result = await post(stack.base, '/v1/messages', MESSAGES_BODY, { 'x-case': 'm_null_stop' });
    expect(result.status).toBe(200);
    expect(await settledAfter(stack, 1)).toMatchObject({ outcome: 'delivered', accepted: false, failedChecks: ['not_truncated'] });
    const labels = { model: 'sim-model' };
    expect(await stack.metric('waybill_choice_finish_reasons_total', { ...labels, finish_reason: 'abort_or_repetition' })).toBe(1);
    expect(await stack.metric('waybill_choice_finish_reasons_total', { ...labels, finish_reason: 'none' })).toBe(0);
    expect(await stack.metric('waybill_requests_total', { ...labels, route: 'messages', outcome: 'delivered' })).toBe(1);
    expect(await stack.metric('waybill_requests_accepted_total', { ...labels, route: 'messages' })).toBe(0);
  });

  it('an error event mid-stream is forwarded, counted as a stream error, and raised by the SDK', async () => {
    const stack = await gateway();
    const raw = await post(stack.base, '/v1/messages', MESSAGES_BODY, { 'x-case': 'm_error_mid' });
    expect(raw.body).toContain('event: error');
    expect((await settledAfter(stack, 1)).outcome).toBe('stream_error');
    const stream = await client(stack, 'm_error_mid').messages.create({ model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }], stream: true });
    await expect(
      (async () => {
        for await (const _event of stream) void _event;
      })(),
    ).rejects.toThrow();
  });

  it('an error event before any output gets a real status with an Anthropic-shaped body', async () => {
    const stack = await gateway();
    const result = await post(stack.base, '/v1/messages', MESSAGES_BODY, { 'x-case': 'm_error_first' });
    expect(result.status).toBe(502);
    expect(JSON.parse(result.body)).toMatchObject({ type: 'error', error: { type: 'api_error' } });
    await expect(
      client(stack, 'm_error_first').messages.create({ model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }], stream: true }),
    ).rejects.toMatchObject({ status: 502 });
  });

  it("a clean end without message_stop: Waybill's own Anthropic error event, and the SDK raises", async () => {
    const stack = await gateway();
    const raw = await post(stack.base, '/v1/messages', MESSAGES_BODY, { 'x-case': 'm_clean_eof_mid' });
    expect(JSON.parse(eventData(raw.body).at(-1) ?? '{}')).toMatchObject({ type: 'error', error: { type: 'api_error' } });
    expect((await settledAfter(stack, 1)).outcome).toBe('incomplete');
    const stream = await client(stack, 'm_clean_eof_mid').messages.create({ model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }], stream: true });
    await expect(
      (async () => {
        for await (const _event of stream) void _event;
      })(),
    ).rejects.toThrow();
  });

  it("vLLM's 500 before streaming is relayed in Anthropic's shape with its message", async () => {
    const stack = await gateway();
    const result = await post(stack.base, '/v1/messages', MESSAGES_BODY, { 'x-case': 'm_500' });
    expect(result.status).toBe(502);
    const body = JSON.parse(result.body) as { type: string; error: { type: string; message: string } };
    expect(body).toMatchObject({ type: 'error', error: { type: 'api_error' } });
    expect(body.error.message).toContain('prompt is too long');
  });

  it("the gateway's own refusals use Anthropic's shape on this route", async () => {
    const stack = await gateway();
    const result = await post(stack.base, '/v1/messages', { model: 'sim-model' });
    expect(result.status).toBe(400);
    expect(JSON.parse(result.body)).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } });
    const unknown = await post(stack.base, '/v1/messages', { ...MESSAGES_BODY, model: 'nope' });
    expect(JSON.parse(unknown.body)).toMatchObject({ type: 'error', error: { type: 'not_found_error' } });
  });

  it("the client's x-api-key (what the Anthropic SDK sends) is for the gateway: never forwarded upstream", async () => {
    const seen: Array<string | string[] | undefined> = [];
    const upstream = await startScripted((req, res) => {
      seen.push(req.headers['x-api-key'], req.headers['authorization']);
      SCRIPTS['m_ok']?.(res);
    });
    cleanups.push(() => upstream.close());
    const stack = await startStack({ sims: 0, extraUpstreams: [{ name: 'scripted', url: upstream.url }], config: { health: { interval: '1h' } } });
    cleanups.push(() => stack.close());
    const stream = await new Anthropic({ baseURL: stack.base, apiKey: 'client-secret', maxRetries: 0 }).messages.create({
      model: 'sim-model',
      max_tokens: 8,
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });
    for await (const _event of stream) void _event;
    expect(seen).toEqual([undefined, undefined]);
  });

  it('non-stream: the message is delivered with its stop reason and usage', async () => {
    const stack = await gateway();
    const message = await client(stack, 'm_json').messages.create({ model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }] });
    expect(message.content[0]).toMatchObject({ type: 'text', text: 'Hello' });
    expect(await settledAfter(stack, 1)).toMatchObject({ route: 'messages', outcome: 'delivered', stream: false, finishReasons: ['stop'], usage: { completionTokens: 2 } });
  });
});
