/** `waybill sim`: the simulated vLLM as a process. Flags are documented in docs/simulator.md. */
import { waitForSignal } from '../util/signals.js';
import { parseArgs } from 'node:util';
import { FAULT_KINDS, isFaultKind, type FaultKind } from './faults.js';
import { DEFAULT_SIM_OPTIONS, validateSimOptions, type SimOptions } from './options.js';
import { createSimulator } from './server.js';

export interface SimArgs {
  readonly port: number;
  readonly host: string;
  readonly options: Readonly<SimOptions>;
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
};

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

The simulated vLLM: speaks vLLM's OpenAI-compatible API with generated text on a timer, and breaks answers on
request (header x-sim-fault) or at random (--fault-rate). Prints its URL, runs until SIGINT or SIGTERM.
Every flag, every fault: docs/simulator.md.

options
  --port P                         port (default 8000; 0 picks a free one)
  --host H                         listen address (default 127.0.0.1)
  --model NAME                     a served model, repeatable (default ${D.models.join(', ')}); the first labels /metrics
  --ttft-ms MS                     request to first output event (default ${D.ttftMs})
  --prefill-ms-per-1k-tokens MS    the first event waits this much longer per 1 000 prompt tokens (default ${D.prefillMsPer1kTokens})
  --itl-ms MS                      delay between output events (default ${D.itlMs})
  --output-tokens N                tokens per choice, capped by max_tokens (default ${D.outputTokens})
  --jitter F                       each delay scaled by a seeded factor in [1 - F, 1 + F] (default ${D.jitter})
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
  -h, --help                       this help

examples
  waybill sim --port 8000 --model llama-3.1-8b-instruct
  waybill sim --port 8001 --itl-ms 20 --fault-rate 0.05 --seed 7
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
        'fault-kinds': { type: 'string' },
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
  if (values['fault-kinds'] !== undefined) {
    const kinds = values['fault-kinds'].split(',').map((k) => k.trim()).filter((k) => k !== '');
    const unknown = kinds.filter((k) => !isFaultKind(k));
    if (unknown.length > 0) problems.push(`--fault-kinds: unknown kind(s) ${unknown.join(', ')}; known: ${FAULT_KINDS.join(', ')}`);
    else set('faultKinds', kinds as FaultKind[]);
  }
  if (problems.length > 0) return { ok: false, message: problems.join('\n') };

  const validated = validateSimOptions(partial);
  if (!validated.ok) {
    return { ok: false, message: validated.problems.map((p) => `${FLAG_OF[p.option]}: ${p.message}`).join('\n') };
  }
  return { ok: true, args: { port, host: values.host, options: validated.options } };
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
  const { port, host, options } = parsed.args;
  const sim = createSimulator(options);
  const { url } = await sim.listen(port, host);
  console.log(`waybill sim: simulated vLLM serving ${options.models.join(', ')} at ${url}`);
  await waitForSignal();
  await sim.close();
  return 0;
}
