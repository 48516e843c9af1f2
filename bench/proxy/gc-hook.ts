/**
 * Preloaded into the gateway by the benchmark (`node --expose-gc --import .../gc-hook.js bin/waybill.js serve`) so
 * it can ask for a full garbage collection before reading RSS: SIGUSR2 runs `gc()`. Nothing else changes. Never
 * send SIGUSR2 to a gateway started without it: the default action ends the process.
 */
const gc = (globalThis as { gc?: () => void }).gc;
process.on('SIGUSR2', () => {
  gc?.();
});
