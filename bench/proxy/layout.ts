/** Where the bench finds its pieces, and which core runs what (2 cores: the proxy alone on one). */
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The bench runs from dist/bench/: three levels up from dist/bench/proxy/. */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export const BIN = join(REPO, 'bin', 'waybill.js');
export const FLOOR = join(REPO, 'dist', 'bench', 'proxy', 'floor.js');
/** The relay served from inside a gateway's process (bench/ab.js --b floor-inside). */
export const FLOOR_INSIDE = join(REPO, 'dist', 'bench', 'proxy', 'floor-inside.js');
export const GC_HOOK = join(REPO, 'dist', 'bench', 'proxy', 'gc-hook.js');
/** The proxy under test, alone. */
export const PROXY_CORE = 0;
/** The simulator and the load client. */
export const LOAD_CORE = 1;

export const sleep = (ms: number): Promise<void> => new Promise<void>((done) => setTimeout(done, ms));
