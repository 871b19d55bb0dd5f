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

-- Every check comes before the first write: a damaged log is reported (the
-- reply names the member) and left untouched.
local first = redis.pcall('ZRANGE', key, 0, 0, 'WITHSCORES')
if type(first) == 'table' and first.err then
  return {-1, first.err}
end
local tagged = first[1] ~= nil
local latest
if tagged then
  if first[1] ~= marker then
    if redis.call('ZSCORE', key, marker) then
      return {-2, 'member ' .. string.format('%q', first[1]) .. ' ranks before the ' .. marker .. ' marker'}
    end
    return {-2, 'a sorted set without the ' .. marker .. ' marker'}
  end
  if first[2] ~= '-inf' then
    return {-2, 'the ' .. marker .. ' marker has score ' .. first[2] .. ', not -inf'}
  end
  local err
  latest, err = horizon(key)
  if not latest then
    return err
  end
end

-- The newest entry sets the next stamp and ticket, and bounds every stamp a
-- denial reads: its stamp must be one these scripts wrote (the key expires
-- `history` after it), its member a ticket number.
local stamp, ticket = now, 0
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[1] and newest[1] ~= marker then
  local score, why = parse_uint(newest[2], MAX_TIME)
  if score and score > latest then
    score, why = nil, 'is ' .. newest[2] .. ' us, after the key expires'
  end
  if not score then
    return {-2, 'the score of member ' .. string.format('%q', newest[1]) .. ' ' .. why}
  end
  ticket = parse_uint(newest[1], MAX_TIME)
  if not ticket or #newest[1] ~= 16 then
    return {-2, 'member ' .. string.format('%q', newest[1]) .. ' is not a 16-digit ticket number'}
  end
  -- Stamps never go back, even when the server clock does.
  stamp = math.max(now, score)
end

-- Permits still in the window (now - T, now]; entries stamped after a stale
-- `now` count too, so a clock that stepped back can only deny more.
local since = '(' .. int(now - window)
local used = redis.call('ZCOUNT', key, since, '+inf')
if used + n <= limit then
  -- Tickets grow with stamps, so no member can already hold a new ticket:
  -- one that does would be moved instead of added, and the log would hold
  -- fewer entries than it admitted.
  for i = 1, n do
    local member = string.format('%016.0f', ticket + i)
    if redis.call('ZSCORE', key, member) then
      return {-2, 'member ' .. member .. ' exists at an older stamp than member ' ..
        string.format('%016.0f', ticket) .. ' (tickets must grow with stamps)'}
    end
  end
  -- Drop the entries older than the history, except the last N with this
  -- admission: a reading from a server clock that stepped back may find those
  -- in its window again (as the in-process log's ring of N would).
  local skip = 0
  if tagged then
    skip = 1
  end
  local stored = redis.call('ZCARD', key) - skip
  local old = redis.call('ZCOUNT', key, '(-inf', int(now - history))
  local drop = math.min(old, stored + n - limit)
  if drop > 0 then
    -- Stamps only grow, so the oldest entries rank first, after the marker.
    redis.call('ZREMRANGEBYRANK', key, skip, skip + drop - 1)
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
local leaves, why = parse_uint(entry[2], MAX_TIME)
if not leaves then
  return {-2, 'the score of member ' .. string.format('%q', tostring(entry[1])) .. ' ' .. why}
end
return {0, now, math.max(0, limit - used), leaves + window - now}
