/** `waybill sim`: the simulated vLLM as a process. Flags are documented in docs/simulator.md. */
import { waitForSignal } from '../util/signals.js';
import { parseArgs } from 'node:util';
import { FAULT_KINDS, isFaultKind, type FaultKind } from './faults.js';
import { DEFAULT_SIM_OPTIONS, validateSimOptions, type SimOptions } from './options.js';
import { createSimulator, type Simulator } from './server.js';

export interface SimArgs {
  /** The first engine's port (the fleet's are port + i unless --ports lists them). */
  readonly port: number;
  readonly host: string;
  /** The first engine's options (the fleet's are in `engines`). */
  readonly options: Readonly<SimOptions>;
  /** One per engine (--engines N): its port and options, per-engine overrides applied. */
  readonly engines: ReadonlyArray<{ readonly port: number; readonly options: Readonly<SimOptions> }>;
}

export type SimArgsResult = { readonly ok: true; readonly args: SimArgs } | { readonly ok: false; readonly message: string };

/** The flag behind each option, for messages (and the docs check). */
export const FLAG_OF: Readonly<Record<keyof SimOptions, string>> = {
  models: '--model',
  ttftMs: '--ttft-ms',
  prefillMsPer1kTokens: '--prefill-ms-per-1k-tokens',
  itlMs: '--itl-ms',
  outputTokens: '--output-tokens',
  jitter: '--jitter',
  tokensPerEvent: '--tokens-per-event',
  cachedTokens: '--cached-tokens',
  promptTokensDetails: '--prompt-tokens-details',
  forceIncludeUsage: '--force-include-usage',
  responsesStore: '--responses-store',
  embeddingDimensions: '--embedding-dimensions',
  apiKey: '--api-key',
  seed: '--seed',
  faultRate: '--fault-rate',
  faultKinds: '--fault-kinds',
  lengthRate: '--length-rate',
  engineModel: '--engine-model',
  blockSize: '--block-size',
  kvBlocks: '--kv-blocks',
  maxNumSeqs: '--max-num-seqs',
  maxNumBatchedTokens: '--max-num-batched-tokens',
  enablePrefixCaching: '--no-enable-prefix-caching',
  stepBaseMs: '--step-base-ms',
  stepPrefillTokenMs: '--step-prefill-token-ms',
  stepDecodeSeqMs: '--step-decode-seq-ms',
  kvCacheMetrics: '--kv-cache-metrics',
  metricsCompat: '--metrics-compat',
  revision: '--revision',
  externalLoad: '--external-load',
  externalPromptTokens: '--external-prompt-tokens',
  externalOutputTokens: '--external-output-tokens',
  restartEveryMs: '--restart-every',
};

/** The options an `--engine I:key=value,…` override may set, by key (a flag's name without its dashes). */
const ENGINE_OVERRIDES: Readonly<Record<string, keyof SimOptions>> = {
  'kv-blocks': 'kvBlocks',
  'max-num-seqs': 'maxNumSeqs',
  'max-num-batched-tokens': 'maxNumBatchedTokens',
  'step-base-ms': 'stepBaseMs',
  'step-prefill-token-ms': 'stepPrefillTokenMs',
  'step-decode-seq-ms': 'stepDecodeSeqMs',
  revision: 'revision',
  'external-load': 'externalLoad',
  'restart-every': 'restartEveryMs',
  'fault-rate': 'faultRate',
  'length-rate': 'lengthRate',
  'output-tokens': 'outputTokens',
};

/** Flags only the timer reads (`--engine-model off`). */
const TIMER_FLAGS = ['--ttft-ms', '--itl-ms', '--prefill-ms-per-1k-tokens', '--jitter', '--cached-tokens'] as const;

/** Most engines one `waybill sim` runs. */
export const MAX_ENGINES = 64;

const D = DEFAULT_SIM_OPTIONS;

/** `text` in lines of at most `width` characters, each after `indent`, broken at spaces. */
function wrap(text: string, width: number, indent: string): string {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(' ')) {
    if (line !== '' && indent.length + line.length + 1 + word.length > width) {
      lines.push(indent + line);
      line = word;
    } else line = line === '' ? word : `${line} ${word}`;
  }
  if (line !== '') lines.push(indent + line);
  return lines.join('\n');
}

