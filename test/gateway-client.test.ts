/**
 * What the client does to a stream: leaving early (the upstream must be closed at once, so vLLM frees the GPU
 * slot) and reading slowly (the upstream must be paused, so gateway memory stays bounded).
 */
import { once } from 'node:events';
import { request as httpRequest, type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { CHAT, startStack, type Stack } from './helpers/stack.js';

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

function startStream(s: Stack, fault: string, body: unknown = { ...CHAT, stream: true }): { req: ClientRequest; response: Promise<IncomingMessage> } {
  const url = new URL(`${s.base}/v1/chat/completions`);
  const req = httpRequest(url, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sim-fault': fault } });
  req.on('error', () => {
    /* the test destroys the request on purpose */
  });
  const response = new Promise<IncomingMessage>((resolve) => req.once('response', resolve));
  req.end(JSON.stringify(body));
  return { req, response };
}

describe('client cancellation', () => {
  it('before the first token: aborts the upstream at once and counts phase before_first_token, code 499', async () => {
    stack = await startStack();
    const s = stack;
    const sim = s.sims[0];
    if (sim === undefined) throw new Error('no simulator');
    const started = once(sim.events, 'request-start');
    const ended = s.simEnded();
    const { req } = startStream(s, 'ttft_ms=60000');
    await started;
    req.destroy();
    const record = await ended;
    expect(record.end).toBe('client_disconnect');
    expect(sim.stats().clientDisconnects).toBe(1);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'client_cancelled', code: 499, cancelPhase: 'before_first_token', slo: 'excluded' });
    expect(await s.metric('waybill_client_cancellations_total', { model: 'sim-model', phase: 'before_first_token' })).toBe(1);
    expect(await s.metric('waybill_requests_total', { code: '499', outcome: 'client_cancelled' })).toBe(1);
    expect(await s.metric('waybill_upstream_attempts_total', { result: 'cancelled' })).toBe(1);
    expect(await s.metric('waybill_inflight_requests', { model: 'sim-model' })).toBe(0);
  });

  it('mid-stream: aborts the upstream and counts phase streaming, code 200', async () => {
    stack = await startStack({ sim: { itlMs: 20, outputTokens: 1000 } });
    const s = stack;
    const ended = s.simEnded();
    const { req, response } = startStream(s, '');
    const res = await response;
    expect(res.statusCode).toBe(200);
    await once(res, 'data');
    req.destroy();
    const record = await ended;
    expect(record.end).toBe('client_disconnect');
    expect(record.completionTokensSent).toBeLessThan(1000);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'client_cancelled', code: 200, cancelPhase: 'streaming', finishReasons: ['none'] });
    expect(await s.metric('waybill_client_cancellations_total', { phase: 'streaming' })).toBe(1);
    expect(await s.metric('waybill_requests_total', { code: '200', outcome: 'client_cancelled' })).toBe(1);
  });
});

describe('backpressure', () => {
  it('pauses the upstream for a slow reader: bounded gateway buffer, and the whole answer arrives', async () => {
    // Far more than the loopback socket buffers on both hops absorb (a few MB here), so the pause must reach
    // the simulator before the answer is done.
    const tokens = 100_000;
    // A short idle timeout: a paused client must not make a healthy upstream look idle.
    stack = await startStack({ sim: { ttftMs: 1, itlMs: 0, outputTokens: tokens }, config: { timeouts: { idle: '200ms' } } });
    const s = stack;
    const sim = s.sims[0];
    if (sim === undefined) throw new Error('no simulator');
    const responses: ServerResponse[] = [];
    s.gateway.app.server.on('request', (_req: IncomingMessage, res: ServerResponse) => responses.push(res));

    const { response } = startStream(s, '');
    const res = await response;
    res.pause();
    // No event says "everything is blocked now", so poll (bounded) until the bytes the gateway has handed to the
    // client's socket stop growing while the client reads nothing.
    let written = -1;
    // Up to 15 s: on a loaded 2-core machine the first bytes have been seen to take more than 5 s to go out.
    for (let i = 0; i < 750; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      const clientResponse = responses[0];
      // What the gateway holds for this client stays near one socket buffer, never the whole answer: in the response,
      // and in its socket (where the events of an answer already under way are written directly).
      expect((clientResponse?.writableLength ?? 0) + (clientResponse?.socket?.writableLength ?? 0)).toBeLessThan(256 * 1024);
      const now = clientResponse?.socket?.bytesWritten ?? 0;
      if (now === written && now > 0) break;
      written = now;
    }
    // The answer is megabytes; the gateway wrote a fraction of it, and the simulator is held up too, which
    // shows the pause reached the upstream socket instead of piling up in the gateway.
    expect(written).toBeGreaterThan(0);
    expect(written).toBeLessThan((tokens * 150) / 2);
    expect(sim.stats().completed).toBe(0);
    expect(sim.stats().inflight).toBe(1);
    // Stay paused for longer than the idle timeout: the subject here is time passing, not synchronisation.
    await new Promise((resolve) => setTimeout(resolve, 600));

    res.resume();
    let received = '';
    res.setEncoding('utf8');
    for await (const chunk of res) received += chunk as string;
    expect(received.endsWith('data: [DONE]\n\n')).toBe(true);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'delivered', usage: { completionTokens: tokens } });
  });
});
