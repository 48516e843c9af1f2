#!/usr/bin/env node
import { main } from '../dist/src/cli.js';

// Exit explicitly: after a drain, sockets a client keeps open must not keep the process alive.
main(process.argv.slice(2)).then(
  (code) => process.exit(typeof code === 'number' ? code : 0),
  (err) => {
    console.error(err instanceof Error ? err.stack ?? err.message : err);
    process.exit(1);
  },
);
