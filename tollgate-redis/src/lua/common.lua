-- Shared by every limiter script. Each script is a function of (KEYS, ARGV)
-- that starts with `begin`: the definitions here are made once when Redis
-- loads the library (a Redis Function) or on every call (the EVALSHA form),
-- and the state of one call lives in the variables `begin` resets, never in
-- anything a later call could see.
--
-- Lua numbers are doubles: every value here is
-- an integer below 2^53 (the clients check the configurations that make this
-- so), where doubles are exact, and these helpers keep results whole.

-- The call's decision time (us), set by `begin`.
local now

-- An argument as a number: `tonumber`, remembered. A decision's terms (a
-- limiter's window, interval, limit) repeat from request to request, and
-- reading a remembered string costs a fraction of parsing it again. Loaded
-- as a library, the table outlives the call (it holds nothing but what the
-- strings mean), and is emptied when it grows past 4096 strings.
local numbers, remembered = {}, 0
local function number(s)
  local v = numbers[s]
  if v == nil then
    v = tonumber(s)
    if remembered >= 4096 then
      numbers, remembered = {}, 0
    end
    numbers[s], remembered = v, remembered + 1
  end
  return v
end

-- The call's first `count` arguments as numbers.
local function arguments(ARGV, count)
  local values = {}
  for i = 1, count do
    values[i] = number(ARGV[i])
  end
  return unpack(values)
end

-- An integer as Redis should store it, in full: Lua's '%d' formats through a
-- 64-bit integer, exact for every value here (integers below 2^53), and
-- costs half of '%.0f', which formats a double by multiple precision (as
-- does Redis's own '%.17g' for a number passed to a command).
local function int(x)
  return string.format('%d', x)
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

-- The expiry of a key whose state has become the same as no state at all
-- once the server's clock has passed `at` (us), as the two arguments of SET
-- or the command of a key already written. Absolute, from this script's own
-- TIME reading: a relative TTL counts from a millisecond the server picks
-- (inside a script, possibly its start, before TIME was read), so it could
-- end a little before `at`. The key expires after ceil(at / 1000) ms, never
-- sooner.
local function expiry(at)
  if replayed_time then
    -- A replayed time is not the server's: keep the key the replayed span plus
    -- an hour of real time, however slowly the test replays it.
    return 'PX', int(idiv(math.max(at - now, 0) + 999, 1000) + 3600000)
  end
  return 'PXAT', int(idiv(at + 999, 1000))
end

local function expire_at(key, at)
  local mode, ms = expiry(at)
  if mode == 'PX' then
    redis.call('PEXPIRE', key, ms)
  else
    redis.call('PEXPIREAT', key, ms)
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
local expiries, expiring
-- The counters' states a call has read or written, key by key (see
-- `read_counter`), and the keys it wrote, in order.
local seen, writing
local function expire_later(key, at)
  if not expiries then
    expiries, expiring = {}, {}
  end
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
  if expiries and expiries[key] then
    return expiries[key] + EXPIRY_SLACK
  end
  local ttl = redis.call('PTTL', key)
  if ttl < 0 then
    return nil, {-2, 'the key has no expiry; every key these scripts write has one'}
  end
  return now + ttl * 1000 + EXPIRY_SLACK
end

