/**
 * Reading a client's JSON body with every limit a front door needs: size, time to arrive, and nesting depth.
 * Fastify's own buffer parser has a size limit but no clock, so a client that sends its headers and then dribbles
 * (or never sends) the body would hold a connection and its buffer for as long as it liked.
 */
import type { IncomingMessage } from 'node:http';
import { Busboy } from '@fastify/busboy';
import type { ErrorCode } from '../delivery/errors.js';
import { exceedsDepth } from './json-bytes.js';

export interface BodyLimits {
  readonly maxBytes: number;
  /** From the request's arrival: the whole body must be in by then. */
  readonly readTimeoutMs: number;
  readonly maxDepth: number;
}

export interface ParsedBody {
  raw: Buffer;
  /** The JSON value; for a multipart form, its text fields (the first value of each name). */
  json: unknown;
  /** A multipart/form-data body (the audio routes), not JSON. */
  form?: true;
}

/** Why a body was refused; `close` when unread bytes may follow, so the connection cannot be reused. */
export class BodyError extends Error {
  constructor(
    readonly code: Extract<ErrorCode, 'body_too_large' | 'request_timeout' | 'invalid_json' | 'json_too_deep' | 'invalid_request' | 'unsupported_media_type'>,
    message: string,
    readonly close: boolean,
  ) {
    super(message);
    this.name = 'BodyError';
  }
}

/** The client went away before its body arrived: nobody is left to answer. */
export class BodyAbandoned extends Error {
  constructor() {
    super('the client closed the connection before its request body arrived');
    this.name = 'BodyAbandoned';
  }
}

/**
 * Reads the body of `request`, which arrived at `remainingMs` before its read deadline. Resolves to the bytes and
 * their JSON (undefined for an empty body where `allowEmpty`: a route that needs none); rejects with a BodyError
 * (answer it) or BodyAbandoned (the client left).
 */
export function readJsonBody(request: IncomingMessage, limits: BodyLimits, remainingMs: number, allowEmpty = false): Promise<ParsedBody> {
  return readBody(request, limits, remainingMs, (raw) => ({ raw, json: allowEmpty && raw.length === 0 ? undefined : parseJson(raw, limits.maxDepth) }));
}

/**
 * Reads a multipart/form-data body (the audio routes) under the same limits, and its text fields: what the gateway
 * routes and accounts by (`model`, `stream`). The file parts are forwarded as they came, never decoded.
 */
export async function readFormBody(request: IncomingMessage, limits: BodyLimits, remainingMs: number): Promise<ParsedBody> {
  const raw = await readBody(request, limits, remainingMs, (bytes) => bytes);
  return { raw, json: await formFields(raw, request.headers['content-type'] ?? ''), form: true };
}

/** Text fields a form may carry before it is refused (vLLM's audio routes take about a dozen). */
const MAX_FORM_FIELDS = 64;
const MAX_FIELD_BYTES = 64 * 1024;

/** The text fields of a multipart body (first value of each name); a malformed form is a 400. */
export function formFields(raw: Buffer, contentType: string): Promise<Record<string, string>> {
  return new Promise((resolve, reject) => {
    const fields: Record<string, string> = Object.create(null) as Record<string, string>;
    const refuse = (message: string) => reject(new BodyError('invalid_request', message, false));
    let parser: ReturnType<typeof Busboy>;
    try {
      parser = Busboy({
        headers: { 'content-type': contentType },
        limits: { fields: MAX_FORM_FIELDS, fieldSize: MAX_FIELD_BYTES, parts: MAX_FORM_FIELDS + 8 },
        // Starlette's rule, which vLLM reads the form with: a part is a file when it has a filename, whatever its type.
        isPartAFile: (_field, _type, filename) => filename !== undefined,
      });
    } catch {
      refuse('the request body is not a valid multipart form (its Content-Type has no boundary)');
      return;
    }
    parser.on('field', (name, value, _nameTruncated, valueTruncated) => {
      // The last value of a repeated name wins, as in Starlette's FormData.get: the gateway must route and check the
      // model the upstream will use. A value cut at the field limit is not a value.
      if (valueTruncated) delete fields[name];
      else fields[name] = value;
    });
    parser.on('file', (_name, stream) => {
      // A file part cut short (no closing boundary) errors on its own stream: without a listener, the process.
      stream.on('error', () => refuse('the request body is not a valid multipart form'));
      stream.resume();
    });
    parser.on('fieldsLimit', () => refuse(`the form has more than ${MAX_FORM_FIELDS} fields`));
    parser.on('partsLimit', () => refuse(`the form has more than ${MAX_FORM_FIELDS + 8} parts`));
    parser.on('error', () => refuse('the request body is not a valid multipart form'));
    parser.on('finish', () => resolve(fields));
    parser.end(raw);
  });
}

