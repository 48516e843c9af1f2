/**
 * The gateway in front of the simulator, over real sockets: the exact bytes a client receives and the value of
 * every counter, for each outcome, attempt result, anomaly kind and finish reason.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DeliveryMachine } from '../src/delivery/machine.js';
import { CHAT, eventData, post, startStack, withoutCreated, type Stack } from './helpers/stack.js';

const STREAM = { ...CHAT, stream: true };
const CHAT_PATH = '/v1/chat/completions';

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

async function open(options: Parameters<typeof startStack>[0] = {}): Promise<Stack> {
  stack = await startStack(options);
  return stack;
}

/** The same request straight to the simulator (what the upstream sent), with the same request id. */
async function direct(s: Stack, body: unknown, fault?: string, id = 'req-1') {
  const headers: Record<string, string> = { 'x-request-id': id };
  if (fault !== undefined) headers['x-sim-fault'] = fault;
  return post(simUrl(s), CHAT_PATH, body, headers);
}

function simUrl(s: Stack): string {
  const record = s.gateway.upstreams.upstreams[0];
  if (record === undefined) throw new Error('no upstream');
  return record.url.origin;
}

async function viaGateway(s: Stack, body: unknown, fault?: string, id = 'req-1') {
  const headers: Record<string, string> = { 'x-request-id': id };
  if (fault !== undefined) headers['x-sim-fault'] = fault;
  return post(s.base, CHAT_PATH, body, headers);
}

const DONE = 'data: [DONE]\n\n';

function gatewayErrorEvent(body: string): { error: { type: string; code: string; message: string } } {
  const last = eventData(body).at(-1) ?? '';
  return JSON.parse(last) as { error: { type: string; code: string; message: string } };
}

