/**
 * One line for a listener that could not be opened, naming the address and what to change: `waybill serve`, `sim`
 * and `demo` print it instead of a stack trace (exit status 2).
 */
/** Why a listener could not be opened, by error code; `host` when the address is what to change, else the port. */
const LISTEN_REASONS: Readonly<Record<string, { readonly reason: string; readonly change: 'port' | 'host' }>> = {
  EADDRINUSE: { reason: 'the port is already in use', change: 'port' },
  EACCES: { reason: 'permission denied (ports below 1024 need privileges)', change: 'port' },
  EADDRNOTAVAIL: { reason: "the address is not one of this machine's", change: 'host' },
  ENOTFOUND: { reason: 'the host name does not resolve', change: 'host' },
  EAI_AGAIN: { reason: 'the host name does not resolve (yet)', change: 'host' },
};

/** What to change about a listener, e.g. 'choose another with --port' (the failed port, where known, as `port`). */
export type ListenHint = (change: 'port' | 'host', port: number | undefined) => string;

/**
 * One line for a listener that could not be opened (a busy port, no permission, an address not this machine's),
 * naming the address and what to change; undefined for any other error.
 */
export function listenProblem(err: unknown, command: string, hint: ListenHint): string | undefined {
  if (!(err instanceof Error)) return undefined;
  const { code, syscall, address, port, hostname } = err as NodeJS.ErrnoException & { address?: string; port?: number; hostname?: string };
  const known = code === undefined ? undefined : LISTEN_REASONS[code];
  // A cluster worker's listen fails in the primary's bind, and is reported as `bind`.
  if (known === undefined || !(syscall === 'listen' || syscall === 'bind' || (syscall === 'getaddrinfo' && hostname !== undefined))) return undefined;
  const host = address ?? hostname;
  const where = host === undefined ? `port ${port ?? '?'}` : `${host.includes(':') ? `[${host}]` : host}${port === undefined ? '' : `:${port}`}`;
  return `waybill ${command}: cannot listen on ${where}: ${known.reason} (${code}); ${hint(known.change, port)}`;
}
