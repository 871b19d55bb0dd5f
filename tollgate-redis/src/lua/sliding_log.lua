-- The exact sliding log: a sorted set with one member per admitted permit,
-- scored by its stamp (us). Members are zero-padded ticket numbers, so equal
-- stamps sort by ticket and the newest member is always last. A marker member
-- at -inf tags the format; no time range ever includes it.
-- ARGV: n, window T (us), limit N, history (us, >= T: how long entries are kept,
-- so that the window can later grow up to it without forgetting permits).
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local history = tonumber(ARGV[4])
local marker = '~tollgate-sl1'

local tagged = redis.pcall('ZSCORE', key, marker)
if type(tagged) == 'table' and tagged.err then
  return {-1, tagged.err}
end
if not tagged and redis.call('EXISTS', key) == 1 then
  return {-2, 'a sorted set without the ' .. marker .. ' marker'}
end

-- Permits still in the window (now - T, now]; entries stamped after a stale
-- `now` count too, so a clock that stepped back can only deny more.
local since = '(' .. int(now - window)
local used = redis.call('ZCOUNT', key, since, '+inf')
if used + n <= limit then
  local stamp, ticket = now, 0
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[1] and newest[1] ~= marker then
    -- Stamps never go back, even when the server clock does.
    stamp = math.max(now, tonumber(newest[2]))
    ticket = tonumber(newest[1])
  end
  -- Drop the entries older than the history, except the last N with this
  -- admission: a reading from a server clock that stepped back may find those
  -- in its window again (as the in-process log's ring of N would).
  local first = 0
  if tagged then
    first = 1
  end
  local stored = redis.call('ZCARD', key) - first
  local old = redis.call('ZCOUNT', key, '(-inf', int(now - history))
  local drop = math.min(old, stored + n - limit)
  if drop > 0 then
    -- Stamps only grow, so the oldest entries rank first, after the marker.
    redis.call('ZREMRANGEBYRANK', key, first, first + drop - 1)
  end
  local score = int(stamp)
  local batch = {}
  for i = 1, n do
    batch[#batch + 1] = score
    batch[#batch + 1] = string.format('%016.0f', ticket + i)
    -- unpack() has a stack limit: add in chunks.
    if #batch >= 1000 or i == n then
      redis.call('ZADD', key, unpack(batch))
      batch = {}
    end
  end
  if not tagged then
    redis.call('ZADD', key, '-inf', marker)
  end
  expire_at(key, stamp + history)
  return {1, stamp, math.max(0, limit - used - n), 0}
end

-- The (used + n - N)-th oldest permit in the window must leave it first.
local k = used + n - limit
local entry = redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
return {0, now, math.max(0, limit - used), tonumber(entry[2]) + window - now}
