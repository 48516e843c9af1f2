/**
 * The simulator's `/v1/responses` and `/v1/messages`, on real sockets, against what vLLM@52a31cce writes on these
 * routes (docs/routes.md, docs/simulator.md): event order, sequence numbers, usage, the Responses stream that is cut
 * rather than failed, the Messages `error` event followed by a clean end, the bodies and refusals. Then the official
 * SDKs (openai 6, @anthropic-ai/sdk 1) read the simulator directly, as a fidelity check: success iterates to the
 * terminal event, the cut Responses stream and the Messages error event raise.
 */
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { request as httpRequest } from 'node:http';
import { describe, expect, it } from 'vitest';
import { chatErrorValidationMessage } from '../src/sim/messages.js';
import type { SimOptions } from '../src/sim/server.js';
import { choiceText, errorInfo } from '../src/sim/wire.js';
import { RESPONSES_STREAM_NAMES, responsesUsage } from './fixtures/vllm-responses.js';
import { sendFresh as send, type Reply } from './helpers/one-request.js';
import { nextEnd } from './helpers/sim-records.js';
import { useSimulators } from './helpers/simulators.js';

// ---- harness ----

const FAST: Partial<SimOptions> = { ttftMs: 2, itlMs: 1, jitter: 0, outputTokens: 4, prefillMsPer1kTokens: 0 };
const start = useSimulators(FAST);

interface Named {
  name: string;
  data: string;
}

/** Named events of an LF-framed stream without comments: `event: <name>\ndata: <data>\n\n` each. */
function eventsOf(text: string): Named[] {
  if (text === '') return [];
  const complete = text.endsWith('\n\n') ? text.slice(0, -2) : text.slice(0, text.lastIndexOf('\n\n'));
  return complete.split('\n\n').map((block) => {
    const match = /^event: ([^\n]+)\ndata: ([^\n]*)$/.exec(block);
    expect(match, block).not.toBeNull();
    return { name: match?.[1] ?? '', data: match?.[2] ?? '' };
  });
}

const json = (event: Named): Record<string, unknown> => JSON.parse(event.data) as Record<string, unknown>;
const names = (events: Named[]): string[] => events.map((e) => e.name);

const RESPONSES = { model: 'sim-model', input: 'Say hello, world', stream: true };
const MESSAGES = { model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'Say hello, world' }], stream: true };
/** ceil(16 chars / 4) */
const PROMPT_TOKENS = 4;

/** ResponsesResponse's keys, in vLLM@52a31cce's declaration order. */
const RESPONSE_KEYS = [
  'id', 'created_at', 'incomplete_details', 'instructions', 'metadata', 'model', 'object', 'output', 'parallel_tool_calls',
  'temperature', 'tool_choice', 'tools', 'top_p', 'background', 'max_output_tokens', 'max_tool_calls', 'previous_response_id',
  'prompt', 'reasoning', 'service_tier', 'status', 'text', 'top_logprobs', 'truncation', 'usage', 'user', 'presence_penalty',
  'frequency_penalty', 'kv_transfer_params', 'input_messages', 'output_messages',
];

/** Every event's `type` is its name and `sequence_number` counts 0, 1, 2… with no gap. */
function expectNumbered(events: Named[]): void {
  events.forEach((event, i) => {
    const data = json(event);
    expect(data.type).toBe(event.name);
    expect(data.sequence_number).toBe(i);
  });
}

// ---- /v1/responses ----

