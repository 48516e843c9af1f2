/**
 * `waybill serve` (cli.ts parses the command): the configuration from a file and/or flags, then one gateway process
 * — alone, or one worker of several — or, with `server.workers` above 1, the primary that forks them
 * (app/primary.ts); SIGHUP reloads the configuration, SIGINT/SIGTERM drains. Each part's modules are imported when
 * it runs: the primary never loads the gateway, nor OpenTelemetry.
 */
import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';
import type { FastifyBaseLogger } from 'fastify';
import type { Config } from '../config/load.js';
import type { ConfigInput } from '../config/schema.js';
import { helpersYield } from '../config/workers.js';
import { waitForSignal } from '../util/signals.js';
import { HELPER_NICE, yieldHelperThreads } from './helper-threads.js';
import { listenProblem } from './listen-problem.js';

/** Builds the configuration for `serve` from a file and/or flags; flags override the file. */
export async function configFromServeArgs(argv: string[]): Promise<Config> {
  const { ConfigError, loadConfigFile, parseConfig } = await import('../config/load.js');
  const { values } = parseArgs({
    args: argv,
    options: {
      config: { type: 'string' },
      upstream: { type: 'string', multiple: true },
      model: { type: 'string', multiple: true },
      'upstream-api-key-env': { type: 'string' },
      host: { type: 'string' },
      port: { type: 'string' },
      workers: { type: 'string' },
    },
    strict: true,
  });
  const problems: string[] = [];
  let workers: number | 'auto' | undefined;
  if (values.workers !== undefined) {
    workers = values.workers === 'auto' ? 'auto' : Number(values.workers);
    if (workers !== 'auto' && (!Number.isInteger(workers) || workers < 1 || workers > 256)) problems.push(`--workers: "${values.workers}" is not auto or a number of processes from 1 to 256`);
  }
  let port: number | undefined;
  if (values.port !== undefined) {
    port = Number(values.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535) problems.push(`--port: "${values.port}" is not a port number`);
  }
  if (values.model !== undefined && values.upstream === undefined) problems.push('--model: needs at least one --upstream');
  const keyEnv = values['upstream-api-key-env'];
  if (keyEnv !== undefined && values.upstream === undefined) problems.push('--upstream-api-key-env: needs at least one --upstream');
  if (keyEnv !== undefined && !/^[A-Za-z_][A-Za-z0-9_]*$/.test(keyEnv)) problems.push(`--upstream-api-key-env: "${keyEnv}" is not an environment variable name`);
  if (values.config === undefined && values.upstream === undefined) problems.push('give --config FILE or at least one --upstream URL');
  if (problems.length > 0) throw new ConfigError('command line', problems);

  const override = (input: ConfigInput): ConfigInput => {
    const next: ConfigInput = { ...input };
    if (values.upstream !== undefined) {
      next.pools = [
        {
          name: 'default',
          ...(values.model !== undefined ? { models: values.model } : {}),
          // The key is read from the variable as api_key_env is: never on the command line, where ps shows it.
          upstreams: values.upstream.map((url) => ({ url, ...(keyEnv !== undefined ? { api_key_env: keyEnv } : {}) })),
        },
      ];
    }
    if (values.host !== undefined || port !== undefined || workers !== undefined) {
      next.server = {
        ...input.server,
        ...(values.host !== undefined ? { host: values.host } : {}),
        ...(port !== undefined ? { port } : {}),
        ...(workers !== undefined ? { workers } : {}),
      };
    }
    return next;
  };
  return values.config !== undefined ? loadConfigFile(values.config, override) : parseConfig(override({} as ConfigInput), 'command line');
}

