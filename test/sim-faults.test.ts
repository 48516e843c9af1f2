/**
 * The simulator's x-sim-fault header (src/sim/faults.ts): its grammar, and every fault, parameter, modifier and flag
 * documented in docs/simulator.md. What each fault does on the wire is in sim.test.ts ("x-sim-fault").
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { FAULT_KINDS, FAULT_PARAMETERS, MODIFIER_NAMES, parseFaultHeader } from '../src/sim/faults.js';
import { FLAG_OF } from '../src/sim/main.js';

describe('fault header grammar', () => {
  it('documents every fault, parameter, modifier and flag in docs/simulator.md', () => {
    const doc = readFileSync(new URL('../docs/simulator.md', import.meta.url), 'utf8');
    for (const name of [...FAULT_KINDS, ...FAULT_PARAMETERS, ...MODIFIER_NAMES]) expect(doc).toContain(`| \`${name}`);
    for (const flag of Object.values(FLAG_OF)) expect(doc).toContain(`| \`${flag}`);
  });

  it('accepts every modifier it documents', () => {
    const samples: Record<(typeof MODIFIER_NAMES)[number], string> = {
      finish_reason: 'finish_reason=abort',
      tokens: 'tokens=3',
      ttft_ms: 'ttft_ms=0',
      prefill_ms_per_1k_tokens: 'prefill_ms_per_1k_tokens=250',
      itl_ms: 'itl_ms=0',
      tokens_per_event: 'tokens_per_event=4',
      cached_tokens: 'cached_tokens=0',
      no_usage: 'no_usage',
      framing: 'framing=cr',
      comments: 'comments',
      multiline_data: 'multiline_data',
    };
    for (const directive of Object.values(samples)) {
      expect(parseFaultHeader(directive)).toMatchObject({ ok: true, directives: { fault: null } });
    }
  });

  it('parses faults with parameters and modifiers together', () => {
    expect(parseFaultHeader(' error_after=3 ; error_code=503;framing=crlf; comments ')).toEqual({
      ok: true,
      directives: {
        fault: { kind: 'error_after', after: 3, code: 503 },
        modifiers: { noUsage: false, framing: 'crlf', comments: true, multilineData: false },
      },
    });
    expect(parseFaultHeader('oversized_after=0')).toMatchObject({ ok: true, directives: { fault: { bytes: 2097152 } } });
  });
});
