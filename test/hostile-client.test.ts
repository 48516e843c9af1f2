/**
 * Hostile clients, over real sockets: each request gets an OpenAI-shaped answer and exactly one count, and what a
 * client can make the gateway hold is bounded by a configured limit.
 */
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHAT, post, startStack, type Stack } from './helpers/stack.js';

let s: Stack;
let port: number;

beforeAll(async () => {
  s = await startStack({
    config: {
      server: {
        host: '127.0.0.1',
        port: 0,
        read_timeout: '300ms',
        headers_timeout: '300ms',
        max_header_bytes: 4096,
        max_connections: 8,
        max_json_depth: 64,
        max_choices: 16,
      },
    },
  });
  port = Number(new URL(s.base).port);
});
afterAll(() => s.close());

/** Sum of waybill_requests_total over every series: one per request the gateway saw end. */
const requestsTotal = () => s.metric('waybill_requests_total');

/** A raw socket: sends `head`, optionally never finishes, and resolves with everything the server sent until it closed. */
function rawExchange(send: (socket: Socket) => void): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => send(socket));
    const chunks: Buffer[] = [];
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('error', reject);
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
}

function openAIError(responseText: string): { status: number; code: string } {
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(responseText)?.[1]);
  const body = JSON.parse(responseText.slice(responseText.indexOf('\r\n\r\n') + 4)) as { error: { code: string; message: string; type: string } };
  expect(body.error.message.length).toBeGreaterThan(0);
  expect(typeof body.error.type).toBe('string');
  return { status, code: body.error.code };
}

describe('bodies', () => {
  it('a 20 KB body nesting an unrelated field 10,000 deep, with stream_options: 400 json_too_deep, counted once', async () => {
    const before = await requestsTotal();
    const deep = `{"a":`.repeat(10_000) + '1' + '}'.repeat(10_000);
    const body = `{"model":"sim-model","stream":true,"stream_options":{},"messages":[{"role":"user","content":"hi"}],"junk":${deep}}`;
    const response = await post(s.base, '/v1/chat/completions', body);
    expect(response.status).toBe(400);
    expect(JSON.parse(response.body)).toMatchObject({ error: { code: 'json_too_deep', type: 'invalid_request_error' } });
    expect(await requestsTotal()).toBe(before + 1);
    expect(await s.metric('waybill_requests_total', { route: 'chat_completions', code: '400', outcome: 'rejected' })).toBeGreaterThanOrEqual(1);
  });

  it('nesting within the limit, with stream_options, is proxied with usage spliced in and delivered', async () => {
    const nested = `{"a":`.repeat(40) + '1' + '}'.repeat(40);
    const body = `{"model":"sim-model","stream":true,"stream_options":{"continuous_usage_stats":false},"seed":12345678901234567891,"messages":[{"role":"user","content":"hi"}],"junk":${nested}}`;
    const sim = s.simEnded();
    const response = await post(s.base, '/v1/chat/completions', body);
    expect(response.status).toBe(200);
    expect(response.body.endsWith('data: [DONE]\n\n')).toBe(true);
    // The usage chunk Waybill asked for is dropped before the client.
    expect(response.body).not.toContain('"choices":[],"usage"');
    expect((await sim).status).toBe(200);
  });

  it('n × prompts over server.max_choices: 400 too_many_choices before anything is allocated per choice', async () => {
    const before = await requestsTotal();
    const prompt = Array.from({ length: 100_000 }, () => 'x');
    const response = await post(s.base, '/v1/completions', { model: 'sim-model', prompt, n: 128 });
    expect(response.status).toBe(400);
    expect(JSON.parse(response.body)).toMatchObject({ error: { code: 'too_many_choices', param: 'n' } });
    expect(await requestsTotal()).toBe(before + 1);
    expect(await s.metric('waybill_choice_finish_reasons_total', { finish_reason: 'none' })).toBe(0);
  });

  it('headers then no body: 408 request_timeout after server.read_timeout, connection closed, counted once', async () => {
    const before = await requestsTotal();
    const started = performance.now();
    const text = await rawExchange((socket) =>
      socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mo'),
    );
    const waited = performance.now() - started;
    expect(openAIError(text)).toEqual({ status: 408, code: 'request_timeout' });
    expect(text.toLowerCase()).toContain('connection: close');
    // read_timeout is 300 ms; the margin above it is generous for a loaded machine, the bound below is exact.
    expect(waited).toBeGreaterThanOrEqual(290);
    expect(waited).toBeLessThan(5000);
    expect(await requestsTotal()).toBe(before + 1);
    expect(await s.metric('waybill_requests_total', { route: 'chat_completions', code: '408', outcome: 'rejected' })).toBe(1);
  });

  it('a body dripped a byte at a time is cut at the read deadline, not each byte', async () => {
    const text = await rawExchange((socket) => {
      socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n');
      const timer = setInterval(() => (socket.writable ? socket.write('{') : clearInterval(timer)), 50);
      socket.on('close', () => clearInterval(timer));
    });
    expect(openAIError(text)).toEqual({ status: 408, code: 'request_timeout' });
  });

  it('a client that resets the connection while sending its body counts once, as a cancellation', async () => {
    const before = await requestsTotal();
    const cancelled = await s.metric('waybill_requests_total', { code: '499', outcome: 'client_cancelled' });
    await rawExchange((socket) => {
      socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mo', () =>
        setTimeout(() => socket.resetAndDestroy(), 50),
      );
    });
    await expect.poll(() => s.metric('waybill_requests_total', { code: '499', outcome: 'client_cancelled' })).toBe(cancelled + 1);
    // A round trip on another connection lets anything still pending for the reset one run: still one count.
    expect((await fetch(`${s.base}/healthz`)).status).toBe(200);
    expect(await requestsTotal()).toBe(before + 1);
  });

  it('a body cut short by the client closing its side (FIN) is a 400, answered and counted once', async () => {
    const before = await requestsTotal();
    const text = await rawExchange((socket) => {
      socket.end('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"mo');
    });
    expect(openAIError(text)).toEqual({ status: 400, code: 'bad_request' });
    expect((await fetch(`${s.base}/healthz`)).status).toBe(200);
    expect(await requestsTotal()).toBe(before + 1);
    expect(await s.metric('waybill_requests_total', { route: 'chat_completions', code: '400', outcome: 'rejected' })).toBeGreaterThanOrEqual(1);
  });

  it('a malformed chunked body: 400, counted once', async () => {
    const before = await requestsTotal();
    const text = await rawExchange((socket) =>
      socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n{}\r\n'),
    );
    expect(openAIError(text)).toEqual({ status: 400, code: 'bad_request' });
    expect((await fetch(`${s.base}/healthz`)).status).toBe(200);
    expect(await requestsTotal()).toBe(before + 1);
  });
});

