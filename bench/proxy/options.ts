/** The bench's command line: its flags (documented in docs/performance.md), their defaults and their checks. */
import { execFileSync } from 'node:child_process';
import { measuresRequests, SCENARIOS, type Scenario } from './scenarios.js';

export interface Options {
  seconds: number;
  repeats: number;
  scenarios: Scenario[];
  /** Overrides every streaming scenario's tokens per request. */
  outputTokens: number | undefined;
  seed: number;
  out: string;
  nginx: string | undefined;
  /** The node-floor row (bench/proxy/floor.ts). */
  floor: boolean;
  lean: boolean;
  otel: boolean;
  /** The waybill-2w row. */
  workers: boolean;
  contractVariant: boolean;
  /** The waybill-turns-off row at max: streaming.turn_budget 0, what fairness under saturation buys. */
  turnsOff: boolean;
  profile: string[];
  profileDir: string | undefined;
  perf: boolean;
  minWarmupS: number;
  keep: boolean;
  /** `--variant NAME=JSON`: a waybill-NAME row, the default configuration with JSON's keys merged over it. */
  variants: { name: string; config: Record<string, unknown> }[];
}

export const USAGE = `usage: node dist/bench/proxy.js [options]
  --seconds N          measured window per target and repeat (default 10)
  --repeats N          repeats; medians are reported (default 2)
  --scenarios LIST     any of ${SCENARIOS.map((s) => s.name).join(',')} (default ${SCENARIOS.filter((s) => s.byDefault).map((s) => s.name).join(',')}), or none
  --tokens N           output tokens per streamed request (default: the scenario's, 64 or 200; reqs stays at 1)
  --seed N             simulator seed (default 1)
  --warmup N           minimum warm-up seconds before each window (default 2)
  --nginx PATH|off     nginx binary (default: nginx on PATH, if any)
  --no-lean            skip the waybill-lean row (request logs off, level warn); --no-log-variant is the same
  --no-turns-off       skip the waybill-turns-off row at max (streaming.turn_budget 0: no fairness under saturation)
  --no-floor           skip the node-floor row (bench/proxy/floor.ts: Node's HTTP server and undici, nothing else)
  --no-otel            skip the waybill+otel row (tracing on, OTLP to a closed port)
  --no-workers         skip the waybill-2w row (--workers 2 on the same core: what a second worker costs)
  --no-contract-variant  skip the run whose requests ask for an output contract (response_format json_object)
  --profile [LIST]     also CPU-profile the gateway under these scenarios (default c64s,max)
  --profile-dir DIR    where the .cpuprofile files go (default a new /tmp directory, kept)
  --perf               with --profile: also count syscalls per event and split CPU by binary with Linux perf,
                       for Waybill and nginx (needs perf on PATH)
  --out FILE           JSON results (default bench-results.json)
  --keep               keep the temporary directory (configs, child logs)
  --variant NAME=JSON  also a waybill-NAME row: the default configuration with JSON's top-level keys over it (server's
                       keys merged with the bench's host and port), e.g. --variant signals-off='{"engine_signals":
                       {"enabled":false}}' or --variant helpers-share='{"server":{"helper_threads":"share"}}' (repeatable)`;

