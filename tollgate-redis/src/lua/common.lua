-- Shared by every limiter script. Lua numbers are doubles: every value here is
-- an integer below 2^53 (the clients check the configurations that make this
-- so), where doubles are exact, and these helpers keep results whole.

-- An integer as Redis should store it: '%.0f' never switches to exponent form.
local function int(x)
  return string.format('%.0f', x)
end

-- floor(a / b) for integers a >= 0, b > 0, a + b < 2^53. The double quotient
-- can round up to the next integer; one step each way corrects it.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- Lets a key vanish once the server's clock has passed `at` (us), when its
-- state has become the same as no state at all. Absolute, from this script's
-- own TIME reading: a relative TTL counts from a millisecond the server picks
-- (inside a script, possibly its start, before TIME was read), so it could end
-- a little before `at`. The key expires after ceil(at / 1000) ms, never sooner.
local function expire_at(key, at)
  if replayed_time then
    -- A replayed time is not the server's: keep the key the replayed span plus
    -- an hour of real time, however slowly the test replays it.
    redis.call('PEXPIRE', key, int(idiv(math.max(at - now, 0) + 999, 1000) + 3600000))
  else
    redis.call('PEXPIREAT', key, int(idiv(at + 999, 1000)))
  end
end

-- What the scripts can have written, so what a field may hold. A count never
-- exceeds a limit, and limits are u32s; a time or a window index stays below
-- 2^52 (a time below 2^51 plus a span up to 2^51). Anything else is damage.
local MAX_COUNT = 4294967295
local MAX_TIME = 4503599627370496
local FIELD_MAX = {c = MAX_COUNT, p = MAX_COUNT}

-- A TTL is whole milliseconds from a moment near this script's TIME reading
-- (its start, or the reading itself): a second of slack covers both.
local EXPIRY_SLACK = 1000000

-- A stored value as the scripts write it: decimal digits only, so a sign, a
-- point, an exponent, 'nan' and 'inf' are all refused, and at most `max`.
-- Returns the number, or nil and why not.
local function parse_uint(s, max)
  if type(s) ~= 'string' then
    return nil, 'is missing'
  end
  if #s > 16 or not string.find(s, '^%d+$') then
    if #s > 40 then
      s = string.sub(s, 1, 40) .. '...'
    end
    return nil, string.format('is %q, not a non-negative integer', s)
  end
  local v = tonumber(s)
  if v > max then
    return nil, 'is ' .. s .. ', above ' .. int(max)
  end
  return v
end

-- Expiries are set when every decision of the call is made. An expiry time
-- that has passed deletes the key at once, and the server's clock runs on
-- while a call decides many requests at the `now` it read first: set at
-- once, the expiry of a state that matters until shortly after `now` could
-- delete it under a later decision of the same call, which would then find
-- no state and admit too much. At the end no decision of the call is left,
-- and every later call reads a time at which a passed expiry means what no
-- key means. The latest time of each key wins; keys in the order written.
-- Until then a key written by this call lives until its pending expiry.
local expiries, expiring = {}, {}
-- The counters' states a call has read or written, key by key (see
-- `read_counter`), and the keys it wrote, in order.
local seen, writing = {}, {}
local function expire_later(key, at)
  local known = expiries[key]
  if not known then
    expiring[#expiring + 1] = key
    expiries[key] = at
  elseif at > known then
    expiries[key] = at
  end
end

-- The latest time (us) a tagged key's state can refer to: each script sets the
-- expiry together with the state, at or after the last moment the state
-- matters, so a time beyond it was not written by these scripts. Nil and the
-- error reply when the key has no expiry (every key these scripts write has
-- one).
local function horizon(key)
  if seen[key] and seen[key].written then
    return seen[key].horizon
  end
  if expiries[key] then
    return expiries[key] + EXPIRY_SLACK
  end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then
    return nil, {-2, 'the key has no expiry; every key these scripts write has one'}
  end
  return now + ttl * 1000 + EXPIRY_SLACK
end

-- Reads a limiter's hash: its format tag in field 'v', then `fields`. Returns
-- the values (all false for a new key), with `horizon` set for a tagged key,
-- or nil and the error reply: -1 when the key holds another type, -2 when it
-- is a hash this script did not write or a field is out of what the scripts
-- write (the reply names the field). Every check comes before any write, so
-- a damaged key is reported and left untouched. A 'tat' (a time) must lie
-- within the key's expiry; window indices are checked by the script that
-- knows the window.
local function read_state(key, version, fields)
  local reply = redis.pcall('HMGET', key, 'v', unpack(fields))
  if type(reply) == 'table' and reply.err then
    return nil, {-1, reply.err}
  end
  if reply[1] == version then
    local latest, err = horizon(key)
    if not latest then
      return nil, err
    end
    reply.horizon = latest
    for i = 2, #reply do
      local name = fields[i - 1]
      local value, why = parse_uint(reply[i], FIELD_MAX[name] or MAX_TIME)
      if not value then
        return nil, {-2, 'field ' .. name .. ' ' .. why}
      end
      if name == 'tat' and value > latest then
        return nil, {-2, 'field tat is ' .. int(value) .. ' us, after the key expires'}
      end
      reply[i] = value
    end
    return reply
  end
  if reply[1] == false and redis.call('EXISTS', key) == 0 then
    return reply
  end
  return nil, {-2, 'expected format ' .. version .. ', found ' .. tostring(reply[1])}
end

-- The counters (token bucket, fixed window, sliding window counter) of a
-- call: each key is read once, on its first decision in the call; every
-- later decision reads and writes the call's own copy; each key written is
-- written once, when every decision of the call is made (`flush`). A key
-- decided a hundred times in one call costs its reads and writes once.
local function read_counter(key, version, fields)
  local state = seen[key]
  if state then
    return state
  end
  local err
  state, err = read_state(key, version, fields)
  if state then
    seen[key] = state
  end
  return state, err
end

-- Keeps a counter's new field values (in the order of its `fields`), to be
-- written when the call ends; the key expires at `at` (us), when the state
-- has become the same as no key.
local function write_counter(key, version, fields, values, at)
  local state = seen[key]
  if not state.written then
    writing[#writing + 1] = key
  end
  local fresh = {version, written = true, fields = fields, horizon = at + EXPIRY_SLACK, at = at}
  for i, value in ipairs(values) do
    fresh[i + 1] = value
  end
  seen[key] = fresh
end

-- Writes what the call kept: each counter once, then its expiry, and the
-- expiries of the other keys the call wrote.
local function flush()
  for _, key in ipairs(writing) do
    local state = seen[key]
    local f = state.fields
    if #f == 1 then
      redis.call('HSET', key, 'v', state[1], f[1], int(state[2]))
    elseif #f == 2 then
      redis.call('HSET', key, 'v', state[1], f[1], int(state[2]), f[2], int(state[3]))
    else
      redis.call('HSET', key, 'v', state[1], f[1], int(state[2]), f[2], int(state[3]),
        f[3], int(state[4]))
    end
    expire_at(key, state.at)
  end
  for _, key in ipairs(expiring) do
    expire_at(key, expiries[key])
  end
end
