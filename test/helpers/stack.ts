/**
 * A gateway in front of simulated vLLMs, over real loopback sockets, for integration tests.
 */
import { createHash } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { request } from 'undici';
import type { Settlement } from '../../src/accounting/ledger.js';
import { parseConfig } from '../../src/config/load.js';
import type { ConfigInput } from '../../src/config/schema.js';
import { createGateway, type Gateway } from '../../src/app/gateway.js';
import type { Tracing } from '../../src/telemetry/tracing.js';
import { createSimulator, type RequestRecord, type SimOptions, type Simulator } from '../../src/sim/server.js';

export interface StackOptions {
  sims?: number;
  sim?: Partial<SimOptions>;
  /** Per-simulator options over `sim` (index i for simulator i), e.g. one engine with less KV. */
  simEach?: ReadonlyArray<Partial<SimOptions> | undefined>;
  /** Merged over the generated config (pools are generated from the simulators unless given). */
  config?: Partial<ConfigInput>;
  /** The generated pool's admission control. */
  admission?: Record<string, unknown>;
  /** The generated pool's routing (pools[].routing). */
  routing?: Record<string, unknown>;
  /** Leave the pool's models out, so they are discovered from the simulators. */
  discover?: boolean;
  /** OpenTelemetry tracing for the gateway. */
  tracing?: Tracing;
  /** Extra upstream URLs added to the pool (e.g. a closed port). */
  extraUpstreams?: Array<{ name: string; url: string }>;
}

export interface Stack {
  readonly gateway: Gateway;
  readonly sims: Simulator[];
  readonly base: string;
  readonly settlements: Settlement[];
  /** Resolves once `count` logical requests have settled in total. */
  settled(count: number): Promise<Settlement[]>;
  /** Resolves with the next record a simulator reports as ended. */
  simEnded(index?: number): Promise<RequestRecord>;
  /** Scrapes /metrics and returns the value of one series (0 when absent). */
  metric(name: string, labels?: Record<string, string>): Promise<number>;
  metricsText(): Promise<string>;
  close(): Promise<void>;
}

/**
 * The key the helpers scrape /metrics with: a test that configures auth.keys adds `adminKey(tenant)` (naming a tenant
 * it already has, so no tenant series is added) for its scrapes to be served (docs/operations.md).
 */
export const ADMIN_KEY = 'sk-test-admin';
export const ADMIN_HEADERS = { authorization: `Bearer ${ADMIN_KEY}` };
export function adminKey(tenant: string): { tenant: string; key_sha256: string; admin: true } {
  return { tenant, key_sha256: createHash('sha256').update(ADMIN_KEY).digest('hex'), admin: true };
}

/**
 * The stack scrapes /metrics with ADMIN_KEY: where a test configures auth.keys and none of them is an admin key, the
 * admin key is added for the first key's tenant (no new tenant series), so the helpers' scrapes are served.
 */
function withAdminKey(config: Partial<ConfigInput> | undefined): Partial<ConfigInput> | undefined {
  const keys = (config?.auth as { keys?: Array<{ tenant: string; admin?: boolean }> } | undefined)?.keys;
  const first = keys?.[0];
  if (config === undefined || keys === undefined || first === undefined || keys.some((key) => key.admin === true)) return config;
  return { ...config, auth: { ...config.auth, keys: [...keys, adminKey(first.tenant)] } };
}

/**
 * Resolves once a streamed body has carried `count` events with content (the client then leaves in the test): what
 * a client that reads most of an answer and goes away has seen.
 */
export function untilContentEvents(body: NodeJS.ReadableStream, count: number): Promise<void> {
  let text = '';
  return new Promise((resolve) => {
    body.on('data', (chunk: Buffer) => {
      text += chunk.toString();
      if ((text.match(/"content":"[^"]/g) ?? []).length >= count) resolve();
    });
  });
}

export const CHAT = { model: 'sim-model', messages: [{ role: 'user', content: 'Hello there' }] };

export async function startStack(options: StackOptions = {}): Promise<Stack> {
  const sims: Simulator[] = [];
  const urls: string[] = [];
  for (let i = 0; i < (options.sims ?? 1); i++) {
    const sim = createSimulator({ ttftMs: 5, itlMs: 1, outputTokens: 8, jitter: 0, ...options.sim, ...options.simEach?.[i] });
    const { url } = await sim.listen(0, '127.0.0.1');
    sims.push(sim);
    urls.push(url);
  }
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port: 0 },
      pools: [
        {
          name: 'sim',
          ...(options.discover === true ? {} : { models: ['sim-model'] }),
          upstreams: [...urls.map((url, i) => ({ name: `sim-${i}`, url })), ...(options.extraUpstreams ?? [])],
          ...(options.admission !== undefined ? { admission: options.admission } : {}),
          ...(options.routing !== undefined ? { routing: options.routing } : {}),
        },
      ],
      logging: { level: 'silent' },
      ...withAdminKey(options.config),
    },
    'test',
  );
  const settlements: Settlement[] = [];
  const waiters: Array<{ count: number; resolve: (s: Settlement[]) => void }> = [];
  const gateway = createGateway(config, {
    logger: pino({ level: 'silent' }),
    defaultMetrics: false,
    ...(options.tracing !== undefined ? { tracing: options.tracing } : {}),
    onSettled: (settlement) => {
      settlements.push(settlement);
      for (const waiter of waiters.filter((w) => settlements.length >= w.count)) {
        waiters.splice(waiters.indexOf(waiter), 1);
        waiter.resolve(settlements.slice());
      }
    },
  });
  await gateway.listen();
  const { port } = gateway.app.server.address() as AddressInfo;
  const base = `http://127.0.0.1:${port}`;

  const metricsText = async () => {
    const response = await request(`${base}/metrics`, { headers: ADMIN_HEADERS });
    return response.body.text();
  };

  return {
    gateway,
    sims,
    base,
    settlements,
    settled(count) {
      if (settlements.length >= count) return Promise.resolve(settlements.slice());
      return new Promise((resolve) => waiters.push({ count, resolve }));
    },
    simEnded(index = 0) {
      return new Promise((resolve) => (sims[index] as Simulator).events.once('request-end', resolve));
    },
    metricsText,
    async metric(name, labels = {}) {
      return metricValue(await metricsText(), name, labels);
    },
    async close() {
      await gateway.close();
      await Promise.all(sims.map((sim) => sim.close()));
    },
  };
}

/** Sum of the samples of `name` whose labels include `labels`. */
export function metricValue(text: string, name: string, labels: Record<string, string> = {}): number {
  let total = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (!(rest.startsWith('{') || rest.startsWith(' '))) continue;
    const labelText = rest.startsWith('{') ? rest.slice(1, rest.indexOf('}')) : '';
    const have = new Map([...labelText.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    if (Object.entries(labels).every(([k, v]) => have.get(k) === v)) total += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return total;
}

export interface ClientResult {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** POSTs JSON and reads the whole response. */
export async function post(base: string, path: string, body: unknown, headers: Record<string, string> = {}): Promise<ClientResult> {
  const response = await request(`${base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await response.body.text();
  return { status: response.statusCode, headers: response.headers, body: text };
}

/** The data of each SSE event in a LF-framed body. */
export function eventData(body: string): string[] {
  return body
    .split('\n\n')
    .filter((block) => block.length > 0)
    .map((block) =>
      block
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5))
        .join('\n'),
    );
}

/** Neutralises the one field that may legitimately differ between two identical generations. */
export function withoutCreated(body: string): string {
  return body.replaceAll(/"created":\d+/g, '"created":0');
}
