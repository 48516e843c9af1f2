/**
 * The stored-response routes end to end: the real gateway in front of TWO simulated vLLMs that keep a Responses
 * store (`responsesStore`, vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1), over real sockets. A response lives in the
 * memory of the one process that generated it (docs/routes.md "Stored responses"), so every read, replay and cancel
 * must reach that simulator — the one the gateway remembered, or the one its lookup finds. Counters are read by value
 * from the gateway's /metrics (docs/metrics.md).
 */
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import type { Simulator } from '../src/sim/server.js';
import { settledAfter } from './helpers/settle.js';
import { endOnAny } from './helpers/sim-records.js';
import { eventData, post, startStack, type Stack } from './helpers/stack.js';

const stacks: Stack[] = [];
afterEach(async () => {
  for (const stack of stacks.splice(0)) await stack.close();
});

const MODEL = 'sim-model';
const INPUT = 'Say hello, world';
/** ceil(16 chars / 4): what each simulator reports as input_tokens. */
const PROMPT_TOKENS = 4;
const OUTPUT_TOKENS = 8;

async function twoSims(config: Record<string, unknown> = {}): Promise<Stack> {
  const stack = await startStack({
    sims: 2,
    sim: { responsesStore: true, ttftMs: 2, itlMs: 1, jitter: 0, outputTokens: OUTPUT_TOKENS, prefillMsPer1kTokens: 0 },
    config: { health: { interval: '1h' }, retries: { max_attempts: 1 }, ...config },
  });
  stacks.push(stack);
  return stack;
}

async function get(url: string): Promise<{ status: number; body: string }> {
  const response = await request(url);
  return { status: response.statusCode, body: await response.body.text() };
}

const retrieves = (sim: Simulator | undefined): number => sim?.stats().byRoute.responses_retrieve ?? -1;

/** waybill_requests_total for `route` with these labels, summed over the rest. */
function requests(stack: Stack, route: string, labels: Record<string, string> = {}): Promise<number> {
  return stack.metric('waybill_requests_total', { route, ...labels });
}