describe('delivered streams', () => {
  it('forwards the upstream bytes unchanged, drops only the usage chunk it asked for, and counts by value', async () => {
    const s = await open();
    const upstream = await direct(s, STREAM);
    const client = await viaGateway(s, STREAM);
    expect(client.status).toBe(200);
    expect(client.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(client.headers['x-request-id']).toBe('req-1');
    // The stream's head: no cache, and buffering reverse proxies in front of the gateway told to pass events at once.
    expect(client.headers['cache-control']).toBe('no-cache');
    expect(client.headers['x-accel-buffering']).toBe('no');
    // The client did not ask for usage, so the simulator sent none to it directly: identical bytes.
    expect(withoutCreated(client.body)).toBe(withoutCreated(upstream.body));
    expect(client.body.endsWith(DONE)).toBe(true);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'delivered', code: 200, slo: 'met', finishReasons: ['stop'] });

    const simRecord = s.sims[0]?.stats().recent.at(-1);
    expect(simRecord).toMatchObject({ requestId: 'req-1', includeUsage: true, end: 'completed' });
    const model = { model: 'sim-model' };
    expect(await s.metric('waybill_requests_total', { ...model, route: 'chat_completions', stream: 'true', code: '200', outcome: 'delivered' })).toBe(1);
    expect(await s.metric('waybill_requests_total')).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { ...model, upstream: 'sim-0', result: 'ok' })).toBe(1);
    expect(await s.metric('waybill_request_attempts_count', model)).toBe(1);
    expect(await s.metric('waybill_choice_finish_reasons_total', { ...model, finish_reason: 'stop' })).toBe(1);
    expect(await s.metric('waybill_completion_tokens_total', model)).toBe(8);
    expect(await s.metric('waybill_prompt_tokens_total', model)).toBe(settlement?.usage?.promptTokens);
    expect(await s.metric('waybill_time_to_first_token_seconds_count', { ...model, prompt_len: '0-1k' })).toBe(1);
    // 8 tokens, one per event: 7 gaps between the 8 output-bearing events.
    expect(await s.metric('waybill_inter_token_latency_seconds_count', model)).toBe(7);
    expect(await s.metric('waybill_time_per_output_token_seconds_count', model)).toBe(1);
    expect(await s.metric('waybill_slo_requests_total', { ...model, prompt_len: '0-1k', result: 'met' })).toBe(1);
    expect(await s.metric('waybill_usage_missing_total', model)).toBe(0);
    expect(await s.metric('waybill_stream_anomalies_total')).toBe(0);
    expect(await s.metric('waybill_inflight_requests', model)).toBe(0);
  });

  it("takes a committed stream's ordinary deltas whole (the machine's ordinaryRead), with the same bytes and counts", async () => {
    // 20 ms between tokens: the kernel seldom joins two of them into one read.
    const s = await open({ sim: { itlMs: 20 } });
    const ordinary = vi.spyOn(DeliveryMachine.prototype, 'ordinaryRead');
    try {
      const upstream = await direct(s, STREAM);
      const client = await viaGateway(s, STREAM);
      expect(withoutCreated(client.body)).toBe(withoutCreated(upstream.body));
      await s.settled(1);
      // 8 tokens, one event a read: the first commits the stream (framed), the last carries finish_reason (framed), the
      // six between are ordinary. Not asserted exactly: two events the kernel joined into one read are framed instead.
      const taken = ordinary.mock.results.filter((result) => result.type === 'return' && result.value !== undefined).length;
      expect(taken).toBeGreaterThanOrEqual(1);
      expect(taken).toBeLessThanOrEqual(6);
      expect(await s.metric('waybill_requests_total', { model: 'sim-model', route: 'chat_completions', stream: 'true', code: '200', outcome: 'delivered' })).toBe(1);
      expect(await s.metric('waybill_inter_token_latency_seconds_count', { model: 'sim-model' })).toBe(7);
    } finally {
      ordinary.mockRestore();
    }
  });

  it('forwards the usage chunk when the client asked for it', async () => {
    const s = await open();
    const body = { ...STREAM, stream_options: { include_usage: true } };
    const upstream = await direct(s, body);
    const client = await viaGateway(s, body);
    expect(withoutCreated(client.body)).toBe(withoutCreated(upstream.body));
    expect(eventData(client.body).at(-2)).toContain('"usage"');
    await s.settled(1);
    expect(await s.metric('waybill_completion_tokens_total')).toBe(8);
  });

  it('passes n > 1 through and counts each choice', async () => {
    const s = await open();
    const client = await viaGateway(s, { ...STREAM, n: 3 });
    expect(client.body.endsWith(DONE)).toBe(true);
    await s.settled(1);
    expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: 'stop' })).toBe(3);
    expect(await s.metric('waybill_completion_tokens_total')).toBe(24);
  });

  it.each(['length', 'tool_calls', 'content_filter', 'function_call', 'abort', 'repetition'])(
    'counts finish_reason %s',
    async (reason) => {
      const s = await open();
      const client = await viaGateway(s, STREAM, `finish_reason=${reason}`);
      expect(client.body.endsWith(DONE)).toBe(true);
      await s.settled(1);
      expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: reason })).toBe(1);
      expect(await s.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(1);
    },
  );

  it('maps an unknown finish_reason to other', async () => {
    const s = await open();
    await viaGateway(s, STREAM, 'finish_reason=eos_reached');
    await s.settled(1);
    expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: 'other' })).toBe(1);
  });

  it('parses CRLF, CR, comments and multi-line data, and forwards those bytes unchanged', async () => {
    const s = await open();
    for (const [i, fault] of ['framing=crlf', 'framing=cr; comments', 'multiline_data; comments'].entries()) {
      const id = `req-${i}`;
      const upstream = await direct(s, STREAM, fault, id);
      const client = await viaGateway(s, STREAM, fault, id);
      expect(withoutCreated(client.body), fault).toBe(withoutCreated(upstream.body));
    }
    await s.settled(3);
    expect(await s.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(3);
    expect(await s.metric('waybill_stream_anomalies_total')).toBe(0);
  });
});

