/**
 * The checks the API routes share, in vLLM's order — method, auth, the fault header (a `reset_before_response` fires
 * before the body is read), body size, content type, JSON — and the choice of a request's fault once it is read.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Exchange, SimContext } from '../context.js';
import { headerValue } from '../context.js';
import { appliesToNonStream, drawFault, NO_DIRECTIVES, parseFaultHeader, type Directives, type Fault, type FaultKind, type ParseResult } from '../faults.js';
import { badRequestBody } from '../pooling-request.js';
import { sendBody } from '../respond.js';
import { errorBody, errorInfo, METHOD_NOT_ALLOWED_BODY, statusBody, UNAUTHORIZED_BODY } from '../wire.js';

const MAX_BODY_BYTES = 64 * 1024 * 1024;

/** A request's parsed JSON body and its fault directives, once the common checks passed. */
export interface ReadJson {
  readonly body: unknown;
  /** Whether an x-sim-fault header was sent (then no random fault is drawn). */
  readonly hasHeader: boolean;
  readonly directives: Directives;
}

type BodyRead = Buffer | 'too_large' | null;

function readBody(req: IncomingMessage, limit: number): Promise<BodyRead> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    req.on('data', (chunk: Buffer) => {
      if (done) return;
      size += chunk.length;
      if (size > limit) {
        done = true;
        resolve('too_large');
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!done) {
        done = true;
        resolve(Buffer.concat(chunks, size));
      }
    });
    req.on('close', () => {
      if (!done) {
        done = true;
        resolve(null);
      }
    });
  });
}

/** The fault header of a request that passed method and auth: its parse, and whether one was sent. */
export interface FaultHeader {
  readonly parsed: ParseResult;
  readonly hasHeader: boolean;
}

/**
 * Method, auth and the fault header of a POST route whose body is read next. Null when the request was answered here
 * (405, 401, or the reset of a `reset_before_response`, which fires before the body is read).
 */
export function checkPost(ctx: SimContext, ex: Exchange, req: IncomingMessage, res: ServerResponse, path: string): FaultHeader | null {
  if (req.method !== 'POST') {
    req.resume();
    ctx.reject(ex, res, 405, METHOD_NOT_ALLOWED_BODY, { allow: 'POST' });
    return null;
  }
  if (!ctx.isAuthorized(req, path)) {
    req.resume();
    ctx.reject(ex, res, 401, UNAUTHORIZED_BODY);
    return null;
  }
  const header = headerValue(req, 'x-sim-fault');
  const parsed = header === undefined ? ({ ok: true, directives: NO_DIRECTIVES } as const) : parseFaultHeader(header);
  if (parsed.ok && parsed.directives.fault?.kind === 'reset_before_response') {
    ctx.applyFault(ex, parsed.directives.fault);
    ctx.settle(ex, 'fault', 0);
    req.socket.resetAndDestroy();
    return null;
  }
  return { parsed, hasHeader: header !== undefined };
}

/** The 400 of an x-sim-fault header that does not parse. */
export function faultHeaderError(message: string): string {
  return errorBody(errorInfo(400, message, 'x-sim-fault'));
}

/**
 * The checks every JSON route shares (checkPost, then body size, the header's parse, content type, JSON). Null when
 * the request was answered here. `schemaType`: the error `type` for content-type and JSON errors — FastAPI's "Bad
 * Request" on the pooling routes; the generation routes keep the simulator's historical "BadRequestError".
 */
export async function readJson(
  ctx: SimContext,
  ex: Exchange,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  schemaType: 'Bad Request' | 'BadRequestError',
): Promise<ReadJson | null> {
  const checked = checkPost(ctx, ex, req, res, path);
  if (checked === null) return null;
  const { parsed } = checked;
  const raw = await readBody(req, MAX_BODY_BYTES);
  if (ex.settled || raw === null) return null; // the client left; the close handler recorded it
  if (raw === 'too_large') {
    ctx.reject(ex, res, 413, errorBody(errorInfo(413, `Request body exceeds ${MAX_BODY_BYTES} bytes.`)), { connection: 'close' });
    return null;
  }
  if (!parsed.ok) {
    ctx.reject(ex, res, 400, faultHeaderError(parsed.message));
    return null;
  }
  const schemaError = (message: string): string =>
    schemaType === 'Bad Request' ? badRequestBody(message) : errorBody(errorInfo(400, message));
  const mediaType = (req.headers['content-type'] ?? '').split(';', 1)[0]?.trim().toLowerCase();
  if (mediaType !== 'application/json') {
    ctx.reject(ex, res, 400, schemaError("Unsupported Media Type: Only 'application/json' is allowed"));
    return null;
  }
  try {
    return { body: JSON.parse(raw.toString('utf8')) as unknown, hasHeader: checked.hasHeader, directives: parsed.directives };
  } catch {
    ctx.reject(ex, res, 400, schemaError('JSON decode error'));
    return null;
  }
}

/**
 * The fault of an accepted request: the header's, or a random one (null when `random` is false). `applies`: the
 * kinds this request honours (default: all for a stream, appliesToNonStream otherwise); others are dropped.
 */
export function chooseFault(
  ctx: SimContext,
  ex: Exchange,
  read: Pick<ReadJson, 'hasHeader' | 'directives'>,
  stream: boolean,
  random = true,
  applies?: (kind: FaultKind) => boolean,
): Fault | null {
  const { opts } = ctx;
  let fault = read.directives.fault;
  if (!read.hasHeader) {
    const kinds = applies !== undefined ? opts.faultKinds.filter(applies) : stream ? opts.faultKinds : ctx.nonStreamFaultKinds;
    fault = random ? drawFault(ctx.faultRandom, opts.faultRate, kinds, opts.outputTokens) : null;
  } else if (fault !== null && !(applies ?? (stream ? () => true : appliesToNonStream))(fault.kind)) {
    fault = null; // e.g. stream-only faults mean nothing without a stream
  }
  if (fault !== null) ctx.applyFault(ex, fault);
  return fault;
}

/**
 * lengthRate: a request without an x-sim-fault header and without a random fault ends with finish_reason `length`
 * at that share (drawn only for such requests, from its own stream).
 */
export function withLengthRate(ctx: SimContext, read: ReadJson, fault: Fault | null): Directives {
  const { directives } = read;
  if (read.hasHeader || fault !== null || ctx.opts.lengthRate <= 0 || ctx.lengthRandom() >= ctx.opts.lengthRate) return directives;
  return { ...directives, modifiers: { ...directives.modifiers, finishReason: 'length' } };
}

/** The faults that answer at once, before any delay: a status, or a reset. True when one did. */
export function answerFaultAtOnce(
  ctx: SimContext,
  ex: Exchange,
  req: IncomingMessage,
  res: ServerResponse,
  fault: Fault | null,
  model: string,
  bodyOf: (status: number, model: string) => string = statusBody,
): boolean {
  if (fault?.kind === 'status') {
    sendBody(res, fault.status, bodyOf(fault.status, model));
    ctx.settle(ex, 'fault', fault.status);
    return true;
  }
  if (fault?.kind === 'reset_before_response') {
    ctx.settle(ex, 'fault', 0);
    req.socket.resetAndDestroy();
    return true;
  }
  return false;
}
