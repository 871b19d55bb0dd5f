-- Bench only: the sliding log of gunslinger008's "Redis realizes dynamic rate
-- control" (2022), each request compared with the N-th
-- previous one, kept in a list of the last N stamps (newest first). ARGV: n,
-- window (us), limit. Same answers as the sorted-set log for a fixed rule.
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local len = redis.call('LLEN', key)
if len > limit - n then
  local oldest = tonumber(redis.call('LINDEX', key, limit - n))
  if oldest > now - window then
    return {0, oldest + window - now}
  end
end
local stamp = now
if len > 0 then
  stamp = math.max(now, tonumber(redis.call('LINDEX', key, 0)))
end
for _ = 1, n do
  redis.call('LPUSH', key, string.format('%.0f', stamp))
end
redis.call('LTRIM', key, 0, limit - 1)
redis.call('PEXPIRE', key, math.floor(window / 1000) + 1)
return {1, stamp}
