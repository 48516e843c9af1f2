/** The gateway's settlements, read in order: a test awaits the `count`th logical request to settle, never a sleep. */
import type { Settlement } from '../../src/accounting/ledger.js';
import type { Stack } from './stack.js';

/** The `count`th settlement of `stack` (1-based), once `count` logical requests have settled in total. */
export async function settledAfter(stack: Stack, count: number): Promise<Settlement> {
  return (await stack.settled(count))[count - 1] as Settlement;
}
