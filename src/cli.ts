/**
 * `waybill` — serve, sim, demo, load, check-config. Every command answers `--help` (`-h`); `waybill --version`.
 * Exit status: 0 success; 2 a problem the operator fixes (a bad flag, an invalid or unreadable configuration, a port
 * that cannot be listened on), as one message on stderr without a stack trace; 1 anything unexpected. `serve` runs
 * from app/serve.ts.
 */
import { waitForSignal } from './util/signals.js';
import { parseArgs } from 'node:util';
import type { AddressInfo } from 'node:net';
import { buildInfo } from './util/build.js';
import { listenProblem, type ListenHint } from './app/listen-problem.js';
import { tuneV8ForGateway } from './app/v8-tuning.js';
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

/**
 * Runs a command that logs JSON lines, then waits for stdout to take the last of them (the drain's): the exit that
 * follows does not wait for a write in flight. A stalled stdout costs the wait, never a hang (telemetry/log-destination.ts).
 */
async function logsFlushed(command: () => Promise<number>): Promise<number> {
  const code = await command();
  const { flushStdout, EXIT_FLUSH_TIMEOUT_MS } = await import('./telemetry/log-destination.js');
  await flushStdout(EXIT_FLUSH_TIMEOUT_MS);
  return code;
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
        tuneV8ForGateway();
        return await logsFlushed(async () => (await import('./app/serve.js')).serve(rest));
      case 'sim':
        return await logsFlushed(async () => (await import('./sim/main.js')).runSim(rest));
      case 'demo':
        tuneV8ForGateway();
        return await logsFlushed(() => demo(rest));
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
