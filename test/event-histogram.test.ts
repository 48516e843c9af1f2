import fc from 'fast-check';
import { Histogram, Registry, type Metric } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { EventHistogram } from '../src/telemetry/event-histogram.js';

const BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.1, 1];

describe('EventHistogram', () => {
  it('exposes exactly what a prom-client histogram exposes for the same observations', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.tuple(fc.constantFrom('a', 'b', 'model/x'), fc.oneof(fc.double({ min: 0, max: 2, noNaN: true }), fc.constantFrom(...BUCKETS))), {
          maxLength: 200,
        }),
        async (observations) => {
          const reference = new Registry();
          const theirs = new Histogram({ name: 'h_seconds', help: 'help', labelNames: ['model'], buckets: BUCKETS, registers: [reference] });
          const ours = new Registry();
          const mine = new EventHistogram('h_seconds', 'help', BUCKETS);
          ours.registerMetric(mine as unknown as Metric);
          for (const [model, value] of observations) {
            theirs.observe({ model }, value);
            mine.for(model).observe(value);
          }
          const sorted = (text: string) => text.split('\n').sort().join('\n');
          expect(sorted(await ours.metrics())).toBe(sorted(await reference.metrics()));
        },
      ),
      { numRuns: 100 },
    );
  });
});
