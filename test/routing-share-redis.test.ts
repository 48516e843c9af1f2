/**
 * Route sharing between gateway replicas through Redis (route_sharing, src/routing/route-bus.ts), against a real
 * redis-server (skips visibly without one; WAYBILL_REQUIRE_TOOLS=1 makes that a failure): two in-process gateways in
 * front of the same three simulators. A prefix replica A placed is found by replica B's first request of it; with
 * route sharing off, B places it afresh. Redis going away never breaks a request: publishes are dropped and counted,
 * and the local index serves alone. A message from something else on the channel is dropped and counted.
 *
 * Waiting for B to learn A's pick is polling B's index size with a deadline (the relay is a pub/sub round trip).
 */
import { pino } from 'pino';
import { Redis } from 'ioredis';
import { request } from 'undici';
import { afterEach, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { prefixBlocks } from '../src/routing/prefix-key.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { until } from './helpers/poll.js';
import { metricValue } from './helpers/stack.js';
import { REDIS, RedisServer } from './helpers/redis-server.js';
import { describeWithTool } from './helpers/system-tool.js';

const SYSTEM = 'You are the replica test. '.repeat(30);
const MESSAGES = (i: number) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: `question ${i}` }];
const BLOCKS = prefixBlocks('chat_completions', { messages: MESSAGES(0) }, { blockChars: 64, blockTokens: 16, maxBlocks: 256 }).blocks.length;

let cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
  cleanups = [];
});

async function sims(): Promise<string[]> {
  const urls: string[] = [];
  for (let i = 0; i < 3; i++) {
    const sim: Simulator = createSimulator({ ttftMs: 1, itlMs: 1, outputTokens: 2, jitter: 0 });
    urls.push((await sim.listen(0, '127.0.0.1')).url);
    cleanups.push(() => sim.close());
  }
  return urls;
}

interface Replica {
  readonly base: string;
  readonly gateway: Gateway;
  metric(name: string, labels?: Record<string, string>): Promise<number>;
  chat(i: number): Promise<number>;
}

async function replica(urls: string[], sharing: ConfigInput['route_sharing']): Promise<Replica> {
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'sim', models: ['sim-model'], upstreams: urls.map((url, i) => ({ name: `sim-${i}`, url })), routing: { policy: 'cache_aware' } }],
      engine_signals: { enabled: false },
      logging: { level: 'silent', requests: false },
      ...(sharing === undefined ? {} : { route_sharing: sharing }),
    },
    'test',
  );
  const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false });
  const base = await gateway.listen();
  cleanups.push(() => gateway.close());
  return {
    base,
    gateway,
    metric: async (name, labels = {}) => metricValue(await (await request(`${base}/metrics`)).body.text(), name, labels),
    chat: async (i) => {
      const response = await request(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sim-model', max_tokens: 2, messages: MESSAGES(i) }),
      });
      await response.body.text();
      return response.statusCode;
    },
  };
}

/** Until both replicas are subscribed: a message published before would reach nobody. */
async function subscribed(redis: RedisServer, count: number): Promise<void> {
  const client = new Redis(redis.url);
  try {
    await until(`${count} subscribers`, async () => Number(((await client.call('PUBSUB', 'NUMSUB', 'waybill:routes')) as [string, number])[1]) >= count);
  } finally {
    client.disconnect();
  }
}

describeWithTool(REDIS, 'route sharing between replicas through Redis', () => {
  it('a prefix one replica placed is a prefix hit on the other’s first request of it', async () => {
    const redis = await RedisServer.start();
    cleanups.push(() => redis.stop());
    const urls = await sims();
    const a = await replica(urls, { enabled: true, redis_url: redis.url });
    const b = await replica(urls, { enabled: true, redis_url: redis.url });
    await subscribed(redis, 2);
    expect(await a.chat(0)).toBe(200);
    await until('replica B to learn A’s pick', async () => (await b.metric('waybill_routing_index_entries', { pool: 'sim' })) === BLOCKS);
    expect(await b.chat(1)).toBe(200);
    expect(await b.metric('waybill_routing_decisions_total', { reason: 'prefix' })).toBe(1);
    expect(await b.metric('waybill_routing_decisions_total', { reason: 'load' })).toBe(0);
    expect(await a.metric('waybill_routing_shared_messages_total', { result: 'sent' })).toBe(1);
    expect(await b.metric('waybill_routing_shared_messages_total', { result: 'received' })).toBe(1);
    // B's pick reaches A in turn; each replica's own message comes back to it and is not counted as another's.
    await until('replica A to hear B’s pick', async () => (await a.metric('waybill_routing_shared_messages_total', { result: 'received' })) === 1);
    expect(await b.metric('waybill_routing_shared_messages_total', { result: 'sent' })).toBe(1);
    expect(await a.metric('waybill_routing_shared_messages_total', { result: 'received' })).toBe(1);
    expect(await b.metric('waybill_routing_shared_messages_total', { result: 'received' })).toBe(1);
  });

  it('without route sharing the other replica places the prefix afresh', async () => {
    const urls = await sims();
    const a = await replica(urls, undefined);
    const b = await replica(urls, undefined);
    expect(await a.chat(0)).toBe(200);
    expect(await b.chat(1)).toBe(200);
    expect(await b.metric('waybill_routing_decisions_total', { reason: 'load' })).toBe(1);
    expect(await b.metric('waybill_routing_decisions_total', { reason: 'prefix' })).toBe(0);
    expect(await b.metric('waybill_routing_index_entries', { pool: 'sim' })).toBe(BLOCKS);
  });

  it('drops what is not a route message, and fails open when Redis goes away', async () => {
    const redis = await RedisServer.start();
    cleanups.push(() => redis.stop());
    const urls = await sims();
    const a = await replica(urls, { enabled: true, redis_url: redis.url });
    await subscribed(redis, 1);
    const client = new Redis(redis.url);
    cleanups.push(() => Promise.resolve(client.disconnect()));
    for (const junk of ['not json', '{"from":"x"}', JSON.stringify({ from: 'x', routes: [['sim', 'sim-0', ['nope']]] }), 'x'.repeat(100)]) {
      await client.publish('waybill:routes', junk);
    }
    // Three dropped whole (not JSON, no routes, not JSON); the third is a message of the right shape whose one record
    // is not, so it is received and its record skipped.
    await until('the junk to be counted', async () => (await a.metric('waybill_routing_shared_messages_total', { result: 'invalid' })) === 3);
    expect(await a.metric('waybill_routing_shared_messages_total', { result: 'received' })).toBe(1);
    expect(await a.metric('waybill_routing_index_entries', { pool: 'sim' })).toBe(0);
    client.disconnect();
    await redis.kill();
    const statuses = [];
    for (let i = 0; i < 5; i++) statuses.push(await a.chat(i));
    expect(statuses).toEqual([200, 200, 200, 200, 200]);
    await until('the dropped publishes to be counted', async () => (await a.metric('waybill_routing_shared_messages_total', { result: 'send_failed' })) >= 1);
    expect(await a.metric('waybill_routing_decisions_total', { reason: 'prefix' })).toBe(4);
  });
});
