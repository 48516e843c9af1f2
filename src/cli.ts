/**
 * `waybill` — serve, sim, demo, load, check-config. Every command answers `--help` (`-h`); `waybill --version`.
 * Exit status: 0 success; 2 a problem the operator fixes (a bad flag, an invalid or unreadable configuration, a port
 * that cannot be listened on), as one message on stderr without a stack trace; 1 anything unexpected.
 */
import { waitForSignal } from './util/signals.js';
import { parseArgs } from 'node:util';
import type { AddressInfo } from 'node:net';
import type { Config } from './config/load.js';
import type { ConfigInput } from './config/schema.js';
import { buildInfo } from './util/build.js';
// Each command's modules are imported when it runs, so `--help` and `--version` answer at once, without loading the
// gateway, the configuration schema or OpenTelemetry (half a second).

const USAGE = `usage: waybill <command> [options]

commands
  serve          run the gateway in front of vLLM upstreams (default port 8080)
  demo           a simulated vLLM and a gateway in front of it, with curl commands to try
  sim            the simulated vLLM alone (default port 8000)
  load           the streaming load generator
  check-config   validate a configuration file and exit

  waybill <command> --help    a command's options and examples
  waybill --version           the version (also -v)

examples
  waybill demo
  waybill serve --upstream http://10.0.0.5:8000 --upstream http://10.0.0.6:8000
  waybill serve --config waybill.yaml
  waybill check-config waybill.yaml

exit status: 0 success; 2 a bad flag, an invalid configuration or a port that cannot be listened on (one message
on stderr); 1 anything else (waybill load: also mismatches found by --reconcile)
`;

const SERVE_USAGE = `usage: waybill serve [--config FILE] [--upstream URL ... [--upstream-api-key-env NAME]] [--model NAME ...] [--host H] [--port P] [--workers N]

Runs the gateway until SIGINT or SIGTERM, then drains (shutdown.grace, shutdown.drain_timeout) and exits 0.
SIGHUP re-reads --config FILE (with the same flags over it) and applies it without dropping a request in flight;
an invalid file is rejected with every problem logged (see docs/operations.md, "Reloading the configuration").
It logs JSON to stdout; its "waybill listening" line says where the API, /metrics, /healthz, /readyz and the
status page are. With more than one worker, one primary process forks them and they share the ports; /metrics adds
up every worker's (see docs/operations.md, "Workers").

options
  --config FILE      YAML configuration (see config.example.yaml, docs/configuration.md); the flags below override it
  --upstream URL     an OpenAI-compatible upstream (vLLM) base URL, repeatable: replaces the file's pools with one
  --model NAME       a model that pool serves, repeatable (needs --upstream); without it the models are
                     discovered from the upstreams' GET /v1/models
  --upstream-api-key-env NAME
                     the environment variable holding the --upstream servers' API key (vLLM's --api-key),
                     sent as Authorization: Bearer; like pools[].upstreams[].api_key_env
  --host H           listen address (default server.host, 0.0.0.0)
  --port P           API port (default server.port, 8080; 0 picks a free one)
  --workers N        processes serving the API: a number, or auto (default server.workers, auto: the cores this
                     process may use, its CPU affinity and cgroup quota)
  -h, --help         this help

examples
  waybill serve --upstream http://10.0.0.5:8000 --upstream http://10.0.0.6:8000
  waybill serve --upstream http://10.0.0.5:8000 --workers 4
  waybill serve --upstream http://10.0.0.5:8000 --model llama-3.1-8b-instruct --port 9000
  VLLM_API_KEY=... waybill serve --upstream http://10.0.0.5:8000 --upstream-api-key-env VLLM_API_KEY
  waybill serve --config waybill.yaml
`;

const DEMO_USAGE = `usage: waybill demo [--port P] [--engines N]

Starts the simulated vLLM (model sim-model, its engine model on: prefix cache, batching, KV pressure) and a gateway
in front of it on 127.0.0.1, prints curl commands to try, and runs until Ctrl-C.

options
  --port P       the gateway's port (default 8080; 0 picks a free one); the simulators take free ports
  --engines N    a fleet of N simulated engines behind the gateway, one pool (default 1)
  -h, --help     this help

examples
  waybill demo
  waybill demo --port 9090 --engines 4
`;

const CHECK_CONFIG_USAGE = `usage: waybill check-config [--skip-env] FILE

Validates FILE as \`waybill serve --config FILE\` would and exits: 0 when it is valid, 2 with the problems found
(each naming its field) when it is not, or when it cannot be read.

options
  --skip-env     do not read the environment variables the file names (pools[].upstreams[].api_key_env,
                 auth.keys[].key_env): check everything else, e.g. in CI where the secrets are not set
  -h, --help     this help

examples
  waybill check-config waybill.yaml
  waybill check-config --skip-env config.example.yaml   # in CI, without the API keys
`;

/** The commands whose help this module prints (sim and load print their own). */
const COMMAND_USAGE: ReadonlyMap<string, string> = new Map([
  ['serve', SERVE_USAGE],
  ['demo', DEMO_USAGE],
  ['check-config', CHECK_CONFIG_USAGE],
]);

