/**
 * An unreachable collector never slows or breaks serving: spans are exported in batches off the request path.
 * (Its own file: the OpenTelemetry SDK is registered once per process.)
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTracing, type Tracing } from '../src/telemetry/tracing.js';
import { CHAT, post, startStack, type Stack } from './helpers/stack.js';

let tracing: Tracing;
let stack: Stack;

beforeAll(() => {
  // Nothing listens on port 9 (discard) on loopback here: every export fails to connect.
  tracing = startTracing({ endpoint: 'http://127.0.0.1:9/v1/traces', captureContent: false }, {});
});

afterAll(async () => {
  await stack.close();
  await tracing.shutdown();
});

it('serves every request while every span export fails', async () => {
  expect(tracing.enabled).toBe(true);
  stack = await startStack({ tracing });
  const n = 40;
  const results = await Promise.all(Array.from({ length: n }, () => post(stack.base, '/v1/chat/completions', { ...CHAT, stream: true })));
  expect(results.every((r) => r.status === 200 && r.body.endsWith('data: [DONE]\n\n'))).toBe(true);
  await stack.settled(n);
  expect(await stack.metric('waybill_requests_total', { outcome: 'delivered' })).toBe(n);
  // Flushing to a dead collector ends within its bound instead of the exporter's whole retry timeout.
  const started = performance.now();
  await tracing.flush();
  expect(performance.now() - started).toBeLessThan(5_000);
});