describe('failures after commit', () => {
  it('forwards an upstream error event, drops the [DONE] after it, and counts stream_error', async () => {
    const s = await open();
    const upstream = await direct(s, STREAM, 'error_after=3');
    const client = await viaGateway(s, STREAM, 'error_after=3');
    expect(upstream.body.endsWith(DONE)).toBe(true);
    expect(withoutCreated(client.body)).toBe(withoutCreated(upstream.body.slice(0, -DONE.length)));
    expect(client.status).toBe(200);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { code: '200', outcome: 'stream_error' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'error_payload' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { upstream: 'sim-0', kind: 'error_payload' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { upstream: 'sim-0', kind: 'done_after_error' })).toBe(1);
    expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: 'none' })).toBe(1);
    expect(await s.metric('waybill_slo_requests_total', { result: 'failed' })).toBe(1);
  });

  it('ends a reset stream with its own error event: incomplete, attempt reset', async () => {
    const s = await open();
    const client = await viaGateway(s, STREAM, 'reset_after=2');
    expect(client.status).toBe(200);
    expect(client.body).not.toContain('[DONE]');
    expect(gatewayErrorEvent(client.body).error).toMatchObject({ type: 'upstream_error', code: 'stream_truncated' });
    // Role chunk plus two output events, then Waybill's error event.
    expect(eventData(client.body)).toHaveLength(4);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { code: '200', outcome: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'reset' })).toBe(1);
  });

  it('ends a stream that closed without [DONE] or finish: incomplete, missing_done, missing_finish_reason', async () => {
    const s = await open();
    const client = await viaGateway(s, STREAM, 'end_after=2');
    expect(client.body).not.toContain('[DONE]');
    expect(gatewayErrorEvent(client.body).error.code).toBe('stream_truncated');
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { outcome: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'missing_done' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'missing_finish_reason' })).toBe(1);
  });

  it('does not call a finished stream without [DONE] delivered', async () => {
    const s = await open();
    const upstream = await direct(s, STREAM, 'no_done');
    const client = await viaGateway(s, STREAM, 'no_done');
    expect(withoutCreated(client.body).startsWith(withoutCreated(upstream.body))).toBe(true);
    expect(gatewayErrorEvent(client.body).error.code).toBe('stream_truncated');
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { outcome: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'missing_done' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'missing_finish_reason' })).toBe(0);
    expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: 'stop' })).toBe(1);
  });

  it('withholds [DONE] when a choice never finished', async () => {
    const s = await open();
    const client = await viaGateway(s, STREAM, 'drop_finish');
    expect(client.body).not.toContain('[DONE]');
    expect(gatewayErrorEvent(client.body).error.message).toMatch(/finish_reason/);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { outcome: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'missing_finish_reason' })).toBe(1);
    expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: 'none' })).toBe(1);
  });

  it('times out an upstream that stalls after commit', async () => {
    const s = await open({ config: { timeouts: { idle: '150ms' } } });
    const simEnded = s.simEnded();
    const client = await viaGateway(s, STREAM, 'stall_after=2');
    expect(gatewayErrorEvent(client.body).error).toMatchObject({ type: 'timeout_error', code: 'stream_timeout' });
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'timeout', code: 200 });
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'timeout' })).toBe(1);
    // The stalled upstream request was closed, so the engine would free its slot.
    expect((await simEnded).end).toBe('client_disconnect');
    expect(s.sims[0]?.stats().clientDisconnects).toBe(1);
  });

  it('fails the attempt on an oversized event', async () => {
    const s = await open({ config: { streaming: { max_event_bytes: 65536 } } });
    const client = await viaGateway(s, STREAM, 'oversized_after=2');
    expect(gatewayErrorEvent(client.body).error.message).toMatch(/larger than the configured limit/);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { outcome: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'incomplete' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'oversized_event' })).toBe(1);
  });
});

describe('anomalies that do not break delivery', () => {
  it('drops a malformed event and still delivers', async () => {
    const s = await open();
    const upstream = await direct(s, STREAM, 'malformed_after=2');
    const client = await viaGateway(s, STREAM, 'malformed_after=2');
    expect(upstream.body).toContain('data: {"id":"broken\n\n');
    expect(withoutCreated(client.body)).toBe(withoutCreated(upstream.body.replace('data: {"id":"broken\n\n', '')));
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'malformed_event' })).toBe(1);
  });

  it('counts data after [DONE] and keeps it from the client', async () => {
    const s = await open();
    const client = await viaGateway(s, STREAM, 'data_after_done');
    expect(client.body.endsWith(DONE)).toBe(true);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'data_after_done' })).toBe(1);
  });
});

