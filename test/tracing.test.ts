/**
 * Traces, logs and exemplars, end to end: the OpenTelemetry SDK exports OTLP/HTTP JSON to a receiver started here;
 * the gateway runs in front of a simulator (and a scripted failing upstream for the retry case). Asserts the span
 * tree and attributes, the traceparent the upstream received, the wide log line, the exemplars, and that no
 * prompt text or key appears anywhere.
 */
import { createServer, request as httpRequest, type Server } from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { createSimulator, type Simulator } from '../src/sim/server.js';
import { createLogger } from '../src/telemetry/logger.js';
import { startTracing, type Tracing } from '../src/telemetry/tracing.js';
import { startScripted, type Scripted } from './helpers/scripted.js';

const PROMPT = 'SECRET-PROMPT-TEXT-4242';
const CLIENT_KEY = 'SECRET-CLIENT-KEY-77';
const UPSTREAM_KEY = 'SECRET-UPSTREAM-KEY-99';
const BODY = { model: 'sim-model', stream: true, max_tokens: 16, temperature: 0.5, messages: [{ role: 'user', content: PROMPT }] };

interface OtlpValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
  arrayValue?: { values: OtlpValue[] };
}
interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes: Array<{ key: string; value: OtlpValue }>;
  events?: Array<{ name: string; attributes?: Array<{ key: string; value: OtlpValue }> }>;
  status?: { code?: number };
}

const SERVER = 2;
const CLIENT = 3;
const STATUS_ERROR = 2;

function plain(value: OtlpValue): unknown {
  if (value.arrayValue !== undefined) return value.arrayValue.values.map(plain);
  if (value.intValue !== undefined) return Number(value.intValue);
  return value.stringValue ?? value.doubleValue ?? value.boolValue;
}

function attrs(list: Array<{ key: string; value: OtlpValue }> | undefined): Record<string, unknown> {
  return Object.fromEntries((list ?? []).map((a) => [a.key, plain(a.value)]));
}

let receiver: Server;
const received: OtlpSpan[] = [];
const rawExports: string[] = [];
let tracing: Tracing;
let gateway: Gateway;
let sim: Simulator;
let failing: Scripted;
let base: string;
const logLines: Array<Record<string, unknown>> = [];
const settlements = new Map<string, (s: Settlement) => void>();

