/**
 * The simulator's request records, awaited: each request it answers ends with one `request-end` event carrying its
 * RequestRecord (src/sim/server.ts), so a test waits for the record instead of sleeping.
 */
import { once } from 'node:events';
import type { RequestRecord, Simulator } from '../../src/sim/server.js';

/** The record of the next request `sim` ends, whichever request it is. */
export function nextEnd(sim: Simulator): Promise<RequestRecord> {
  return once(sim.events, 'request-end').then(([record]) => record as RequestRecord);
}

/** The next record `sim` ends that matches `match` (records of other requests are skipped). */
export function endOf(sim: Simulator, match: (record: RequestRecord) => boolean): Promise<RequestRecord> {
  return new Promise((resolve) => {
    const listener = (record: RequestRecord): void => {
      if (!match(record)) return;
      sim.events.off('request-end', listener);
      resolve(record);
    };
    sim.events.on('request-end', listener);
  });
}

/** The record of a request that may already have ended (looked up in `recent` first), or the next one that matches. */
export function endedOf(sim: Simulator, match: (record: RequestRecord) => boolean): Promise<RequestRecord> {
  const done = sim.stats().recent.find(match);
  return done === undefined ? endOf(sim, match) : Promise.resolve(done);
}

/** The next record any of `sims` ends that matches, with the index of the simulator that ended it. */
export function endOnAny(sims: readonly Simulator[], match: (record: RequestRecord) => boolean): Promise<{ index: number; record: RequestRecord }> {
  return new Promise((resolve) => {
    const listeners = sims.map((sim, index) => {
      const listener = (record: RequestRecord): void => {
        if (!match(record)) return;
        sims.forEach((s, i) => s.events.off('request-end', listeners[i] as (record: RequestRecord) => void));
        resolve({ index, record });
      };
      sim.events.on('request-end', listener);
      return listener;
    });
  });
}