describe('POST /v1/responses, streaming', () => {
  it('sends created, in_progress, the item and part, one delta per output event, the done events and completed', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-request-id': 'req-abc' } });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(reply.complete).toBe(true);
    expect(reply.text).not.toContain('[DONE]');
    expect(reply.text).not.toMatch(/^:/m);

    const events = eventsOf(reply.text);
    expect(names(events)).toEqual(RESPONSES_STREAM_NAMES);
    expectNumbered(events);

    const created = json(events[0] as Named).response as Record<string, unknown>;
    expect(Object.keys(created)).toEqual(RESPONSE_KEYS);
    expect(created).toMatchObject({ object: 'response', status: 'in_progress', output: [], usage: null, incomplete_details: null, model: 'sim-model' });
    // X-Request-Id is not the response id on this route.
    expect(created.id).toMatch(/^resp_[0-9a-f]{16}$/);
    expect(String(created.id)).not.toContain('req-abc');
    expect(json(events[1] as Named).response).toEqual(created);

    const itemId = (json(events[2] as Named).item as { id: string }).id;
    expect(itemId).toMatch(/^[0-9a-f]{16}$/);
    expect(events[2]?.data).toBe(
      `{"item":{"id":"${itemId}","content":[],"role":"assistant","status":"in_progress","type":"message","phase":null},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}`,
    );
    expect(events[3]?.data).toBe(
      `{"content_index":0,"item_id":"${itemId}","output_index":0,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},"sequence_number":3,"type":"response.content_part.added"}`,
    );
    const deltas = events.slice(4, 8);
    deltas.forEach((event, t) => {
      expect(event.data).toBe(
        `{"content_index":0,"delta":${JSON.stringify(choiceText(0, t, 1))},"item_id":"${itemId}","logprobs":[],"output_index":0,"sequence_number":${4 + t},"type":"response.output_text.delta"}`,
      );
    });
    const text = choiceText(0, 0, 4);
    const part = { annotations: [], text, type: 'output_text', logprobs: null };
    expect(json(events[8] as Named)).toEqual({ content_index: 0, item_id: itemId, logprobs: [], output_index: 0, text, sequence_number: 8, type: 'response.output_text.done' });
    expect(json(events[9] as Named)).toEqual({ content_index: 0, item_id: itemId, output_index: 0, part, sequence_number: 9, type: 'response.content_part.done' });
    expect(json(events[10] as Named)).toEqual({
      item: { id: itemId, content: [part], role: 'assistant', status: 'completed', type: 'message', phase: null, summary: [] },
      output_index: 0,
      sequence_number: 10,
      type: 'response.output_item.done',
    });

    const completed = json(events[11] as Named).response as Record<string, unknown>;
    expect(Object.keys(completed)).toEqual(RESPONSE_KEYS);
    expect(completed).toMatchObject({ id: created.id, status: 'completed', incomplete_details: null, usage: responsesUsage(PROMPT_TOKENS, 4) });
    // The output is rebuilt, with an id of its own.
    const output = completed.output as { id: string }[];
    expect(output).toEqual([{ id: output[0]?.id, content: [part], role: 'assistant', status: 'completed', type: 'message', phase: null }]);
    expect(output[0]?.id).toMatch(/^msg_[0-9a-f]{16}$/);
    // Python floats and vLLM's defaults.
    expect(events[11]?.data).toContain('"temperature":1.0,"tool_choice":"none","tools":[],"top_p":1.0,"background":false,"max_output_tokens":131068,');
    expect(events[11]?.data).toContain('"presence_penalty":0.0,"frequency_penalty":0.0,"kv_transfer_params":null,"input_messages":null,"output_messages":null}');

    const record = await ended;
    expect(record).toMatchObject({ route: 'responses', path: '/v1/responses', end: 'completed', status: 200, stream: true, model: 'sim-model', outputEventsSent: 4, completionTokensSent: 4, promptTokens: PROMPT_TOKENS, requestId: 'req-abc' });
    expect(sim.stats().byRoute.responses).toBe(1);
  });

  it('sends created and in_progress at once, then nothing until the first token', async () => {
    const { url } = await start();
    const reply = await send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-sim-fault': 'ttft_ms=400' } });
    expect(reply.firstByteMs).toBeLessThan(300);
    expect(names(eventsOf(reply.firstChunk))).toEqual(['response.created', 'response.in_progress']);
    expect(names(eventsOf(reply.text))).toEqual(RESPONSES_STREAM_NAMES);
  });

  it('is completed with status incomplete when max_output_tokens caps it', async () => {
    const { sim, url } = await start();
    const reply = await send(url, '/v1/responses', { body: { ...RESPONSES, max_output_tokens: 2 } });
    const events = eventsOf(reply.text);
    expect(names(events).at(-1)).toBe('response.completed');
    expect(names(events).filter((n) => n === 'response.output_text.delta')).toHaveLength(2);
    expectNumbered(events);
    const response = json(events.at(-1) as Named).response;
    expect(response).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, max_output_tokens: 2, usage: responsesUsage(PROMPT_TOKENS, 2) });
    expect(sim.stats().recent.at(-1)).toMatchObject({ end: 'completed', completionTokensSent: 2 });
  });

  it('echoes instructions and text.format, counts instructions in the prompt and always reports cached tokens', async () => {
    const { url } = await start();
    const format = { type: 'json_schema', name: 'greeting', schema: { type: 'object' } };
    const body = { ...RESPONSES, instructions: 'Be brief', text: { format }, stream: false };
    const reply = await send(url, '/v1/responses', { body, headers: { 'x-sim-fault': 'cached_tokens=2' } });
    expect(JSON.parse(reply.text)).toMatchObject({
      instructions: 'Be brief',
      text: { format: { name: 'greeting', schema: { type: 'object' }, type: 'json_schema', description: null, strict: null }, verbosity: null },
      usage: responsesUsage(6, 4, 2),
    });
  });

  it('cuts the connection on an engine error after output: no error event, no response.completed, no terminator', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-sim-fault': 'error_after=2' } });
    expect(reply.status).toBe(200);
    expect(reply.complete).toBe(false);
    expect(reply.error).not.toBeNull();
    const events = eventsOf(reply.text);
    expect(names(events)).toEqual(RESPONSES_STREAM_NAMES.slice(0, 6));
    expectNumbered(events);
    expect(reply.text).not.toContain('error');
    expect(await ended).toMatchObject({ route: 'responses', fault: 'error_after', end: 'fault', status: 200, outputEventsSent: 2 });
  });

  it('cuts the connection right after created and in_progress on an error before output', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-sim-fault': 'error_before_output' } });
    expect(reply.complete).toBe(false);
    expect(reply.error).not.toBeNull();
    expect(names(eventsOf(reply.text))).toEqual(['response.created', 'response.in_progress']);
    expect(await ended).toMatchObject({ fault: 'error_before_output', end: 'fault', outputEventsSent: 0 });
  });

  it('maps the wire faults onto the route: end_after, no_done, drop_finish, data_after_done, malformed_after, oversized_after', async () => {
    const { url } = await start();
    const run = async (fault: string): Promise<Reply> => send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-sim-fault': fault } });

    const endAfter = await run('end_after=1');
    expect(endAfter.complete).toBe(true);
    expect(names(eventsOf(endAfter.text))).toEqual(RESPONSES_STREAM_NAMES.slice(0, 5));

    const noDone = await run('no_done');
    expect(noDone.complete).toBe(true);
    expect(names(eventsOf(noDone.text))).toEqual(RESPONSES_STREAM_NAMES.slice(0, -1));

    const dropFinish = eventsOf((await run('drop_finish')).text);
    expect(names(dropFinish)).toEqual([...RESPONSES_STREAM_NAMES.slice(0, 8), 'response.completed']);
    expectNumbered(dropFinish);

    const late = eventsOf((await run('data_after_done')).text);
    expect(names(late)).toEqual([...RESPONSES_STREAM_NAMES, 'response.output_text.delta']);
    expectNumbered(late);

    const malformed = await run('malformed_after=1');
    expect(malformed.text).toContain('event: response.output_text.delta\ndata: {"id":"broken\n\n');
    const wellFormed = eventsOf(malformed.text).filter((e) => e.data !== '{"id":"broken');
    expect(names(wellFormed)).toEqual(RESPONSES_STREAM_NAMES);
    expectNumbered(wellFormed);

    const oversized = eventsOf((await run('oversized_after=1; oversized_bytes=4096')).text);
    expect(names(oversized)).toEqual([...RESPONSES_STREAM_NAMES.slice(0, 5), 'response.output_text.delta', ...RESPONSES_STREAM_NAMES.slice(5)]);
    expect(Buffer.byteLength(oversized[5]?.data ?? '')).toBe(4096);
    expectNumbered(oversized);
  });

  it('resets with a RST after k output events, and stalls with the connection open', async () => {
    const { sim, url } = await start();
    const reset = await send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-sim-fault': 'reset_after=1' } });
    expect(reset.complete).toBe(false);
    expect(reset.error).not.toBeNull();
    expect(sim.stats().recent.at(-1)).toMatchObject({ fault: 'reset_after', end: 'fault' });

    const ended = nextEnd(sim);
    const stalled = await send(url, '/v1/responses', {
      body: RESPONSES,
      headers: { 'x-sim-fault': 'stall_after=0' },
      onChunk: (text) => text.includes('response.in_progress'),
    });
    expect(names(eventsOf(stalled.text))).toEqual(['response.created', 'response.in_progress']);
    expect(await ended).toMatchObject({ fault: 'stall_after', end: 'client_disconnect' });
  });

  it('takes the framing modifiers: CRLF and comments', async () => {
    const { url } = await start();
    const reply = await send(url, '/v1/responses', { body: RESPONSES, headers: { 'x-sim-fault': 'framing=crlf; comments' } });
    expect(reply.text.startsWith('event: response.created\r\ndata: {')).toBe(true);
    expect(reply.text).toContain('\r\n\r\n: ping\r\nevent: response.in_progress\r\ndata: ');
  });
});