/** `waybill sim --help`; every flag of FLAG_OF, with the defaults of DEFAULT_SIM_OPTIONS. */
export const SIM_USAGE = `usage: waybill sim [--port 8000] [--host 127.0.0.1] [--model NAME ...] [options]

The simulated vLLM: speaks vLLM's OpenAI-compatible API with generated text, paced by a model of vLLM's engine
(prefix cache of KV blocks, continuous batching, preemption) or by a timer, and breaks answers on request (header
x-sim-fault) or at random (--fault-rate). One engine per port; --engines N runs a fleet. Prints each URL, runs until
SIGINT or SIGTERM. Every flag, every fault: docs/simulator.md.

options
  --port P                         port (default 8000; 0 picks a free one)
  --host H                         listen address (default 127.0.0.1)
  --model NAME                     a served model, repeatable (default ${D.models.join(', ')}); the first labels /metrics
  --engines N                      run N engines, on ports P..P+N-1 (default 1; at most ${MAX_ENGINES})
  --ports P1,P2,...                one port per engine instead (0 picks free ones)
  --engine I:key=value,...         override engine I (0-based), repeatable; keys: ${Object.keys(ENGINE_OVERRIDES).join(', ')}
  --engine-model on|off            the engine model (default on) or the timer below (off)
  --block-size N                   tokens per KV block, like vLLM's (default ${D.blockSize})
  --kv-blocks N                    KV capacity in blocks (default ${D.kvBlocks})
  --max-num-seqs N                 sequences running at once, like vLLM's (default ${D.maxNumSeqs})
  --max-num-batched-tokens N       tokens per step, prefill and decode, like vLLM's (default ${D.maxNumBatchedTokens})
  --no-enable-prefix-caching       like vLLM's: no prefix cache
  --step-base-ms MS                step cost: fixed part (default ${D.stepBaseMs})
  --step-prefill-token-ms MS       step cost: per prompt token computed (default ${D.stepPrefillTokenMs})
  --step-decode-seq-ms MS          step cost: per sequence decoding (default ${D.stepDecodeSeqMs})
  --kv-cache-metrics               like vLLM's: the KV block residency histograms on /metrics
  --metrics-compat current|old     old: serve the pre-rename vllm:gpu_cache_usage_perc (default ${D.metricsCompat})
  --revision R                     what GET /version reports (default ${D.revision})
  --external-load RATE             other clients' requests per second straight into the engine (default ${D.externalLoad})
  --external-prompt-tokens N       their prompt length (default ${D.externalPromptTokens})
  --external-output-tokens N       their output length (default ${D.externalOutputTokens})
  --restart-every DURATION         restart the engine (cache and counters emptied) every 30s, 5m, 500ms… (default never)
  --ttft-ms MS                     engine model off: request to first output event (default ${D.ttftMs})
  --prefill-ms-per-1k-tokens MS    engine model off: the first event waits this much longer per 1 000 prompt tokens (default ${D.prefillMsPer1kTokens})
  --itl-ms MS                      engine model off: delay between output events (default ${D.itlMs})
  --output-tokens N                tokens per choice, capped by max_tokens (default ${D.outputTokens})
  --jitter F                       engine model off: each delay scaled by a seeded factor in [1 - F, 1 + F] (default ${D.jitter})
  --tokens-per-event N             tokens carried by one output event (default ${D.tokensPerEvent})
  --cached-tokens N                with --prompt-tokens-details: usage's cached_tokens (default ${D.cachedTokens})
  --prompt-tokens-details          like vLLM's --enable-prompt-tokens-details
  --force-include-usage            like vLLM's --enable-force-include-usage
  --responses-store                like vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1: store, background, GET and cancel
  --embedding-dimensions N         length of /v1/embeddings and /pooling vectors (default ${D.embeddingDimensions})
  --api-key KEY                    require Authorization: Bearer KEY, like vLLM's --api-key (default none)
  --seed N                         seeds jitter, interleaving and random faults (default ${D.seed})
  --fault-rate F                   share of requests without x-sim-fault that get a random fault (default ${D.faultRate})
  --fault-kinds a,b,...            kinds random faults are drawn from, comma-separated (default all):
${wrap(FAULT_KINDS.join(', '), 100, ' '.repeat(35))}
  --length-rate F                  share of chat/completions answers without a fault that end with finish_reason
                                   length (default ${D.lengthRate})
  -h, --help                       this help

examples
  waybill sim --port 8000 --model llama-3.1-8b-instruct
  waybill sim --port 8001 --engines 4 --kv-blocks 2048 --engine 3:external-load=20 --prompt-tokens-details
  waybill sim --port 8001 --engine-model off --itl-ms 20 --fault-rate 0.05 --seed 7
`;

