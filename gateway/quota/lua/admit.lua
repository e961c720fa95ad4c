-- Admission: reserve 1 request, ARGV[8] tokens and (if capped) a concurrency lease, all or nothing.
-- Mirrors gateway/quota/reference.py:admit; tests compare the two.
-- KEYS: 1 requests hash, 2 tokens hash (bucket index -> amount), 3 leases zset (id -> expiry ms),
--       4 daily hash {day, used}. All share the tenant's hash tag, so one cluster slot.
-- ARGV: 1 now ms override ('' = server TIME; tests only), 2 window ms, 3 bucket ms,
--       4 requests/min, 5 tokens/min, 6 concurrent, 7 daily tokens (-1 = unlimited),
--       8 cost (estimated tokens), 9 lease id, 10 lease ms.
-- Returns {admitted, denied bits, retry ms, requests used, requests reset ms, tokens used,
--          tokens reset ms, concurrent in use, daily used, slot, day, now ms}.

-- Redis < 5 replicates scripts verbatim, which forbids writes after TIME; effects replication
-- (the default from 5, the only mode from 7) does not. Asking for it explicitly costs nothing.
if redis.replicate_commands then redis.replicate_commands() end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local window_ms, bucket_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm, conc, daily = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local cost, lease_id, lease_ms = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local DAY_MS = 86400000

local nbuckets = window_ms / bucket_ms
local slot = math.floor(now / bucket_ms)
local oldest = slot - nbuckets

local function expires_at(index) return (index + nbuckets + 1) * bucket_ms end

-- read_window: prune buckets that no longer count; sum and list (oldest first) the rest.
local function read_window(key)
  local flat = redis.call('HGETALL', key)
  local used, stale, live = 0, {}, {}
  for i = 1, #flat, 2 do
    local index, amount = tonumber(flat[i]), tonumber(flat[i + 1])
    if index < oldest then
      stale[#stale + 1] = flat[i]
    else
      used = used + amount
      if amount > 0 then live[#live + 1] = {index, amount} end
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return used, live
end

local function wait_ms(used, live, amount, limit)
  local need = used + amount - limit
  if need <= 0 then return 0 end
  local freed = 0
  for _, bucket in ipairs(live) do
    freed = freed + bucket[2]
    if freed >= need then return expires_at(bucket[1]) - now end
  end
  return window_ms
end

local function reset_ms(live)
  if #live == 0 then return 0 end
  return expires_at(live[#live][1]) - now
end

local req_used, req_live = read_window(KEYS[1])
local tok_used, tok_live = read_window(KEYS[2])
local in_use = 0
if conc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  in_use = redis.call('ZCARD', KEYS[3])
end
local day = math.floor(now / DAY_MS)
local stored = redis.call('HMGET', KEYS[4], 'day', 'used')
local day_used = 0
if tonumber(stored[1]) == day then day_used = tonumber(stored[2]) or 0 end

local denied, wait = 0, 0
if rpm >= 0 and req_used + 1 > rpm then
  denied = denied + 1
  wait = math.max(wait, wait_ms(req_used, req_live, 1, rpm))
end
if tpm >= 0 and tok_used + cost > tpm then
  denied = denied + 2
  wait = math.max(wait, wait_ms(tok_used, tok_live, cost, tpm))
end
if conc >= 0 and in_use >= conc then
  denied = denied + 4
  wait = math.max(wait, 1000)
end
if daily >= 0 and day_used + cost > daily then
  denied = denied + 8
  wait = math.max(wait, (day + 1) * DAY_MS - now)
end
if denied > 0 then
  return {0, denied, wait, req_used, reset_ms(req_live), tok_used, reset_ms(tok_live), in_use,
          day_used, slot, day, now}
end

-- Keys outlive their last counted bucket by a little, so idle tenants cost no memory.
local window_ttl = window_ms + 2 * bucket_ms
redis.call('HINCRBY', KEYS[1], slot, 1)
redis.call('PEXPIRE', KEYS[1], window_ttl)
redis.call('HINCRBY', KEYS[2], slot, cost)
redis.call('PEXPIRE', KEYS[2], window_ttl)
if conc >= 0 then
  redis.call('ZADD', KEYS[3], now + lease_ms, lease_id)
  in_use = in_use + 1
  if redis.call('PTTL', KEYS[3]) < lease_ms then redis.call('PEXPIRE', KEYS[3], lease_ms) end
end
redis.call('HSET', KEYS[4], 'day', day, 'used', day_used + cost)
redis.call('PEXPIRE', KEYS[4], 2 * DAY_MS)

local tok_reset = reset_ms(tok_live)
if cost > 0 then tok_reset = expires_at(slot) - now end
return {1, 0, 0, req_used + 1, expires_at(slot) - now, tok_used + cost, tok_reset, in_use,
        day_used + cost, slot, day, now}