describe('POST /v1/responses, not streaming and refused', () => {
  it('answers the response object, incomplete with HTTP 200 when capped', async () => {
    const { sim, url } = await start();
    const reply = await send(url, '/v1/responses', { body: { model: 'sim-model', input: [{ role: 'user', content: 'Say hello, world' }], max_output_tokens: 3 } });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('application/json');
    const body = JSON.parse(reply.text) as Record<string, unknown>;
    expect(Object.keys(body)).toEqual(RESPONSE_KEYS);
    expect(body).toMatchObject({
      object: 'response',
      status: 'incomplete',
      incomplete_details: { reason: 'max_output_tokens' },
      output: [{ content: [{ annotations: [], text: choiceText(0, 0, 3), type: 'output_text', logprobs: null }], role: 'assistant', status: 'completed', type: 'message', phase: null }],
      usage: responsesUsage(PROMPT_TOKENS, 3),
    });
    expect(sim.stats().recent.at(-1)).toMatchObject({ route: 'responses', stream: false, end: 'completed', status: 200, completionTokensSent: 3, requestId: String(body.id).slice('resp_'.length) });
  });

  it('refuses before the stream with real statuses', async () => {
    const { sim, url } = await start();
    const post = async (body: unknown): Promise<{ status: number; body: unknown }> => {
      const reply = await send(url, '/v1/responses', { body });
      return { status: reply.status, body: JSON.parse(reply.text) };
    };
    expect(await post({ ...RESPONSES, model: 'nope' })).toEqual({
      status: 404,
      body: { error: { message: 'The model `nope` does not exist.', type: 'NotFoundError', param: 'model', code: 404 } },
    });
    expect(await post({ model: 'sim-model', stream: true })).toMatchObject({ status: 400, body: { error: { type: 'Bad Request', code: 400 } } });
    expect(await post({ ...RESPONSES, previous_response_id: 'resp_1' })).toEqual({
      status: 404,
      body: { error: { message: "Response with id 'resp_1' not found.", type: 'invalid_request_error', param: 'response_id', code: 404 } },
    });
    expect(await post({ ...RESPONSES, background: true })).toMatchObject({ status: 400, body: { error: { type: 'invalid_request_error', param: 'background' } } });
    expect(await post({ ...RESPONSES, tool_choice: 'required' })).toMatchObject({ status: 400, body: { error: { type: 'Bad Request', param: 'tool_choice' } } });
    expect(await post({ ...RESPONSES, input: 'x'.repeat(4 * 131_072) })).toMatchObject({ status: 400, body: { error: { type: 'invalid_request_error', param: 'input' } } });
    const bad = await send(url, '/v1/responses', { body: 'not json' });
    expect(bad.status).toBe(400);
    sim.setEngineDead(true);
    expect(await post(RESPONSES)).toMatchObject({ status: 500, body: { error: { type: 'InternalServerError', code: 500 } } });
    expect(sim.stats().recent.every((r) => r.end === 'rejected')).toBe(true);
  });
});

