/**
 * Property: however the upstream's bytes are cut into TCP reads, the client receives the same bytes and the
 * ledger records the same facts. A scripted upstream replays one generated stream under two random chunkings.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import fc from 'fast-check';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Settlement } from '../src/accounting/ledger.js';
import { parseConfig } from '../src/config/load.js';
import { createGateway, type Gateway } from '../src/app/gateway.js';
import { cutInto, generateChatPayloads, mulberry32 } from './fixtures/sse-fixtures.js';
import { post } from './helpers/stack.js';

interface Script {
  chunks: Buffer[];
  /** End with a TCP reset instead of a clean end. */
  reset: boolean;
}

const scripts = new Map<string, Script>();
let upstream: Server;
let gateway: Gateway;
let base: string;
const settled = new Map<string, (s: Settlement) => void>();

beforeAll(async () => {
  upstream = createServer((req, res) => {
    if (req.url === '/health') {
      res.end();
      return;
    }
    req.resume();
    req.on('end', () => {
      const script = scripts.get(String(req.headers['x-script']));
      if (script === undefined) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      void (async () => {
        for (const chunk of script.chunks) {
          // Hand each chunk to the kernel before the next, so reads tend to follow the script's cuts.
          await new Promise<void>((resolve) => res.write(chunk, () => resolve()));
          await new Promise((resolve) => setImmediate(resolve));
        }
        if (script.reset) res.socket?.resetAndDestroy();
        else res.end();
      })();
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const port = (upstream.address() as AddressInfo).port;
  const config = parseConfig({
    server: { host: '127.0.0.1', port: 0 },
    pools: [{ name: 'p', models: ['m'], upstreams: [{ name: 'scripted', url: `http://127.0.0.1:${port}` }] }],
    streaming: { drain_grace: '200ms' },
    // The property is about framing: one attempt each, so the retry budget cannot make two runs differ.
    retries: { max_attempts: 1 },
  });
  gateway = createGateway(config, {
    logger: pino({ level: 'silent' }),
    defaultMetrics: false,
    onSettled: (settlement, requestId) => settled.get(requestId)?.(settlement),
  });
  await gateway.listen();
  base = `http://127.0.0.1:${(gateway.app.server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await gateway.close();
  await new Promise((resolve) => upstream.close(resolve));
});

/** The facts of a settlement that do not depend on timing. */
function facts(s: Settlement) {
  return {
    outcome: s.outcome,
    code: s.code,
    attempts: s.attempts.map((a) => [a.upstream, a.result, a.status]),
    anomalies: s.anomalies,
    finishReasons: s.finishReasons,
    usage: s.usage,
    promptLen: s.promptLen,
    doneAfterErrorDropped: s.doneAfterErrorDropped,
  };
}


let counter = 0;
async function run(script: Script): Promise<{ body: string; facts: ReturnType<typeof facts> }> {
  const id = `script-${counter++}`;
  scripts.set(id, script);
  const settlement = new Promise<Settlement>((resolve) => settled.set(id, resolve));
  const client = await post(base, '/v1/chat/completions', { model: 'm', stream: true, messages: [] }, { 'x-script': id, 'x-request-id': id });
  const result = { body: client.body, facts: facts(await settlement) };
  scripts.delete(id);
  settled.delete(id);
  return result;
}

/** A vLLM stream with, sometimes, an error event, a cut-off tail, CRLF line ends, comments or a malformed event. */
const streamArbitrary = fc
  .record({
    seed: fc.integer(),
    variant: fc.constantFrom('plain', 'error_mid', 'truncated', 'crlf_comments', 'malformed', 'reset'),
    at: fc.nat(),
  })
  .map(({ seed, variant, at }) => {
    const payloads = generateChatPayloads(mulberry32(seed), { minDeltas: 3, maxDeltas: 12, usageProbability: 1 });
    const position = 1 + (at % (payloads.length - 2));
    let lineEnd = '\n';
    let events = payloads.map((p) => `data: ${p}`);
    switch (variant) {
      case 'error_mid':
        events.splice(position, 0, 'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}');
        events = events.slice(0, position + 1).concat(['data: [DONE]']);
        break;
      case 'truncated':
      case 'reset':
        events = events.slice(0, position + 1);
        break;
      case 'crlf_comments':
        lineEnd = '\r\n';
        events = events.flatMap((e) => [`: keep-alive${lineEnd}${e}`]);
        break;
      case 'malformed':
        events.splice(position, 0, 'data: {"id":"broken');
        break;
      case 'plain':
        break;
    }
    const bytes = Buffer.from(events.map((e) => `${e}${lineEnd}${lineEnd}`).join(''), 'utf8');
    return { bytes, reset: variant === 'reset' };
  });

describe('re-chunking the upstream bytes', () => {
  it('gives identical client bytes and identical ledger facts', async () => {
    await fc.assert(
      fc.asyncProperty(streamArbitrary, fc.array(fc.nat(), { maxLength: 40 }), fc.array(fc.nat(), { maxLength: 40 }), async (stream, cutsA, cutsB) => {
        const a = await run({ chunks: cutInto(stream.bytes, cutsA), reset: stream.reset });
        const b = await run({ chunks: cutInto(stream.bytes, cutsB), reset: stream.reset });
        expect(b.body).toBe(a.body);
        expect(b.facts).toEqual(a.facts);
      }),
      { numRuns: 30 },
    );
  });

  it('delivers the plain stream byte for byte, minus the injected usage chunk', async () => {
    const payloads = generateChatPayloads(mulberry32(7), { minDeltas: 5, maxDeltas: 5, usageProbability: 1 });
    const bytes = Buffer.from(payloads.map((p) => `data: ${p}\n\n`).join(''), 'utf8');
    const result = await run({ chunks: cutInto(bytes, [1, 7, 100, 101, 333]), reset: false });
    const usageEvent = `data: ${payloads.at(-2) ?? ''}\n\n`;
    expect(usageEvent).toContain('"usage"');
    expect(result.body).toBe(bytes.toString('utf8').replace(usageEvent, ''));
    expect(result.facts.outcome).toBe('delivered');
  });
});
