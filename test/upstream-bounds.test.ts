/**
 * What an upstream can make the gateway hold or say about itself (issue 22, items 10, 11, 15, 16), over real
 * sockets: a scripted upstream, a real gateway on port 0.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { request } from 'undici';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { metricValue, post } from './helpers/stack.js';

type Route = (req: IncomingMessage, res: ServerResponse) => void;

interface Upstream {
  readonly url: string;
  /** Requests per path. */
  readonly hits: Map<string, number>;
  close(): Promise<void>;
}

const servers: Array<{ close(): Promise<void> }> = [];

async function upstream(routes: Record<string, Route>): Promise<Upstream> {
  const hits = new Map<string, number>();
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0] ?? '';
    hits.set(path, (hits.get(path) ?? 0) + 1);
    req.resume();
    req.on('end', () => {
      const route = routes[path];
      if (route !== undefined) route(req, res);
      else if (path === '/health') res.end();
      else res.writeHead(404).end();
    });
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const handle = {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    hits,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
  servers.push(handle);
  return handle;
}

async function gateway(input: Record<string, unknown>): Promise<{ gateway: Gateway; base: string; metrics(): Promise<string> }> {
  const config = parseConfig({ server: { host: '127.0.0.1', port: 0 }, logging: { level: 'silent' }, ...input }, 'test');
  const g = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  servers.push({ close: () => g.close() });
  await g.listen();
  const base = `http://127.0.0.1:${(g.app.server.address() as AddressInfo).port}`;
  return { gateway: g, base, metrics: async () => (await request(`${base}/metrics`)).body.text() };
}

/** Polls `condition` every 10 ms for at most `ms` (a bound, not a sleep: it returns as soon as it holds). */
async function until(condition: () => boolean | Promise<boolean>, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const chatAnswer = (model: string) =>
  JSON.stringify({
    id: 'c',
    object: 'chat.completion',
    created: 1,
    model,
    choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop', logprobs: null }],
    usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
  });

const chatRoute: Route = (_req, res) => {
  res.writeHead(200, { 'content-type': 'application/json' }).end(chatAnswer('m'));
};

const modelsBody = (ids: readonly string[]) => JSON.stringify({ object: 'list', data: ids.map((id) => ({ id, object: 'model' })) });

/** The distinct values of label `label` among the samples of `name`. */
function labelValues(text: string, name: string, label: string): Set<string> {
  const values = new Set<string>();
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const match = new RegExp(`[{,]${label}="([^"]*)"`).exec(line);
    if (match?.[1] !== undefined) values.add(match[1]);
  }
  return values;
}

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

