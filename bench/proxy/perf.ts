/**
 * Linux `perf` views of a proxy process over a measured window, for what a V8 CPU profile cannot see: system calls
 * per streamed event (`perf stat` on syscall tracepoints) and where the CPU goes by binary — kernel, the node binary
 * (V8 builtins and runtime, Node's C++), JIT-compiled JavaScript, libc, nginx (`perf record` + `perf report --sort dso`).
 * Optional: used only with `--perf` when `perf` is on PATH.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';

const SYSCALL_EVENTS = [
  'raw_syscalls:sys_enter',
  'syscalls:sys_enter_read',
  'syscalls:sys_enter_recvfrom',
  'syscalls:sys_enter_writev',
  'syscalls:sys_enter_write',
  'syscalls:sys_enter_epoll_wait',
  'syscalls:sys_enter_epoll_pwait',
  'context-switches',
];

export interface PerfWindow {
  stop(): Promise<void>;
}

export interface PerfFigures {
  /** Counts over the window, by event name. */
  counts: Record<string, number>;
  /** Share of CPU samples by binary (dso), e.g. { '[kernel.kallsyms]': 0.37, node: 0.41 }. */
  dso: Record<string, number>;
}

/** Starts `perf stat` (syscalls) and `perf record` (samples) on `pid`; stop() ends both and waits for them. */
export function startPerf(pid: number, dataFile: string): { window: PerfWindow; result: () => PerfFigures } {
  let statOut = '';
  const stat = spawn('perf', ['stat', '-x', ',', '-e', SYSCALL_EVENTS.join(','), '-p', String(pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  stat.stderr.setEncoding('utf8');
  stat.stderr.on('data', (text: string) => (statOut += text));
  const record = spawn('perf', ['record', '-q', '-F', '999', '-o', dataFile, '-p', String(pid)], { stdio: 'ignore' });
  const exited = (child: ChildProcess) =>
    new Promise<void>((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', () => resolve())));
  return {
    window: {
      async stop() {
        stat.kill('SIGINT');
        record.kill('SIGINT');
        await Promise.all([exited(stat), exited(record)]);
      },
    },
    result: () => {
      const counts: Record<string, number> = {};
      for (const line of statOut.split('\n')) {
        const [value, , event] = line.split(',');
        if (event !== undefined && value !== undefined && /^\d+$/.test(value)) counts[event] = Number(value);
      }
      const dso: Record<string, number> = {};
      const report = spawnSync('perf', ['report', '-i', dataFile, '--no-children', '--sort', 'dso', '--stdio', '-g', 'none', '-q'], { encoding: 'utf8' });
      for (const line of (report.stdout ?? '').split('\n')) {
        const match = /^\s*([\d.]+)%\s+(.+?)\s*$/.exec(line);
        if (match === null) continue;
        // `[JIT] tid 1234` → `[JIT]`: one JIT bucket whatever the thread.
        const name = (match[2] as string).replace(/^\[JIT\].*$/, '[JIT] JavaScript');
        dso[name] = (dso[name] ?? 0) + Number(match[1]) / 100;
      }
      return { counts, dso };
    },
  };
}

export function perfAvailable(): boolean {
  const probe = spawnSync('perf', ['stat', '-e', 'raw_syscalls:sys_enter', 'true'], { encoding: 'utf8' });
  return probe.status === 0;
}

/** Per streamed event: syscalls, reads, writes, epoll waits, context switches. */
export function perEvent(counts: Record<string, number>, events: number): Record<string, number> {
  const get = (name: string) => counts[name] ?? 0;
  const per = (n: number) => (events > 0 ? n / events : Number.NaN);
  return {
    syscalls: per(get('raw_syscalls:sys_enter')),
    reads: per(get('syscalls:sys_enter_read') + get('syscalls:sys_enter_recvfrom')),
    writes: per(get('syscalls:sys_enter_writev') + get('syscalls:sys_enter_write')),
    epollWaits: per(get('syscalls:sys_enter_epoll_wait') + get('syscalls:sys_enter_epoll_pwait')),
    contextSwitches: per(get('context-switches')),
  };
}