/** Parse `waybill sim` flags; every problem is reported, each naming its flag. */
export function parseSimArgs(argv: string[]): SimArgsResult {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        port: { type: 'string', default: '8000' },
        host: { type: 'string', default: '127.0.0.1' },
        model: { type: 'string', multiple: true },
        'ttft-ms': { type: 'string' },
        'prefill-ms-per-1k-tokens': { type: 'string' },
        'itl-ms': { type: 'string' },
        'output-tokens': { type: 'string' },
        jitter: { type: 'string' },
        'tokens-per-event': { type: 'string' },
        'cached-tokens': { type: 'string' },
        'prompt-tokens-details': { type: 'boolean' },
        'force-include-usage': { type: 'boolean' },
        'responses-store': { type: 'boolean' },
        'embedding-dimensions': { type: 'string' },
        'api-key': { type: 'string' },
        seed: { type: 'string' },
        'fault-rate': { type: 'string' },
        'length-rate': { type: 'string' },
        'fault-kinds': { type: 'string' },
        engines: { type: 'string' },
        ports: { type: 'string' },
        engine: { type: 'string', multiple: true },
        'engine-model': { type: 'string' },
        'block-size': { type: 'string' },
        'kv-blocks': { type: 'string' },
        'max-num-seqs': { type: 'string' },
        'max-num-batched-tokens': { type: 'string' },
        'no-enable-prefix-caching': { type: 'boolean' },
        'step-base-ms': { type: 'string' },
        'step-prefill-token-ms': { type: 'string' },
        'step-decode-seq-ms': { type: 'string' },
        'kv-cache-metrics': { type: 'boolean' },
        'metrics-compat': { type: 'string' },
        revision: { type: 'string' },
        'external-load': { type: 'string' },
        'external-prompt-tokens': { type: 'string' },
        'external-output-tokens': { type: 'string' },
        'restart-every': { type: 'string' },
      },
    }));
  } catch (error) {
    return { ok: false, message: error instanceof Error ? error.message : String(error) };
  }

  const problems: string[] = [];
  const number = (flag: string, raw: string | undefined): number | undefined => {
    if (raw === undefined) return undefined;
    const parsed = raw.trim() === '' ? Number.NaN : Number(raw);
    if (!Number.isFinite(parsed)) problems.push(`${flag}: "${raw}" is not a number`);
    return parsed;
  };

  const port = number('--port', values.port) ?? 8000;
  if (Number.isFinite(port) && !(Number.isInteger(port) && port >= 0 && port <= 65535)) {
    problems.push(`--port: "${values.port}" is not a port number`);
  }
  const partial: Partial<SimOptions> = {};
  const set = <K extends keyof SimOptions>(key: K, value: SimOptions[K] | undefined): void => {
    if (value !== undefined) partial[key] = value;
  };
  set('models', values.model);
  set('ttftMs', number('--ttft-ms', values['ttft-ms']));
  set('prefillMsPer1kTokens', number('--prefill-ms-per-1k-tokens', values['prefill-ms-per-1k-tokens']));
  set('itlMs', number('--itl-ms', values['itl-ms']));
  set('outputTokens', number('--output-tokens', values['output-tokens']));
  set('jitter', number('--jitter', values.jitter));
  set('tokensPerEvent', number('--tokens-per-event', values['tokens-per-event']));
  set('cachedTokens', number('--cached-tokens', values['cached-tokens']));
  set('promptTokensDetails', values['prompt-tokens-details']);
  set('forceIncludeUsage', values['force-include-usage']);
  set('responsesStore', values['responses-store']);
  set('embeddingDimensions', number('--embedding-dimensions', values['embedding-dimensions']));
  set('apiKey', values['api-key']);
  set('seed', number('--seed', values.seed));
  set('faultRate', number('--fault-rate', values['fault-rate']));
  set('lengthRate', number('--length-rate', values['length-rate']));
  const engineModel = values['engine-model'] ?? 'on';
  if (engineModel !== 'on' && engineModel !== 'off') problems.push(`--engine-model: "${engineModel}" is not on or off`);
  // The CLI runs the engine model unless told not to; the programmatic default stays the timer (scripted timings).
  set('engineModel', engineModel !== 'off');
  if (engineModel !== 'off') {
    // The timer's flags would be silently ignored by the engine model: say so instead.
    for (const flag of TIMER_FLAGS) {
      if (values[flag.slice(2) as keyof typeof values] !== undefined) {
        problems.push(`${flag}: a timer setting, not used by the engine model; add --engine-model off (the engine's timing is --step-base-ms, --step-prefill-token-ms, --step-decode-seq-ms)`);
      }
    }
  }
  set('blockSize', number('--block-size', values['block-size']));
  set('kvBlocks', number('--kv-blocks', values['kv-blocks']));
  set('maxNumSeqs', number('--max-num-seqs', values['max-num-seqs']));
  set('maxNumBatchedTokens', number('--max-num-batched-tokens', values['max-num-batched-tokens']));
  if (values['no-enable-prefix-caching'] === true) set('enablePrefixCaching', false);
  set('stepBaseMs', number('--step-base-ms', values['step-base-ms']));
  set('stepPrefillTokenMs', number('--step-prefill-token-ms', values['step-prefill-token-ms']));
  set('stepDecodeSeqMs', number('--step-decode-seq-ms', values['step-decode-seq-ms']));
  set('kvCacheMetrics', values['kv-cache-metrics']);
  if (values['metrics-compat'] !== undefined) set('metricsCompat', values['metrics-compat'] as SimOptions['metricsCompat']);
  set('revision', values.revision);
  set('externalLoad', number('--external-load', values['external-load']));
  set('externalPromptTokens', number('--external-prompt-tokens', values['external-prompt-tokens']));
  set('externalOutputTokens', number('--external-output-tokens', values['external-output-tokens']));
  if (values['restart-every'] !== undefined) {
    const ms = parseDurationMs(values['restart-every']);
    if (ms === null) problems.push(`--restart-every: "${values['restart-every']}" is not a duration (500ms, 30s, 5m, or ms)`);
    else set('restartEveryMs', ms);
  }
  const engineCount = number('--engines', values.engines) ?? 1;
  if (!(Number.isInteger(engineCount) && engineCount >= 1 && engineCount <= MAX_ENGINES)) {
    problems.push(`--engines: "${values.engines}" is not an integer between 1 and ${MAX_ENGINES}`);
  }
  let ports: number[] | null = null;
  if (values.ports !== undefined) {
    ports = values.ports.split(',').map((p) => (p.trim() === '' ? Number.NaN : Number(p)));
    if (ports.some((p) => !(Number.isInteger(p) && p >= 0 && p <= 65535))) problems.push(`--ports: "${values.ports}" is not a list of port numbers`);
    if (values.engines !== undefined && ports.length !== engineCount) problems.push(`--ports lists ${ports.length} ports for --engines ${engineCount}`);
  }
  const count = ports?.length ?? (Number.isInteger(engineCount) ? engineCount : 1);
  if (ports === null && Number.isFinite(port) && port !== 0 && port + count - 1 > 65535) problems.push(`--port ${port} --engines ${count}: ports past 65535`);
  const overrides = parseEngineOverrides(values.engine ?? [], count, problems);
  if (values['fault-kinds'] !== undefined) {
    const kinds = values['fault-kinds'].split(',').map((k) => k.trim()).filter((k) => k !== '');
    const unknown = kinds.filter((k) => !isFaultKind(k));
    if (unknown.length > 0) problems.push(`--fault-kinds: unknown kind(s) ${unknown.join(', ')}; known: ${FAULT_KINDS.join(', ')}`);
    else set('faultKinds', kinds as FaultKind[]);
  }
  if (problems.length > 0) return { ok: false, message: problems.join('\n') };

  const engines: Array<{ port: number; options: Readonly<SimOptions> }> = [];
  for (let i = 0; i < count; i++) {
    // Each engine draws its own jitter, interleaving and faults: seed + i.
    const validated = validateSimOptions({ ...partial, ...(partial.seed !== undefined || i > 0 ? { seed: (partial.seed ?? DEFAULT_SIM_OPTIONS.seed) + i } : {}), ...overrides[i] });
    if (!validated.ok) {
      const where = i === 0 && overrides[0] === undefined ? '' : ` (engine ${i})`;
      return { ok: false, message: validated.problems.map((p) => `${FLAG_OF[p.option]}${where}: ${p.message}`).join('\n') };
    }
    engines.push({ port: ports?.[i] ?? (port === 0 ? 0 : port + i), options: validated.options });
  }
  const first = engines[0];
  if (first === undefined) return { ok: false, message: 'no engine' };
  return { ok: true, args: { port: first.port, host: values.host, options: first.options, engines } };
}

