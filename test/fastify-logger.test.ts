/**
 * src/http/fastify-logger.ts: the logger fastify is given makes no child per request — a request's logger is the app's
 * — and what fastify logs still reaches the gateway's logger, at the level the gateway's logger has now.
 */
import { Writable } from 'node:stream';
import Fastify from 'fastify';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { requestlessLogger } from '../src/http/fastify-logger.js';

function capture(): { logger: pino.Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  });
  return { logger: pino({ level: 'info' }, stream), lines };
}

describe('requestlessLogger', () => {
  it("gives every request the app's logger, and fastify's lines reach the gateway's logger at its current level", async () => {
    const { logger, lines } = capture();
    const app = Fastify({ loggerInstance: requestlessLogger(logger), disableRequestLogging: true });
    const seen: unknown[] = [];
    app.get('/', (request) => {
      seen.push(request.log);
      request.log.info({ marker: 'from-a-request' }, 'hello');
      request.log.debug({ marker: 'debug-line' }, 'hidden until the level allows it');
      return 'ok';
    });
    await app.inject({ url: '/' });
    await app.inject({ url: '/' });
    expect(seen).toHaveLength(2);
    expect(seen[0]).toBe(app.log);
    expect(seen[1]).toBe(app.log);
    // The level is the gateway's logger's own, read through: a change there applies at once.
    logger.level = 'debug';
    await app.inject({ url: '/' });
    await new Promise((resolve) => setImmediate(resolve));
    expect(lines.filter((line) => line['marker'] === 'from-a-request')).toHaveLength(3);
    expect(lines.filter((line) => line['marker'] === 'debug-line')).toHaveLength(1);
    // No request id bound to the lines: Waybill's own request line carries it.
    expect(lines.every((line) => line['reqId'] === undefined)).toBe(true);
    await app.close();
  });
});