// ---- /v1/messages ----

const MESSAGE_ID = 'chatcmpl-req-7';

function messagesStream(tokens: number, stopReason: string | null): string {
  const event = (name: string, data: string): string => `event: ${name}\ndata: ${data}\n\n`;
  let text =
    event('message_start', `{"type":"message_start","message":{"id":"${MESSAGE_ID}","content":[],"model":"sim-model","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":${PROMPT_TOKENS},"output_tokens":0}}}`) +
    event('content_block_start', '{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}');
  for (let t = 0; t < tokens; t++) {
    text += event('content_block_delta', `{"type":"content_block_delta","delta":{"type":"text_delta","text":${JSON.stringify(choiceText(0, t, 1))}},"index":0}`);
  }
  return (
    text +
    event('content_block_stop', '{"type":"content_block_stop","index":0}') +
    event('message_delta', `{"type":"message_delta","delta":{"stop_reason":${JSON.stringify(stopReason)}},"usage":{"input_tokens":${PROMPT_TOKENS},"output_tokens":${tokens}}}`) +
    event('message_stop', '{"type":"message_stop"}')
  );
}

describe('POST /v1/messages, streaming', () => {
  it('writes vLLM converter events, byte for byte', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-request-id': 'req-7' } });
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(reply.complete).toBe(true);
    expect(reply.text).toBe(messagesStream(4, 'end_turn'));
    expect(await ended).toMatchObject({ route: 'messages', end: 'completed', status: 200, outputEventsSent: 4, completionTokensSent: 4, promptTokens: PROMPT_TOKENS, requestId: 'req-7' });
    expect(sim.stats().byRoute.messages).toBe(1);
  });

  it('maps length to max_tokens and abort to a null stop reason', async () => {
    const { url } = await start();
    const capped = await send(url, '/v1/messages', { body: { ...MESSAGES, max_tokens: 2 }, headers: { 'x-request-id': 'req-7' } });
    expect(capped.text).toBe(messagesStream(2, 'max_tokens'));
    const aborted = await send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-request-id': 'req-7', 'x-sim-fault': 'finish_reason=abort' } });
    expect(aborted.text).toBe(messagesStream(4, null));
  });

  it('sends message_start at the first token, not at once', async () => {
    const { url } = await start();
    const reply = await send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-sim-fault': 'ttft_ms=300' } });
    expect(reply.firstByteMs).toBeGreaterThanOrEqual(250);
    expect(reply.firstChunk.startsWith('event: message_start\n')).toBe(true);
  });

  it('ends an engine error mid-stream with one error event, then a clean end', async () => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    const reply = await send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-request-id': 'req-7', 'x-sim-fault': 'error_after=2; error_code=503' } });
    expect(reply.complete).toBe(true);
    expect(reply.error).toBeNull();
    const events = eventsOf(reply.text);
    expect(names(events)).toEqual(['message_start', 'content_block_start', 'content_block_delta', 'content_block_delta', 'error']);
    const message = chatErrorValidationMessage(errorInfo(503));
    expect(events[4]?.data).toBe(JSON.stringify({ type: 'error', error: { type: 'internal_error', message } }));
    expect(message).toBe(
      "2 validation errors for ChatCompletionStreamResponse\nmodel\n  Field required [type=missing, input_value={'error': {'message': 'Se...am': None, 'code': 503}}, input_type=dict]\n" +
        '    For further information visit https://errors.pydantic.dev/2.13/v/missing\n' +
        "choices\n  Field required [type=missing, input_value={'error': {'message': 'Se...am': None, 'code': 503}}, input_type=dict]\n" +
        '    For further information visit https://errors.pydantic.dev/2.13/v/missing',
    );
    expect(await ended).toMatchObject({ route: 'messages', fault: 'error_after', end: 'fault', status: 200, outputEventsSent: 2 });
  });

  it('makes the error event the first and only event on an error before output', async () => {
    const { url } = await start();
    const reply = await send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-sim-fault': 'error_before_output' } });
    expect(reply.complete).toBe(true);
    const events = eventsOf(reply.text);
    expect(names(events)).toEqual(['error']);
    expect(json(events[0] as Named)).toEqual({
      type: 'error',
      error: { type: 'internal_error', message: chatErrorValidationMessage(errorInfo(400, 'Token id 151936 is out of vocabulary')) },
    });
  });

  it('maps the wire faults: reset cuts, no_done drops message_stop, drop_finish drops message_delta', async () => {
    const { url } = await start();
    const run = async (fault: string): Promise<Reply> => send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-sim-fault': fault } });
    const reset = await run('reset_after=1');
    expect(reset.complete).toBe(false);
    expect(reset.error).not.toBeNull();
    expect(names(eventsOf((await run('no_done')).text)).at(-1)).toBe('message_delta');
    expect(names(eventsOf((await run('drop_finish')).text)).slice(-2)).toEqual(['content_block_delta', 'message_stop']);
    expect(names(eventsOf((await run('data_after_done')).text)).slice(-2)).toEqual(['message_stop', 'content_block_delta']);
    const endAfter = await run('end_after=1');
    expect(endAfter.complete).toBe(true);
    expect(names(eventsOf(endAfter.text))).toEqual(['message_start', 'content_block_start', 'content_block_delta']);
  });
});

