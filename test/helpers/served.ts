/**
 * `waybill serve` as a child process (the built CLI, bin/waybill.js) with its JSON lines kept and awaitable: for the
 * tests of what the command itself does (workers, helper threads).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { stringify } from 'yaml';
import type { ConfigInput } from '../../src/config/schema.js';
import { ADMIN_HEADERS, metricValue } from './stack.js';

const BIN = new URL('../../bin/waybill.js', import.meta.url).pathname;

export interface Line {
  readonly msg?: string;
  readonly worker?: number;
  readonly primary?: boolean;
  readonly url?: string;
  readonly pid?: number;
  readonly [key: string]: unknown;
}

/** A `waybill serve` process with its JSON lines, awaitable. */
export class Served {
  readonly lines: Line[] = [];
  private readonly watchers = new Set<() => void>();
  readonly exited: Promise<number | null>;
  base = '';

  constructor(
    readonly child: ChildProcess,
    readonly dir: string,
  ) {
    this.exited = once(child, 'exit').then(([code]) => code as number | null);
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on('line', (line) => {
      try {
        this.lines.push(JSON.parse(line) as Line);
      } catch {
        this.lines.push({ msg: line });
      }
      for (const watcher of this.watchers) watcher();
    });
  }

  /** Resolves when `count` lines match (bounded: gives up after `ms`, naming what it waited for). */
  async until(what: string, match: (line: Line) => boolean, count = 1, ms = 20_000): Promise<Line[]> {
    const found = () => this.lines.filter(match);
    if (found().length >= count) return found();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.watchers.delete(check);
        reject(new Error(`gave up after ${ms} ms waiting for ${what}; lines:\n${this.lines.map((l) => JSON.stringify(l)).join('\n')}`));
      }, ms);
      const check = () => {
        if (found().length < count) return;
        clearTimeout(timer);
        this.watchers.delete(check);
        resolve(found());
      };
      this.watchers.add(check);
    });
  }

  async metric(name: string, labels: Record<string, string> = {}): Promise<number> {
    const response = await request(`${this.base}/metrics`, { headers: ADMIN_HEADERS });
    return metricValue(await response.body.text(), name, labels);
  }

  async stop(): Promise<number | null> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    const code = await this.exited;
    rmSync(this.dir, { recursive: true, force: true });
    return code;
  }
}

/**
 * `waybill serve --config FILE --workers N`, not yet listening; `prefix` runs it under another command
 * (`['taskset', '-c', '0']`).
 */
export function serveRaw(config: ConfigInput, workers = 2, prefix: readonly string[] = []): Served {
  const dir = mkdtempSync(join(tmpdir(), 'waybill-serve-'));
  const file = join(dir, 'waybill.yaml');
  writeFileSync(file, stringify(config));
  const [command = process.execPath, ...args] = [...prefix, process.execPath, BIN, 'serve', '--config', file, '--workers', String(workers)];
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Served(child, dir);
}
