/**
 * Resolves on the first SIGINT or SIGTERM. A second one exits at once with status 1 (an operator who means it), so
 * a drain that hangs can always be cut short.
 */
export function waitForSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const onSignal = (signal: NodeJS.Signals) => {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      const again = () => {
        console.error(`${signal} again: exiting without draining`);
        process.exit(1);
      };
      process.once('SIGINT', again);
      process.once('SIGTERM', again);
      resolve(signal);
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  });
}
