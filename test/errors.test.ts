import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { anthropicType, ERRORS } from '../src/delivery/errors.js';

describe('docs/errors.md and src/delivery/errors.ts agree', () => {
  it('lists every error code with its status and type, and no other', () => {
    const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');
    const rows = [...doc.matchAll(/^\| `(\w+)` \| (\d{3}) \| (\w+) \|/gm)].map((m) => [m[1], Number(m[2]), m[3]]);
    expect(rows).toEqual(Object.entries(ERRORS).map(([code, spec]) => [code, spec.status, spec.type]));
  });
});

describe('docs/errors.md "On /v1/messages" and anthropicType agree', () => {
  it('every status the table names has the error.type the code gives it, and any other status is api_error', () => {
    const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');
    const section = doc.split('## On `/v1/messages`')[1] ?? '';
    const rows = [...section.matchAll(/^\| ([\d, ]+|any other) \| `(\w+)` \|$/gm)];
    const named = new Set<number>();
    let other: string | undefined;
    for (const [, statuses, type] of rows) {
      if (statuses === 'any other') {
        other = type;
        continue;
      }
      for (const status of (statuses ?? '').split(',').map((s) => Number(s.trim()))) {
        named.add(status);
        expect(anthropicType(status), String(status)).toBe(type);
      }
    }
    expect(named.size).toBeGreaterThan(5);
    for (const status of [408, 415, 422, 431]) expect(named.has(status), `${status} is in the table`).toBe(true);
    expect(other).toBe('api_error');
    for (let status = 400; status <= 599; status++) {
      if (!named.has(status)) expect(anthropicType(status), `${status}: any other`).toBe('api_error');
    }
  });
});
