/** The one pending wake-up of a stream. */
export type CancelTimer = () => void;

/**
 * Run `fn` after `ms`. setTimeout clamps 0 to 1 ms, which would cap an `itl_ms=0` stream at 1 000 events a
 * second; a zero delay runs on the next turn of the event loop instead (still after pending I/O, so
 * backpressure and disconnects are seen between events).
 */
export function after(ms: number, fn: () => void): CancelTimer {
  if (ms <= 0) {
    const immediate = setImmediate(fn);
    return () => clearImmediate(immediate);
  }
  const timeout = setTimeout(fn, ms);
  return () => clearTimeout(timeout);
}
