/**
 * Structured logs: pino, one JSON object per line by default; `pretty` for a terminal. Never prompts, completions,
 * API keys or Authorization headers: nothing logs a request body or headers.
 */
import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import type { Config } from '../config/load.js';

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
  if (logging.format === 'json') return destination === process.stdout ? pino(options) : pino(options, destination);
  const pretty = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      for (const line of chunk.toString('utf8').split('\n')) if (line !== '') destination.write(prettyLine(line));
      callback();
    },
  });
  return pino(options, pretty);
}
