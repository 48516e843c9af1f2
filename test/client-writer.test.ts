/**
 * The client write path below ServerResponse (src/proxy/client-writer.ts): the bytes on the wire must stay valid
 * HTTP/1.1 chunked encoding, in order, with pipelined requests and with HTTP/1.0 clients (which get no chunking).
 * The oracle is a strict decoder written here from RFC 9112 §7.1, sharing nothing with the code under test.
 */
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chunkFrame } from '../src/proxy/client-writer.js';
import { CHAT, startStack, type Stack } from './helpers/stack.js';

interface Parsed {
  status: number;
  headers: Record<string, string>;
  /** The body's chunks as the sender framed them (chunked), or the whole body (HTTP/1.0). */
  chunks: Buffer[];
  body: string;
}

const CRLF = Buffer.from('\r\n');

/** Parses one response from `bytes` at `at`; returns it and where the next begins, or undefined if incomplete. */
function parseResponse(bytes: Buffer, at: number, untilClose: boolean): { response: Parsed; next: number } | undefined {
  const headEnd = bytes.indexOf('\r\n\r\n', at);
  if (headEnd < 0) return undefined;
  const [statusLine, ...lines] = bytes.subarray(at, headEnd).toString('latin1').split('\r\n');
  const status = Number(/^HTTP\/1\.[01] (\d{3}) /.exec(statusLine ?? '')?.[1]);
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(':');
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  let p = headEnd + 4;
  const chunks: Buffer[] = [];
  if (headers['transfer-encoding'] === 'chunked') {
    for (;;) {
      const lineEnd = bytes.indexOf(CRLF, p);
      if (lineEnd < 0) return undefined;
      const sizeText = bytes.subarray(p, lineEnd).toString('latin1');
      expect(sizeText, 'a chunk size is hex digits only (no extensions are sent)').toMatch(/^[0-9a-f]+$/);
      const size = parseInt(sizeText, 16);
      p = lineEnd + 2;
      if (size === 0) {
        if (bytes.length < p + 2) return undefined;
        expect(bytes.subarray(p, p + 2).equals(CRLF), 'no trailers: the last chunk is followed by CRLF').toBe(true);
        p += 2;
        break;
      }
      if (bytes.length < p + size + 2) return undefined;
      chunks.push(bytes.subarray(p, p + size));
      expect(bytes.subarray(p + size, p + size + 2).equals(CRLF), 'each chunk ends in CRLF').toBe(true);
      p += size + 2;
    }
  } else if (headers['content-length'] !== undefined) {
    const length = Number(headers['content-length']);
    if (bytes.length < p + length) return undefined;
    chunks.push(bytes.subarray(p, p + length));
    p += length;
  } else {
    if (!untilClose) return undefined;
    chunks.push(bytes.subarray(p));
    p = bytes.length;
  }
  return { response: { status, headers, chunks, body: Buffer.concat(chunks).toString('utf8') }, next: p };
}

/** Sends raw bytes on one connection and parses `count` responses (the last may run until the server closes). */
function exchange(port: number, raw: string, count: number): Promise<Parsed[]> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const received: Buffer[] = [];
    const parseAll = (closed: boolean): Parsed[] | undefined => {
      const bytes = Buffer.concat(received);
      const responses: Parsed[] = [];
      let at = 0;
      while (responses.length < count) {
        const parsed = parseResponse(bytes, at, closed);
        if (parsed === undefined) return undefined;
        responses.push(parsed.response);
        at = parsed.next;
      }
      return responses;
    };
    socket.on('data', (data: Buffer) => {
      received.push(data);
      const responses = parseAll(false);
      if (responses !== undefined) {
        socket.end();
        resolve(responses);
      }
    });
    socket.on('end', () => {
      const responses = parseAll(true);
      if (responses !== undefined) resolve(responses);
      else reject(new Error(`connection ended with ${Buffer.concat(received).length} bytes, not ${count} whole responses`));
    });
    socket.on('error', reject);
    socket.write(raw);
  });
}

