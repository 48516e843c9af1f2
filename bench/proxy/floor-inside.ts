/**
 * The bare Node relay (floor.ts) served from inside a Waybill process: does what the gateway's process loads and keeps
 * — its modules, heap, V8 flags, timers, metrics, engine-signal scrapes — cost a relay anything per event?
 *
 *   node dist/bench/ab.js --a relay --b floor-inside --scenario c64s
 *
 * Started as `bench/proxy/procs.ts` starts a gateway (`floor-inside.js serve --config FILE …`): the gateway runs from
 * that configuration as `waybill serve` would, on a port of its own and with no traffic, and once it is ready the
 * configuration's port is the relay's, to the configuration's first upstream. `/readyz` is answered here.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { main } from '../../src/cli.js';
import { relayHandler } from './floor.js';
import { freePort, waitFor200 } from './procs.js';

interface BenchConfig {
  server: { port: number; [key: string]: unknown };
  pools: Array<{ upstreams: Array<{ url: string }> }>;
}

async function start(argv: string[]): Promise<void> {
  const at = argv.indexOf('--config');
  const file = at < 0 ? undefined : argv[at + 1];
  if (argv[0] !== 'serve' || file === undefined) throw new Error('usage: floor-inside.js serve --config FILE (the bench\'s gateway configuration, JSON)');
  const config = JSON.parse(readFileSync(file, 'utf8')) as BenchConfig;
  const port = config.server.port;
  const upstream = config.pools[0]?.upstreams[0]?.url;
  if (upstream === undefined) throw new Error(`${file}: no upstream`);
  const inner = await freePort();
  const innerFile = `${file}.inside.json`;
  writeFileSync(innerFile, JSON.stringify({ ...config, server: { ...config.server, port: inner } }));
  // The gateway's own drain on SIGTERM ends the process, relay and all.
  void main(['serve', '--config', innerFile, '--workers', '1']).then(
    (code) => process.exit(typeof code === 'number' ? code : 0),
    (error: unknown) => {
      console.error(error);
      process.exit(1);
    },
  );
  await waitFor200(`http://127.0.0.1:${inner}/readyz`, 15_000);
  const relay = relayHandler(upstream);
  createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
    if (req.url === '/readyz') res.end('ready\n');
    else relay(req, res);
  }).listen(port, '127.0.0.1', () => console.log(`node-floor inside a gateway (its own port ${inner}) on http://127.0.0.1:${port}`));
}

start(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
});
