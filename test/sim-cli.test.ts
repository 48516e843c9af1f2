/** `waybill sim`'s flags (src/sim/main.ts parseSimArgs, runSim) and its Python-compatible JSON (src/sim/wire.ts). */
import { describe, expect, it } from 'vitest';
import { parseSimArgs, runSim } from '../src/sim/main.js';
import { pythonJsonDumps } from '../src/sim/wire.js';

describe('json.dumps and the CLI', () => {
  it('formats like Python json.dumps with ensure_ascii', () => {
    expect(pythonJsonDumps({ error: { message: 'héllo 🙂\n', param: null, code: 500, ok: true, list: [1, 'a'] } })).toBe(
      '{"error": {"message": "h\\u00e9llo \\ud83d\\ude42\\n", "param": null, "code": 500, "ok": true, "list": [1, "a"]}}',
    );
  });

  it('parses flags into options and names the flag on bad input', async () => {
    const good = parseSimArgs([
      '--port', '0', '--engine-model', 'off', '--model', 'a', '--model', 'b', '--ttft-ms', '5', '--fault-rate', '0.25',
      '--fault-kinds', 'no_done,status', '--prompt-tokens-details', '--api-key', 'k', '--prefill-ms-per-1k-tokens', '12.5',
    ]);
    expect(good).toMatchObject({
      ok: true,
      args: { port: 0, host: '127.0.0.1', options: { models: ['a', 'b'], ttftMs: 5, prefillMsPer1kTokens: 12.5, faultRate: 0.25, faultKinds: ['no_done', 'status'], promptTokensDetails: true, apiKey: 'k', itlMs: 10 } },
    });
    expect(parseSimArgs([])).toMatchObject({ ok: true, args: { port: 8000, options: { engineModel: true } } });
    // The timer's flags with the engine model on would be ignored: refused, naming the way out.
    const timerWithEngine = parseSimArgs(['--itl-ms', '5']);
    expect(timerWithEngine).toMatchObject({ ok: false });
    if (!timerWithEngine.ok) expect(timerWithEngine.message).toContain('--itl-ms: a timer setting, not used by the engine model; add --engine-model off');
    const fleet = parseSimArgs(['--port', '0', '--engines', '3', '--engine', '1:kv-blocks=64,revision=canary', '--seed', '5']);
    expect(fleet).toMatchObject({ ok: true });
    if (fleet.ok) {
      expect(fleet.args.engines.map((e) => [e.port, e.options.kvBlocks, e.options.revision, e.options.seed])).toEqual([
        [0, 8192, 'waybill-sim', 5],
        [0, 64, 'canary', 6],
        [0, 8192, 'waybill-sim', 7],
      ]);
    }
    // One port per engine when listed: as many as there are engines.
    const listed = parseSimArgs(['--ports', '0,0', '--engines', '3']);
    expect(listed.ok === false && listed.message).toBe('--ports lists 2 ports for --engines 3');
    for (const [argv, flag] of [
      [['--engines', '0'], '--engines'],
      [['--engines', '2', '--engine', '2:kv-blocks=4'], '--engine'],
      [['--engine', '0:colour=red'], 'unknown key "colour"'],
      [['--restart-every', 'soon'], '--restart-every'],
      [['--metrics-compat', 'older'], '--metrics-compat'],
      [['--restart-every', '0.5ms'], '--restart-every'],
      [['--restart-every', '30d'], '--restart-every'],
      [['--kv-blocks', '32', '--external-load', '5'], '--external-prompt-tokens'],
      [['--ttft-ms', 'soon'], '--ttft-ms'],
      [['--prefill-ms-per-1k-tokens', '-5'], '--prefill-ms-per-1k-tokens'],
      [['--jitter', '3'], '--jitter'],
      [['--fault-kinds', 'boom'], '--fault-kinds'],
      [['--port', '70000'], '--port'],
      [['--output-tokens', '0'], '--output-tokens'],
      [['--colour'], '--colour'],
    ] as const) {
      const result = parseSimArgs([...argv]);
      expect(result.ok).toBe(false);
      if (!result.ok) expect(result.message).toContain(flag);
    }
    const errors: unknown[] = [];
    const original = console.error;
    console.error = (...args: unknown[]) => errors.push(...args);
    try {
      expect(await runSim(['--seed', 'x'])).toBe(2);
    } finally {
      console.error = original;
    }
    expect(String(errors[0])).toContain('--seed');
  });
});
