-- Gives back `unused` permits of a lease whose debit left the TAT at
-- `lease_tat`. Only while that debit is still the last one: then lowering the
-- TAT by unused·interval leaves exactly the state a smaller lease would have
-- left. After any other debit, lowering it could undo that debit's idle-time
-- clamp and mint permits, so nothing is returned (the permits are forfeited:
-- under-admission, never over-admission).
-- ARGV: unused, interval, lease_tat. Reply: {1, now, returned, tat} / {-1|-2, message}.
local key = KEYS[1]
local unused = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local lease_tat = tonumber(ARGV[3])

local state, err = read_state(key, 'tb1', {'tat'})
if not state then
  return err
end
local tat = state[2]
if tat ~= lease_tat then
  return {1, now, 0, tat or 0}
end
local next_tat = tat - unused * interval
if next_tat <= now then
  -- A full bucket: the same as no key.
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'v', 'tb1', 'tat', int(next_tat))
  expire_at(key, next_tat)
end
return {1, now, unused, next_tat}
