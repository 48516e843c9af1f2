/**
 * Teardown in reverse order of setup: a test pushes each thing it starts (an upstream, then the gateway in front of
 * it), and after the test the gateway closes first, then what it was talking to.
 */
import { afterEach } from 'vitest';

export type Cleanups = Array<() => Promise<unknown> | void>;

/** Registers the afterEach that runs and empties the list; call once at the top of a test file. */
export function useCleanups(): Cleanups {
  const cleanups: Cleanups = [];
  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });
  return cleanups;
}