describe('discovered model names: the label set is capped for the life of the process (item 10)', () => {
  it('the default cap: 99 names discovered over three refreshes, each one asked for, make 64 model labels and _other', async () => {
    let step = 0;
    const names = (k: number) => Array.from({ length: 33 }, (_, i) => `adapter-${k}-${String(i).padStart(2, '0')}`);
    const up = await upstream({
      '/v1/models': (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' }).end(modelsBody(names(step)));
      },
      '/v1/chat/completions': chatRoute,
    });
    const g = await gateway({
      pools: [{ name: 'lora', upstreams: [{ name: 'u', url: up.url }] }],
      discovery: { refresh_interval: '20ms' },
      health: { interval: '1h' },
    });
    for (; step < 3; step++) {
      await until(async () => {
        const list = (await (await request(`${g.base}/v1/models`)).body.json()) as { data: Array<{ id: string }> };
        return names(step).every((name) => list.data.some((m) => m.id === name));
      });
      for (const name of names(step)) {
        const answer = await post(g.base, '/v1/chat/completions', { model: name, messages: [{ role: 'user', content: 'x' }] });
        expect(answer.status).toBe(200);
      }
    }
    const text = await g.metrics();
    const labels = labelValues(text, 'waybill_requests_total', 'model');
    expect(labels.size).toBe(65);
    expect(labels.has('_other')).toBe(true);
    expect(metricValue(text, 'waybill_requests_total', { model: '_other', code: '200' })).toBe(99 - 64);
    // Every model-labelled metric is bounded the same way.
    for (const name of ['waybill_request_duration_seconds_count', 'waybill_inflight_requests', 'waybill_completion_tokens_total']) {
      expect(labelValues(text, name, 'model').size).toBeGreaterThan(0);
      expect(labelValues(text, name, 'model').size).toBeLessThanOrEqual(65);
    }
  });

  it('an upstream whose /v1/models changes every refresh: names past discovery.max_models_per_pool are served but counted under _other', async () => {
    // Each step, discovery lists two names never seen before (LoRA adapters loading and unloading), six steps.
    let listing = 0;
    let k = 0;
    const up = await upstream({
      '/v1/models': (_req, res) => {
        listing++;
        // The loop below ends with k = 6: the list stays at the last step's (a name that left and came back would
        // count again when listed anew).
        const step = Math.min(k, 5);
        res.writeHead(200, { 'content-type': 'application/json' }).end(modelsBody([`lora-${2 * step}`, `lora-${2 * step + 1}`]));
      },
      '/v1/chat/completions': chatRoute,
    });
    const g = await gateway({
      pools: [{ name: 'lora', upstreams: [{ name: 'u', url: up.url }] }],
      discovery: { refresh_interval: '20ms', max_models_per_pool: 3 },
      health: { interval: '1h' },
    });
    const served = new Set<string>();
    // Every name, once discovered, is asked for: each one the gateway serves gets a request.
    for (; k <= 5; k++) {
      const names = [`lora-${2 * k}`, `lora-${2 * k + 1}`];
      await until(async () => {
        const list = (await (await request(`${g.base}/v1/models`)).body.json()) as { data: Array<{ id: string }> };
        return names.every((name) => list.data.some((m) => m.id === name));
      });
      for (const name of names) {
        const answer = await post(g.base, '/v1/chat/completions', { model: name, messages: [{ role: 'user', content: 'x' }] });
        // Routing to a name over the cap still works: the upstream serves it.
        expect(answer.status).toBe(200);
        served.add(name);
      }
    }
    expect(served.size).toBe(12);
    const text = await g.metrics();
    // The first three names discovered keep their labels; the nine others share _other.
    expect(labelValues(text, 'waybill_requests_total', 'model')).toEqual(new Set(['lora-0', 'lora-1', 'lora-2', '_other']));
    expect(metricValue(text, 'waybill_requests_total', { model: '_other', code: '200' })).toBe(9);
    expect(metricValue(text, 'waybill_requests_total', { code: '200' })).toBe(12);
    // Each refused name counted once, when first listed.
    expect(metricValue(text, 'waybill_discovered_models_refused_total', { pool: 'lora' })).toBe(9);
    // The in-flight gauge went up and down under the same label.
    for (const model of labelValues(text, 'waybill_inflight_requests', 'model')) {
      expect(metricValue(text, 'waybill_inflight_requests', { model })).toBe(0);
    }
    // Later refreshes (the list no longer changes) count nothing more.
    const before = listing;
    await until(() => listing >= before + 2);
    expect(metricValue(await g.metrics(), 'waybill_discovered_models_refused_total', { pool: 'lora' })).toBe(9);
  });
});

