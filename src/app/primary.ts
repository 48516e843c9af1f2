/**
 * The primary of the cluster (cluster.ts): forks the workers, relays what they share, counts the tenants' limits and
 * the requests of a worker that died, restarts the dead, and drains them all on a signal.
 */
import cluster, { type Worker } from 'node:cluster';
import type { Logger } from 'pino';
import { LimitHost } from '../proxy/cluster-limit-store.js';
import { COUNT_ENV, INDEX_ENV, isOwner, RESTART_MAX_MS, type HeldKey, type ToPrimary, type ToWorker } from './cluster.js';
import { MetricsCollector } from './metrics-collector.js';

export interface PrimaryOptions {
  readonly count: number;
  readonly logger: Logger;
  /** Once every worker listens (the first time): where, for the start-up line. */
  readonly onListening: (url: string, adminUrl: string | undefined, models: readonly string[]) => void;
  /** A worker's start-up failure, reported once (the CLI prints it as one line). */
  readonly onFatal: (problem: string) => void;
  /** Resolves on the first SIGINT/SIGTERM (the CLI's waitForSignal). */
  readonly stopSignal: Promise<NodeJS.Signals>;
}

/** Runs the workers until a signal (then drains them all) or a start-up failure; resolves to the exit code. */
export async function runPrimary(options: PrimaryOptions): Promise<number> {
  const { count, logger } = options;
  const limits = new LimitHost(() => performance.now());
  const listening = new Set<number>();
  let started = false;
  let stopping = false;
  let fatal: { problem: string; code: number } | undefined;
  let crashes = 0;
  let lastCrash = 0;
  const workers = new Map<number, Worker>();
  /** Workers waiting out their restart pause: they hold the primary (with every worker dead, nothing else does). */
  const restarts = new Set<NodeJS.Timeout>();
  let allExited: (() => void) | undefined;
  const exited = new Promise<void>((resolve) => (allExited = resolve));
  const metrics = new MetricsCollector(logger);
  /** The requests each worker holds, by label set, as it reported them. */
  const held = new Map<number, Map<HeldKey, number>>();

  /** A send to a worker that is going away fails (EPIPE): never the primary's problem. */
  const tell = (worker: Worker, message: ToWorker) => {
    if (worker.isConnected()) worker.send(message, (error: Error | null) => error !== null && logger.debug({ err: error }, 'a message to a worker was lost'));
  };

  const stopAll = () => {
    if (stopping) return;
    stopping = true;
    for (const timer of restarts) clearTimeout(timer);
    restarts.clear();
    for (const worker of workers.values()) tell(worker, { type: 'waybill:drain' });
  };

  const fork = (index: number) => {
    const worker = cluster.fork({ [INDEX_ENV]: String(index), [COUNT_ENV]: String(count) });
    workers.set(index, worker);
    // An IPC write to a worker that just died: logged, never an uncaught error that ends the primary (and with it
    // every worker).
    worker.on('error', (error: Error) => logger.warn({ worker: index, err: error }, 'worker channel error'));
    worker.on('message', (message: ToPrimary) => {
      if (typeof message !== 'object' || message === null) return;
      if (message.type === 'waybill:listening') {
        listening.add(index);
        logger.info({ worker: index, pid: worker.process.pid }, 'worker listening');
        // Told to drain before it could hear it (a signal during its start-up): tell it again.
        if (stopping) tell(worker, { type: 'waybill:drain' });
        else if (!started && listening.size === count) {
          started = true;
          options.onListening(message.url, message.adminUrl, message.models);
        }
      } else if (message.type === 'waybill:fatal') {
        if (fatal === undefined) {
          fatal = { problem: message.problem, code: message.code };
          if (!started) options.onFatal(message.problem);
          else logger.error({ worker: index, problem: message.problem }, 'worker cannot serve');
        }
        if (!started) stopAll();
      } else if (message.type === 'waybill:metrics') {
        const serving = [...listening].map((i) => [i, workers.get(i)] as const).filter((entry): entry is readonly [number, Worker] => entry[1] !== undefined);
        metrics.collect(serving, tell).then(
          (body) => tell(worker, { type: 'waybill:metrics', id: message.id, body }),
          (error: unknown) => tell(worker, { type: 'waybill:metrics', id: message.id, error: String(error) }),
        );
      } else if (message.type === 'waybill:collected') {
        metrics.collected(index, message);
      } else if (message.type === 'waybill:limit') {
        let answer: ToWorker;
        try {
          answer = { type: 'waybill:limit', id: message.id, result: limits.answer(message.call, index, message.id) };
        } catch (error) {
          answer = { type: 'waybill:limit', id: message.id, error: String(error) };
        }
        tell(worker, answer);
      } else if (message.type === 'waybill:limit-cancel') {
        limits.cancel(index, message.id);
      } else if (message.type === 'waybill:owner') {
        // Relayed as it came to every other worker that serves; one that starts later does not learn it (its
        // residual: docs/security.md).
        if (!isOwner(message.id, message.tenant)) return;
        for (const i of listening) if (i !== index) {
          const other = workers.get(i);
          if (other !== undefined) tell(other, { type: 'waybill:owner', id: message.id, tenant: message.tenant });
        }
      } else if (message.type === 'waybill:routes') {
        // Relayed as it came to every other worker that serves (each checks the records' shape).
        if (!Array.isArray(message.routes)) return;
        const relayed: ToWorker = { type: 'waybill:routes', routes: message.routes };
        for (const i of listening) if (i !== index) {
          const other = workers.get(i);
          if (other !== undefined) tell(other, relayed);
        }
      } else if (message.type === 'waybill:held') {
        let counts = held.get(index);
        if (counts === undefined) held.set(index, (counts = new Map<HeldKey, number>()));
        for (const [key, delta] of message.deltas) {
          const value = (counts.get(key) ?? 0) + delta;
          if (value === 0) counts.delete(key);
          else counts.set(key, value);
        }
      }
    });
    // A worker's last messages (its fatal problem) arrive before its channel's 'disconnect', not always before 'exit'.
    worker.on('exit', (code, signal) => {
      if (worker.isConnected()) worker.once('disconnect', () => ended(code, signal));
      else ended(code, signal);
    });
    const ended = (code: number | null, signal: string | null) => {
      if (workers.get(index) === worker) workers.delete(index);
      listening.delete(index);
      metrics.retire(index);
      // Its requests in flight ended with it, in a reset the worker never counted: counted here.
      const lost = metrics.lost(held.get(index));
      held.delete(index);
      if (lost > 0) logger.warn({ worker: index, requests: lost }, 'a worker died with requests in flight: counted as lost (waybill_worker_lost_requests_total)');
      const freed = limits.workerGone(index);
      if (freed > 0) logger.warn({ worker: index, slots: freed }, "a worker's tenant-limit slots were given back");
      if (stopping || (fatal !== undefined && !started)) {
        if (workers.size === 0) allExited?.();
        return;
      }
      if (!started) {
        // Died before the gateway ever listened, without saying why: nothing to restart into.
        fatal = { problem: `waybill serve: worker ${index} exited during start-up (${signal ?? `code ${code}`})`, code: 1 };
        options.onFatal(fatal.problem);
        stopAll();
        if (workers.size === 0) allExited?.();
        return;
      }
      // The pause doubles while workers keep dying, and starts over after a minute without a death.
      const at = performance.now();
      crashes = at - lastCrash > 60_000 ? 1 : crashes + 1;
      lastCrash = at;
      const delay = Math.min(RESTART_MAX_MS, 500 * 2 ** Math.min(crashes - 1, 10));
      logger.error({ worker: index, code, signal, restartInMs: delay }, 'worker died; starting another');
      // Not unref'd: with every worker dead at once the cluster closed the listening handle, and this timer is all
      // that keeps the primary alive to start them again.
      const timer = setTimeout(() => {
        restarts.delete(timer);
        if (!stopping) fork(index);
        else if (workers.size === 0) allExited?.();
      }, delay);
      restarts.add(timer);
    };
  };

  const onHangup = () => {
    logger.info({ workers: workers.size }, 'SIGHUP: every worker reloads the configuration');
    for (const worker of workers.values()) tell(worker, { type: 'waybill:reload' });
  };
  process.on('SIGHUP', onHangup);
  for (let index = 0; index < count; index++) fork(index);

  void options.stopSignal.then((signal) => {
    process.off('SIGHUP', onHangup);
    process.on('SIGHUP', () => logger.warn('SIGHUP ignored: the gateway is shutting down'));
    logger.info({ signal, workers: workers.size }, 'shutting down: every worker drains');
    stopAll();
    if (workers.size === 0) allExited?.();
  });
  // A second signal: the CLI's waitForSignal exits at once; the workers go with it.
  process.once('exit', () => {
    for (const worker of workers.values()) worker.process.kill('SIGKILL');
  });

  await exited;
  return fatal !== undefined && !started ? fatal.code : 0;
}
