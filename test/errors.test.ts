import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERRORS } from '../src/delivery/errors.js';

describe('docs/errors.md and src/delivery/errors.ts agree', () => {
  it('lists every error code with its status and type, and no other', () => {
    const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');
    const rows = [...doc.matchAll(/^\| `(\w+)` \| (\d{3}) \| (\w+) \|/gm)].map((m) => [m[1], Number(m[2]), m[3]]);
    expect(rows).toEqual(Object.entries(ERRORS).map(([code, spec]) => [code, spec.status, spec.type]));
  });
});
