/**
 * A redis-server of a test's own (Debian's package; .ci/run installs it): on a free port, without persistence, in a
 * temporary directory. Tests that use it skip visibly without redis-server (test/helpers/system-tool.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { freePort } from './ports.js';
import type { SystemTool } from './system-tool.js';

export const REDIS: SystemTool = { command: 'redis-server', install: 'Debian: apt-get install redis-server' };


export class RedisServer {
  private child: ChildProcess | undefined;
  private readonly dir = mkdtempSync(join(tmpdir(), 'waybill-redis-'));
  private output = '';

  private constructor(readonly port: number) {}

  static async start(): Promise<RedisServer> {
    // A free port can be taken between the check and the bind: try another.
    for (let attempt = 0; ; attempt++) {
      const server = new RedisServer(await freePort());
      try {
        await server.run();
        return server;
      } catch (error) {
        server.cleanUp();
        if (attempt === 2) throw error;
      }
    }
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Starts (again, on the same port: a Redis that comes back, empty) and resolves once it accepts connections. */
  async run(): Promise<void> {
    const child = spawn(REDIS.command, ['--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', this.dir, '--daemonize', 'no'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child = child;
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
    await new Promise<void>((resolve, reject) => {
      lines.on('line', (line) => {
        this.output += `${line}\n`;
        if (line.includes('Ready to accept connections')) resolve();
      });
      child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
      child.once('exit', (code) => reject(new Error(`redis-server exited with ${String(code)} before it was ready:\n${this.output}`)));
    });
  }

  /** SIGKILL: no goodbye to its clients, as a crash or a network cut. */
  async kill(): Promise<void> {
    const child = this.child;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill('SIGKILL');
    await exited;
  }

  async stop(): Promise<void> {
    await this.kill();
    this.cleanUp();
  }

  private cleanUp(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
