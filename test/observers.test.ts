/**
 * Observers cannot break delivery, and a bug inside the exchange still ends in an answer and one count. Each test
 * makes one observer (or the core's record of facts) throw for real, over real sockets, and checks the client's bytes,
 * the count, and waybill_internal_errors_total.
 *
 * The core's faults are injected by mocking the two record modules' functions the reducer calls: recording an
 * upstream event (accounting/record-upstream.ts `recordStreamEvent`) and the settlement (accounting/settle.ts
 * `settleRequest`). Each mock calls through to the real function unless the test arms a fault for a given call.
 */
import type { Tracer } from '@opentelemetry/api';
import { pino } from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type GatewayOptions } from '../src/app/gateway.js';
import { createSimulator } from '../src/sim/server.js';
import { CHAT, metricValue, post } from './helpers/stack.js';

/** Which call of each core function throws (1-based, counted since the fault was armed); undefined: none. */
const faults = vi.hoisted(() => ({
  streamEventCall: undefined as number | undefined,
  settleCall: undefined as number | undefined,
  judgeCall: undefined as number | undefined,
  streamEvents: 0,
  settles: 0,
  judges: 0,
}));

vi.mock('../src/accounting/record-upstream.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/accounting/record-upstream.js')>();
  return {
    ...real,
    recordStreamEvent: (...args: Parameters<typeof real.recordStreamEvent>) => {
      if (faults.streamEventCall !== undefined && ++faults.streamEvents === faults.streamEventCall) throw new Error('ledger bug');
      return real.recordStreamEvent(...args);
    },
  };
});

// recordJudged is the first thing the real settleRequest does to the record: a throw there is a settlement failing
// half-way, with the record already marked as settling.
vi.mock('../src/accounting/record.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/accounting/record.js')>();
  return {
    ...real,
    recordJudged: (...args: Parameters<typeof real.recordJudged>) => {
      if (faults.judgeCall !== undefined && ++faults.judges === faults.judgeCall) throw new Error('judge bug');
      return real.recordJudged(...args);
    },
  };
});

vi.mock('../src/accounting/settle.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/accounting/settle.js')>();
  return {
    ...real,
    settleRequest: (...args: Parameters<typeof real.settleRequest>) => {
      if (faults.settleCall !== undefined && ++faults.settles === faults.settleCall) throw new Error('settle bug');
      return real.settleRequest(...args);
    },
  };
});

function armFault(which: 'streamEvent' | 'settle' | 'judge', call: number): void {
  if (which === 'streamEvent') faults.streamEventCall = call;
  else if (which === 'settle') faults.settleCall = call;
  else faults.judgeCall = call;
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  vi.restoreAllMocks();
  Object.assign(faults, { streamEventCall: undefined, settleCall: undefined, judgeCall: undefined, streamEvents: 0, settles: 0, judges: 0 });
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const STREAM = { ...CHAT, stream: true };

async function start(options: GatewayOptions) {
  const sim = createSimulator({ ttftMs: 5, itlMs: 1, outputTokens: 8, jitter: 0 });
  const { url } = await sim.listen(0, '127.0.0.1');
  cleanups.push(() => sim.close());
  const config = parseConfig({
    server: { host: '127.0.0.1', port: 0 },
    pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url }] }],
    health: { interval: '1h' },
    logging: { level: 'info' },
  });
  const gateway = createGateway(config, { logger: pino({ level: 'silent' }), defaultMetrics: false, ...options });
  const base = await gateway.listen();
  cleanups.push(() => gateway.close());
  const metric = async (name: string, labels: Record<string, string> = {}) => metricValue(await (await fetch(`${base}/metrics`)).text(), name, labels);
  return { base, metric };
}

