import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 20_000,
    hookTimeout: 20_000,
    // Integration tests bind real sockets on loopback; files run in parallel, each on its own ports.
    pool: 'forks',
  },
});