function fail(message: string): number {
  console.error(message);
  return 2;
}

/** A bad command line: the problem, then where the command's options are. */
function usageError(command: string, message: string): number {
  return fail(`${message}\n(waybill ${command} --help: its options and examples)`);
}

/** `--help` or `-h` anywhere among a command's arguments: asking for help wins over every other flag. */
function wantsHelp(argv: readonly string[]): boolean {
  return argv.includes('--help') || argv.includes('-h');
}

function version(): string {
  const { version, revision } = buildInfo();
  return `waybill ${version}${revision === 'unknown' ? '' : ` (revision ${revision})`}`;
}

/** Why a listener could not be opened, by error code; `host` when the address is what to change, else the port. */
const LISTEN_REASONS: Readonly<Record<string, { readonly reason: string; readonly change: 'port' | 'host' }>> = {
  EADDRINUSE: { reason: 'the port is already in use', change: 'port' },
  EACCES: { reason: 'permission denied (ports below 1024 need privileges)', change: 'port' },
  EADDRNOTAVAIL: { reason: "the address is not one of this machine's", change: 'host' },
  ENOTFOUND: { reason: 'the host name does not resolve', change: 'host' },
  EAI_AGAIN: { reason: 'the host name does not resolve (yet)', change: 'host' },
};

/** What to change about a listener, e.g. 'choose another with --port' (the failed port, where known, as `port`). */
type ListenHint = (change: 'port' | 'host', port: number | undefined) => string;

/**
 * One line for a listener that could not be opened (a busy port, no permission, an address not this machine's),
 * naming the address and what to change; undefined for any other error.
 */
function listenProblem(err: unknown, command: string, hint: ListenHint): string | undefined {
  if (!(err instanceof Error)) return undefined;
  const { code, syscall, address, port, hostname } = err as NodeJS.ErrnoException & { address?: string; port?: number; hostname?: string };
  const known = code === undefined ? undefined : LISTEN_REASONS[code];
  // A cluster worker's listen fails in the primary's bind, and is reported as `bind`.
  if (known === undefined || !(syscall === 'listen' || syscall === 'bind' || (syscall === 'getaddrinfo' && hostname !== undefined))) return undefined;
  const host = address ?? hostname;
  const where = host === undefined ? `port ${port ?? '?'}` : `${host.includes(':') ? `[${host}]` : host}${port === undefined ? '' : `:${port}`}`;
  return `waybill ${command}: cannot listen on ${where}: ${known.reason} (${code}); ${hint(known.change, port)}`;
}

/** sim and demo: their flags. */
const flagHint: ListenHint = (change) => `choose another with --${change}`;

/**
 * An environment that has every variable: each name reads as a placeholder, and is recorded. For `check-config
 * --skip-env`, through parseConfig's env parameter.
 */
function placeholderEnv(asked: Set<string>): NodeJS.ProcessEnv {
  return new Proxy<NodeJS.ProcessEnv>({}, {
    get(_target, name) {
      if (typeof name !== 'string') return undefined;
      asked.add(name);
      return `(placeholder for ${name})`;
    },
  });
}