describe('POST /v1/messages, not streaming and refused', () => {
  it('answers the message body (exclude_none)', async () => {
    const { url } = await start();
    const reply = await send(url, '/v1/messages', { body: { ...MESSAGES, stream: false }, headers: { 'x-request-id': 'req-7' } });
    expect(reply.status).toBe(200);
    expect(reply.text).toBe(
      `{"id":"${MESSAGE_ID}","type":"message","role":"assistant","content":[{"type":"text","text":${JSON.stringify(choiceText(0, 0, 4))}}],"model":"sim-model","stop_reason":"end_turn","usage":{"input_tokens":${PROMPT_TOKENS},"output_tokens":4}}`,
    );
    const aborted = await send(url, '/v1/messages', { body: { ...MESSAGES, stream: false }, headers: { 'x-sim-fault': 'finish_reason=abort' } });
    expect(JSON.parse(aborted.text)).not.toHaveProperty('stop_reason');
  });

  it('refuses with the chat layer status and vLLM type names, 500 for raised errors, OpenAI shape for validation', async () => {
    const { sim, url } = await start();
    const post = async (body: unknown, fault?: string): Promise<{ status: number; body: unknown }> => {
      const reply = await send(url, '/v1/messages', { body, headers: fault === undefined ? {} : { 'x-sim-fault': fault } });
      return { status: reply.status, body: JSON.parse(reply.text) };
    };
    expect(await post({ ...MESSAGES, model: 'nope' })).toEqual({
      status: 404,
      body: { type: 'error', error: { type: 'NotFoundError', message: 'The model `nope` does not exist.' } },
    });
    const tooLong = await post({ ...MESSAGES, max_tokens: 131_000, messages: [{ role: 'user', content: 'x'.repeat(400) }] });
    expect(tooLong).toMatchObject({ status: 500, body: { type: 'error', error: { type: 'internal_error' } } });
    expect(JSON.stringify(tooLong.body)).toContain("This model's maximum context length is 131072 tokens.");
    expect(await post({ model: 'sim-model', messages: [] })).toMatchObject({ status: 400, body: { error: { type: 'Bad Request', code: 400 } } });
    expect(await post({ ...MESSAGES, max_tokens: 0 })).toMatchObject({ status: 400, body: { error: { message: 'max_tokens: Value error, max_tokens must be positive' } } });
    expect(await post({ ...MESSAGES, stream: false }, 'error_after=1; error_code=503')).toEqual({
      status: 500,
      body: { type: 'error', error: { type: 'internal_error', message: 'Service Unavailable' } },
    });
    expect(await post(MESSAGES, 'status=503')).toEqual({ status: 503, body: { error: 'Service Unavailable' } });
    expect(await post(MESSAGES, 'status=400')).toEqual({ status: 400, body: { type: 'error', error: { type: 'BadRequestError', message: 'Bad Request' } } });
    sim.setEngineDead(true);
    expect(await post(MESSAGES)).toMatchObject({ status: 500, body: { type: 'error', error: { type: 'internal_error' } } });
  });
});

