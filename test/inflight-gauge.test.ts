/**
 * `waybill_inflight_requests` across configuration reloads (issue 22, item 8): a reload declares the series of the
 * models it serves, and must not set a gauge of work in flight back to 0 while streams are in flight (it then read
 * −N once they ended). Over real sockets:
 *
 * - a property over interleavings of stream starts, stream ends and reloads: after every step the gauge is exactly
 *   the number of streams open, and never below zero; at rest, 0;
 * - `waybill serve --config FILE` (one process) with streams in flight, sent SIGHUP: the gauge keeps counting them.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import fc from 'fast-check';
import { pino } from 'pino';
import { request } from 'undici';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import type { ConfigInput } from '../src/config/schema.js';
import { createGateway } from '../src/app/gateway.js';
import { metricValue } from './helpers/stack.js';
import { startScripted, wire, type Scripted } from './helpers/scripted.js';

const BIN = new URL('../bin/waybill.js', import.meta.url).pathname;
const CHAT = { model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], stream: true };

/** An upstream whose streams stay open, after their first chunk, until the test ends them (in arrival order). */
async function heldUpstream(): Promise<{ upstream: Scripted; held: ServerResponse[]; arrived: () => Promise<void> }> {
  const held: ServerResponse[] = [];
  const waiters: Array<() => void> = [];
  const upstream = await startScripted((_req, res) => {
    res.writeHead(200, wire.sse);
    res.write(wire.role);
    res.write(wire.content('a'));
    held.push(res);
    waiters.shift()?.();
  });
  return { upstream, held, arrived: () => new Promise((resolve) => waiters.push(resolve)) };
}

function finish(res: ServerResponse): void {
  res.end(wire.finish + wire.done);
}

/** A client stream: resolves once its first bytes arrived; `rest` reads it to the end. */
async function openStream(base: string): Promise<{ rest: () => Promise<string> }> {
  const response = await request(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(CHAT) });
  expect(response.statusCode).toBe(200);
  const iterator = response.body[Symbol.asyncIterator]();
  const chunks: Buffer[] = [];
  const first = await iterator.next();
  if (first.done !== true) chunks.push(first.value as Buffer);
  return {
    async rest() {
      for (let next = await iterator.next(); next.done !== true; next = await iterator.next()) chunks.push(next.value as Buffer);
      return Buffer.concat(chunks).toString();
    },
  };
}

const gauge = async (base: string) => metricValue(await (await request(`${base}/metrics`)).body.text(), 'waybill_inflight_requests');

