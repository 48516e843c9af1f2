/** Waiting for a state another process or timer reaches, bounded: the wait gives up saying what it waited for. */

/** Polls `check` every 20 ms until it is true; throws `timed out waiting for <what>` after `ms`. */
export async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
