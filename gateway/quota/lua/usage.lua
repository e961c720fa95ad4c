-- Usage: what a tenant has used right now; read-only. Mirrors gateway/quota/reference.py:read.
-- KEYS as in admit.lua. ARGV: 1 now ms override ('' = server TIME), 2 window ms, 3 bucket ms.
-- Returns {requests used, requests reset ms, tokens used, tokens reset ms, concurrent in use,
--          daily used, now ms}.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local window_ms, bucket_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local DAY_MS = 86400000
local nbuckets = window_ms / bucket_ms
local oldest = math.floor(now / bucket_ms) - nbuckets

local function window(key)
  local flat = redis.call('HGETALL', key)
  local used, newest = 0, nil
  for i = 1, #flat, 2 do
    local index, amount = tonumber(flat[i]), tonumber(flat[i + 1])
    if index >= oldest then
      used = used + amount
      if amount > 0 and (newest == nil or index > newest) then newest = index end
    end
  end
  if newest == nil then return used, 0 end
  return used, (newest + nbuckets + 1) * bucket_ms - now
end

local req_used, req_reset = window(KEYS[1])
local tok_used, tok_reset = window(KEYS[2])
local in_use = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
local stored = redis.call('HMGET', KEYS[4], 'day', 'used')
local day_used = 0
if tonumber(stored[1]) == math.floor(now / DAY_MS) then day_used = tonumber(stored[2]) or 0 end
return {req_used, req_reset, tok_used, tok_reset, in_use, day_used, now}