export function parseOptions(argv: string[]): Options {
  const options: Options = {
    seconds: 10,
    repeats: 2,
    scenarios: SCENARIOS.filter((s) => s.byDefault),
    outputTokens: undefined,
    seed: 1,
    out: 'bench-results.json',
    nginx: onPath('nginx'),
    floor: true,
    lean: true,
    otel: true,
    workers: true,
    contractVariant: true,
    turnsOff: true,
    profile: [],
    profileDir: undefined,
    perf: false,
    minWarmupS: 2,
    keep: false,
    variants: [],
  };
  const number = (flag: string, raw: string | undefined, min: number): number => {
    const value = Number(raw);
    if (raw === undefined || !Number.isFinite(value) || value < min) throw new UsageError(`${flag}: needs a number >= ${min}`);
    return value;
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i] as string;
    const next = () => argv[++i];
    switch (flag) {
      case '--seconds':
        options.seconds = number(flag, next(), 0.5);
        break;
      case '--repeats':
        options.repeats = Math.round(number(flag, next(), 1));
        break;
      case '--tokens':
        options.outputTokens = Math.round(number(flag, next(), 2));
        break;
      case '--seed':
        options.seed = Math.round(number(flag, next(), 0));
        break;
      case '--warmup':
        options.minWarmupS = number(flag, next(), 0);
        break;
      case '--scenarios': {
        const list = next() ?? '';
        options.scenarios = list === 'none' ? [] : list.split(',').map(scenarioNamed);
        break;
      }
      case '--nginx': {
        const path = next();
        if (path === undefined) throw new UsageError('--nginx: needs a path or "off"');
        options.nginx = path === 'off' ? undefined : path;
        break;
      }
      case '--no-lean':
      case '--no-log-variant':
        options.lean = false;
        break;
      case '--no-turns-off':
        options.turnsOff = false;
        break;
      case '--no-floor':
        options.floor = false;
        break;
      case '--no-otel':
        options.otel = false;
        break;
      case '--no-workers':
        options.workers = false;
        break;
      case '--no-contract-variant':
        options.contractVariant = false;
        break;
      case '--profile': {
        const list = argv[i + 1];
        if (list !== undefined && !list.startsWith('--')) {
          i++;
          options.profile = list.split(',').map((name) => scenarioNamed(name).name);
        } else {
          options.profile = ['c64s', 'max'];
        }
        break;
      }
      case '--perf':
        options.perf = true;
        break;
      case '--profile-dir':
        options.profileDir = next();
        break;
      case '--out':
        options.out = next() ?? options.out;
        break;
      case '--keep':
        options.keep = true;
        break;
      case '--variant':
        options.variants.push(parseVariant(next()));
        break;
      case '-h':
      case '--help':
        console.log(USAGE);
        process.exit(0);
        break;
      default:
        throw new UsageError(`unknown flag ${flag}`);
    }
  }
  return options;
}

export class UsageError extends Error {}

const BENCH_KEYS = ['pools', 'shutdown'];
/** The `server` keys a variant may not set: where the gateway listens, and how many processes (`--workers`). */
const BENCH_SERVER_KEYS = ['host', 'port', 'admin_port', 'admin_host', 'workers'];
/** The built-in rows' suffixes (waybill-lean, waybill-2w, …) and names their config and log files take. */
const BUILT_IN_ROWS = ['lean', 'otel', '2w', 'turns-off', 'contract'];

/** `NAME=JSON`: a row name of letters, digits and dashes, and a JSON object of configuration keys. */
export function parseVariant(raw: string | undefined): { name: string; config: Record<string, unknown> } {
  const at = raw?.indexOf('=') ?? -1;
  const name = raw?.slice(0, at) ?? '';
  if (raw === undefined || at < 1 || !/^[a-z0-9-]+$/.test(name)) throw new UsageError('--variant: needs NAME=JSON, NAME of a-z, 0-9 and -');
  const config = parseConfigKeys(`--variant ${name}`, raw.slice(at + 1));
  if (BUILT_IN_ROWS.includes(name)) throw new UsageError(`--variant ${name}: waybill-${name} is a built-in row`);
  return { name, config };
}

/**
 * A JSON object of configuration keys for a gateway the bench starts (`--variant`, bench/ab.js `--a-config`): none of
 * the bench's own — where the gateway listens, what it proxies, how fast it stops. `label` names the flag in errors.
 */
export function parseConfigKeys(label: string, json: string): Record<string, unknown> {
  let config: unknown;
  try {
    config = JSON.parse(json);
  } catch {
    throw new UsageError(`${label}: the configuration is not JSON`);
  }
  if (typeof config !== 'object' || config === null || Array.isArray(config)) throw new UsageError(`${label}: the configuration must be a JSON object`);
  for (const key of BENCH_KEYS) if (key in config) throw new UsageError(`${label}: ${key} is the bench's own (set per row)`);
  if ('server' in config) {
    const server = config.server;
    if (typeof server !== 'object' || server === null || Array.isArray(server)) throw new UsageError(`${label}: server must be a JSON object`);
    for (const key of BENCH_SERVER_KEYS) if (key in server) throw new UsageError(`${label}: server.${key} is the bench's own (set per row)`);
  }
  return config as Record<string, unknown>;
}

/** Output tokens per request in `scenario`, after `--tokens`. */
export function tokensOf(scenario: Scenario, options: Options): number {
  return measuresRequests(scenario) ? scenario.tokens : (options.outputTokens ?? scenario.tokens);
}

export function scenarioNamed(name: string): Scenario {
  const scenario = SCENARIOS.find((s) => s.name === name);
  if (scenario === undefined) throw new UsageError(`unknown scenario "${name}" (one of ${SCENARIOS.map((s) => s.name).join(', ')})`);
  return scenario;
}

export function onPath(command: string): string | undefined {
  try {
    const found = execFileSync('sh', ['-c', `command -v ${command}`], { encoding: 'utf8' }).trim();
    return found === '' ? undefined : found;
  } catch {
    return undefined;
  }
}