describe('gateway + two simulators with a Responses store', () => {
  it('a background request is answered queued; its id is then read from the simulator that generated it, the only one asked', async () => {
    const stack = await twoSims();
    const generated = endOnAny(stack.sims, (r) => r.route === 'responses');
    const ack = await post(stack.base, '/v1/responses', { model: MODEL, input: INPUT, background: true });
    expect(ack.status).toBe(200);
    const queued = JSON.parse(ack.body) as { id: string; status: string; background: boolean };
    expect(queued).toMatchObject({ status: 'queued', background: true, output: [], usage: null });
    expect(await settledAfter(stack, 1)).toMatchObject({ route: 'responses', outcome: 'delivered', finishReasons: [], accepted: true });

    // The generation goes on in the simulator after the acknowledgement.
    const { index, record } = await generated;
    expect(record).toMatchObject({ responseId: queued.id, end: 'completed', outputEventsSent: OUTPUT_TOKENS });
    const home = stack.sims[index];
    const other = stack.sims[1 - index];

    const read = await get(`${stack.base}/v1/responses/${queued.id}`);
    expect(read.status).toBe(200);
    expect(JSON.parse(read.body)).toMatchObject({ id: queued.id, status: 'completed', background: true, usage: { input_tokens: PROMPT_TOKENS, output_tokens: OUTPUT_TOKENS } });
    // Remembered from the acknowledgement: no lookup, the other simulator was never asked.
    expect(retrieves(home)).toBe(1);
    expect(retrieves(other)).toBe(0);
    expect(await settledAfter(stack, 2)).toMatchObject({ route: 'responses_retrieve', outcome: 'delivered', code: 200, stream: false, usage: undefined });
    expect(await requests(stack, 'responses_retrieve', { stream: 'false', code: '200', outcome: 'delivered' })).toBe(1);
    expect(await requests(stack, 'responses', { stream: 'false', code: '200', outcome: 'delivered' })).toBe(1);
    // The acknowledgement carries no usage and the read's is not counted: the gateway counts no tokens at all here.
    expect(await stack.metric('waybill_prompt_tokens_total')).toBe(0);
    expect(await stack.metric('waybill_completion_tokens_total')).toBe(0);
    expect(await stack.metric('waybill_usage_missing_total')).toBe(0);
  });

  it('an id created on one simulator behind the gateway\'s back is found by asking both; the next read goes straight there', async () => {
    const stack = await twoSims();
    const [, holder] = stack.sims;
    // Straight to the second simulator (the gateway's upstream sim-1), as another gateway replica would have sent it.
    const upstream = stack.gateway.upstreams.upstreams.find((u) => u.name === 'sim-1')?.url.origin ?? '';
    const created = JSON.parse((await post(upstream, '/v1/responses', { model: MODEL, input: INPUT })).body) as { id: string };

    const read = await get(`${stack.base}/v1/responses/${created.id}`);
    expect(read.status).toBe(200);
    expect(JSON.parse(read.body)).toMatchObject({ id: created.id, status: 'completed' });
    // The lookup asked both (a 404 from the first), then the request itself went to the holder.
    expect(retrieves(stack.sims[0])).toBe(1);
    expect(retrieves(holder)).toBe(2);
    expect(stack.sims[0]?.stats().recent.find((r) => r.route === 'responses_retrieve')).toMatchObject({ responseId: created.id, status: 404 });

    await get(`${stack.base}/v1/responses/${created.id}`);
    expect(retrieves(stack.sims[0])).toBe(1);
    expect(retrieves(holder)).toBe(3);
    await stack.settled(2);
    expect(await requests(stack, 'responses_retrieve', { code: '200', outcome: 'delivered' })).toBe(2);

    // An id neither holds: a 404 after asking both, counted rejected.
    const missing = await get(`${stack.base}/v1/responses/resp_nobody`);
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.body)).toMatchObject({ error: { code: 'not_found', param: 'response_id' } });
    await stack.settled(3);
    expect(await requests(stack, 'responses_retrieve', { code: '404', outcome: 'rejected' })).toBe(1);
  });

  it('?stream=true replays a background stream: delivered at response.completed, counted responses_retrieve, its usage not counted again', async () => {
    const stack = await twoSims();
    const generated = endOnAny(stack.sims, (r) => r.route === 'responses');
    const streamed = await post(stack.base, '/v1/responses', { model: MODEL, input: INPUT, background: true, stream: true });
    expect(streamed.status).toBe(200);
    const events = eventData(streamed.body).map((data) => JSON.parse(data) as { type: string; sequence_number: number; response?: { id: string } });
    expect(events.at(-1)?.type).toBe('response.completed');
    const id = events[0]?.response?.id ?? '';
    expect(await settledAfter(stack, 1)).toMatchObject({ route: 'responses', stream: true, outcome: 'delivered' });
    expect(await stack.metric('waybill_prompt_tokens_total')).toBe(PROMPT_TOKENS);
    expect(await stack.metric('waybill_completion_tokens_total')).toBe(OUTPUT_TOKENS);

    const replay = await get(`${stack.base}/v1/responses/${id}?stream=true&starting_after=3`);
    expect(replay.status).toBe(200);
    const replayed = eventData(replay.body).map((data) => JSON.parse(data) as { type: string; sequence_number: number });
    expect(replayed.map((e) => e.sequence_number)).toEqual(events.slice(4).map((e) => e.sequence_number));
    expect(replayed.at(-1)?.type).toBe('response.completed');
    expect(await settledAfter(stack, 2)).toMatchObject({ route: 'responses_retrieve', stream: true, outcome: 'delivered', finishReasons: ['stop'], usage: undefined });
    expect(await requests(stack, 'responses_retrieve', { stream: 'true', code: '200', outcome: 'delivered' })).toBe(1);
    // The home was learned from the stream itself: no lookup.
    const { index } = await generated;
    expect([retrieves(stack.sims[index]), retrieves(stack.sims[1 - index])]).toEqual([1, 0]);
    expect(await stack.metric('waybill_prompt_tokens_total')).toBe(PROMPT_TOKENS);
    expect(await stack.metric('waybill_completion_tokens_total')).toBe(OUTPUT_TOKENS);
    expect(await stack.metric('waybill_usage_missing_total')).toBe(0);
  });

  it('a background stream whose task died hangs open; the gateway\'s idle timeout ends it (and its replay), counted timeout', async () => {
    const stack = await twoSims({ timeouts: { idle: '150ms' } });
    const died = endOnAny(stack.sims, (r) => r.route === 'responses');
    const streamed = await post(stack.base, '/v1/responses', { model: MODEL, input: INPUT, background: true, stream: true }, { 'x-sim-fault': 'error_after=2' });
    const { index, record } = await died;
    expect(record).toMatchObject({ end: 'fault', fault: 'error_after', outputEventsSent: 2 });
    expect(streamed.status).toBe(200);
    const last = JSON.parse(eventData(streamed.body).at(-1) ?? '{}') as Record<string, unknown>;
    expect(last).toMatchObject({ type: 'error', error: { code: 'stream_timeout' }, sequence_number: 6 });
    expect(await settledAfter(stack, 1)).toMatchObject({ route: 'responses', stream: true, outcome: 'timeout', code: 200 });
    expect(await requests(stack, 'responses', { stream: 'true', code: '200', outcome: 'timeout' })).toBe(1);

    // The simulator's record of the replay ends when the gateway leaves it.
    const id = String(record.responseId);
    const replayLeft = endOnAny(stack.sims, (r) => r.route === 'responses_retrieve' && r.stream);
    const replay = await get(`${stack.base}/v1/responses/${id}?stream=true`);
    expect(replay.status).toBe(200);
    expect(JSON.parse(eventData(replay.body).at(-1) ?? '{}')).toMatchObject({ type: 'error', error: { code: 'stream_timeout' } });
    expect(await settledAfter(stack, 2)).toMatchObject({ route: 'responses_retrieve', stream: true, outcome: 'timeout', code: 200 });
    expect(await requests(stack, 'responses_retrieve', { stream: 'true', code: '200', outcome: 'timeout' })).toBe(1);
    expect(await replayLeft).toMatchObject({ index, record: { end: 'client_disconnect', status: 200 } });
    expect(retrieves(stack.sims[1 - index])).toBe(0);

    // The task died: queued for ever.
    expect(JSON.parse((await get(`${stack.base}/v1/responses/${id}`)).body)).toMatchObject({ status: 'queued' });
  });

  it('/cancel reaches the holder and stops its generation; a second cancel is relayed as vLLM refuses it', async () => {
    const stack = await twoSims();
    const ack = await post(stack.base, '/v1/responses', { model: MODEL, input: INPUT, background: true }, { 'x-sim-fault': 'stall_after=0' });
    const { id } = JSON.parse(ack.body) as { id: string };
    const stopped = endOnAny(stack.sims, (r) => r.route === 'responses');
    const cancelled = await post(stack.base, `/v1/responses/${id}/cancel`, '');
    expect(cancelled.status).toBe(200);
    expect(JSON.parse(cancelled.body)).toMatchObject({ id, status: 'cancelled', output: [], usage: null });
    expect(await stopped).toMatchObject({ record: { responseId: id, end: 'cancelled' } });

    const refused = await request(`${stack.base}/v1/responses/${id}/cancel`, { method: 'POST' });
    expect(refused.statusCode).toBe(400);
    expect(JSON.parse(await refused.body.text())).toMatchObject({ error: { message: 'Cannot cancel a synchronous response.' } });
    await stack.settled(3);
    expect(await requests(stack, 'responses_cancel', { code: '200', outcome: 'delivered' })).toBe(1);
    expect(await requests(stack, 'responses_cancel', { code: '400', outcome: 'rejected' })).toBe(1);
    expect(JSON.parse((await get(`${stack.base}/v1/responses/${id}`)).body)).toMatchObject({ status: 'cancelled' });
  });

  it('/v1/messages/count_tokens is answered by a simulator with the /v1/messages estimate, counted count_tokens, no tokens', async () => {
    const stack = await twoSims();
    const body = { model: MODEL, messages: [{ role: 'user', content: INPUT }] };
    const counted = await post(stack.base, '/v1/messages/count_tokens', body);
    expect(counted.status).toBe(200);
    expect(JSON.parse(counted.body)).toEqual({ input_tokens: PROMPT_TOKENS, context_management: { original_input_tokens: PROMPT_TOKENS } });
    expect(await settledAfter(stack, 1)).toMatchObject({ route: 'count_tokens', outcome: 'delivered', usage: undefined });
    expect(await requests(stack, 'count_tokens', { code: '200', outcome: 'delivered' })).toBe(1);
    expect(await stack.metric('waybill_prompt_tokens_total')).toBe(0);
    expect(stack.sims.reduce((n, sim) => n + sim.stats().byRoute.count_tokens, 0)).toBe(1);
  });
});
