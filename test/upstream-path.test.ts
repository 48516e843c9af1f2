/**
 * An upstream's URL may carry a base path (vLLM behind a path-routing ingress): every API path is sent under it,
 * whatever trailing slashes the configuration wrote.
 */
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.js';
import { Upstream } from '../src/proxy/upstreams.js';

function upstreamAt(url: string): Upstream {
  const config = parseConfig({ pools: [{ name: 'p', models: ['m'], upstreams: [{ name: 'u', url }] }] }, 'test', {});
  const upstreamConfig = config.pools[0]?.upstreams[0];
  if (upstreamConfig === undefined) throw new Error('no upstream configured');
  return new Upstream(upstreamConfig, config, () => {});
}

describe('Upstream.path', () => {
  it.each([
    ['http://127.0.0.1:1', '/v1/chat/completions'],
    ['http://127.0.0.1:1/', '/v1/chat/completions'],
    ['http://127.0.0.1:1/vllm', '/vllm/v1/chat/completions'],
    ['http://127.0.0.1:1/vllm/', '/vllm/v1/chat/completions'],
    ['http://127.0.0.1:1/a/b///', '/a/b/v1/chat/completions'],
  ])('%s sends /v1/chat/completions as %s', async (url, expected) => {
    const upstream = upstreamAt(url);
    try {
      expect(upstream.path('/v1/chat/completions')).toBe(expected);
      // The same answer on every call (it is worked out once).
      expect(upstream.path('/v1/models')).toBe(expected.replace('/chat/completions', '/models'));
    } finally {
      await upstream.close();
    }
  });
});
