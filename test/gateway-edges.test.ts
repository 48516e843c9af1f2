/**
 * Edge cases found in review, each pinned by a scripted upstream: aborts from inside the framer, attempts that
 * never connect, the drain grace running out, and a client that never takes its response.
 */
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import { useCleanups } from './helpers/cleanups.js';
import { scriptedUpstream, wire } from './helpers/scripted.js';
import { CHAT, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const { role, content, finish } = wire;
const errorEvent = wire.errorEvent(500);
const bigEvent = `data: {"x":"${'a'.repeat(4000)}"}\n\n`;
const STREAM = { ...CHAT, stream: true };

async function gatewayFor(url: string, config: Record<string, unknown> = {}): Promise<Stack> {
  const stack = await startStack({
    sims: 0,
    extraUpstreams: [{ name: 'scripted', url }],
    config: { ...config, health: { interval: '1h', timeout: '200ms' } },
  });
  cleanups.push(() => stack.close());
  return stack;
}

const SSE = { 'content-type': 'text/event-stream; charset=utf-8' };

describe('an abort from inside the framer', () => {
  it('still writes the events forwarded from the same read before the error event', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.write(role + content('Hel'), () => res.write(content('KEPT') + bigEvent));
    });
    const s = await gatewayFor(url, { streaming: { max_event_bytes: 1024 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    const events = client.body.split('\n\n').filter(Boolean);
    expect(events.slice(0, 3)).toEqual([role, content('Hel'), content('KEPT')].map((e) => e.slice(0, -2)));
    expect(events[3]).toMatch(/"code":"stream_truncated"/);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'incomplete', anomalies: [{ upstream: 'scripted', kind: 'oversized_event' }] });
  });

  it('commits and then fails in one read: the client gets what was committed, then the error event', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.write(role + content('FIRST') + bigEvent);
    });
    const s = await gatewayFor(url, { streaming: { max_event_bytes: 1024 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(200);
    expect(client.body.startsWith(role + content('FIRST'))).toBe(true);
    const [settlement] = await s.settled(1);
    expect(settlement?.outcome).toBe('incomplete');
  });
});

describe('the drain grace running out', () => {
  it('judges the attempt by what it sent: ok after [DONE], error_payload after an error event', async () => {
    const url = await scriptedUpstream(cleanups, (req, res) => {
      res.writeHead(200, SSE);
      // Neither response ever ends: the gateway stops reading after the drain grace.
      if (req.headers['x-case'] === 'done') res.write(role + content('hi') + finish + 'data: [DONE]\n\n');
      else res.write(role + content('hi') + errorEvent);
    });
    const s = await gatewayFor(url, { streaming: { drain_grace: '100ms' } });
    const done = await post(s.base, '/v1/chat/completions', STREAM, { 'x-case': 'done' });
    expect(done.body.endsWith('data: [DONE]\n\n')).toBe(true);
    const error = await post(s.base, '/v1/chat/completions', STREAM, { 'x-case': 'error' });
    expect(error.body.endsWith(errorEvent)).toBe(true);
    const [first, second] = await s.settled(2);
    expect(first).toMatchObject({ outcome: 'delivered', attempts: [{ result: 'ok' }] });
    expect(second).toMatchObject({ outcome: 'stream_error', attempts: [{ result: 'error_payload' }] });
  });
});

describe('an attempt that is still connecting', () => {
  /** Accepts TCP and never answers: a TLS handshake to it never completes. */
  async function blackhole(): Promise<string> {
    const sockets: Socket[] = [];
    const server = createTcpServer((socket) => {
      sockets.push(socket);
      socket.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => {
      for (const socket of sockets) socket.destroy();
      server.close();
    });
    return `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  it('obeys the first-output deadline without waiting for the connect timeout', async () => {
    const s = await gatewayFor(await blackhole(), { timeouts: { connect: '30s', first_output: '200ms' }, retries: { max_attempts: 1 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(504);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'timeout', code: 504, attempts: [{ result: 'timeout' }] });
    expect(settlement?.durationMs).toBeLessThan(5_000);
  });

  it('settles a client cancellation at once', async () => {
    const s = await gatewayFor(await blackhole(), { timeouts: { connect: '30s' } });
    const req = httpRequest(`${s.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
    req.on('error', () => undefined);
    req.end(JSON.stringify(STREAM));
    // The request is in the gateway once the gateway counts it in flight.
    for (let i = 0; i < 200 && (await s.metric('waybill_inflight_requests', { model: 'sim-model' })) === 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    req.destroy();
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'client_cancelled', code: 499, attempts: [{ result: 'cancelled' }] });
    expect(settlement?.durationMs).toBeLessThan(5_000);
    expect(await s.metric('waybill_inflight_requests', { model: 'sim-model' })).toBe(0);
  });
});

describe('a client that never takes its response', () => {
  it('is a cancellation, not a delivery, even after the whole answer was handed to the response', async () => {
    // A non-stream body far larger than the loopback socket buffers, so it cannot all leave the gateway unread.
    const text = 'x'.repeat(40 * 1024 * 1024);
    const body = JSON.stringify({
      id: 'c',
      object: 'chat.completion',
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop' }],
      usage: { prompt_tokens: 1, completion_tokens: 1 },
    });
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body);
    });
    const s = await gatewayFor(url);
    const responses: ServerResponse[] = [];
    s.gateway.app.server.on('request', (_req: IncomingMessage, res: ServerResponse) => responses.push(res));
    const req = httpRequest(`${s.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } });
    req.on('error', () => undefined);
    const response = new Promise<IncomingMessage>((resolve) => req.once('response', resolve));
    req.end(JSON.stringify(CHAT));
    (await response).pause();
    // Poll (bounded) until the gateway has ended its response: every byte is now in its hands or the kernel's.
    for (let i = 0; i < 500 && responses[0]?.writableEnded !== true; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    expect(responses[0]?.writableEnded).toBe(true);
    expect(responses[0]?.writableFinished).toBe(false);
    expect(s.settlements).toHaveLength(0);
    req.destroy();
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'client_cancelled', code: 200, stream: false });
  });
});
