/**
 * Simulators on loopback ports for the simulator's own tests: each started one is closed after its test.
 */
import { afterEach } from 'vitest';
import { createSimulator, type SimOptions, type Simulator } from '../../src/sim/server.js';

export type StartSimulator = (options?: Partial<SimOptions>) => Promise<{ sim: Simulator; url: string }>;

/** Registers the cleanup and returns `start`, which listens on a free port with `defaults` under `options`. */
export function useSimulators(defaults: Partial<SimOptions>): StartSimulator {
  let sims: Simulator[] = [];
  afterEach(async () => {
    await Promise.all(sims.map((s) => s.close()));
    sims = [];
  });
  return async (options = {}) => {
    const sim = createSimulator({ ...defaults, ...options });
    sims.push(sim);
    const { url } = await sim.listen(0);
    return { sim, url };
  };
}
