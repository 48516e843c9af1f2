/**
 * The Lua scripts of the Redis limit store (redis-limit-store.ts): each step — reserve, settle, undo a late reserve,
 * renew the slots' leases — runs in Redis as one script, so it is atomic, and on Redis's clock, so replicas whose
 * clocks differ still agree on the window. The rules are tenant-limits.ts's (`decide`, `correction`).
 */

/** Redis's clock, in milliseconds, and the open window's number; `int` writes a Lua number as Redis wants it. */
const PRELUDE = `
if redis.replicate_commands then redis.replicate_commands() end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = math.floor(now / ${60_000})
local function int(n) return string.format('%d', n) end
`;

/**
 * KEYS: the window hash, the in-flight set. ARGV: requests_per_minute, tokens_per_minute, max_concurrent (0: no
 * such limit), the tokens to reserve, the ticket, the slot's lifetime (ms). The rule is `decide`'s: admitted when
 * every limit passes, and then everything is counted. Answers {admitted, window, requests, tokens, in flight (the
 * counts before this request), now}.
 */
export const RESERVE = `${PRELUDE}
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, ttl = tonumber(ARGV[4]), tonumber(ARGV[6])
local counts = redis.call('HMGET', KEYS[1], 'window', 'requests', 'tokens')
local requests, used = 0, 0
if tonumber(counts[1]) == window then
  requests = tonumber(counts[2]) or 0
  used = tonumber(counts[3]) or 0
end
local inflight = 0
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
  inflight = redis.call('ZCARD', KEYS[2])
end
local admitted = (rpm == 0 or requests + 1 <= rpm) and (tpm == 0 or used + tokens <= tpm) and (maxc == 0 or inflight + 1 <= maxc)
if admitted then
  redis.call('HSET', KEYS[1], 'window', int(window), 'requests', int(requests + 1), 'tokens', int(used + tokens))
  redis.call('PEXPIRE', KEYS[1], int((window + 1) * ${60_000} - now + 1000))
  if maxc > 0 then
    redis.call('ZADD', KEYS[2], int(now + ttl), ARGV[5])
    redis.call('PEXPIRE', KEYS[2], int(ttl + 1000))
  end
end
return {admitted and 1 or 0, window, requests, used, inflight, now}
`;

/**
 * KEYS: the window hash. ARGV: the reservation's window, its tokens, the tokens used. The rule is `correction`'s:
 * in the reservation's window the use replaces the reservation; later, only use beyond it is charged, to the open
 * window. Answers the correction applied.
 */
export const SETTLE = `${PRELUDE}
local delta = tonumber(ARGV[3]) - tonumber(ARGV[2])
if tonumber(ARGV[1]) ~= window and delta < 0 then delta = 0 end
if delta == 0 then return 0 end
local counts = redis.call('HMGET', KEYS[1], 'window', 'tokens')
if tonumber(counts[1]) == window then
  redis.call('HSET', KEYS[1], 'tokens', int(math.max(0, (tonumber(counts[2]) or 0) + delta)))
elseif delta > 0 then
  redis.call('HSET', KEYS[1], 'window', int(window), 'requests', 0, 'tokens', int(delta))
  redis.call('PEXPIRE', KEYS[1], int((window + 1) * ${60_000} - now + 1000))
end
return delta
`;

/**
 * KEYS: the window hash, the in-flight set. ARGV: the reservation's window, its tokens, its ticket. Takes back a
 * reserve that Redis ran after its caller gave up on it: the request and its tokens (while their window is open),
 * and its slot.
 */
export const UNDO = `${PRELUDE}
local counts = redis.call('HMGET', KEYS[1], 'window', 'requests', 'tokens')
if tonumber(counts[1]) == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'requests', int(math.max(0, (tonumber(counts[2]) or 0) - 1)), 'tokens', int(math.max(0, (tonumber(counts[3]) or 0) - tonumber(ARGV[2]))))
end
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
`;

/**
 * KEYS: the in-flight set. ARGV: pairs of (lifetime in ms, ticket). Renews the lease of the tickets this process
 * holds: each one's expiry moves to now + its lifetime (re-added if it had expired while its request runs), and the
 * set lives at least as long as the longest of them.
 */
export const RENEW = `${PRELUDE}
local longest = 0
for i = 1, #ARGV, 2 do
  local ttl = tonumber(ARGV[i])
  redis.call('ZADD', KEYS[1], int(now + ttl), ARGV[i + 1])
  if ttl > longest then longest = ttl end
end
if redis.call('PTTL', KEYS[1]) < longest + 1000 then redis.call('PEXPIRE', KEYS[1], int(longest + 1000)) end
return 1
`;

export type ReserveReply = [admitted: number, window: number, requests: number, tokens: number, inflight: number, now: number];

export interface ScriptedRedis {
  waybillReserve(windowKey: string, inflightKey: string, ...args: Array<string | number>): Promise<ReserveReply>;
  waybillSettle(windowKey: string, ...args: Array<string | number>): Promise<number>;
  waybillUndo(windowKey: string, inflightKey: string, ...args: Array<string | number>): Promise<number>;
  waybillRenew(inflightKey: string, ...args: Array<string | number>): Promise<number>;
}
