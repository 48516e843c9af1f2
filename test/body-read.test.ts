/**
 * readJsonBody over real sockets: a body that came in the head's read is taken from Node's buffer at once (no
 * listeners, no clock); one that follows is read as it comes. Either way the bytes, the limits and the request
 * stream's own end are the same, whatever the client's writes were cut into.
 */
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BodyError, readJsonBody } from '../src/http/body.js';

interface Seen {
  json: unknown;
  error: string | undefined;
  /** A 'data' listener was attached to the request: it was read as it came. */
  listened: boolean;
  /** The request stream emitted 'end' and 'close'. */
  ended: Promise<void>;
}

const LIMITS = { maxBytes: 4096, readTimeoutMs: 2000, maxDepth: 16 };
let server: Server;
let port: number;
const seen: Seen[] = [];
let onSeen: (() => void) | undefined;

beforeAll(async () => {
  server = createServer((req: IncomingMessage, res) => {
    let listened = false;
    const on = req.on.bind(req);
    req.on = ((event: string, listener: (...args: unknown[]) => void) => {
      if (event === 'data') listened = true;
      return on(event, listener);
    }) as typeof req.on;
    const ended = new Promise<void>((resolve) => {
      let ends = 0;
      const one = () => ++ends === 2 && resolve();
      on('end', one);
      on('close', one);
    });
    readJsonBody(req, LIMITS, LIMITS.readTimeoutMs).then(
      (body) => {
        seen.push({ json: body.json, error: undefined, listened, ended });
        onSeen?.();
        res.end(JSON.stringify(body.json));
      },
      (error: unknown) => {
        seen.push({ json: undefined, error: error instanceof BodyError ? error.code : String(error), listened, ended });
        onSeen?.();
        res.statusCode = 400;
        res.setHeader('connection', 'close');
        res.end();
      },
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  port = (server.address() as { port: number }).port;
});
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

function open(): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => resolve(socket));
    socket.on('error', reject);
  });
}

/** Waits until the server has seen `count` bodies in all. */
function bodies(count: number): Promise<void> {
  return new Promise((resolve) => {
    const check = () => {
      if (seen.length >= count) {
        onSeen = undefined;
        resolve();
      }
    };
    onSeen = check;
    check();
  });
}

function sized(body: string): Buffer {
  return Buffer.from(`POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
}

/** The body in `pieces` chunks (cut anywhere, inside a character too). */
function chunked(body: string, pieces: number): Buffer {
  const bytes = Buffer.from(body);
  const step = Math.max(1, Math.ceil(bytes.length / pieces));
  const out = [Buffer.from('POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n')];
  for (let at = 0; at < bytes.length; at += step) {
    const piece = bytes.subarray(at, at + step);
    out.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n'));
  }
  out.push(Buffer.from('0\r\n\r\n'));
  return Buffer.concat(out);
}

async function oneWrite(wire: Buffer): Promise<Seen> {
  const before = seen.length;
  const socket = await open();
  socket.write(wire);
  await bodies(before + 1);
  socket.destroy();
  return seen[before] as Seen;
}

describe('readJsonBody', () => {
  it('takes a body that came with its head without listening, and the request still ends', async () => {
    const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'héllo' }] });
    const got = await oneWrite(sized(body));
    expect(got).toMatchObject({ json: JSON.parse(body) as unknown, error: undefined, listened: false });
    await got.ended;
  });

  it('takes a chunked body whole, joined', async () => {
    // Without a Content-Length the body is known whole only once Node has parsed its end, which is after the first
    // microtask: read as it comes, most of the time.
    const body = JSON.stringify({ a: 'x'.repeat(300), b: [1, 2, 3] });
    const got = await oneWrite(chunked(body, 5));
    expect(got).toMatchObject({ json: JSON.parse(body) as unknown, error: undefined });
    await got.ended;
  });

  it('refuses a whole body past the limit, and a whole body that is not JSON', async () => {
    // Node's parser refuses a Content-Length past its own limit only far above this one.
    expect(await oneWrite(sized(JSON.stringify({ a: 'x'.repeat(LIMITS.maxBytes) })))).toMatchObject({ error: 'body_too_large' });
    expect(await oneWrite(chunked(JSON.stringify({ a: 'x'.repeat(LIMITS.maxBytes) }), 3))).toMatchObject({ error: 'body_too_large' });
    expect(await oneWrite(sized('{"a":'))).toMatchObject({ error: 'invalid_json', listened: false });
  });

  it('reads a body that follows its head as it comes', async () => {
    const before = seen.length;
    const body = JSON.stringify({ late: true });
    const wire = sized(body);
    const socket = await open();
    const received = new Promise<void>((resolve) => server.once('request', () => resolve()));
    socket.write(wire.subarray(0, wire.length - body.length));
    await received;
    socket.write(body);
    await bodies(before + 1);
    socket.destroy();
    expect(seen[before]).toMatchObject({ json: { late: true }, error: undefined, listened: true });
    await (seen[before] as Seen).ended;
  });

  it('gives each request of a keep-alive connection its own bytes, however the writes are cut', async () => {
    const start = seen.length;
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.record({ text: fc.string({ maxLength: 200 }), n: fc.integer(), chunks: fc.integer({ min: 0, max: 4 }) }), { minLength: 1, maxLength: 4 }),
        fc.array(fc.nat(), { maxLength: 6 }),
        async (requests, cuts) => {
          const bodies_ = requests.map((r) => JSON.stringify({ text: r.text, n: r.n }));
          const wire = Buffer.concat(bodies_.map((body, i) => ((requests[i] as { chunks: number }).chunks === 0 ? sized(body) : chunked(body, (requests[i] as { chunks: number }).chunks))));
          const points = [...new Set(cuts.map((c) => c % wire.length))].sort((x, y) => x - y);
          const before = seen.length;
          const socket = await open();
          let at = 0;
          for (const point of [...points, wire.length]) {
            if (point <= at) continue;
            socket.write(wire.subarray(at, point));
            at = point;
            // Each piece its own read, where the loop lets it be one.
            await new Promise((resolve) => setImmediate(resolve));
          }
          await bodies(before + requests.length);
          socket.destroy();
          // Node hands pipelined requests over as it parses them, so a later one can finish reading first.
          const got = seen.slice(before);
          const order = (values: unknown[]) => values.map((v) => JSON.stringify(v)).sort();
          expect(got.map((s) => s.error)).toEqual(requests.map(() => undefined));
          expect(order(got.map((s) => s.json))).toEqual(order(bodies_.map((b) => JSON.parse(b) as unknown)));
          await Promise.all(got.map((s) => s.ended));
        },
      ),
      { numRuns: 60 },
    );
    // Both ways of reading were taken.
    expect(seen.slice(start).some((s) => s.listened)).toBe(true);
    expect(seen.slice(start).some((s) => !s.listened)).toBe(true);
  });
});
