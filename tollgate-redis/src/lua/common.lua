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

-- Reads a limiter's hash: its format tag in field 'v', then `fields`. Returns
-- the values (all false for a new key), or nil and the error reply: -1 when the
-- key holds another type, -2 when it is a hash this script did not write.
local function read_state(key, version, fields)
  local reply = redis.pcall('HMGET', key, 'v', unpack(fields))
  if type(reply) == 'table' and reply.err then
    return nil, {-1, reply.err}
  end
  if reply[1] == version then
    for i = 2, #reply do
      if not tonumber(reply[i]) then
        return nil, {-2, 'field ' .. fields[i - 1] .. ' is not an integer'}
      end
      reply[i] = tonumber(reply[i])
    end
    return reply
  end
  if reply[1] == false and redis.call('EXISTS', key) == 0 then
    return reply
  end
  return nil, {-2, 'expected format ' .. version .. ', found ' .. tostring(reply[1])}
end
