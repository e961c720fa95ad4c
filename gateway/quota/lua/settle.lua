-- Settlement: apply delta = actual - reserved tokens, release the lease and append the request's
-- usage event, in one round trip and atomically (gateway/ledger).
-- Mirrors gateway/quota/reference.py:settle. KEYS as in admit.lua, plus 5: the tenant's usage
-- stream (same hash tag, so the same cluster slot).
-- ARGV: 1 now ms override ('' = server TIME), 2 window ms, 3 bucket ms, 4 slot charged,
--       5 day charged, 6 delta, 7 lease id ('' = none), 8 usage event JSON (absent or '' = none).
if redis.replicate_commands then redis.replicate_commands() end

-- First: if the append fails (out of memory), the script stops before any write, so a
-- settlement is never applied without its event, nor an event written without its settlement.
if ARGV[8] and ARGV[8] ~= '' then redis.call('XADD', KEYS[5], '*', 'e', ARGV[8]) end

local window_ms, bucket_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local slot, day, delta, lease_id = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local DAY_MS = 86400000

if delta < 0 then
  -- A refund goes back to the bucket it was charged to; gone from the window, nothing to do.
  local have = tonumber(redis.call('HGET', KEYS[2], slot))
  local refund = have and math.min(have, -delta) or 0
  -- Only when positive: Lua formats -0 as "-0", which HINCRBY rejects.
  if refund > 0 then redis.call('HINCRBY', KEYS[2], slot, -refund) end
  local stored = redis.call('HMGET', KEYS[4], 'day', 'used')
  if tonumber(stored[1]) == day then
    redis.call('HSET', KEYS[4], 'used', math.max(0, (tonumber(stored[2]) or 0) + delta))
  end
elseif delta > 0 then
  -- An overrun counts from now, so the current bucket takes it.
  local now = tonumber(ARGV[1])
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local current = math.floor(now / bucket_ms)
  redis.call('HINCRBY', KEYS[2], current, delta)
  redis.call('PEXPIRE', KEYS[2], window_ms + 2 * bucket_ms)
  local today = math.floor(now / DAY_MS)
  local stored = redis.call('HMGET', KEYS[4], 'day', 'used')
  if tonumber(stored[1]) == today then
    redis.call('HSET', KEYS[4], 'used', (tonumber(stored[2]) or 0) + delta)
  else
    redis.call('HSET', KEYS[4], 'day', today, 'used', delta)
  end
  redis.call('PEXPIRE', KEYS[4], 2 * DAY_MS)
end
if lease_id ~= '' then redis.call('ZREM', KEYS[3], lease_id) end
return 1