// ---- both ----

describe('both routes: disconnects and engine counters', () => {
  /** A streaming POST whose client leaves as soon as the status line arrives. */
  function leaveAfterHeaders(url: string, path: string, body: unknown): Promise<void> {
    return new Promise((resolve) => {
      const req = httpRequest(`${url}${path}`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'x-sim-fault': 'ttft_ms=150' } }, (res) => {
        res.destroy();
        resolve();
      });
      req.on('error', () => resolve());
      req.end(JSON.stringify(body));
    });
  }

  it.each([
    ['/v1/responses', RESPONSES],
    ['/v1/messages', MESSAGES],
  ])('%s: a client that leaves before the first token cancels the timer', async (path, body) => {
    const { sim, url } = await start();
    const ended = nextEnd(sim);
    await leaveAfterHeaders(url, path, body);
    const record = await ended;
    expect(record).toMatchObject({ end: 'client_disconnect', status: 200, outputEventsSent: 0 });
    await new Promise((resolve) => setTimeout(resolve, 250));
    const stats = sim.stats();
    expect(stats.inflight).toBe(0);
    expect(stats.tokens.completion).toBe(0);
    expect(stats.recent).toHaveLength(1);
    const metrics = await fetch(`${url}/metrics`).then((r) => r.text());
    expect(metrics).toContain('vllm:num_requests_waiting{model_name="sim-model",engine="0"} 0.0');
    expect(metrics).toContain('vllm:generation_tokens_total{model_name="sim-model",engine="0"} 0.0');
  });

  it('counts both routes in /metrics like vLLM: prompt and generation tokens, successes by finish reason', async () => {
    const { url } = await start();
    await send(url, '/v1/responses', { body: RESPONSES });
    await send(url, '/v1/messages', { body: { ...MESSAGES, max_tokens: 3 } });
    await send(url, '/v1/messages', { body: MESSAGES, headers: { 'x-sim-fault': 'error_after=1' } });
    const metrics = await fetch(`${url}/metrics`).then((r) => r.text());
    const labels = 'model_name="sim-model",engine="0"';
    expect(metrics).toContain(`vllm:prompt_tokens_total{${labels}} ${3 * PROMPT_TOKENS}.0`);
    expect(metrics).toContain(`vllm:generation_tokens_total{${labels}} 8.0`);
    expect(metrics).toContain(`vllm:request_success_total{${labels},finished_reason="stop"} 1.0`);
    expect(metrics).toContain(`vllm:request_success_total{${labels},finished_reason="length"} 1.0`);
  });
});

