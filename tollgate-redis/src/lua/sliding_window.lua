-- The weighted two-window counter: the previous window's count, weighted by its
-- overlap with the sliding window, plus the current count, stays within the
-- limit. ARGV: n, window T (us), limit N, with N * T <= 2^51 so that every
-- product below (at most 3 * N * T) stays exact.
local key = KEYS[1]
local n = tonumber(ARGV[1])
local t = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

local state, err = read_state(key, 'sw1', {'k', 'c', 'p'})
if not state then
  return err
end
-- Window k's state matters until window k + 2 starts, when the key expires:
-- a later end was not written with this window length.
if state[1] and (state[2] + 2) * t > state.horizon then
  return {-2, 'field k is window ' .. int(state[2]) .. ' of ' .. int(t) ..
    ' us, whose state outlives the key (damaged, or another window length)'}
end
-- k: the newest window; c: its count; p: the count of window k - 1.
local k, c, p
local stale = false
local current = idiv(now, t)
if not state[1] then
  k, c, p = current, 0, 0
elseif current <= state[2] then
  k, c, p = state[2], state[3], state[4]
  -- A reading older than the newest window (the server clock stepped back) is
  -- denied until time catches up.
  stale = current < k
else
  k, c = current, 0
  if current == state[2] + 1 then
    p = state[3]
  else
    p = 0
  end
end

local start = k * t
local function available(elapsed, used)
  if stale then
    return 0
  end
  -- ceil(p * (T - e) / T): what the previous window still weighs.
  local weighted = idiv(p * (t - elapsed) + t - 1, t)
  return math.max(0, limit - weighted - used)
end

if not stale then
  local elapsed = now - start
  if p * (t - elapsed) + (c + n) * t <= limit * t then
    redis.call('HSET', key, 'v', 'sw1', 'k', int(k), 'c', int(c + n), 'p', int(p))
    -- From window k + 2 on, window k weighs nothing.
    expire_at(key, start + 2 * t)
    return {1, now, available(elapsed, c + n), 0}
  end
end

-- The exact time the inequality next holds, if nothing else is admitted.
local at
if c + n <= limit then
  -- Inside window k, once p * (T - e) <= (N - c - n) * T.
  local reach = t
  if p > 0 then
    reach = math.min(idiv((limit - c - n) * t, p), t)
  end
  at = start + t - reach
else
  -- In window k + 1, with c before it and nothing in it.
  at = start + 2 * t - math.min(idiv((limit - n) * t, c), t)
end
local free = 0
if not stale then
  free = available(now - start, c)
end
return {0, now, free, math.max(0, math.max(at, start) - now)}
