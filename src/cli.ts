/**
 * `waybill` — serve, sim, demo, check-config.
 */
import { waitForSignal } from './util/signals.js';
import { parseArgs } from 'node:util';
import type { AddressInfo } from 'node:net';
import { ConfigError, loadConfigFile, parseConfig, type Config } from './config/load.js';
import type { ConfigInput } from './config/schema.js';
import { createGateway } from './http/server.js';
import { startTracing } from './telemetry/tracing.js';
import { createSimulator } from './sim/server.js';
import { runSim } from './sim/main.js';
import { runLoad } from '../load/main.js';

const USAGE = `usage: waybill <command> [options]

commands:
  serve [--config FILE] [--upstream URL ...] [--model NAME ...] [--host H] [--port P]
        run the gateway (default port 8080). --upstream/--model configure one pool without a file;
        without --model the served models are discovered from the upstreams' GET /v1/models.
  sim [--port P] [--model NAME] ...      run the simulated vLLM (default port 8000); see docs/simulator.md
  demo [--port P]                        run the simulator and a gateway in front of it
  load --url URL ...                     the streaming load generator; waybill load --help
  check-config FILE                      validate a configuration file and exit
`;

function fail(message: string): number {
  console.error(message);
  return 2;
}


/** Builds the configuration for `serve` from a file and/or flags; flags override the file. */
export async function configFromServeArgs(argv: string[]): Promise<Config> {
  const { values } = parseArgs({
    args: argv,
    options: {
      config: { type: 'string' },
      upstream: { type: 'string', multiple: true },
      model: { type: 'string', multiple: true },
      host: { type: 'string' },
      port: { type: 'string' },
    },
    strict: true,
  });
  const problems: string[] = [];
  let port: number | undefined;
  if (values.port !== undefined) {
    port = Number(values.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535) problems.push(`--port: "${values.port}" is not a port number`);
  }
  if (values.model !== undefined && values.upstream === undefined) problems.push('--model: needs at least one --upstream');
  if (values.config === undefined && values.upstream === undefined) problems.push('give --config FILE or at least one --upstream URL');
  if (problems.length > 0) throw new ConfigError('command line', problems);

  const override = (input: ConfigInput): ConfigInput => {
    const next: ConfigInput = { ...input };
    if (values.upstream !== undefined) {
      next.pools = [
        {
          name: 'default',
          ...(values.model !== undefined ? { models: values.model } : {}),
          upstreams: values.upstream.map((url) => ({ url })),
        },
      ];
    }
    if (values.host !== undefined || port !== undefined) {
      next.server = { ...input.server, ...(values.host !== undefined ? { host: values.host } : {}), ...(port !== undefined ? { port } : {}) };
    }
    return next;
  };
  return values.config !== undefined ? loadConfigFile(values.config, override) : parseConfig(override({} as ConfigInput), 'command line');
}

async function serve(argv: string[]): Promise<number> {
  const config = await configFromServeArgs(argv);
  const tracing = startTracing(config.tracing);
  const gateway = createGateway(config, { tracing });
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
  const url = await gateway.listen();
  const admin = gateway.adminUrl;
  // With server.admin_port, the API port serves only the API: say where the operational endpoints went.
  const operations = admin === undefined ? {} : { metrics: `${admin}/metrics`, healthz: `${admin}/healthz`, readyz: `${admin}/readyz` };
  log.info({ url, models: gateway.upstreams.models(), ...operations }, 'waybill listening');
  const signal = await waitForSignal();
  log.info({ signal, inflight: gateway.inflight }, 'shutting down');
  await gateway.drain();
  // Telemetry last, so the spans of drained requests are exported.
  await tracing.shutdown();
  return 0;
}

async function checkConfig(argv: string[]): Promise<number> {
  const [file, ...rest] = argv;
  if (file === undefined || rest.length > 0) return fail('usage: waybill check-config FILE');
  const config = await loadConfigFile(file);
  const models = config.pools.flatMap((pool) => pool.models ?? [`(discovered for pool ${pool.name})`]);
  console.log(`${file}: OK — ${config.pools.length} pool(s), models: ${models.join(', ')}`);
  return 0;
}

async function demo(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { port: { type: 'string', default: '8080' } }, strict: true });
  const port = Number(values.port);
  if (!Number.isInteger(port)) return fail(`--port: "${values.port}" is not a port number`);
  const sim = createSimulator({ models: ['sim-model'] });
  const simAddress = await sim.listen(0, '127.0.0.1');
  const config = parseConfig(
    {
      server: { host: '127.0.0.1', port },
      pools: [{ name: 'sim', models: ['sim-model'], upstreams: [{ name: 'sim-0', url: simAddress.url }] }],
      // Keep the demo's terminal for the instructions below; `waybill serve` logs at info.
      logging: { level: 'warn' },
    },
    'demo',
  );
  const gateway = createGateway(config);
  await gateway.listen();
  const address = gateway.app.server.address() as AddressInfo;
  const base = `http://127.0.0.1:${address.port}`;
  console.log(`Waybill demo: gateway ${base} -> simulated vLLM ${simAddress.url}

Try a streamed chat completion:
  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

Then one the simulator breaks mid-stream (see docs/simulator.md for every fault):
  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' -H 'x-sim-fault: error_after=3' \\
    -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

And one that is delivered but not accepted: it asks for JSON, and the simulator (like a model served without
structured outputs) answers in prose, so its format_valid check fails (docs/output-contract.md):
  curl -N ${base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"Hello"}]}'

And see what the ledger says — HTTP status, delivery, acceptance:
  curl -s ${base}/metrics | grep -E '^waybill_(requests_total|requests_accepted_total|output_checks_total)'

Ctrl-C to stop.`);
  await waitForSignal();
  await gateway.close();
  await sim.close();
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'serve':
        return await serve(rest);
      case 'sim':
        return await runSim(rest);
      case 'demo':
        return await demo(rest);
      case 'load':
        return await runLoad(rest);
      case 'check-config':
        return await checkConfig(rest);
      case undefined:
      case 'help':
      case '--help':
      case '-h':
        console.log(USAGE);
        return command === undefined ? 2 : 0;
      default:
        return fail(`unknown command "${command}"\n\n${USAGE}`);
    }
  } catch (err) {
    if (err instanceof ConfigError) return fail(err.message);
    if (err instanceof TypeError && (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) return fail(`${err.message}\n\n${USAGE}`);
    throw err;
  }
}
