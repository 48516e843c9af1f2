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
    // The ledger and the SSE framer are pure: no I/O, no clock, no framework.
    files: ['src/accounting/**/*.ts', 'src/sse/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        patterns: [
          { group: ['node:*', 'fastify', 'undici', 'prom-client', '../http/*', '../proxy/*', '../telemetry/*', '../sim/*', '../config/*'],
            message: 'accounting/ and sse/ are the pure core: no I/O or framework imports.' },
        ],
      }],
      'no-restricted-globals': ['error',
        { name: 'Date', message: 'The pure core takes time from its caller.' },
        { name: 'performance', message: 'The pure core takes time from its caller.' },
        { name: 'setTimeout', message: 'The pure core does no I/O.' }],
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
