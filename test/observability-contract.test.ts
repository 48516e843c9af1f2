import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { RequestLedger } from './helpers/ledger-driver.js';
import { prettyLine } from '../src/telemetry/logger.js';
import { requestLogLine } from '../src/telemetry/request-log.js';
import { EVENTS, GEN_AI, WAYBILL } from '../src/telemetry/request-trace.js';
import { requestInfo } from './helpers/ledger-info.js';

const doc = readFileSync(new URL('../docs/observability.md', import.meta.url), 'utf8');

describe('docs/observability.md and the code agree', () => {
  it('documents every span attribute and event name the code uses', () => {
    for (const name of [...Object.values(GEN_AI), ...Object.values(WAYBILL), ...Object.values(EVENTS)]) {
      expect(doc, name).toContain(`\`${name}\``);
    }
  });

  it('documents exactly the fields of the per-request log line', () => {
    const ledger = new RequestLedger(requestInfo(), 0);
    ledger.reject(400);
    const line = requestLogLine(ledger.settle(1), 'id', undefined);
    const section = doc.split('## The per-request log line')[1] ?? '';
    const documented = [...section.matchAll(/^\| `(\w+)` \|/gm)].map((m) => m[1]);
    expect(documented).toEqual(Object.keys(line));
  });
});

describe('pretty log format', () => {
  it('prints time, level, message and the fields as key=value', () => {
    const line = prettyLine(JSON.stringify({ level: 40, time: Date.UTC(2026, 0, 1, 12, 34, 56, 789), pid: 1, service: 'waybill', msg: 'upstream ejected', upstream: 'vllm-0', reason: 'two words', n: 3 }));
    expect(line).toBe('12:34:56.789 WARN  upstream ejected upstream=vllm-0 reason="two words" n=3\n');
  });
});