describe('waybill_inflight_requests across reloads', () => {
  let rig: Awaited<ReturnType<typeof heldUpstream>>;
  beforeAll(async () => {
    rig = await heldUpstream();
  });
  afterAll(async () => {
    for (const res of rig.held.splice(0)) res.destroy();
    await rig.upstream.close();
  });

  it('is the number of streams in flight after any interleaving of starts, ends and reloads, never below zero', async () => {
    const input = (timeout: string): ConfigInput => ({
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'p', models: ['sim-model'], upstreams: [{ name: 'u', url: rig.upstream.url }] }],
      logging: { level: 'silent' },
      // Each reload changes something a reload may change, so every one builds a new generation.
      timeouts: { first_output: '10s', idle: timeout, total: '60s' },
    });
    const gateway = createGateway(parseConfig(input('20s'), 'test'), { logger: pino({ level: 'silent' }), defaultMetrics: false });
    await gateway.listen();
    const base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
    let reloads = 0;
    try {
      type Step = { readonly op: 'start' } | { readonly op: 'end'; readonly pick: number } | { readonly op: 'reload' };
      const step: fc.Arbitrary<Step> = fc.oneof(
        fc.constant<Step>({ op: 'start' }),
        fc.nat(7).map<Step>((pick) => ({ op: 'end', pick })),
        fc.constant<Step>({ op: 'reload' }),
      );
      await fc.assert(
        fc.asyncProperty(fc.array(step, { minLength: 1, maxLength: 14 }), async (steps) => {
          const open: Array<{ res: ServerResponse; client: Promise<string> }> = [];
          const seen: number[] = [];
          try {
            for (const s of steps) {
              if (s.op === 'start') {
                const arrived = rig.arrived();
                const client = await openStream(base);
                await arrived;
                const res = rig.held.at(-1);
                if (res === undefined) throw new Error('no upstream stream');
                open.push({ res, client: client.rest() });
              } else if (s.op === 'end') {
                if (open.length === 0) continue;
                const [ended] = open.splice(s.pick % open.length, 1);
                finish(ended!.res);
                expect(await ended!.client).toContain('[DONE]');
              } else {
                reloads++;
                expect((await gateway.reload(parseConfig(input(`${20 + (reloads % 2)}s`), 'test'))).result).toBe('ok');
              }
              // A stream settles when its client has read it to the end: the gauge is read after that.
              const value = await gauge(base);
              seen.push(value);
              expect(value, `after ${JSON.stringify(s)} (steps ${JSON.stringify(steps)}, gauge so far ${seen.join(',')})`).toBe(open.length);
            }
          } finally {
            for (const { res, client } of open.splice(0)) {
              finish(res);
              await client;
            }
          }
          expect(await gauge(base)).toBe(0);
        }),
        { numRuns: 25, seed: 22 },
      );
    } finally {
      rig.held.splice(0);
      await gateway.close();
    }
  }, 120_000);

  it('keeps counting the streams in flight through a SIGHUP to waybill serve, and reads 0 at rest', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'waybill-inflight-'));
    const file = join(dir, 'waybill.yaml');
    const config = (idle: string): ConfigInput => ({
      server: { host: '127.0.0.1', port: 0 },
      pools: [{ name: 'p', models: ['sim-model'], upstreams: [{ name: 'u', url: rig.upstream.url }] }],
      timeouts: { first_output: '10s', idle, total: '60s' },
      health: { interval: '1h' },
      shutdown: { grace: '0s', drain_timeout: '5s' },
      logging: { requests: false },
    });
    writeFileSync(file, stringify(config('20s')));
    const child = spawn(process.execPath, [BIN, 'serve', '--config', file, '--workers', '1'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const lines: Array<{ msg?: string; url?: string }> = [];
    const watchers = new Set<() => void>();
    createInterface({ input: child.stdout }).on('line', (line) => {
      try {
        lines.push(JSON.parse(line) as { msg?: string });
      } catch {
        lines.push({ msg: line });
      }
      for (const watch of watchers) watch();
    });
    const until = (what: string, match: (line: { msg?: string }) => boolean) =>
      new Promise<{ msg?: string; url?: string }>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`gave up waiting for ${what}: ${JSON.stringify(lines)}`)), 20_000);
        const check = () => {
          const found = lines.find(match);
          if (found === undefined) return;
          clearTimeout(timer);
          watchers.delete(check);
          resolve(found);
        };
        watchers.add(check);
        check();
      });
    try {
      const base = (await until('waybill listening', (line) => line.msg === 'waybill listening')).url ?? '';
      const streams = [];
      for (let i = 0; i < 5; i++) {
        const arrived = rig.arrived();
        const client = await openStream(base);
        await arrived;
        streams.push(client.rest());
      }
      expect(await gauge(base)).toBe(5);
      writeFileSync(file, stringify(config('21s')));
      child.kill('SIGHUP');
      await until('the reload', (line) => typeof line.msg === 'string' && line.msg.startsWith('configuration reloaded'));
      expect(await gauge(base)).toBe(5);
      for (const res of rig.held.splice(0)) finish(res);
      for (const text of await Promise.all(streams)) expect(text).toContain('[DONE]');
      expect(await gauge(base)).toBe(0);
      child.kill('SIGTERM');
      expect((await once(child, 'exit'))[0]).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