-- The counters (token bucket, fixed window, sliding window counter) keep
-- their state as one string: the format tag, then the fields, ':'-separated,
-- e.g. 'tb2:1764000000000000'. One GET (or one MGET for a call's keys) reads
-- it and one SET ... PXAT writes it with its expiry. Earlier versions kept a
-- hash {v = 'tb1', tat = ...}; such a key is still read (`read_hash`) and is
-- written in the string format when it next admits.
--
-- A counter's format: its fields in order, its tag, the tag of its earlier
-- hash, the pattern that reads its string and the format that writes it
-- (`%d`, as `int`). One table each, made when the library loads (or, as a
-- script, on every call).
local TB = {'tat', version = 'tb2', hash = 'tb1', pattern = '^tb2:(%d+)$', text = 'tb2:%d'}
local FW = {'w', 'c', version = 'fw2', hash = 'fw1', pattern = '^fw2:(%d+):(%d+)$',
  text = 'fw2:%d:%d'}
local SW = {'k', 'c', 'p', version = 'sw2', hash = 'sw1', pattern = '^sw2:(%d+):(%d+):(%d+)$',
  text = 'sw2:%d:%d:%d'}

-- Reads a hash of the earlier format: its tag in field 'v', then `fields`.
-- Returns the values (all false for a new key), with `horizon` set for a
-- tagged key, or nil and the error reply: -1 when the key holds another
-- type, -2 when it is a hash this script did not write or a field is out of
-- what the scripts write (the reply names the field). A 'tat' (a time) must
-- lie within the key's expiry; window indices are checked by the script
-- that knows the window.
local function read_hash(key, version, fields)
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

-- Why a counter's string is not one these scripts write: the reply naming
-- the tag or the field.
local function damaged_counter(s, version, fields)
  local parts = {}
  for part in string.gmatch(s .. ':', '([^:]*):') do
    parts[#parts + 1] = part
  end
  if parts[1] ~= version then
    if #s > 40 then
      s = string.sub(s, 1, 40) .. '...'
    end
    return {-2, 'expected format ' .. version .. ', found ' .. string.format('%q', s)}
  end
  for i, name in ipairs(fields) do
    local _, why = parse_uint(parts[i + 1], FIELD_MAX[name] or MAX_TIME)
    if why then
      return {-2, 'field ' .. name .. ' ' .. why}
    end
  end
  return {-2, 'holds ' .. (#parts - 1) .. ' fields; format ' .. version .. ' has ' .. #fields}
end

-- A counter's string as its values, {version, field values...}, or nil and
-- the error reply. Every value as `parse_uint` accepts it: digits only, at
-- most 16 of them, within the field's bound.
local function parse_counter(s, format)
  -- The fields `write_counter` sets are made here, so that setting them does
  -- not grow the table.
  local state = {written = false, horizon = false, at = false, format = false, format.version,
    string.match(s, format.pattern)}
  if #state ~= #format + 1 then
    return nil, damaged_counter(s, format.version, format)
  end
  for i = 2, #state do
    local digits = state[i]
    local value = tonumber(digits)
    if #digits > 16 or value > (FIELD_MAX[format[i - 1]] or MAX_TIME) then
      return nil, damaged_counter(s, format.version, format)
    end
    state[i] = value
  end
  return state
end

-- The counters' strings a call of several read in one MGET (`prefetch`):
-- the string, or false for a key known to be missing.
local fetched

-- The call's empty state and its decision time: every script's first step.
-- (The tables only the sliding log or a call of several uses are made when
-- first needed: a table costs as much as a decision's arithmetic.)
local function begin(ARGV)
  now = clock(ARGV)
  seen, writing = {}, {}
  expiries, expiring, fetched = nil, nil, nil
end

-- Reads every counter key of a call in one MGET. MGET answers nil both for a
-- missing key and for a key of another type (a hash of the earlier format,
-- or not ours): one EXISTS over those keys tells the usual case, all
-- missing, from the rest, which each decision then reads for itself.
local function prefetch(keys)
  fetched = {}
  local unique, known = {}, {}
  for _, key in ipairs(keys) do
    if not known[key] then
      known[key] = true
      unique[#unique + 1] = key
    end
  end
  -- unpack() has a stack limit: read in chunks.
  for first = 1, #unique, 1000 do
    local chunk = {unpack(unique, first, math.min(first + 999, #unique))}
    local values = redis.call('MGET', unpack(chunk))
    local absent = {}
    for i, key in ipairs(chunk) do
      if values[i] then
        fetched[key] = values[i]
      else
        absent[#absent + 1] = key
      end
    end
    if #absent > 0 and redis.call('EXISTS', unpack(absent)) == 0 then
      for _, key in ipairs(absent) do
        fetched[key] = false
      end
    end
  end
end

-- The counters (token bucket, fixed window, sliding window counter) of a
-- call: each key is read once, on its first decision in the call; every
-- later decision reads and writes the call's own copy; each key written is
-- written once, when every decision of the call is made (`flush`). A key
-- decided a hundred times in one call costs its reads and writes once.
--
-- Returns {version or false, field values...} (false: a new key), or nil and
-- the error reply. The string format's expiry is not read here: a decision
-- reads it (`horizon`) only when the state lies beyond what its
-- configuration writes, where a state must lie within its key's expiry.
-- Every check comes before any write, so a damaged key is reported and left
-- untouched.
local function read_counter(key, format)
  local state = seen[key]
  if state then
    return state
  end
  local value = fetched and fetched[key]
  if value == nil then
    value = redis.pcall('GET', key)
  end
  local err
  if type(value) == 'string' then
    state, err = parse_counter(value, format)
  elseif value == false then
    state = {written = false, horizon = false, at = false, format = false, false}
  else
    -- Not a string: a hash of the earlier format, or another type.
    state, err = read_hash(key, format.hash, format)
  end
  if state then
    seen[key] = state
  end
  return state, err
end

-- The latest time (us) a counter's state may refer to: its key's expiry
-- (`horizon`), read once, or nil and the error reply.
local function counter_horizon(key, state)
  if not state.horizon then
    local latest, err = horizon(key)
    if not latest then
      return nil, err
    end
    state.horizon = latest
  end
  return state.horizon
end

-- A GCRA state's TAT (0 for a new key), or nil and the error reply. A TAT
-- is at most `tolerance` after the decision that wrote it, so one beyond
-- `now + tolerance` was written before the server clock stepped back or
-- under a larger capacity, and must lie within the key's expiry.
local function gcra_tat(key, state, tolerance)
  local tat = state[2] or 0
  if tat > now + tolerance then
    local latest, err = counter_horizon(key, state)
    if not latest then
      return nil, err
    end
    if tat > latest then
      return nil, {-2, 'field tat is ' .. int(tat) .. ' us, after the key expires'}
    end
  end
  return tat
end

-- A token bucket's state and its TAT, checked as `gcra_tat` checks it; or
-- nil, nil and the error reply. (The decisions' and the leases' bucket.)
local function gcra_state(key, tolerance)
  local state, err = read_counter(key, TB)
  if not state then
    return nil, nil, err
  end
  local tat
  tat, err = gcra_tat(key, state, tolerance)
  if not tat then
    return nil, nil, err
  end
  return state, tat
end

-- Keeps a counter's new field values (in the order of its format's fields),
-- to be written when the call ends; the key expires at `at` (us), when the
-- state has become the same as no key.
-- The call's copy is replaced in place: a group's checks are all made
-- before its first write, so no check still reads it.
local function write_counter(key, format, values, at)
  local state = seen[key]
  if not state.written then
    writing[#writing + 1] = key
  end
  state[1], state.format, state.written = format.version, format, true
  state.horizon, state.at = at + EXPIRY_SLACK, at
  for i, value in ipairs(values) do
    state[i + 1] = value
  end
end

-- Writes what the call kept: each counter once, with its expiry, in one
-- SET; then the expiries of the other keys the call wrote.
local function flush()
  for _, key in ipairs(writing) do
    local state = seen[key]
    local mode, ms = expiry(state.at)
    local format = state.format
    redis.call('SET', key, string.format(format.text, unpack(state, 2, #format + 1)), mode, ms)
  end
  if expiring then
    for _, key in ipairs(expiring) do
      expire_at(key, expiries[key])
    end
  end
end