/** Builds the configuration for `serve` from a file and/or flags; flags override the file. */
export async function configFromServeArgs(argv: string[]): Promise<Config> {
  const { ConfigError, loadConfigFile, parseConfig } = await import('./config/load.js');
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

async function serve(argv: string[]): Promise<number> {
  const [workers, { WorkerLink }] = await Promise.all([import('./app/cluster.js'), import('./app/worker-link.js')]);
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
    import('./telemetry/tracing.js'),
    import('./app/gateway.js'),
    import('./telemetry/logger.js'),
    import('./proxy/cluster-limit-store.js'),
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
    if (link === undefined) return fail(problem);
    // The primary prints it, once for all workers.
    await link.fatal(problem, 2);
    link.close();
    return 2;
  }
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

/** One of several workers: the primary said where everything is; it says when to reload and when to drain. */
async function serveAsWorker(
  argv: string[],
  gateway: import('./app/gateway.js').Gateway,
  link: import('./app/worker-link.js').WorkerLink,
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
  const [{ createLogger }, { runPrimary }, { oversplitLimits }] = await Promise.all([import('./telemetry/logger.js'), import('./app/primary.js'), import('./config/workers.js')]);
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
function reloadOnHangup(argv: string[], gateway: import('./app/gateway.js').Gateway): () => void {
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
    const { ConfigError } = await import('./config/load.js');
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

async function checkConfig(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args: argv, options: { 'skip-env': { type: 'boolean', default: false } }, allowPositionals: true, strict: true });
  const [file, ...rest] = positionals;
  if (file === undefined || rest.length > 0) return usageError('check-config', file === undefined ? 'give the FILE to check' : `one FILE only, not ${positionals.length}`);
  const { loadConfigFile } = await import('./config/load.js');
  const skipped = new Set<string>();
  const config = await loadConfigFile(file, undefined, values['skip-env'] ? placeholderEnv(skipped) : process.env);
  const models = config.pools.flatMap((pool) => pool.models ?? [`(discovered for pool ${pool.name})`]);
  const notRead = skipped.size === 0 ? '' : `; not read (--skip-env): ${[...skipped].join(', ')}`;
  console.log(`${file}: OK — ${config.pools.length} pool(s), models: ${models.join(', ')}${notRead}`);
  return 0;
}

async function demo(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { port: { type: 'string', default: '8080' }, engines: { type: 'string', default: '1' } }, strict: true });
  const port = values.port.trim() === '' ? Number.NaN : Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) return fail(`--port: "${values.port}" is not a port number`);
  const engines = values.engines.trim() === '' ? Number.NaN : Number(values.engines);
  if (!Number.isInteger(engines) || engines < 1 || engines > 16) return fail(`--engines: "${values.engines}" is not an integer between 1 and 16`);
  const [{ parseConfig }, { createGateway }, { createSimulator }] = await Promise.all([
    import('./config/load.js'),
    import('./app/gateway.js'),
    import('./sim/server.js'),
  ]);
  // The demo's fleet runs the engine model (docs/simulator.md): cached_tokens and TTFT come from its prefix cache.
  const sims = Array.from({ length: engines }, (_, i) => createSimulator({ models: ['sim-model'], engineModel: true, promptTokensDetails: true, seed: 1 + i }));
  const simAddresses = await Promise.all(sims.map((s) => s.listen(0, '127.0.0.1')));
  const simAddress = simAddresses[0] ?? { url: '' };
  const closeSims = (): Promise<unknown> => Promise.all(sims.map((s) => s.close()));
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port },
      pools: [{ name: 'sim', models: ['sim-model'], upstreams: simAddresses.map((a, i) => ({ name: `sim-${i}`, url: a.url })) }],
      // Keep the demo's terminal for the instructions below; `waybill serve` logs at info.
      logging: { level: 'warn' },
    },
    'demo',
  );
  const gateway = createGateway(config);
  try {
    await gateway.listen();
  } catch (err) {
    await gateway.close();
    await closeSims();
    throw err;
  }
  const address = gateway.app.server.address() as AddressInfo;
  const base = `http://127.0.0.1:${address.port}`;
  const ejection =
    simAddresses.length === 1
      ? `Send it three times and sim-0 would be ejected, but passive health never ejects the last upstream of a pool
(health.max_ejection_percent, docs/operations.md): it keeps serving, and ${base}/readyz stays 200.`
      : `Break three answers of one engine and it is ejected for a while, up to health.max_ejection_percent of the pool
(docs/operations.md); ${base}/readyz stays 200 while any engine serves.`;
  const fleet = simAddresses.length === 1 ? `simulated vLLM ${simAddress.url}` : `${simAddresses.length} simulated vLLM engines ${simAddresses.map((a) => a.url).join(', ')}`;
  console.log(`Waybill demo: gateway ${base} -> ${fleet}

Try a streamed chat completion:
  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

Then one the simulator breaks mid-stream (see docs/simulator.md for every fault):
  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' -H 'x-sim-fault: error_after=3' \\
    -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'
${ejection}

And one that is delivered but not accepted: it asks for JSON, and the simulator (like a model served without
structured outputs) answers in prose, so its format_valid check fails (docs/output-contract.md):
  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"Hello"}]}'

And see what the ledger says — HTTP status, delivery, acceptance:
  curl -s ${base}/metrics | grep -E '^waybill_(requests_total|requests_accepted_total|output_checks_total)'
or watch it live in a browser: ${base}/status (docs/status-page.md)

Ctrl-C to stop.`);
  await waitForSignal();
  await gateway.close();
  await closeSims();
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    const usage = command === undefined ? undefined : COMMAND_USAGE.get(command);
    if (usage !== undefined && wantsHelp(rest)) {
      console.log(usage);
      return 0;
    }
    switch (command) {
      case 'serve':
        return await serve(rest);
      case 'sim':
        return await (await import('./sim/main.js')).runSim(rest);
      case 'demo':
        return await demo(rest);
      case 'load':
        return await (await import('../load/main.js')).runLoad(rest);
      case 'check-config':
        return await checkConfig(rest);
      case '--version':
      case '-v':
      case 'version':
        console.log(version());
        return 0;
      case 'help':
        // `waybill help serve` is `waybill serve --help`.
        if (rest[0] !== undefined && rest[0] !== 'help') return await main([rest[0], '--help']);
        console.log(USAGE);
        return 0;
      case '--help':
      case '-h':
        console.log(USAGE);
        return 0;
      case undefined:
        console.error(USAGE);
        return 2;
      default:
        return fail(`unknown command "${command}"\n\n${USAGE}`);
    }
  } catch (err) {
    const { ConfigError } = await import('./config/load.js');
    if (err instanceof ConfigError) return fail(err.message);
    if (err instanceof TypeError && (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      return usageError(command ?? '', err.message);
    }
    // serve says which of its listeners failed itself; load does not listen.
    const problem = command === 'sim' || command === 'demo' ? listenProblem(err, command, flagHint) : undefined;
    if (problem !== undefined) return fail(problem);
    throw err;
  }
}