export async function serve(argv: string[]): Promise<number> {
  const [workers, { WorkerLink }] = await Promise.all([import('../app/cluster.js'), import('../app/worker-link.js')]);
  const identity = workers.workerIdentity();
  // A worker listens to its primary before anything else: a drain sent during its start-up is not lost.
  const link = identity === undefined ? undefined : new WorkerLink();
  const config = await configFromServeArgs(argv);
  // A cluster worker of another supervisor (no WAYBILL_WORKER_INDEX) runs as one process, never as a primary.
  if (identity === undefined && !workers.isClusterWorker()) {
    const count = workers.workersOnThisMachine(config.server.workers);
    if (count > 1) return servePrimary(config, count);
  }
  const [{ startTracing }, { createGateway }, { createLogger }, { ClusterLimitStore }] = await Promise.all([
    import('../telemetry/tracing.js'),
    import('../app/gateway.js'),
    import('../telemetry/logger.js'),
    import('../proxy/cluster-limit-store.js'),
  ]);
  const tracing = startTracing(config.tracing);
  // A worker: its primary aggregates the metrics and counts the tenants' limits; its log lines say which it is.
  const gateway = createGateway(config, {
    tracing,
    ...(identity !== undefined &&
      link !== undefined && {
        logger: createLogger(config.logging).child({ worker: identity.index }),
        worker: { ...identity, scrape: () => link.scrape(), limitStore: new ClusterLimitStore(link.limits), held: link.held, owners: link.owners, routes: link.routes },
      }),
  });
  link?.serveMetrics(gateway.metrics.registry);
  const log = gateway.app.log;
  log.info(
    {
      pools: config.pools.map((pool) => ({
        name: pool.name,
        models: pool.models ?? 'discovered',
        upstreams: pool.upstreams.map((u) => `${u.name}=${u.url.origin}${u.apiKey === undefined ? '' : ' (api key set)'}`),
        admission: pool.admission ?? 'off',
      })),
      tracing: tracing.endpoint ?? 'off',
    },
    'configuration loaded',
  );
  let url: string;
  try {
    url = await gateway.listen();
  } catch (err) {
    const adminPort = config.server.admin_port;
    const problem = listenProblem(err, 'serve', (change, port) =>
      adminPort !== undefined && adminPort !== 0 && port === adminPort
        ? 'choose another server.admin_port (the admin listener)'
        : `choose another with --${change} or server.${change}${change === 'host' && adminPort !== undefined ? ' (or server.admin_host)' : ''}`,
    );
    if (problem === undefined) throw err;
    await gateway.close();
    await tracing.shutdown();
    if (link === undefined) {
      console.error(problem);
      return 2;
    }
    // The primary prints it, once for all workers.
    await link.fatal(problem, 2);
    link.close();
    return 2;
  }
  lowerHelperThreads(config.server.helper_threads, identity?.count ?? 1, log);
  if (link !== undefined) return serveAsWorker(argv, gateway, link, url, () => tracing.shutdown());
  // Where everything is, in one line: with server.admin_port the operational endpoints are on the admin listener.
  const ops = gateway.adminUrl ?? url;
  log.info(
    { url, models: gateway.upstreams.models(), metrics: `${ops}/metrics`, healthz: `${ops}/healthz`, readyz: `${ops}/readyz`, status: `${ops}/status`, docs: 'docs/operations.md' },
    'waybill listening',
  );
  const onHangup = reloadOnHangup(argv, gateway);
  process.on('SIGHUP', onHangup);
  const signal = await waitForSignal();
  process.off('SIGHUP', onHangup);
  // A SIGHUP during the drain changes nothing (and does not end the process either).
  process.on('SIGHUP', () => log.warn('SIGHUP ignored: the gateway is shutting down'));
  log.info({ signal, inflight: gateway.inflight }, 'shutting down');
  await gateway.drain();
  // Telemetry last, so the spans of drained requests are exported.
  await tracing.shutdown();
  return 0;
}

/**
 * `server.helper_threads` once the gateway listens (app/helper-threads.ts): by then V8's and libuv's threads have
 * started. One line says what was done; `yield` where it cannot be done is a warning, `auto` there says nothing.
 */