describe('a throwing observer', () => {
  it('a settlement hook that throws: the answer is delivered, counted once, and the error counted', async () => {
    const seen: Settlement[] = [];
    const g = await start({
      onSettled: (settlement) => {
        seen.push(settlement);
        throw new Error('subscriber bug');
      },
    });
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(seen).toHaveLength(1);
    expect(await g.metric('waybill_requests_total', { outcome: 'delivered', code: '200', stream: 'true' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'hook' })).toBe(1);
  });

  it('a log destination that throws on the request line: delivered, counted, the error counted', async () => {
    const logger = pino(
      { level: 'info' },
      {
        write(line: string) {
          if (line.includes('"msg":"request"')) throw new Error('disk full');
        },
      },
    );
    const g = await start({ logger });
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(await g.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'logging' })).toBe(1);
  });

  it('a tracer that throws: delivered, counted, the error counted', async () => {
    const tracer = {
      startSpan: () => {
        throw new Error('exporter bug');
      },
    } as unknown as Tracer;
    const g = await start({ tracing: { enabled: true, tracer, flush: () => Promise.resolve(), shutdown: () => Promise.resolve() } as never });
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith('data: [DONE]\n\n')).toBe(true);
    expect(await g.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'tracing' })).toBe(1);
  });
});

describe('an error inside the exchange', () => {
  it('before commit: the client gets a 500 internal_error, the request counts once as failed, the upstream is let go', async () => {
    const g = await start({});
    armFault('streamEvent', 1);
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(500);
    expect(JSON.parse(client.body)).toMatchObject({ error: { code: 'internal_error', type: 'internal_error' } });
    expect(await g.metric('waybill_requests_total')).toBe(1);
    expect(await g.metric('waybill_requests_total', { code: '500', outcome: 'failed' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'exchange' })).toBe(1);
    await expect.poll(() => g.metric('waybill_upstream_inflight')).toBe(0);
    expect(await g.metric('waybill_inflight_requests')).toBe(0);
    // The next request is served normally (the spy calls through again).
    expect((await post(g.base, '/v1/chat/completions', STREAM)).body.endsWith('data: [DONE]\n\n')).toBe(true);
  });

  it('after commit: the stream ends with an internal_error event and no [DONE], counted once as incomplete', async () => {
    // The 4th event (after the role chunk and two content chunks committed the stream) throws; the rest pass through.
    const g = await start({});
    armFault('streamEvent', 4);
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    expect(client.status).toBe(200);
    expect(client.body).not.toContain('[DONE]');
    expect(client.body.trimEnd().split('\n\n').at(-1)).toMatch(/^data: \{"error":\{.*"code":"internal_error"/);
    expect(await g.metric('waybill_requests_total')).toBe(1);
    expect(await g.metric('waybill_requests_total', { code: '200', outcome: 'incomplete' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'exchange' })).toBe(1);
    await expect.poll(() => g.metric('waybill_upstream_inflight')).toBe(0);
  });

  it('the ledger failing to settle: the request still counts once, from what the shell was told', async () => {
    const g = await start({});
    armFault('settle', 1);
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    // The answer had already gone out whole when the settlement failed.
    expect(client.body.endsWith('data: [DONE]\n\n')).toBe(true);
    await expect.poll(() => g.metric('waybill_requests_total')).toBe(1);
    expect(await g.metric('waybill_requests_total', { code: '200', outcome: 'incomplete' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'exchange' })).toBe(1);
    expect(await g.metric('waybill_inflight_requests')).toBe(0);
  });

  it('a settlement that throws half-way is not settled again from the record it changed: counted once, from what the shell was told', async () => {
    const seen: Settlement[] = [];
    const g = await start({ onSettled: (settlement) => seen.push(settlement) });
    armFault('judge', 1);
    const client = await post(g.base, '/v1/chat/completions', STREAM);
    expect(client.body.endsWith('data: [DONE]\n\n')).toBe(true);
    await expect.poll(() => g.metric('waybill_requests_total')).toBe(1);
    expect(await g.metric('waybill_requests_total', { code: '200', outcome: 'incomplete' })).toBe(1);
    expect(await g.metric('waybill_internal_errors_total', { component: 'exchange' })).toBe(1);
    // The crash path's own settlement (crashSettlement): no attempts, no usage, the prompt's class unknown — not a
    // second run of the settlement over the half-settled record (which would report the attempt and its usage).
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ outcome: 'incomplete', code: 200, attempts: [], promptLen: 'unknown' });
    expect(seen[0]!.usage?.completionTokens).toBeUndefined();
  });
});
