-- GCRA: the state is the theoretical arrival time (TAT), when the bucket is full
-- again. ARGV: n, interval (us per permit), tolerance (capacity * interval).
-- Values: now < 2^51, tolerance <= 2^51, so TAT <= now + tolerance < 2^52.
local key = KEYS[1]
local n = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])

local state, err = read_state(key, 'tb1', {'tat'})
if not state then
  return err
end
local tat = state[2] or 0

-- A server clock that stepped back only lowers `limit`: it can deny, never
-- over-admit.
local base = math.max(tat, now)
local next_tat = base + n * interval
local limit = now + tolerance
if next_tat <= limit then
  redis.call('HSET', key, 'v', 'tb1', 'tat', int(next_tat))
  -- At the TAT the bucket is full: the same as a missing key.
  expire_at(key, next_tat)
  return {1, now, idiv(limit - next_tat, interval), 0}
end
-- Denied means tat > now, so at now + wait the base is still tat and next_tat
-- equals the limit: the wait is exact.
return {0, now, idiv(limit - base, interval), next_tat - limit}
