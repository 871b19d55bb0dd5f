-- Gives back `unused` permits of a lease whose debit left the TAT at
-- `lease_tat`. Only while that debit is still the last one: then lowering the
-- TAT by unused·interval leaves exactly the state a smaller lease would have
-- left. After any other debit, lowering it could undo that debit's idle-time
-- clamp and mint permits, so nothing is returned (the permits are forfeited:
-- under-admission, never over-admission).
-- ARGV: unused, interval, lease_tat, tolerance (the state is checked as a
-- decision checks it). Reply: {1, now, returned, tat} / {-1|-2, message}.
local function lease_return(KEYS, ARGV)
  begin(ARGV)
  local key = KEYS[1]
  local unused, interval, lease_tat, tolerance = arguments(ARGV, 4)

  local state, tat, err = gcra_state(key, tolerance)
  if not state then
    return err
  end
  if not state[1] or tat ~= lease_tat then
    return {1, now, 0, tat}
  end
  local next_tat = tat - unused * interval
  if next_tat <= now then
    -- A full bucket: the same as no key.
    redis.call('DEL', key)
  else
    write_counter(key, TB, {next_tat}, next_tat)
    flush()
  end
  return {1, now, unused, next_tat}
end