describe('failures before commit get a real status (retries off: one attempt)', () => {
  const once = { retries: { max_attempts: 1 } };
  it('answers an error event before any output with the status its code names (lazy validation)', async () => {
    const s = await open({ config: once });
    const client = await viaGateway(s, STREAM, 'error_before_output=400');
    expect(client.status).toBe(400);
    expect(client.headers['content-type']).toBe('application/json');
    const body = JSON.parse(client.body) as { error: Record<string, unknown> };
    expect(body.error).toMatchObject({ type: 'BadRequestError', code: 400 });
    expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { code: '400', outcome: 'rejected' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'error_payload' })).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'done_after_error' })).toBe(1);
    expect(await s.metric('waybill_slo_requests_total', { result: 'excluded' })).toBe(1);
    expect(await s.metric('waybill_choice_finish_reasons_total')).toBe(0);
  });

  it('passes a 5xx error event before output through as that status: failed', async () => {
    const s = await open({ config: once });
    const client = await viaGateway(s, STREAM, 'error_before_output=500');
    expect(client.status).toBe(500);
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { code: '500', outcome: 'failed' })).toBe(1);
  });

  it('passes an upstream 4xx through with its message, string-shaped 401 included', async () => {
    const s = await open({ config: once });
    const bad = await viaGateway(s, STREAM, 'status=400');
    expect(bad.status).toBe(400);
    const unauthorized = await viaGateway(s, STREAM, 'status=401');
    expect(unauthorized.status).toBe(401);
    expect(JSON.parse(unauthorized.body)).toEqual({
      error: { message: 'Unauthorized', type: 'invalid_request_error', param: null, code: 401 },
    });
    await s.settled(2);
    expect(await s.metric('waybill_requests_total', { code: '400', outcome: 'rejected' })).toBe(1);
    expect(await s.metric('waybill_requests_total', { code: '401', outcome: 'rejected' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'http_4xx' })).toBe(2);
  });

  it('answers an upstream 5xx with 502', async () => {
    const s = await open({ config: once });
    const client = await viaGateway(s, STREAM, 'status=503');
    expect(client.status).toBe(502);
    expect(JSON.parse(client.body)).toMatchObject({ error: { type: 'upstream_error', code: 'upstream_error' } });
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { code: '502', outcome: 'failed' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'http_5xx' })).toBe(1);
  });

  it('answers a reset before any output with 502', async () => {
    const s = await open({ config: once });
    const afterHeaders = await viaGateway(s, STREAM, 'reset_after=0');
    expect(afterHeaders.status).toBe(502);
    const beforeResponse = await viaGateway(s, STREAM, 'reset_before_response');
    expect(beforeResponse.status).toBe(502);
    expect(JSON.parse(beforeResponse.body)).toMatchObject({ error: { code: 'upstream_reset' } });
    await s.settled(2);
    expect(await s.metric('waybill_requests_total', { code: '502', outcome: 'failed' })).toBe(2);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'reset' })).toBe(2);
  });

  it('answers an unreachable upstream with 502 connect_error', async () => {
    const s = await open({ sims: 0, extraUpstreams: [{ name: 'closed', url: 'http://127.0.0.1:9' }], config: once });
    const client = await post(s.base, CHAT_PATH, STREAM);
    expect(client.status).toBe(502);
    expect(JSON.parse(client.body)).toMatchObject({ error: { code: 'upstream_unreachable' } });
    await s.settled(1);
    expect(await s.metric('waybill_upstream_attempts_total', { upstream: 'closed', result: 'connect_error' })).toBe(1);
  });

  it('answers no first output within the limit with 504', async () => {
    const s = await open({ config: { ...once, timeouts: { first_output: '150ms' } } });
    const client = await viaGateway(s, STREAM, 'stall_after=0');
    expect(client.status).toBe(504);
    expect(JSON.parse(client.body)).toMatchObject({ error: { type: 'timeout_error', code: 'upstream_timeout' } });
    await s.settled(1);
    expect(await s.metric('waybill_requests_total', { code: '504', outcome: 'timeout' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'timeout' })).toBe(1);
  });
});

describe('usage and deadlines', () => {
  it('counts cached prompt tokens when the upstream reports them', async () => {
    const s = await open();
    await viaGateway(s, STREAM, 'cached_tokens=2');
    const [settlement] = await s.settled(1);
    expect(settlement?.usage?.cachedTokens).toBe(2);
    expect(await s.metric('waybill_cached_prompt_tokens_total', { model: 'sim-model' })).toBe(2);
  });

  it('with usage injection off, asks for nothing and counts the delivered stream as usage_missing', async () => {
    const s = await open({ config: { streaming: { inject_usage: false } } });
    const client = await viaGateway(s, STREAM);
    expect(client.body.endsWith(DONE)).toBe(true);
    await s.settled(1);
    expect(s.sims[0]?.stats().recent.at(-1)?.includeUsage).toBe(null);
    expect(await s.metric('waybill_usage_missing_total', { model: 'sim-model' })).toBe(1);
    expect(await s.metric('waybill_completion_tokens_total')).toBe(0);
    expect(await s.metric('waybill_time_per_output_token_seconds_count')).toBe(0);
  });

  it('ends a committed stream at the total deadline with a timeout error event', async () => {
    const s = await open({ config: { timeouts: { total: '300ms' } }, sim: { itlMs: 50, outputTokens: 100 } });
    const simEnded = s.simEnded();
    const client = await viaGateway(s, STREAM);
    expect(client.body).not.toContain('[DONE]');
    expect(gatewayErrorEvent(client.body).error.code).toBe('stream_timeout');
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'timeout', code: 200 });
    // libuv timers run on a loop clock cached per tick, so they may fire a fraction of a millisecond early.
    expect(settlement?.durationMs).toBeGreaterThan(295);
    expect((await simEnded).end).toBe('client_disconnect');
  });
});
