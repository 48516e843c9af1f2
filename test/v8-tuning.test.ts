/**
 * src/app/v8-tuning.ts: what `serve` and `demo` ask of V8 before they load the gateway. The effect (no request
 * promoted through a tenured allocation site) is a chance per process and is measured, not tested
 * (docs/performance.md, "Pretenured requests"); here, which flags are set and when the environment opts out.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { tuneV8ForGateway } from '../src/app/v8-tuning.js';

function flagsSet(env: NodeJS.ProcessEnv): string[] {
  const set: string[] = [];
  tuneV8ForGateway(env, (flags) => set.push(flags));
  return set;
}

describe('tuneV8ForGateway', () => {
  it('turns allocation-site pretenuring off by default', () => {
    expect(flagsSet({})).toEqual(['--no-allocation-site-pretenuring']);
  });

  it('leaves it alone with WAYBILL_V8_PRETENURING=1, and only then', () => {
    expect(flagsSet({ WAYBILL_V8_PRETENURING: '1' })).toEqual([]);
    for (const value of ['0', 'true', '', 'yes']) expect(flagsSet({ WAYBILL_V8_PRETENURING: value })).toEqual(['--no-allocation-site-pretenuring']);
  });

  it('names a flag this V8 knows (an unknown one would be reported on stderr and ignored)', () => {
    // V8 prints "unrecognized flag" for a name it does not know; the real setter runs in a child so this process's
    // flags stay as they are.
    const script = `require('node:v8').setFlagsFromString(${JSON.stringify(flagsSet({})[0])}); require('node:v8').setFlagsFromString('--no-such-flag-for-the-test')`;
    const child = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    expect(child.status).toBe(0);
    const complaints = child.stderr.split('\n').filter((line) => /unrecognized|unknown/i.test(line));
    // The made-up flag shows the check works; ours must not be among the complaints.
    expect(complaints.some((line) => line.includes('no-such-flag-for-the-test'))).toBe(true);
    expect(complaints.some((line) => line.includes('allocation-site-pretenuring'))).toBe(false);
  });
});