function chatRequest(version: '1.1' | '1.0', content: string): string {
  const body = JSON.stringify({ ...CHAT, stream: true, messages: [{ role: 'user', content }] });
  return `POST /v1/chat/completions HTTP/${version}\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

/** The stream's events, as the data lines the client would read. */
function dataLines(body: string): string[] {
  return body
    .split('\n\n')
    .filter((block) => block.startsWith('data: '))
    .map((block) => block.slice('data: '.length));
}

describe('chunkFrame', () => {
  it.each([1, 9, 15, 16, 255, 256, 4095, 4096, 70_000])('frames %i bytes as size-in-hex CRLF bytes CRLF', (size) => {
    const data = Buffer.alloc(size, 0x61);
    const frame = chunkFrame(data);
    const parsed = parseResponse(Buffer.concat([Buffer.from('HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n'), frame, Buffer.from('0\r\n\r\n')]), 0, false);
    expect(parsed?.response.chunks.map((c) => c.length)).toEqual([size]);
    expect(parsed?.response.chunks[0]?.equals(data)).toBe(true);
    expect(frame.subarray(0, frame.indexOf(CRLF)).toString('latin1')).toBe(size.toString(16));
  });
});

describe('the streamed answer on the wire', () => {
  let stack: Stack;
  let port: number;

  beforeAll(async () => {
    stack = await startStack({ sim: { outputTokens: 12, itlMs: 2 } });
    port = Number(new URL(stack.base).port);
  });
  afterAll(() => stack.close());

  it('is valid chunked encoding, one event or more per chunk, ending in [DONE]', async () => {
    const [response] = await exchange(port, chatRequest('1.1', 'one'), 1);
    expect(response?.status).toBe(200);
    expect(response?.headers['transfer-encoding']).toBe('chunked');
    // Events 2 ms apart: several chunks, so the writes after the first (which carries the head) are exercised.
    expect(response?.chunks.length).toBeGreaterThan(3);
    for (const chunk of response?.chunks ?? []) expect(chunk.toString('utf8').endsWith('\n\n'), 'whole events per chunk').toBe(true);
    const lines = dataLines(response?.body ?? '');
    expect(lines[lines.length - 1]).toBe('[DONE]');
    expect(lines.length).toBeGreaterThanOrEqual(13);
  });

  it('answers two pipelined streaming requests in order on one connection, each whole', async () => {
    const responses = await exchange(port, chatRequest('1.1', 'first') + chatRequest('1.1', 'second'), 2);
    expect(responses.map((r) => r.status)).toEqual([200, 200]);
    for (const response of responses) {
      expect(response.chunks.length).toBeGreaterThan(3);
      const lines = dataLines(response.body);
      expect(lines[lines.length - 1]).toBe('[DONE]');
      expect(lines.filter((line) => line === '[DONE]')).toHaveLength(1);
      for (const line of lines.slice(0, -1)) expect(() => JSON.parse(line) as unknown).not.toThrow();
    }
    expect(responses[0]?.headers['x-request-id']).not.toBe(responses[1]?.headers['x-request-id']);
  });

  it('gives an HTTP/1.0 client the stream unchunked, ended by closing the connection', async () => {
    const [response] = await exchange(port, chatRequest('1.0', 'old client'), 1);
    expect(response?.status).toBe(200);
    expect(response?.headers['transfer-encoding']).toBeUndefined();
    const lines = dataLines(response?.body ?? '');
    expect(lines[lines.length - 1]).toBe('[DONE]');
    expect(lines.length).toBeGreaterThanOrEqual(13);
    // No chunk-size lines leaked into the body: every block is an event.
    expect(response?.body.split('\n\n').filter((b) => b !== '' && !b.startsWith('data: '))).toEqual([]);
  });
});
