/**
 * An upstream whose GET /v1/models is 300 MB (a hostile or broken one): prints its port, then, on stderr, how many
 * bytes it wrote before the gateway closed the socket. Used by measure.sh (issue 22, item 11).
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

let written = 0;
const chunk = Buffer.from(','.padStart(64 * 1024, ' '));
const server = createServer((req, res) => {
  if (req.url === '/health') {
    res.end();
    return;
  }
  if (req.url !== '/v1/models') {
    res.writeHead(404).end();
    return;
  }
  written = 0;
  res.writeHead(200, { 'content-type': 'application/json' });
  res.write('{"data":[{"id":"m"}');
  let closed = false;
  res.on('close', () => {
    closed = true;
    console.error(`wrote ${written} bytes`);
  });
  const pump = (): void => {
    while (!closed && written < 300 * 1024 * 1024) {
      written += chunk.length;
      if (!res.write(chunk)) {
        res.once('drain', pump);
        return;
      }
    }
    if (!closed) res.end(']}');
  };
  pump();
});
server.listen(0, '127.0.0.1', () => console.log((server.address() as AddressInfo).port));
