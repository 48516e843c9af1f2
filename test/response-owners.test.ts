/**
 * The binding of stored responses to tenants (proxy/response-owners.ts) and the lookup bookkeeping of
 * proxy/response-homes.ts — its per-tenant cap, negative cache and attempt reports — without sockets.
 */
import { describe, expect, it } from 'vitest';
import type { AttemptResult } from '../src/accounting/outcomes.js';
import { parseConfig } from '../src/config/load.js';
import { ResponseHomes } from '../src/proxy/response-homes.js';
import { ResponseOwners } from '../src/proxy/response-owners.js';
import type { Upstream, UpstreamRegistry } from '../src/proxy/upstreams.js';

const owners = (secret: string | undefined, unownedUsable = false) => new ResponseOwners({ secret, capacity: 2, unownedUsable });

describe('ResponseOwners', () => {
  it("a minted id is its tenant's alone, under any instance with the same key, and of no one's under another key", () => {
    const id = owners('s').mint('team-a');
    expect(id).toMatch(/^resp_w1-[0-9a-f]{32}-[0-9a-f]{32}$/);
    expect(owners('s').mayUse('team-a', id)).toBe(true);
    expect(owners('s').mayUse('team-c', id)).toBe(false);
    expect(owners('other').mayUse('team-a', id)).toBe(false);
    // The built-in key binds as well.
    const builtIn = owners(undefined).mint('team-a');
    expect(owners(undefined).mayUse('team-a', builtIn)).toBe(true);
    expect(owners(undefined).mayUse('team-c', builtIn)).toBe(false);
    // A tag one hex digit off is nobody's; so is a minted id even where unowned ids are usable.
    const forged = id.slice(0, -1) + (id.endsWith('0') ? '1' : '0');
    expect(owners('s', true).mayUse('team-a', forged)).toBe(false);
    expect(owners('s').mayCreate('team-a', forged)).toBe(false);
    expect(owners('s').mayCreate('team-a', id)).toBe(true);
    expect(owners('s').mayCreate('team-c', id)).toBe(false);
  });

  it('a client-chosen id is bound to the tenant that created it, least recently used forgotten; unowned ids follow the setting', () => {
    const bound = owners('s');
    expect(bound.mayUse('team-a', 'mine')).toBe(false);
    expect(owners('s', true).mayUse('team-a', 'mine')).toBe(true);
    bound.bind('one', 'team-a');
    bound.bind('two', 'team-c');
    expect([bound.mayUse('team-a', 'one'), bound.mayUse('team-c', 'one'), bound.mayCreate('team-c', 'one'), bound.mayCreate('team-a', 'one')]).toEqual([true, false, false, true]);
    // 'one' was used last: a third id forgets 'two' (capacity 2).
    bound.bind('three', 'team-a');
    expect(bound.mayUse('team-c', 'two')).toBe(false);
    expect(bound.mayCreate('team-a', 'two')).toBe(true);
    expect(bound.mayUse('team-a', 'one')).toBe(true);
  });

  it('responses.id_secret_env must name a set variable', () => {
    const base = { pools: [{ name: 'p', models: ['m'], upstreams: [{ url: 'http://127.0.0.1:1' }] }] };
    expect(() => parseConfig({ ...base, responses: { id_secret_env: 'NOT_SET_ANYWHERE' } }, 'test', {})).toThrow(/responses\.id_secret_env/);
    expect(parseConfig({ ...base, responses: { id_secret_env: 'S' } }, 'test', { S: 'x' }).responses.idSecret).toBe('x');
  });
});

/** Upstreams answering lookups by script: a status, or a promise the test settles. */
function registry(answers: Record<string, () => Promise<number>>): UpstreamRegistry {
  const upstreams = Object.entries(answers).map(([name, answer]) => ({ name, lookup: answer }) as unknown as Upstream);
  return { upstreams } as unknown as UpstreamRegistry;
}

describe('ResponseHomes lookups', () => {
  it('report each GET as an attempt; a miss is answered from memory until its time is up', async () => {
    let now = 0;
    const reports: Array<[string, AttemptResult]> = [];
    const homes = new ResponseHomes(10, 1000, { negativeTtlMs: 500, now: () => now, onLookup: (u, r) => reports.push([u.name, r]) });
    let asked = 0;
    const timeout = Object.assign(new Error('timed out'), { name: 'TimeoutError' });
    const upstreams = registry({
      a: () => (asked++, Promise.resolve(404)),
      b: () => (asked++, Promise.reject(timeout)),
      c: () => (asked++, Promise.resolve(503)),
    });
    expect(await homes.find('resp_x', upstreams, { tenant: 't' })).toBeUndefined();
    expect(reports).toEqual([['a', 'http_4xx'], ['b', 'timeout'], ['c', 'http_5xx']]);
    now = 499;
    expect(await homes.find('resp_x', upstreams, { tenant: 't' })).toBeUndefined();
    expect(asked).toBe(3);
    now = 500;
    await homes.find('resp_x', upstreams, { tenant: 't' });
    expect(asked).toBe(6);
    // Learned meanwhile (relayed): the miss is forgotten at once.
    homes.learn('resp_x', 'a');
    expect(await homes.find('resp_x', upstreams)).toMatchObject({ name: 'a' });
  });

  it("cap each tenant's lookups in flight on their own", async () => {
    const held: Array<(status: number) => void> = [];
    const upstreams = registry({ a: () => new Promise<number>((resolve) => held.push(resolve)) });
    const homes = new ResponseHomes(10, 1000, { maxLookupsPerTenant: 2 });
    const first = [homes.find('r1', upstreams, { tenant: 'a' }), homes.find('r2', upstreams, { tenant: 'a' })];
    expect(await homes.find('r3', upstreams, { tenant: 'a' })).toBe('busy');
    const other = homes.find('r4', upstreams, { tenant: 'c' });
    const own = homes.find('r5', upstreams);
    expect(held).toHaveLength(4);
    for (const release of held.splice(0)) release(200);
    expect((await Promise.all([...first, other, own])).map((u) => (typeof u === 'object' ? u.name : u))).toEqual(['a', 'a', 'a', 'a']);
    // Its slots are back.
    const again = homes.find('r6', upstreams, { tenant: 'a' });
    held.splice(0).forEach((release) => release(404));
    expect(await again).toBeUndefined();
  });
});
