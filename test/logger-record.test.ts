import fc from 'fast-check';
import { pino, type LoggerOptions } from 'pino';
import { describe, expect, it } from 'vitest';
import { tracingChannel } from 'node:diagnostics_channel';
import { Writable } from 'node:stream';
import { createLogger, dataRecordWriter } from '../src/telemetry/logger.js';
import { requestLogMembers, type RequestLogLine } from '../src/telemetry/request-log.js';

// The oracle is pino itself: the writer must write, byte for byte, the line `logger.info(record, msg)` writes.

function capture(options: LoggerOptions): { logger: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const logger = pino({ timestamp: () => ',"time":1764547200000', ...options }, { write: (line: string) => void lines.push(line) });
  return { logger, lines };
}

/** Both ways, on two loggers of the same options: what pino writes and what the writer writes. */
function both(options: LoggerOptions, record: object, msg: string, child?: Record<string, unknown>): { pino: string[]; writer: string[] } {
  const a = capture(options);
  const b = capture(options);
  const la = child === undefined ? a.logger : a.logger.child(child);
  const lb = child === undefined ? b.logger : b.logger.child(child);
  la.info(record, msg);
  dataRecordWriter(lb)(record, msg);
  return { pino: a.lines, writer: b.lines };
}

/** Strings without lone surrogates (where the two differ on purpose: see dataRecordWriter), any other character. */
const text = fc.string({ unit: 'grapheme', maxLength: 12 });
const scalar = fc.oneof(text, fc.integer(), fc.double(), fc.boolean(), fc.constant(undefined), fc.constant(null));
const value = fc.letrec((tie) => ({
  leaf: scalar,
  node: fc.oneof({ depthSize: 'small' }, tie('leaf'), fc.array(tie('node'), { maxLength: 3 }), fc.dictionary(text, tie('node'), { maxKeys: 3 })),
})).node;
const record = fc.dictionary(text, value, { maxKeys: 8 });

