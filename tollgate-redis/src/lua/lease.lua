-- Takes a lease: up to `want` permits debited at once from the key's GCRA
-- budget (the same state as the token bucket's decisions, so per-decision clients and
-- leasing clients share one limit). ARGV: want, interval, tolerance,
-- low_water (permits), share (divisor). Below `low_water` permits left, a lease
-- is at most ceil(left / share): the tail is spread over the processes instead
-- of landing in the first one that asks.
-- Reply: {1, now, granted, tat} or {0, now, 0, wait_us} or {-1|-2, message}.
local function lease(KEYS, ARGV)
  begin(ARGV)
  local key = KEYS[1]
  local want, interval, tolerance, low_water, share = arguments(ARGV, 5)

  local state, tat, err = gcra_state(key, tolerance)
  if not state then
    return err
  end
  local base = math.max(tat, now)
  local limit = now + tolerance
  local left = 0
  if base < limit then
    left = idiv(limit - base, interval)
  end
  if left == 0 then
    return {0, now, 0, base + interval - limit}
  end
  local granted = math.min(want, left)
  if left < low_water then
    granted = math.min(granted, idiv(left + share - 1, share))
  end
  local next_tat = base + granted * interval
  write_counter(key, TB, {next_tat}, next_tat)
  flush()
  return {1, now, granted, next_tat}
end