// ---- the official SDKs against the simulator ----

describe('the official SDKs read the simulator', () => {
  const openai = (url: string): OpenAI => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const anthropic = (url: string): Anthropic => new Anthropic({ baseURL: url, apiKey: 'unused', maxRetries: 0 });

  it('openai: a Responses stream iterates to response.completed', async () => {
    const { url } = await start();
    const stream = await openai(url).responses.create({ model: 'sim-model', input: 'Say hello, world', stream: true });
    const types: string[] = [];
    let text = '';
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') text += event.delta;
      if (event.type === 'response.completed') expect(event.response.usage?.output_tokens).toBe(4);
    }
    expect(types).toEqual(RESPONSES_STREAM_NAMES);
    expect(text).toBe(choiceText(0, 0, 4));
  });

  it('openai: a cut Responses stream raises in the iterator (transport error)', async () => {
    const { url } = await start();
    const stream = await openai(url).responses.create({ model: 'sim-model', input: 'x', stream: true }, { headers: { 'x-sim-fault': 'error_after=1' } });
    const types: string[] = [];
    const iterate = async (): Promise<void> => {
      for await (const event of stream) types.push(event.type);
    };
    await expect(iterate()).rejects.toThrow();
    expect(types).toEqual(RESPONSES_STREAM_NAMES.slice(0, 5));
  });

  it('openai: a non-streaming response', async () => {
    const { url } = await start();
    const response = await openai(url).responses.create({ model: 'sim-model', input: 'x', max_output_tokens: 2 });
    expect(response).toMatchObject({ object: 'response', status: 'incomplete', output_text: choiceText(0, 0, 2) });
  });

  it('anthropic: a Messages stream iterates to message_stop', async () => {
    const { url } = await start();
    const stream = await anthropic(url).messages.create({ model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }], stream: true });
    const types: string[] = [];
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'message_delta') expect(event).toMatchObject({ delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 4 } });
    }
    expect(types).toEqual(['message_start', 'content_block_start', ...Array<string>(4).fill('content_block_delta'), 'content_block_stop', 'message_delta', 'message_stop']);
  });

  it.each(['error_after=2', 'error_before_output'])('anthropic: the Messages error event raises (%s)', async (fault) => {
    const { url } = await start();
    const stream = await anthropic(url).messages.create(
      { model: 'sim-model', max_tokens: 32, messages: [{ role: 'user', content: 'hi' }], stream: true },
      { headers: { 'x-sim-fault': fault } },
    );
    const iterate = async (): Promise<void> => {
      for await (const event of stream) void event;
    };
    await expect(iterate()).rejects.toMatchObject({ type: 'internal_error', error: { type: 'error', error: { type: 'internal_error' } } });
  });

  it('anthropic: refusals and a non-streaming message', async () => {
    const { url } = await start();
    const client = anthropic(url);
    const message = await client.messages.create({ model: 'sim-model', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    expect(message).toMatchObject({ type: 'message', role: 'assistant', content: [{ type: 'text', text: choiceText(0, 0, 2) }], stop_reason: 'max_tokens', usage: { output_tokens: 2 } });
    await expect(client.messages.create({ model: 'nope', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] })).rejects.toMatchObject({ status: 404 });
  });
});