beforeAll(async () => {
  receiver = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk: string) => (body += chunk));
    req.on('end', () => {
      rawExports.push(body);
      const parsed = JSON.parse(body) as { resourceSpans: Array<{ scopeSpans: Array<{ spans: OtlpSpan[] }> }> };
      for (const resource of parsed.resourceSpans) for (const scope of resource.scopeSpans) received.push(...scope.spans);
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  const collector = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/v1/traces`;

  sim = createSimulator({ ttftMs: 2, itlMs: 1, outputTokens: 6, jitter: 0, apiKey: UPSTREAM_KEY });
  const simUrl = (await sim.listen(0, '127.0.0.1')).url;
  failing = await startScripted((_req, res) => res.writeHead(503).end());

  const config = parseConfig({
    server: { host: '127.0.0.1', port: 0 },
    pools: [
      {
        name: 'p',
        models: ['sim-model'],
        // The failing upstream first: with random() = 0 the picker's first draw is the first upstream.
        upstreams: [
          { name: 'failing', url: failing.url, api_key: UPSTREAM_KEY },
          { name: 'sim', url: simUrl, api_key: UPSTREAM_KEY },
        ],
      },
    ],
    health: { interval: '1h', eject_after_failures: 1000 },
    retries: { backoff_base: '1ms', backoff_max: '1ms' },
    tracing: { endpoint: collector },
    logging: { level: 'info' },
  });
  tracing = startTracing(config.tracing, {});
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      for (const line of chunk.toString().split('\n')) if (line !== '') logLines.push(JSON.parse(line) as Record<string, unknown>);
      callback();
    },
  });
  gateway = createGateway(config, {
    tracing,
    logger: createLogger(config.logging, sink),
    defaultMetrics: false,
    random: () => 0,
    onSettled: (settlement, requestId) => settlements.get(requestId)?.(settlement),
  });
  await gateway.listen();
  base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await gateway.close();
  await tracing.shutdown();
  await sim.close();
  await failing.close();
  await new Promise((resolve) => receiver.close(resolve));
});

/** Sends a request with an id and waits until it has settled. */
async function send(id: string, headers: Record<string, string> = {}, body: unknown = BODY): Promise<{ status: number; text: string }> {
  const settled = new Promise<Settlement>((resolve) => settlements.set(id, resolve));
  const response = await request(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': id, authorization: `Bearer ${CLIENT_KEY}`, ...headers },
    body: JSON.stringify(body),
  });
  const text = await response.body.text();
  await settled;
  return { status: response.statusCode, text };
}

/** The exported SERVER span of request `id` and its CLIENT children, after a flush. */
async function spansOf(id: string): Promise<{ server: OtlpSpan; attempts: OtlpSpan[] }> {
  await tracing.flush();
  const server = received.find((s) => s.kind === SERVER && attrs(s.attributes)['waybill.request_id'] === id);
  if (server === undefined) throw new Error(`no server span for ${id}`);
  const attempts = received
    .filter((s) => s.kind === CLIENT && s.parentSpanId === server.spanId)
    .sort((a, b) => Number(attrs(a.attributes)['waybill.attempt']) - Number(attrs(b.attributes)['waybill.attempt']));
  return { server, attempts };
}

function logOf(id: string): Record<string, unknown> {
  const line = logLines.find((l) => l['request_id'] === id);
  if (line === undefined) throw new Error(`no log line for ${id}`);
  return line;
}

const INCOMING_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const INCOMING_SPAN = '00f067aa0ba902b7';

describe('a retried, then delivered stream', () => {
  it('is one SERVER span continuing the client trace, with one CLIENT span per attempt', async () => {
    const { status, text } = await send('trace-retry', { traceparent: `00-${INCOMING_TRACE}-${INCOMING_SPAN}-01` });
    expect(status).toBe(200);
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
    const { server, attempts } = await spansOf('trace-retry');

    expect(server.traceId).toBe(INCOMING_TRACE);
    expect(server.parentSpanId).toBe(INCOMING_SPAN);
    expect(server.name).toBe('POST /v1/chat/completions');
    expect(attrs(server.attributes)).toMatchObject({
      'http.request.method': 'POST',
      'http.route': '/v1/chat/completions',
      'http.response.status_code': 200,
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': 'sim-model',
      'gen_ai.request.max_tokens': 16,
      'gen_ai.request.temperature': 0.5,
      'gen_ai.request.stream': true,
      'gen_ai.response.model': 'sim-model',
      'gen_ai.response.id': 'chatcmpl-trace-retry',
      'gen_ai.response.finish_reasons': ['stop'],
      'gen_ai.usage.output_tokens': 6,
      'waybill.outcome': 'delivered',
      'waybill.attempts': 2,
      'waybill.slo': 'met',
    });
    expect(typeof attrs(server.attributes)['gen_ai.usage.input_tokens']).toBe('number');
    expect(typeof attrs(server.attributes)['waybill.ttft_ms']).toBe('number');
    expect(server.status?.code ?? 0).not.toBe(STATUS_ERROR);
    expect(server.events?.map((e) => e.name)).toEqual(['retry_scheduled', 'first_output_written']);
    expect(attrs(server.events?.[0]?.attributes)).toMatchObject({ 'waybill.retry_reason': 'http_5xx' });

    expect(attempts).toHaveLength(2);
    const [first, second] = attempts;
    expect(first?.traceId).toBe(INCOMING_TRACE);
    expect(attrs(first?.attributes)).toMatchObject({
      'waybill.upstream': 'failing',
      'waybill.attempt': 1,
      'waybill.attempt.result': 'http_5xx',
      'http.response.status_code': 503,
      'error.type': 'http_5xx',
      'server.address': '127.0.0.1',
    });
    expect(first?.status?.code).toBe(STATUS_ERROR);
    expect(attrs(second?.attributes)).toMatchObject({
      'waybill.upstream': 'sim',
      'waybill.attempt': 2,
      'waybill.attempt.result': 'ok',
      'waybill.retry_reason': 'http_5xx',
      'http.response.status_code': 200,
    });
    expect(typeof attrs(second?.attributes)['waybill.attempt.first_output_ms']).toBe('number');

    // The simulator (vLLM) received a traceparent whose parent is the attempt span that reached it.
    const seen = sim.stats().recent.find((r) => r.requestId === 'trace-retry');
    expect(seen?.headers.traceparent).toBe(`00-${INCOMING_TRACE}-${second?.spanId}-01`);
  });

  it('writes one wide log line with the attempts and timings', () => {
    const line = logOf('trace-retry');
    expect(line).toMatchObject({
      msg: 'request',
      trace_id: INCOMING_TRACE,
      model: 'sim-model',
      route: 'chat_completions',
      stream: true,
      code: 200,
      outcome: 'delivered',
      finish_reasons: ['stop'],
      slo: 'met',
      tokens: { completion: 6 },
      attempts: [
        { upstream: 'failing', result: 'http_5xx', status: 503 },
        { upstream: 'sim', result: 'ok', status: 200 },
      ],
    });
    expect(typeof line['ttft_ms']).toBe('number');
    expect(typeof line['tpot_ms']).toBe('number');
    expect(typeof line['duration_ms']).toBe('number');
    expect(typeof (line['attempts'] as Array<{ duration_ms: unknown }>)[0]?.duration_ms).toBe('number');
  });
});

describe('failures after commit', () => {
  it('marks an error event after commit as an ERROR with error.type stream_error, and records the event', async () => {
    await send('trace-error', { 'x-sim-fault': 'error_after=2' });
    const { server, attempts } = await spansOf('trace-error');
    expect(attrs(server.attributes)).toMatchObject({ 'waybill.outcome': 'stream_error', 'error.type': 'stream_error', 'waybill.anomalies': ['error_payload', 'done_after_error'] });
    expect(server.status?.code).toBe(STATUS_ERROR);
    const attempt = attempts.at(-1);
    const events = attempt?.events ?? [];
    const upstreamError = events.find((e) => e.name === 'upstream_error');
    expect(attrs(upstreamError?.attributes)).toEqual({ 'error.type': 'InternalServerError', 'error.code': 500 });
    expect(events.filter((e) => e.name === 'stream_anomaly').map((e) => attrs(e.attributes)['waybill.anomaly'])).toEqual(['error_payload', 'done_after_error']);
    expect(logOf('trace-error')).toMatchObject({ outcome: 'stream_error', anomalies: ['error_payload', 'done_after_error'] });
  });

  it('marks a truncated stream as an ERROR with error.type incomplete', async () => {
    await send('trace-cut', { 'x-sim-fault': 'reset_after=2' });
    const { server, attempts } = await spansOf('trace-cut');
    expect(attrs(server.attributes)).toMatchObject({ 'waybill.outcome': 'incomplete', 'error.type': 'incomplete', 'http.response.status_code': 200 });
    expect(attrs(attempts.at(-1)?.attributes)).toMatchObject({ 'waybill.attempt.result': 'reset', 'error.type': 'reset' });
    expect(logOf('trace-cut')).toMatchObject({ outcome: 'incomplete', code: 200 });
  });
});

describe('a client that leaves', () => {
  it('is recorded as an event, and is not an error', async () => {
    const settled = new Promise<Settlement>((resolve) => settlements.set('trace-cancel', resolve));
    const started = once(sim.events, 'request-start');
    const req = httpRequest(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'trace-cancel', 'x-sim-fault': 'ttft_ms=60000' },
    });
    req.on('error', () => undefined);
    req.end(JSON.stringify(BODY));
    await started;
    req.destroy();
    await settled;
    const { server } = await spansOf('trace-cancel');
    expect(attrs(server.attributes)).toMatchObject({ 'waybill.outcome': 'client_cancelled', 'waybill.cancel_phase': 'before_first_token' });
    expect(attrs(server.attributes)['error.type']).toBeUndefined();
    expect(server.status?.code ?? 0).not.toBe(STATUS_ERROR);
    expect(server.events?.map((e) => e.name)).toContain('client_cancelled');
    expect(logOf('trace-cancel')).toMatchObject({ outcome: 'client_cancelled', code: 499, cancel_phase: 'before_first_token' });
  });
});

describe('exemplars and privacy', () => {
  it('attaches trace-id exemplars to the requests counter and latency histograms in OpenMetrics only', async () => {
    const { server } = await spansOf('trace-retry');
    const open = await request(`${base}/metrics`, { headers: { accept: 'application/openmetrics-text; version=1.0.0' } });
    expect(open.headers['content-type']).toMatch(/^application\/openmetrics-text/);
    const text = await open.body.text();
    expect(text.trimEnd().endsWith('# EOF')).toBe(true);
    const exemplar = `# {trace_id="${server.traceId}"}`;
    expect(text.split('\n').some((l) => l.startsWith('waybill_requests_total{') && l.includes(exemplar))).toBe(true);
    expect(text.split('\n').some((l) => l.startsWith('waybill_time_to_first_token_seconds_bucket{') && l.includes('# {trace_id="'))).toBe(true);
    expect(text.split('\n').some((l) => l.startsWith('waybill_request_duration_seconds_bucket{') && l.includes('# {trace_id="'))).toBe(true);
    // Requests without a trace leave no empty exemplar behind (it would replace a real one).
    expect(text).not.toContain('# {}');
    const plainText = await (await request(`${base}/metrics`)).body.text();
    expect(plainText).toContain('waybill_requests_total{');
    expect(plainText).not.toContain('trace_id');
  });

  it('never puts the prompt, the client key or the upstream key in spans, logs or metrics', async () => {
    await tracing.flush();
    const everything = [
      ...rawExports,
      ...logLines.map((l) => JSON.stringify(l)),
      await (await request(`${base}/metrics`)).body.text(),
      await (await request(`${base}/metrics`, { headers: { accept: 'application/openmetrics-text' } })).body.text(),
    ].join('\n');
    expect(rawExports.length).toBeGreaterThan(0);
    expect(logLines.length).toBeGreaterThanOrEqual(4);
    for (const secret of [PROMPT, CLIENT_KEY, UPSTREAM_KEY]) expect(everything).not.toContain(secret);
    // The upstream did get its own key, and never the client's.
    expect(sim.stats().recent.every((r) => r.headers.authorization === 'present')).toBe(true);
  });
});
