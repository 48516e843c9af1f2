/**
 * Hostile upstreams, over real sockets: numbers are validated before they are counted, every anomaly names what
 * happened, what an upstream can make the gateway hold is bounded, and pre-commit failures say their real cause.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { createGateway } from '../src/app/gateway.js';
import { useCleanups } from './helpers/cleanups.js';
import { scriptedUpstream, wire, type Handler } from './helpers/scripted.js';
import { CHAT, metricValue, post, startStack, type Stack } from './helpers/stack.js';

const cleanups = useCleanups();

const { role, content, finish, done, sse: SSE } = wire;
const STREAM = { ...CHAT, stream: true };

async function gatewayFor(urls: string | string[], config: Record<string, unknown> = {}): Promise<Stack> {
  const list = Array.isArray(urls) ? urls : [urls];
  const stack = await startStack({
    sims: 0,
    extraUpstreams: list.map((url, i) => ({ name: list.length === 1 ? 'scripted' : `u${i}`, url })),
    config: { health: { interval: '1h', timeout: '200ms' }, ...config },
  });
  cleanups.push(() => stack.close());
  return stack;
}

const chunk = (body: Record<string, unknown>) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'sim-model', ...body })}\n\n`;

describe('usage numbers', () => {
  it.each([
    ['1e308', { prompt_tokens: 1e308, completion_tokens: 3 }],
    ['fractional', { prompt_tokens: 2.5, completion_tokens: 3 }],
    ['negative', { prompt_tokens: 5, completion_tokens: -3 }],
    ['a string', { prompt_tokens: '5', completion_tokens: 3 }],
    ['cached above prompt', { prompt_tokens: 5, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 6 } }],
  ])('%s: counted as missing usage plus invalid_usage, never added to a token counter', async (_name, usage) => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.end(role + content('hi') + finish + chunk({ choices: [], usage }) + done);
    });
    const s = await gatewayFor(url);
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith(done)).toBe(true);
    const [settlement] = await s.settled(1);
    // No usage: the prompt's class is the request's own estimate ("Hello there": a few tokens).
    expect(settlement).toMatchObject({ outcome: 'delivered', usage: undefined, promptLen: '0-1k', anomalies: [{ kind: 'invalid_usage' }] });
    const text = await s.metricsText();
    expect(metricValue(text, 'waybill_prompt_tokens_total')).toBe(0);
    expect(metricValue(text, 'waybill_completion_tokens_total')).toBe(0);
    expect(metricValue(text, 'waybill_cached_prompt_tokens_total')).toBe(0);
    expect(metricValue(text, 'waybill_usage_missing_total')).toBe(1);
    expect(metricValue(text, 'waybill_stream_anomalies_total', { kind: 'invalid_usage' })).toBe(1);
  });

  it('valid usage is still counted exactly', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.end(role + content('hi') + finish + chunk({ choices: [], usage: { prompt_tokens: 7, completion_tokens: 2, prompt_tokens_details: { cached_tokens: 7 } } }) + done);
    });
    const s = await gatewayFor(url);
    await post(s.base, '/v1/chat/completions', STREAM);
    const text = await s.metricsText();
    expect(metricValue(text, 'waybill_prompt_tokens_total')).toBe(7);
    expect(metricValue(text, 'waybill_cached_prompt_tokens_total')).toBe(7);
    expect(metricValue(text, 'waybill_stream_anomalies_total')).toBe(0);
  });
});

describe('choice indices', () => {
  it('an n=1 stream naming indices 1..5000: one unexpected_choice, and exactly one finish reason counted', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      let extra = '';
      for (let index = 1; index <= 5000; index++) extra += chunk({ choices: [{ index, delta: {}, finish_reason: 'stop' }] });
      res.end(role + content('hi') + extra + finish + done);
    });
    const s = await gatewayFor(url);
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith(done)).toBe(true);
    const [settlement] = await s.settled(1);
    expect(settlement?.finishReasons).toEqual(['stop']);
    expect(settlement?.anomalies).toEqual([{ upstream: 'scripted', kind: 'unexpected_choice' }]);
    expect(await s.metric('waybill_choice_finish_reasons_total')).toBe(1);
    expect(await s.metric('waybill_stream_anomalies_total', { kind: 'unexpected_choice' })).toBe(1);
  });

  it('a finish for a non-integer or negative index does not finish choice 0', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.end(role + content('hi') + chunk({ choices: [{ index: -1, delta: {}, finish_reason: 'stop' }] }) + chunk({ choices: [{ index: 0.5, delta: {}, finish_reason: 'stop' }] }) + done);
    });
    const s = await gatewayFor(url);
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.body).toMatch(/"code":"stream_truncated"/);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'incomplete', finishReasons: ['none'] });
  });
});

describe('the idle clock', () => {
  it('runs on whole events: an upstream dripping bytes with no event boundary times out at timeouts.idle', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.write(role + content('hi'));
      const timer = setInterval(() => res.write('x'), 50);
      res.on('close', () => clearInterval(timer));
    });
    const s = await gatewayFor(url, { timeouts: { idle: '300ms', total: '20s' } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.body).toMatch(/"code":"stream_timeout"/);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'timeout', attempts: [{ result: 'timeout' }] });
    // The idle timeout (300 ms), not the total deadline (20 s), ended it.
    expect(settlement?.durationMs).toBeLessThan(10_000);
  });

  it('comments are events for the idle clock: keep-alives hold a slow stream open', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.write(role + content('hi'));
      let beats = 0;
      const timer = setInterval(() => {
        if (++beats < 6) res.write(': keep-alive\n\n');
        else {
          clearInterval(timer);
          res.end(finish + done);
        }
      }, 100);
    });
    const s = await gatewayFor(url, { timeouts: { idle: '300ms' } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith(done)).toBe(true);
  });
});

describe('what is held before the first output', () => {
  it('3 MB of blank lines before the first token are not held: the stream is delivered', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.write(role);
      res.write('\n'.repeat(3 * 1024 * 1024), () => res.end(content('hi') + finish + done));
    });
    const s = await gatewayFor(url, { streaming: { max_event_bytes: 64 * 1024 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(200);
    expect(client.body.endsWith(done)).toBe(true);
    const [settlement] = await s.settled(1);
    expect(settlement?.outcome).toBe('delivered');
  });

  it('n=100: the hundred role chunks vLLM sends before any content are held and delivered, not refused', async () => {
    const s = await startStack();
    cleanups.push(() => s.close());
    const client = await post(s.base, '/v1/chat/completions', { ...STREAM, n: 100 });
    expect(client.status).toBe(200);
    expect(client.body.endsWith(done)).toBe(true);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'delivered', attempts: [{ result: 'ok' }] });
    expect(settlement?.finishReasons).toHaveLength(100);
  });

  it('more comments than streaming.max_held_events before any output: 502 naming the cause, oversized_event', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(200, SSE);
      res.end(': ping\n\n'.repeat(20) + role + content('late') + finish + done);
    });
    const s = await gatewayFor(url, { streaming: { max_held_events: 10 }, retries: { max_attempts: 1 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(502);
    const body = JSON.parse(client.body) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('upstream_protocol_error');
    expect(body.error.message).toMatch(/before the first output/);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'failed', anomalies: [{ kind: 'oversized_event' }] });
  });
});

describe('pre-commit failures name their cause', () => {
  it.each([
    ['a redirect (never followed)', (res: ServerResponse) => res.writeHead(302, { location: 'http://127.0.0.1:1/' }).end(), /redirect/, 'http_3xx', undefined],
    ['an HTML page under 200', (res: ServerResponse) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>login</html>'), /without an event stream/, 'incomplete', 'malformed_event'],
    ['a gzip body', (res: ServerResponse) => res.writeHead(200, { ...SSE, 'content-encoding': 'gzip' }).end(Buffer.from([0x1f, 0x8b, 8, 0])), /compressed/, 'incomplete', 'malformed_event'],
    ['an oversized event', (res: ServerResponse) => res.writeHead(200, SSE).end(`data: {"x":"${'a'.repeat(5000)}"}\n\n`), /oversized event/, 'incomplete', 'oversized_event'],
  ])('%s', async (_name, answer, message, result, anomaly) => {
    const url = await scriptedUpstream(cleanups, (_req, res) => answer(res));
    const s = await gatewayFor(url, { streaming: { max_event_bytes: 1024 }, retries: { max_attempts: 1 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(502);
    const body = JSON.parse(client.body) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('upstream_protocol_error');
    expect(body.error.message).toMatch(message);
    const [settlement] = await s.settled(1);
    expect(settlement).toMatchObject({ outcome: 'failed', code: 502, attempts: [{ result }] });
    expect(settlement?.anomalies.map((a) => a.kind)).toEqual(anomaly === undefined ? [] : [anomaly]);
    expect(await s.metric('waybill_upstream_attempts_total', { result })).toBe(1);
  });

  it('a huge upstream error body is read up to streaming.max_error_body_bytes and its message relayed cut short', async () => {
    const url = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'm'.repeat(50_000), type: 'BadRequestError', code: 400 } }));
    });
    const s = await gatewayFor(url, { streaming: { max_error_body_bytes: 100_000 } });
    const client = await post(s.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(400);
    const body = JSON.parse(client.body) as { error: { message: string; type: string } };
    expect(body.error.type).toBe('BadRequestError');
    expect(body.error.message.length).toBe(4097);

    const capped = await scriptedUpstream(cleanups, (_req, res) => {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'm'.repeat(50_000), code: 400 } }));
    });
    const t = await gatewayFor(capped, { streaming: { max_error_body_bytes: 1024 } });
    const cut = await post(t.base, '/v1/chat/completions', STREAM);
    // Past the cap the body is not JSON any more: the status is relayed with a message of Waybill's own.
    expect(cut.status).toBe(400);
    expect(JSON.parse(cut.body)).toMatchObject({ error: { message: 'upstream answered 400' } });
  });
});

describe('retries go to upstreams not yet tried', () => {
  it('with 2 sick replicas of 3 and 3 attempts, every request reaches the healthy one', async () => {
    const sick: Handler = (_req, res) => res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"sick","code":503}}');
    const healthy: Handler = (_req, res) => res.writeHead(200, SSE).end(role + content('ok') + finish + done);
    const urls = [await scriptedUpstream(cleanups, sick), await scriptedUpstream(cleanups, sick), await scriptedUpstream(cleanups, healthy)];
    // No ejection and no budget limit: only the choice of upstream decides.
    const s = await gatewayFor(urls, {
      health: { interval: '1h', timeout: '200ms', eject_after_failures: 1000 },
      retries: { max_attempts: 3, backoff_base: '1ms', backoff_max: '2ms', budget: { ratio: 1, min_per_second: 1000 } },
    });
    for (let i = 0; i < 30; i++) {
      const client = await post(s.base, '/v1/chat/completions', STREAM);
      expect(client.status, `request ${i}`).toBe(200);
    }
    const settlements = await s.settled(30);
    for (const settlement of settlements) {
      const names = settlement.attempts.map((a) => a.upstream);
      expect(new Set(names).size, names.join(',')).toBe(names.length);
    }
  });
});

describe('discovery and health checks carry the upstream key', () => {
  it('discovers the models of an upstream started with --api-key; a wrong key is logged with its status and counted', async () => {
    const key = 'sekrit';
    const server = createServer((req: IncomingMessage, res: ServerResponse) => {
      if (req.headers.authorization !== `Bearer ${key}`) {
        res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"Unauthorized"}');
        return;
      }
      if (req.url === '/health') res.end();
      else if (req.url === '/v1/models') res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[{"id":"guarded-model","object":"model"}]}');
      else res.writeHead(200, SSE).end(role + content('ok') + finish + done);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

    const start = async (apiKey: string) => {
      const lines: Array<Record<string, unknown>> = [];
      const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
      const config = parseConfig({
        server: { host: '127.0.0.1', port: 0 },
        pools: [{ name: 'guarded', upstreams: [{ name: 'guarded', url, api_key: apiKey }] }],
        health: { interval: '1h' },
        logging: { level: 'info', requests: false },
      });
      const gateway = createGateway(config, { logger, defaultMetrics: false });
      const base = await gateway.listen();
      cleanups.push(() => gateway.close());
      return { gateway, base, lines };
    };

    const right = await start(key);
    expect(right.gateway.upstreams.models()).toEqual(['guarded-model']);
    expect((await post(right.base, '/v1/chat/completions', { ...STREAM, model: 'guarded-model' })).status).toBe(200);

    const wrong = await start('nope');
    expect(wrong.gateway.upstreams.models()).toEqual([]);
    const text = await (await fetch(`${wrong.base}/metrics`)).text();
    expect(metricValue(text, 'waybill_upstream_probe_failures_total', { upstream: 'guarded', probe: 'discovery' })).toBe(1);
    expect(metricValue(text, 'waybill_upstream_probe_failures_total', { upstream: 'guarded', probe: 'health' })).toBe(1);
    expect(wrong.lines).toContainEqual(expect.objectContaining({ msg: 'model discovery failed', upstream: 'guarded', status: 401 }));
    expect(wrong.lines).toContainEqual(expect.objectContaining({ msg: 'upstream unhealthy', upstream: 'guarded', status: 401 }));
    // The key itself is never logged.
    expect(JSON.stringify(wrong.lines)).not.toContain('nope');
  });
});