/** `500ms`, `30s`, `5m`, `1h`, or a number of ms; null for anything else. */
export function parseDurationMs(raw: string): number | null {
  const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(raw);
  if (match === null) return null;
  const scale = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(match[2] ?? 'ms') as 'ms' | 's' | 'm' | 'h'];
  return Number(match[1]) * scale;
}

/** `--engine I:key=value,…` flags → per-engine option overrides; problems pushed, each naming the flag. */
function parseEngineOverrides(flags: readonly string[], count: number, problems: string[]): Array<Partial<SimOptions> | undefined> {
  const overrides: Array<Partial<SimOptions> | undefined> = [];
  for (const flag of flags) {
    const match = /^(\d+):(.+)$/.exec(flag);
    const index = match === null ? Number.NaN : Number(match[1]);
    if (match === null || !(index < count)) {
      problems.push(`--engine: "${flag}" is not I:key=value,… with I below --engines (${count})`);
      continue;
    }
    const override: Partial<SimOptions> = { ...overrides[index] };
    for (const pair of (match[2] ?? '').split(',')) {
      const [key = '', value = ''] = pair.split('=', 2).map((part) => part.trim());
      const option = ENGINE_OVERRIDES[key];
      if (option === undefined) {
        problems.push(`--engine ${index}: unknown key "${key}"; known: ${Object.keys(ENGINE_OVERRIDES).join(', ')}`);
        continue;
      }
      if (option === 'revision') override.revision = value;
      else if (option === 'restartEveryMs') {
        const ms = parseDurationMs(value);
        if (ms === null) problems.push(`--engine ${index}: restart-every "${value}" is not a duration`);
        else override.restartEveryMs = ms;
      } else {
        const parsed = value === '' ? Number.NaN : Number(value);
        if (!Number.isFinite(parsed)) problems.push(`--engine ${index}: ${key} "${value}" is not a number`);
        else (override as Record<string, number>)[option] = parsed;
      }
    }
    overrides[index] = override;
  }
  return overrides;
}


/**
 * Run the simulator until SIGINT/SIGTERM. 0 after a clean stop or `--help`; 2 on bad flags (message on stderr). A
 * port that cannot be listened on rejects with the listen error (the CLI turns it into one line and status 2).
 */
export async function runSim(argv: string[]): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(SIM_USAGE);
    return 0;
  }
  const parsed = parseSimArgs(argv);
  if (!parsed.ok) {
    console.error(`${parsed.message}\n(waybill sim --help: its options and examples)`);
    return 2;
  }
  const { host, engines } = parsed.args;
  const sims: Simulator[] = [];
  try {
    for (const [i, engine] of engines.entries()) {
      const sim = createSimulator(engine.options);
      sims.push(sim);
      const { url } = await sim.listen(engine.port, host);
      const which = engines.length > 1 ? ` engine ${i}` : '';
      console.log(`waybill sim${which}: simulated vLLM serving ${engine.options.models.join(', ')} at ${url}`);
    }
  } catch (error) {
    await Promise.all(sims.map((sim) => sim.close()));
    throw error;
  }
  await waitForSignal();
  await Promise.all(sims.map((sim) => sim.close()));
  return 0;
}