function lowerHelperThreads(setting: Config['server']['helper_threads'], workers: number, log: FastifyBaseLogger): void {
  if (!helpersYield(setting, workers, availableParallelism())) return;
  const result = yieldHelperThreads();
  if (result === undefined) {
    if (setting === 'yield') log.warn({ helper_threads: setting, platform: process.platform }, "server.helper_threads: yield needs Linux and this process's /proc; the helper threads keep their priority");
    return;
  }
  const line = { helper_threads: setting, pid: process.pid, nice: HELPER_NICE, lowered: result.lowered, threadpool_kept: result.threadpool, ...(result.refused > 0 && { refused: result.refused, reason: result.reason }) };
  if (result.refused > 0) log.warn(line, 'helper threads lowered to nice 19, some refused');
  else log.info(line, "helper threads lowered to nice 19: they run in the serving thread's idle time");
}

/** One of several workers: the primary said where everything is; it says when to reload and when to drain. */
async function serveAsWorker(
  argv: string[],
  gateway: import('../app/gateway.js').Gateway,
  link: import('../app/worker-link.js').WorkerLink,
  url: string,
  shutdownTracing: () => Promise<void>,
): Promise<number> {
  link.reloads(reloadOnHangup(argv, gateway));
  link.listening(url, gateway.adminUrl, gateway.upstreams.models());
  await link.drain;
  gateway.app.log.info({ inflight: gateway.inflight }, 'worker shutting down');
  await gateway.drain();
  await shutdownTracing();
  link.close();
  return 0;
}

/**
 * `serve` with more than one worker (server.workers): this process forks them and serves nothing itself
 * (app/primary.ts). Its lines: the start-up line once every worker listens, and the workers' comings and goings.
 */
async function servePrimary(config: Config, count: number): Promise<number> {
  const [{ createLogger }, { runPrimary }, { oversplitLimits }] = await Promise.all([import('../telemetry/logger.js'), import('../app/primary.js'), import('../config/workers.js')]);
  const log = createLogger(config.logging).child({ primary: true });
  const over = oversplitLimits(config, count);
  if (over.length > 0) log.warn({ limits: over, workers: count }, 'limits smaller than the number of workers: each worker keeps at least 1, so together they allow more');
  return runPrimary({
    count,
    logger: log,
    onListening: (url, adminUrl, models) => {
      const ops = adminUrl ?? url;
      log.info(
        { url, workers: count, models, metrics: `${ops}/metrics`, healthz: `${ops}/healthz`, readyz: `${ops}/readyz`, status: `${ops}/status`, docs: 'docs/operations.md' },
        'waybill listening',
      );
    },
    onFatal: (problem) => console.error(problem),
    stopSignal: waitForSignal(),
  });
}

/**
 * SIGHUP: re-reads the configuration as `serve` read it (the same file, the same flags over it) and reloads the
 * gateway with it (docs/operations.md, "Reloading the configuration"). An invalid file is rejected with every problem
 * logged, and the configuration in force stays. Reloads run one at a time.
 */
function reloadOnHangup(argv: string[], gateway: import('../app/gateway.js').Gateway): () => void {
  const log = gateway.app.log;
  const { values } = parseArgs({ args: argv, options: { config: { type: 'string' } }, strict: false });
  const file = typeof values.config === 'string' ? values.config : undefined;
  let queue: Promise<void> = Promise.resolve();
  const reload = async () => {
    if (file === undefined) {
      log.warn('SIGHUP: nothing to reload: the configuration comes from flags alone (serve --config FILE reloads FILE)');
      return;
    }
    log.info({ file }, 'SIGHUP: reloading the configuration');
    const { ConfigError } = await import('../config/load.js');
    let next: Config;
    try {
      next = await configFromServeArgs(argv);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      gateway.metrics.configReloaded('invalid');
      log.error({ file, problems: err.problems, hash: gateway.configHash }, `configuration reload rejected: ${err.problems.length} problem(s) in ${err.source}; the configuration in force stays`);
      for (const problem of err.problems) log.error({ file, problem }, `configuration reload: ${problem}`);
      return;
    }
    await gateway.reload(next);
  };
  return () => {
    queue = queue.then(reload).catch((err: unknown) => log.error({ err }, 'configuration reload failed; the configuration in force stays'));
  };
}
