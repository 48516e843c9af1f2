/**
 * Structured logs: pino, one JSON object per line by default; `pretty` for a terminal. Never prompts, completions,
 * API keys or Authorization headers: nothing logs a request body or headers.
 */
import { tracingChannel } from 'node:diagnostics_channel';
import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import type { Config } from '../config/load.js';
import { stdoutDestination } from './log-destination.js';

const LEVELS: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };
const OMITTED = new Set(['level', 'time', 'msg', 'pid', 'hostname', 'service']);

function formatValue(value: unknown): string {
  if (typeof value === 'string') return /[\s="]/.test(value) ? JSON.stringify(value) : value;
  return JSON.stringify(value);
}

/** `12:34:56.789 INFO  request model=m outcome=delivered ...` from one pino JSON line. */
export function prettyLine(line: string): string {
  let record: Record<string, unknown>;
  try {
    record = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line;
  }
  const time = typeof record['time'] === 'number' ? new Date(record['time']).toISOString().slice(11, 23) : '';
  const level = (LEVELS[record['level'] as number] ?? String(record['level'])).padEnd(5);
  const fields = Object.entries(record)
    .filter(([key]) => !OMITTED.has(key))
    .map(([key, value]) => `${key}=${formatValue(value)}`)
    .join(' ');
  const msg = typeof record['msg'] === 'string' ? record['msg'] : '';
  return `${time} ${level} ${msg}${fields ? ` ${fields}` : ''}\n`;
}

export function createLogger(logging: Config['logging'], destination: NodeJS.WritableStream = process.stdout): Logger {
  const options = { level: logging.level, base: { service: 'waybill' } };
  // stdout: bounded, never waited for while serving, waited for up to 2 s at exit (log-destination.ts); pino's own
  // held without bound and could not exit once stdout stalled.
  if (logging.format === 'json') return pino(options, destination === process.stdout ? stdoutDestination(logging.buffer_bytes) : destination);
  const pretty = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      for (const line of chunk.toString('utf8').split('\n')) if (line !== '') destination.write(prettyLine(line));
      callback();
    },
  });
  return pino(options, pretty);
}

/** pino traces each line's formatting here (lib/tools.js asJson); a subscriber may change the record. */
const asJsonChannel = tracingChannel('pino_asJson');

const SYMBOLS = pino.symbols as unknown as Record<string, symbol>;
const sym = (name: string): symbol => {
  const found = SYMBOLS[name];
  if (found === undefined) throw new Error(`pino.symbols.${name} is missing: this pino is not the one logger.ts was written for`);
  return found;
};

/**
 * `logger.info(record, msg)` for a record of data only (strings, numbers, booleans, arrays and plain objects of them,
 * undefined fields left out), built as one `JSON.stringify` instead of pino's walk over its fields and one string per
 * field: the request's wide line (one per request) was the largest allocation of a request's settlement (issue 27).
 * The line is the one pino writes — its level, time, bindings, the record's fields in order, the message and its
 * line end, read from the logger itself — to the logger's own stream, so it goes out in order with every other line.
 * A logger configured so that pino would change the record (a mixin, hooks, a log formatter, a nested key,
 * redaction, serializers, a message prefix, `info` at another level number) gets `logger.info` itself; so does a line
 * while something subscribes to pino's `tracing:pino_asJson` channel (an agent may add fields there), and a record
 * JSON.stringify refuses (a BigInt, a cycle: pino's safe stringify writes them). Strings differ from pino's in one
 * respect only: a lone surrogate in a short top-level string is escaped (`\udXXX`, valid JSON) where pino writes it
 * raw, to be replaced by U+FFFD on output. `members` writes the record's JSON without its braces ('' for none):
 * JSON.stringify's, or one written for the record's shape that writes the same text (request-log.ts
 * requestLogMembers), which spares the line a copy of itself (a slice of the whole text, flattened).
 */
export function dataRecordWriter<T extends object>(logger: Logger, members: (record: T) => string = jsonMembers): (record: T, msg: string) => void {
  const l = logger as unknown as Record<symbol, unknown>;
  const hooks = l[sym('hooksSym')] as { logMethod?: unknown; streamWrite?: unknown } | undefined;
  const formatters = l[sym('formattersSym')] as { log?: unknown } | undefined;
  const serializers = l[sym('serializersSym')] as Record<string, unknown> | undefined;
  const stringifiers = l[sym('stringifiersSym')] as Record<string | symbol, unknown> | undefined;
  const stream = l[sym('streamSym')] as ({ write?: unknown } & Record<symbol, unknown>) | undefined;
  const levels = (logger as { levels?: { values?: Record<string, number | undefined> } }).levels;
  const plain =
    // Something that only looks like a pino logger (a test's stub) is simply called.
    typeof stream?.write === 'function' &&
    !l[sym('mixinSym')] &&
    hooks?.logMethod === undefined &&
    hooks?.streamWrite === undefined &&
    formatters?.log === undefined &&
    !l[sym('nestedKeySym')] &&
    typeof l[sym('msgPrefixSym')] !== 'string' &&
    (stringifiers === undefined || Reflect.ownKeys(stringifiers).length === 0) &&
    // pino's default serializers hold only `err` (for the error key), which a data record has no use for.
    (serializers === undefined || Object.keys(serializers).every((key) => key === 'err')) &&
    stream[sym('needsMetadataGsym')] !== true &&
    levels?.values?.['info'] === 30;
  if (!plain) return (record, msg) => logger.info(record as object, msg);
  // The request lines may wait for others to join their write (log-destination.ts), where the stream offers it.
  const target = stream as { write(line: string): unknown; writeLater?: (line: string) => unknown };
  const out = typeof target.writeLater === 'function' ? { write: target.writeLater.bind(target) } : target;
  const time = l[sym('timeSym')] as () => string;
  const end = l[sym('endSym')] as string;
  const messageKey = JSON.stringify(l[sym('messageKeySym')]);
  // Read at each line: setBindings replaces the bindings.
  const lsCache = sym('lsCacheSym');
  const chindings = sym('chindingsSym');
  // The line's end for the last message seen (the request lines' is always the same).
  let lastMsg: string | undefined;
  let tail = '';
  return (record, msg) => {
    if (!logger.isLevelEnabled('info')) return;
    if (asJsonChannel.hasSubscribers) return void logger.info(record as object, msg);
    let fields: string;
    try {
      fields = members(record);
    } catch {
      return void logger.info(record as object, msg);
    }
    if (msg !== lastMsg) {
      lastMsg = msg;
      tail = ',' + messageKey + ':' + JSON.stringify(msg) + end;
    }
    const head = (l[lsCache] as Record<number, string>)[30] as string;
    out.write(head + time.call(logger) + (l[chindings] as string) + (fields === '' ? '' : ',' + fields) + tail);
  };
}

/** JSON.stringify's text of an object without its braces. */
function jsonMembers(record: object): string {
  const text = JSON.stringify(record);
  return text.length > 2 ? text.slice(1, -1) : '';
}
