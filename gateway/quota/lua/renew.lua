-- Lease renewal: push the expiry to now + lease ms; re-take an expired lease only if a slot is free.
-- Mirrors gateway/quota/reference.py:renew. KEYS[1]: leases zset.
-- ARGV: 1 now ms override ('' = server TIME), 2 lease id, 3 lease ms, 4 concurrency limit.
-- Returns 1 renewed, 2 re-acquired, 0 lost.
if redis.replicate_commands then redis.replicate_commands() end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local lease_id, lease_ms, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local result = 0
if redis.call('ZSCORE', KEYS[1], lease_id) then
  result = 1
elseif redis.call('ZCARD', KEYS[1]) < limit then
  result = 2
end
if result > 0 then
  redis.call('ZADD', KEYS[1], now + lease_ms, lease_id)
  if redis.call('PTTL', KEYS[1]) < lease_ms then redis.call('PEXPIRE', KEYS[1], lease_ms) end
end
return result
