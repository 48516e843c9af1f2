import { it } from 'vitest';
import { createSimulator } from '../src/sim/server.js';
import { parseLoadArgs, runLoadWith } from '../load/main.js';
it('dbg', async () => {
  const sim = createSimulator({ engineModel: true, promptTokensDetails: true });
  const { url } = await sim.listen(0);
  let last = '';
  const timer = setInterval(() => {
    const snap = JSON.stringify(sim.engineSnapshot());
    const st = sim.stats();
    const line = `${snap} inflight=${st.inflight}`;
    if (line !== last) console.log(Math.round(performance.now()), line);
    last = line;
  }, 1000);
  const config = await parseLoadArgs(['--url', url, '--concurrency', '16', '--requests', '300', '--fault-share', '0.1', '--cancel-share', '0.05', '--quiet']);
  if ('problems' in config) throw new Error(config.problems.join());
  const p = runLoadWith(config, () => undefined);
  await Promise.race([p, new Promise((r) => setTimeout(r, 25000))]);
  clearInterval(timer);
  const recent = sim.stats().recent.filter((r) => r.end === 'rejected' || true).slice(-5);
  console.log('END', JSON.stringify(sim.engineSnapshot()), sim.stats().inflight);
  // eslint-disable-next-line
  const exs = [...(sim as any).engineExchanges];
  for (const ex of exs) console.log('OPEN', JSON.stringify({ r: ex.record.route, s: ex.record.stream, n: ex.record.n, f: ex.record.fault, ev: ex.record.outputEventsSent, gen: ex.job?.generated, fin: ex.job?.finished, done: ex.job?.done }));
  process.exit(0);
}, 60000);