describe('bodies the gateway reads from an upstream for itself are size-limited and have a deadline (item 11)', () => {
  it('a huge /v1/models: the read stops at health.max_body_bytes (default 1 MiB), the socket is closed, the stop counted', async () => {
    let written = 0;
    let closed = false;
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    const up = await upstream({
      '/v1/models': (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"data":[');
        res.on('close', () => (closed = true));
        // Streams whitespace until the reader goes away (a 64 MiB list, at whatever pace the socket takes it).
        const pump = () => {
          while (!closed && written < 64 * 1024 * 1024) {
            written += chunk.length;
            if (!res.write(chunk)) {
              res.once('drain', pump);
              return;
            }
          }
        };
        pump();
      },
    });
    const g = await gateway({
      pools: [{ name: 'p', upstreams: [{ name: 'u', url: up.url }] }],
      discovery: { refresh_interval: '1h' },
      health: { interval: '1h', timeout: '10s' },
    });
    await until(() => closed);
    const text = await g.metrics();
    expect(metricValue(text, 'waybill_upstream_reads_stopped_total', { upstream: 'u', read: 'discovery', reason: 'too_large' })).toBe(1);
    expect(metricValue(text, 'waybill_upstream_probe_failures_total', { upstream: 'u', probe: 'discovery' })).toBe(1);
    // The upstream got to write at most the limit plus what the sockets' buffers hold (loopback: a few MiB), not 64.
    expect(written).toBeLessThan(16 * 1024 * 1024);
  });

  it('health.max_body_bytes sets the limit; a health check with a long body fails and is counted', async () => {
    const up = await upstream({
      '/health': (_req, res) => res.writeHead(200).end(Buffer.alloc(8 * 1024, 0x20)),
      '/v1/models': (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(modelsBody(['m'])),
    });
    const g = await gateway({
      pools: [{ name: 'p', upstreams: [{ name: 'u', url: up.url }] }],
      discovery: { refresh_interval: '1h' },
      health: { interval: '1h', max_body_bytes: 4096 },
    });
    const text = await g.metrics();
    expect(metricValue(text, 'waybill_upstream_reads_stopped_total', { upstream: 'u', read: 'health', reason: 'too_large' })).toBe(1);
    expect(metricValue(text, 'waybill_upstream_reads_stopped_total', { upstream: 'u', read: 'discovery' })).toBe(0);
    expect(metricValue(text, 'waybill_upstream_probe_failures_total', { upstream: 'u', probe: 'health' })).toBe(1);
    expect(metricValue(text, 'waybill_upstream_up', { upstream: 'u' })).toBe(0);
  });

  it('a /v1/models that trickles: the read stops at health.timeout, counted as a deadline', async () => {
    let closed = false;
    const up = await upstream({
      '/v1/models': (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"data":[');
        // A byte every 20 ms: never idle long enough for an idle timeout, never done.
        const timer = setInterval(() => res.write(' '), 20);
        res.on('close', () => {
          closed = true;
          clearInterval(timer);
        });
      },
    });
    const started = Date.now();
    const g = await gateway({
      pools: [{ name: 'p', upstreams: [{ name: 'u', url: up.url }] }],
      discovery: { refresh_interval: '1h' },
      health: { interval: '1h', timeout: '300ms' },
    });
    // listen() waits for the first discovery: it ended at the deadline, not never.
    expect(Date.now() - started).toBeLessThan(5_000);
    await until(() => closed);
    expect(metricValue(await g.metrics(), 'waybill_upstream_reads_stopped_total', { upstream: 'u', read: 'discovery', reason: 'deadline' })).toBe(1);
  });
});

describe('a failed discovery answers 503 model_unavailable, not 404 (item 15)', () => {
  it('while no upstream of a discovering pool has listed its models: 503 with Retry-After in each route\'s shape; 404 once discovery succeeds', async () => {
    let listing = false;
    const up = await upstream({
      '/v1/models': (_req, res) => {
        if (listing) res.writeHead(200, { 'content-type': 'application/json' }).end(modelsBody(['real-model']));
        else res.writeHead(503).end('loading');
      },
      '/v1/chat/completions': chatRoute,
    });
    const g = await gateway({
      pools: [{ name: 'p', upstreams: [{ name: 'u', url: up.url }] }],
      discovery: { refresh_interval: '500ms' },
      health: { interval: '1h' },
    });
    const chat = await post(g.base, '/v1/chat/completions', { model: 'real-model', messages: [{ role: 'user', content: 'x' }] });
    expect(chat.status).toBe(503);
    expect(chat.headers['retry-after']).toBe('1');
    expect(JSON.parse(chat.body)).toMatchObject({ error: { code: 'model_unavailable', type: 'unavailable_error', param: 'model' } });
    const messages = await post(g.base, '/v1/messages', { model: 'real-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] });
    expect(messages.status).toBe(503);
    expect(JSON.parse(messages.body)).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
    // Counted once each, under the closed label (a gateway-answered 5xx is a failed request, docs/errors.md).
    const text = await g.metrics();
    expect(metricValue(text, 'waybill_requests_total', { code: '503', model: '_other' })).toBe(2);
    expect(metricValue(text, 'waybill_requests_total', { code: '503', outcome: 'failed', model: '_other' })).toBe(2);

    listing = true;
    await until(async () => (await post(g.base, '/v1/chat/completions', { model: 'real-model', messages: [{ role: 'user', content: 'x' }] })).status === 200);
    const unknown = await post(g.base, '/v1/chat/completions', { model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
    expect(unknown.status).toBe(404);
    expect(JSON.parse(unknown.body)).toMatchObject({ error: { code: 'model_not_found' } });
  });
});

describe('discovery pending is bounded per pool (review finding)', () => {
  const ask = (base: string, model: string) => post(base, '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }] });

  it('a discovering pool whose upstream answers /v1/models 401: an unknown model is 404 at once, the other pool\'s model served', async () => {
    const served = await upstream({ '/v1/chat/completions': chatRoute });
    const wrongKey = await upstream({ '/v1/models': (_req, res) => res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"unauthorized"}') });
    const g = await gateway({
      pools: [
        { name: 'a', models: ['m'], upstreams: [{ name: 'ua', url: served.url }] },
        { name: 'b', upstreams: [{ name: 'ub', url: wrongKey.url }] },
      ],
      discovery: { refresh_interval: '1h' },
      health: { interval: '1h' },
    });
    const typo = await ask(g.base, 'typo-model');
    expect(typo.status).toBe(404);
    expect(JSON.parse(typo.body)).toMatchObject({ error: { code: 'model_not_found' } });
    expect((await ask(g.base, 'm')).status).toBe(200);
    expect(metricValue(await g.metrics(), 'waybill_upstream_probe_failures_total', { upstream: 'ub', probe: 'discovery' })).toBe(1);
  });

  it('a body that is not a model list counts as answered too: 404, not 503', async () => {
    const notVllm = await upstream({ '/v1/models': (_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>hello</html>') });
    const g = await gateway({
      pools: [{ name: 'b', upstreams: [{ name: 'ub', url: notVllm.url }] }],
      discovery: { refresh_interval: '1h' },
      health: { interval: '1h' },
    });
    expect((await ask(g.base, 'typo-model')).status).toBe(404);
  });

  it('upstreams that never answer (5xx): 503 model_unavailable for a bounded number of rounds, then 404', async () => {
    const down = await upstream({ '/v1/models': (_req, res) => res.writeHead(503).end('loading') });
    const g = await gateway({
      pools: [{ name: 'b', upstreams: [{ name: 'ub', url: down.url }] }],
      discovery: { refresh_interval: '50ms' },
      health: { interval: '1h' },
    });
    expect((await ask(g.base, 'typo-model')).status).toBe(503);
    // DISCOVERY_PENDING_ROUNDS (3) rounds: ~100 ms; the bound is 5 s.
    await until(async () => (await ask(g.base, 'typo-model')).status === 404);
  });
});

describe('a reload while a discovering pool\'s upstreams are down keeps its models served (review finding)', () => {
  it('the unchanged pool starts from the previous list: 200, not 503', async () => {
    let listing = true;
    const up = await upstream({
      '/v1/models': (_req, res) => {
        if (listing) res.writeHead(200, { 'content-type': 'application/json' }).end(modelsBody(['real-model']));
        else res.writeHead(503).end('down');
      },
      '/v1/chat/completions': chatRoute,
    });
    const input = { server: { host: '127.0.0.1', port: 0 }, logging: { level: 'silent' }, pools: [{ name: 'p', upstreams: [{ name: 'u', url: up.url }] }], health: { interval: '1h' } };
    const g = await gateway({ ...input, discovery: { refresh_interval: '1h' } });
    const ask = () => post(g.base, '/v1/chat/completions', { model: 'real-model', messages: [{ role: 'user', content: 'x' }] });
    expect((await ask()).status).toBe(200);
    listing = false;
    const reloaded = await g.gateway.reload(parseConfig({ ...input, discovery: { refresh_interval: '30m' } }, 'test'));
    expect(reloaded.result).toBe('ok');
    expect((await ask()).status).toBe(200);
  });
});

describe('passive health never ejects the last upstream of a pool (item 16)', () => {
  it('three failed requests to a pool of one: not ejected, /readyz stays 200', async () => {
    const up = await upstream({
      '/v1/chat/completions': (_req, res) => res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom","type":"x","code":500}}'),
    });
    const g = await gateway({
      pools: [{ name: 'p', models: ['m'], upstreams: [{ name: 'only', url: up.url }] }],
      health: { interval: '1h', eject_after_failures: 3 },
      retries: { max_attempts: 1 },
    });
    for (let i = 0; i < 5; i++) {
      const answer = await post(g.base, '/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }] });
      expect(answer.status).toBe(502);
    }
    const text = await g.metrics();
    expect(metricValue(text, 'waybill_upstream_ejections_total', { upstream: 'only' })).toBe(0);
    expect(metricValue(text, 'waybill_upstream_up', { upstream: 'only' })).toBe(1);
    const ready = await request(`${g.base}/readyz`);
    expect(ready.statusCode).toBe(200);
    expect(await ready.body.json()).toMatchObject({ status: 'ready', pools: [{ upstreams: [{ name: 'only', circuit: 'closed' }] }] });
  });

  it('a pool of two, both failing: one is ejected, the other keeps taking traffic; max_ejection_percent 0 ejects none', async () => {
    const failing: Route = (_req, res) => res.writeHead(500, { 'content-type': 'application/json' }).end('{"error":{"message":"boom","type":"x","code":500}}');
    const a = await upstream({ '/v1/chat/completions': failing });
    const b = await upstream({ '/v1/chat/completions': failing });
    for (const [percent, ejected] of [[undefined, 1], [0, 0]] as const) {
      const g = await gateway({
        pools: [{ name: 'p', models: ['m'], upstreams: [{ name: 'a', url: a.url }, { name: 'b', url: b.url }] }],
        health: { interval: '1h', eject_after_failures: 2, ejection_base: '1h', ejection_max: '1h', ...(percent === undefined ? {} : { max_ejection_percent: percent }) },
        retries: { max_attempts: 1 },
      });
      for (let i = 0; i < 12; i++) await post(g.base, '/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'x' }] });
      const text = await g.metrics();
      expect(metricValue(text, 'waybill_upstream_ejections_total')).toBe(ejected);
      expect(metricValue(text, 'waybill_upstream_up')).toBe(2 - ejected);
      expect((await request(`${g.base}/readyz`)).statusCode).toBe(200);
      await g.gateway.close();
    }
  });
});