async function readBody<T>(request: IncomingMessage, limits: BodyLimits, remainingMs: number, parse: (raw: Buffer) => T): Promise<T> {
  const declared = Number(request.headers['content-length']);
  if (declared > limits.maxBytes) throw tooLarge(limits);
  // Fastify asks for the body from inside Node's callback for the request's head, before Node's parser has gone on to
  // the bytes after it in the same read; the microtasks run after it has.
  await Promise.resolve();
  const whole = arrived(request, declared);
  if (whole === undefined) return readAsItComes(request, limits, remainingMs, declared, parse);
  // The whole body came with the head (the common case: a small body in the head's packets), and Node holds it: taken
  // at once, without a clock or listeners (their setup and removal were ~10k instructions of a ~350k-instruction
  // request, issue 27). Node's parser keeps a body to its Content-Length or its chunked framing.
  const raw = (request.read() as Buffer | null) ?? EMPTY;
  // Before its end was parsed: the stream flows, so that its 'end' (and then 'close') come when it is.
  if (whole === 'buffered') request.resume();
  if (raw.length > limits.maxBytes) throw tooLarge(limits);
  return parse(raw);
}

function readAsItComes<T>(request: IncomingMessage, limits: BodyLimits, remainingMs: number, declared: number, parse: (raw: Buffer) => T): Promise<T> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let received = 0;
    let finished = false;
    const finish = (error: Error | undefined, body?: T) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      request.off('data', onData);
      request.off('end', onEnd);
      request.off('error', onError);
      request.off('close', onClose);
      if (error !== undefined) {
        // Stop buffering: what is still in flight is discarded by Node, and the response closes the connection.
        chunks.length = 0;
        request.resume();
        reject(error);
      } else {
        resolve(body as T);
      }
    };
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      if (received > limits.maxBytes) finish(tooLarge(limits));
      else chunks.push(chunk);
    };
    const onEnd = () => {
      if (!Number.isNaN(declared) && received !== declared) {
        finish(new BodyError('invalid_request', 'the request body does not match its Content-Length', true));
        return;
      }
      const raw = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, received);
      try {
        finish(undefined, parse(raw));
      } catch (error) {
        finish(error as Error);
      }
    };
    const onError = () => finish(new BodyAbandoned());
    const onClose = () => finish(new BodyAbandoned());
    const timer = setTimeout(
      () => finish(new BodyError('request_timeout', `the request body did not arrive within ${limits.readTimeoutMs} ms`, true)),
      Math.max(0, remainingMs),
    );
    request.on('data', onData);
    request.on('end', onEnd);
    request.on('error', onError);
    request.on('close', onClose);
  });
}

const EMPTY = Buffer.alloc(0);

/**
 * Whether the whole body is in the stream's buffer, where `read()` returns it in one Buffer: `complete` (Node's parser
 * has the whole message; it sets this as it pushes the body's end), or `buffered` (not yet, but as many bytes as
 * Content-Length says are there, and Node's parser gives a body no more). Undefined otherwise, or when the stream was
 * read from, listened to, paused or destroyed: then it is read as it comes.
 */
function arrived(request: IncomingMessage, declared: number): 'complete' | 'buffered' | undefined {
  if (request.readableFlowing !== null || request.readableEnded || request.destroyed || request.readableEncoding !== null || request.readableObjectMode) return undefined;
  if (request.listenerCount('data') !== 0) return undefined;
  if (request.complete) return 'complete';
  return request.readableLength === declared && request.headers['transfer-encoding'] === undefined ? 'buffered' : undefined;
}

function tooLarge(limits: BodyLimits): BodyError {
  return new BodyError('body_too_large', `the request body is larger than ${limits.maxBytes} bytes`, true);
}

/**
 * JSON.parse behind a nesting limit checked first on the bytes: JSON.parse itself copes with deep nesting, but
 * everything after it (JSON.stringify, structured logging, a schema validator) recurses and throws RangeError,
 * and a request must not be able to reach a stack overflow anywhere in the gateway.
 */
export function parseJson(raw: Buffer, maxDepth: number): unknown {
  if (exceedsDepth(raw, maxDepth)) {
    throw new BodyError('json_too_deep', `the request body nests deeper than ${maxDepth} levels`, false);
  }
  try {
    return JSON.parse(raw.toString('utf8'));
  } catch {
    throw new BodyError('invalid_json', 'the request body is not valid JSON', false);
  }
}