describe('dataRecordWriter: the line logger.info writes, built in one JSON.stringify', () => {
  it('equals pino on generated records (control characters, quotes, non-BMP text, NaN, nesting, undefined)', () => {
    fc.assert(
      fc.property(record, text, (rec, msg) => {
        const { pino: expected, writer } = both({ base: { service: 'waybill' } }, rec, msg);
        expect(expected).toHaveLength(1);
        expect(writer).toEqual(expected);
      }),
      { numRuns: 500 },
    );
  });

  it("equals pino for a request's wide line, a child's bindings, another message key and a CRLF line end", () => {
    const line = { request_id: 'r-1', trace_id: undefined, model: 'm', stream: true, code: 200, attempts: [{ upstream: 'a', status: undefined, duration_ms: 1.5 }], tokens: { prompt: 3 }, finish_reasons: ['stop'] };
    for (const options of [{}, { base: { service: 'waybill' } }, { messageKey: 'message' }, { crlf: true }, { base: null }] as LoggerOptions[]) {
      const { pino: expected, writer } = both(options, line, 'request');
      expect(writer).toEqual(expected);
    }
    const { pino: expected, writer } = both({}, line, 'request', { worker: 2, name: 'x"y' });
    expect(writer[0]).toContain('"worker":2');
    expect(writer).toEqual(expected);
    expect(JSON.parse(writer[0] as string)).toMatchObject({ level: 30, msg: 'request', request_id: 'r-1', attempts: [{ upstream: 'a', duration_ms: 1.5 }] });
  });

  it("equals pino for request lines written by the line's own members writer, message after message", () => {
    const a = capture({ base: { service: 'waybill' } });
    const b = capture({ base: { service: 'waybill' } });
    const write = dataRecordWriter<RequestLogLine>(b.logger, requestLogMembers);
    fc.assert(
      fc.property(
        fc.record({ id: text, ms: fc.integer({ min: -1e9, max: 1e12 }), msg: fc.constantFrom('request', 'other', 'request') }),
        ({ id, ms, msg }) => {
          const line: RequestLogLine = {
            request_id: id, trace_id: undefined, model: 'm', tenant: 't', route: 'chat_completions', stream: false, code: 200, outcome: 'delivered',
            attempts: [{ upstream: 'u', result: 'delivered', status: 200, duration_ms: ms / 1000 }], ttft_ms: ms / 1000, tpot_ms: undefined,
            tokens: { prompt: 3, cached: undefined, completion: 1 }, finish_reasons: ['stop'], anomalies: [], cancel_phase: undefined, slo: 'met',
            prompt_len: 'short', accepted: true, checks_failed: [], format_valid: undefined, verdict: undefined, evaluator: false,
            evaluation_sample: undefined, client_retry: undefined, routing: undefined, duration_ms: (ms + 7) / 1000,
          };
          a.logger.info(line, msg);
          write(line, msg);
          expect(b.lines).toEqual(a.lines);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('writes nothing when info is off, and follows a level changed after it was made', () => {
    const { logger, lines } = capture({ level: 'warn' });
    const write = dataRecordWriter(logger);
    write({ a: 1 }, 'request');
    expect(lines).toEqual([]);
    logger.level = 'info';
    write({ a: 1 }, 'request');
    expect(lines).toEqual(['{"level":30,"time":1764547200000,"pid":' + process.pid + ',"hostname":' + JSON.stringify((JSON.parse(lines[0] as string) as { hostname: string }).hostname) + ',"a":1,"msg":"request"}\n']);
  });

  it('hands the record to pino where pino would change it: a mixin, a log formatter, redaction, serializers, a message prefix, a nested key', () => {
    const changing: LoggerOptions[] = [
      { mixin: () => ({ mixed: true }) },
      { formatters: { log: (o) => ({ ...o, formatted: true }) } },
      { redact: ['secret'] },
      { serializers: { secret: () => 'hidden' } },
      { msgPrefix: '[gw] ' },
      { nestedKey: 'payload' },
      { hooks: { streamWrite: (s: string) => s.replace('"a":1', '"a":2') } },
      { hooks: { logMethod(args, method) { method.apply(this, [{ ...(args[0] as object), hooked: 1 }, ...args.slice(1)] as Parameters<typeof method>); } } },
      { mixin: () => ({ m: 1 }), mixinMergeStrategy: (merge: object, mixin: object) => ({ ...merge, ...mixin, merged: true }) },
      { customLevels: { info: 35 }, useOnlyCustomLevels: true, level: 'info' },
    ];
    for (const options of changing) {
      const { pino: expected, writer } = both(options, { a: 1, secret: 's' }, 'request');
      expect(writer, JSON.stringify(Object.keys(options))).toEqual(expected);
      // Each really changes the line: a writer that ignored the option would not match.
      expect(expected[0]).not.toBe(both({}, { a: 1, secret: 's' }, 'request').pino[0]);
    }
  });

  it("takes its own path, not logger.info, for the gateway's loggers (json and pretty)", () => {
    for (const format of ['json', 'pretty'] as const) {
      const out: string[] = [];
      const destination = new Writable({ write: (chunk: Buffer, _e, done) => void (out.push(chunk.toString()), done()) });
      const logger = createLogger({ level: 'info', format, requests: true, buffer_bytes: 1 << 20 }, destination);
      let infos = 0;
      const info = logger.info.bind(logger);
      logger.info = ((...args: Parameters<typeof info>) => (infos++, info(...args)));
      dataRecordWriter(logger)({ model: 'm', code: 200 }, 'request');
      expect(infos, format).toBe(0);
      expect(out.join(''), format).toMatch(format === 'json' ? /"model":"m","code":200,"msg":"request"}\n$/ : / INFO {2}request model=m code=200\n$/);
    }
  });

  it("reads the bindings and the level at each line: setBindings, and a level changed on a worker's child", () => {
    const a = capture({ level: 'warn' });
    const b = capture({ level: 'warn' });
    const [ca, cb] = [a.logger.child({ worker: 1 }), b.logger.child({ worker: 1 })];
    const write = dataRecordWriter(cb);
    write({ x: 1 }, 'request');
    expect(b.lines).toEqual([]);
    for (const c of [ca, cb]) {
      c.level = 'info';
      c.setBindings({ worker: 2 });
    }
    ca.info({ x: 1 }, 'request');
    write({ x: 1 }, 'request');
    expect(b.lines[0]).toContain('"worker":2');
    expect(b.lines).toEqual(a.lines);
  });

  it("gives the line to pino while pino's formatting channel has a subscriber, and where JSON.stringify refuses the record", () => {
    const channel = tracingChannel('pino_asJson');
    const handlers = { start: (message: unknown) => void ((message as { arguments: [Record<string, unknown>] }).arguments[0]['agent'] = 'x'), end() {}, asyncStart() {}, asyncEnd() {}, error() {} };
    channel.subscribe(handlers);
    try {
      const { pino: expected, writer } = both({}, { a: 1 }, 'request');
      expect(expected[0]).toContain('"agent":"x"');
      expect(writer).toEqual(expected);
    } finally {
      channel.unsubscribe(handlers);
    }
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic['self'] = cyclic;
    for (const odd of [{ n: 10n }, cyclic]) {
      const { pino: expected, writer } = both({}, odd, 'request');
      expect(expected).toHaveLength(1);
      expect(writer).toEqual(expected);
    }
  });

  it('calls info on something that only looks like a logger (no pino stream, no levels)', () => {
    const seen: unknown[] = [];
    const stub = { info: (record: object, msg: string) => void seen.push([record, msg]) } as unknown as pino.Logger;
    dataRecordWriter(stub)({ a: 1 }, 'request');
    expect(seen).toEqual([[{ a: 1 }, 'request']]);
  });

  it('a lone surrogate is escaped, so the line stays one valid JSON object with the same string', () => {
    const { logger, lines } = capture({});
    dataRecordWriter(logger)({ id: 'a\uD800b' }, 'request');
    expect(lines[0]).toContain('"id":"a\\ud800b"');
    expect((JSON.parse(lines[0] as string) as { id: string }).id).toBe('a\uD800b');
  });
});