describe("Node's HTTP-level refusals", () => {
  it.each([
    ['a malformed request line', 'GARBAGE\r\n\r\n', 400, 'bad_request'],
    ['a header over server.max_header_bytes', `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(8000)}\r\n\r\n`, 431, 'headers_too_large'],
  ])('%s: an OpenAI-shaped answer, counted under route="_other"', async (_name, head, status, code) => {
    const labels = { model: '_other', route: '_other', code: String(status) };
    const before = await s.metric('waybill_requests_total', labels);
    const text = await rawExchange((socket) => socket.write(head));
    expect(openAIError(text)).toEqual({ status, code });
    expect(await s.metric('waybill_requests_total', labels)).toBe(before + 1);
  });

  it('one oversized header sent in many reads is answered and counted once', async () => {
    const labels = { route: '_other', code: '431' };
    const before = await s.metric('waybill_requests_total', labels);
    const text = await rawExchange((socket) => socket.write(`GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(400_000)}\r\n\r\n`));
    expect(openAIError(text)).toEqual({ status: 431, code: 'headers_too_large' });
    expect((await fetch(`${s.base}/healthz`)).status).toBe(200);
    expect(await s.metric('waybill_requests_total', labels)).toBe(before + 1);
  });

  it('a connection that never sends a byte is closed at the header deadline, not answered or counted', async () => {
    const before = await requestsTotal();
    const text = await rawExchange(() => undefined);
    expect(text).toBe('');
    expect(await requestsTotal()).toBe(before);
  });

  it('headers that never finish: 408 after server.headers_timeout, counted under route="_other"', async () => {
    const labels = { route: '_other', code: '408' };
    const before = await s.metric('waybill_requests_total', labels);
    const text = await rawExchange((socket) => socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n'));
    expect(openAIError(text)).toEqual({ status: 408, code: 'request_timeout' });
    expect(await s.metric('waybill_requests_total', labels)).toBe(before + 1);
  });
});

describe('connections', () => {
  it('a request on a connection past server.max_connections gets 503 too_many_connections and is counted', async () => {
    // 8 allowed: hold 8 idle connections open, then the 9th is answered 503 and closed.
    const idle: Socket[] = [];
    for (let i = 0; i < 8; i++) {
      const socket = connect(port, '127.0.0.1');
      await new Promise((resolve) => socket.once('connect', resolve));
      idle.push(socket);
    }
    try {
      const before = await s.metric('waybill_requests_total', { code: '503', outcome: 'failed' });
      const text = await rawExchange((socket) =>
        socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${JSON.stringify(CHAT).length}\r\n\r\n${JSON.stringify(CHAT)}`),
      );
      expect(openAIError(text)).toEqual({ status: 503, code: 'too_many_connections' });
      for (const socket of idle) socket.destroy();
      await expect.poll(() => s.metric('waybill_requests_total', { route: 'chat_completions', code: '503', outcome: 'failed' })).toBe(before + 1);
    } finally {
      for (const socket of idle) socket.destroy();
    }
    // Once they are gone, new connections are served again.
    await expect.poll(async () => (await post(s.base, '/v1/chat/completions', CHAT)).status).toBe(200);
  });
});
