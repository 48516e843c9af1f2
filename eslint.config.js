// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'coverage/'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        projectService: { allowDefaultProject: ['bin/*.js'] },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // The framer, the ledger and the delivery machine are the pure core: no I/O, no clock, no framework, and no
    // arrow back up to the layers that use them (sse <- accounting <- delivery <- proxy <- http).
    files: ['src/accounting/**/*.ts', 'src/sse/**/*.ts', 'src/delivery/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [
          { group: ['node:*', 'fastify', 'undici', 'prom-client', 'pino', '**/http/*', '**/proxy/*', '**/telemetry/*', '!**/telemetry/labels.js', '**/sim/*', '**/config/*', '**/app/*'],
            message: 'sse/, accounting/ and delivery/ are the pure core: no I/O or framework imports, no imports from the shell (telemetry/labels.ts, a leaf of label values, excepted).' },
        ],
      }],
      'no-restricted-globals': ['error',
        { name: 'Date', message: 'The pure core takes time from its caller.' },
        { name: 'performance', message: 'The pure core takes time from its caller.' },
        { name: 'setTimeout', message: 'The pure core does no I/O.' },
        { name: 'setInterval', message: 'The pure core does no I/O.' },
        { name: 'setImmediate', message: 'The pure core does no I/O.' },
        { name: 'process', message: 'The pure core reads nothing of its process: settings come in with the request.' },
        { name: 'fetch', message: 'The pure core does no I/O.' }],
      'no-restricted-properties': ['error',
        { object: 'Math', property: 'random', message: 'The pure core is deterministic: randomness (retry jitter) comes from its caller.' }],
    },
  },
  {
    // Two more pure cores: the simulated engine's model (stepped by runtime.ts, which owns the clock) and the routing
    // decisions (prefix keys, the index, the pick, the /metrics parser; the scraper in engine-signals.ts owns timers).
    files: [
      'src/sim/engine/core.ts', 'src/sim/engine/block-hash.ts', 'src/sim/engine/block-pool.ts', 'src/sim/engine/kv-manager.ts',
      'src/sim/engine/metrics.ts', 'src/sim/engine/types.ts',
      'src/routing/prefix-key.ts', 'src/routing/block-hasher.ts', 'src/routing/prefix-index.ts', 'src/routing/score.ts', 'src/routing/engine-metrics.ts', 'src/routing/sessions.ts', 'src/routing/router.ts', 'src/routing/route-records.ts',
    ],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [{ group: ['node:*', 'fastify', 'undici', 'prom-client', 'pino'], message: 'A pure core: no I/O or framework imports.' }],
      }],
      'no-restricted-globals': ['error',
        { name: 'Date', message: 'A pure core takes time from its caller.' },
        { name: 'performance', message: 'A pure core takes time from its caller.' },
        { name: 'setTimeout', message: 'A pure core does no I/O.' }],
      'no-restricted-properties': ['error',
        { object: 'Math', property: 'random', message: 'A pure core is deterministic: randomness comes from its caller.' }],
    },
  },
  {
    // The shell does not reach back up: proxy/ executes the machine's effects and knows nothing of HTTP routes.
    files: ['src/proxy/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [{ group: ['**/http/*', '**/sim/*', '**/app/*'], message: 'proxy/ is below http/ and app/: no imports from them.' }],
      }],
    },
  },
  {
    // config/ is schema, loading, resolution and reload rules: it knows nothing of what reads it. Only the label
    // values it resolves (the anonymous tenant, the prompt-length classes) come from telemetry/labels.ts, a leaf.
    files: ['src/config/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [{ group: ['**/accounting/*', '**/delivery/*', '**/sse/*', '**/proxy/*', '**/http/*', '**/telemetry/*', '!**/telemetry/labels.js', '**/routing/*', '**/sim/*', '**/app/*'],
          message: 'config/ is free of the core and the shell: it may import only zod, yaml, node: and telemetry/labels.ts. Build what the core needs of a configuration beside the code that reads it.' }],
      }],
    },
  },
  {
    // Telemetry watches the requests; it does not reach up into the proxy or the HTTP surface that drive them. The
    // label sets the proxy produces live in telemetry/labels.ts, which proxy/ imports.
    files: ['src/telemetry/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [{ group: ['**/proxy/*', '**/http/*', '**/app/*', '**/sim/*'], message: 'telemetry/ is below proxy/ and http/: no imports from them (closed label sets go in telemetry/labels.ts).' }],
      }],
    },
  },
  {
    // The HTTP surface is assembled by the composition root (app/), never the other way round.
    files: ['src/http/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [{ group: ['**/app/*', '**/sim/*'], message: 'http/ is the HTTP surface: the composition root (app/) imports it, not the reverse.' }],
      }],
    },
  },
  {
    // The load client is the reconciliation's oracle: it must not share the code it checks (docs/load.md).
    files: ['load/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [
          { group: ['**/src/sse/*', '**/src/accounting/*', '**/src/delivery/*'],
            message: 'load/ is the oracle Waybill is reconciled against: read and judge responses independently (load/sse.ts, load/stats.ts).' },
        ],
      }],
    },
  },
  {
    files: ['eslint.config.js', 'bin/*.js'],
    ...tseslint.configs.disableTypeChecked,
  },
  {
    files: ['bin/*.js'],
    languageOptions: { globals: { process: 'readonly', console: 'readonly' } },
  },
);
