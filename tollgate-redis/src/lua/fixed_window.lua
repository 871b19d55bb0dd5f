-- Fixed window: the index of the window last written and its count. ARGV: n,
-- window (us), limit. Windows are aligned to the Unix epoch.
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

local state, err = read_state(key, 'fw1', {'w', 'c'})
if not state then
  return err
end
-- A window ending after the key's expiry was not written with this window
-- length: trusting it would count against a window that never closes.
if state[1] and (state[2] + 1) * window > state.horizon then
  return {-2, 'field w is window ' .. int(state[2]) .. ' of ' .. int(window) ..
    ' us, which ends after the key expires (damaged, or another window length)'}
end
local index, count
if state[1] and now < (state[2] + 1) * window then
  -- The stored window, or a reading older than it (a server clock that stepped
  -- back): time stands still, a closed window never reopens.
  index, count = state[2], state[3]
else
  index, count = idiv(now, window), 0
end
local ends = (index + 1) * window
if count + n <= limit then
  redis.call('HSET', key, 'v', 'fw1', 'w', int(index), 'c', int(count + n))
  expire_at(key, ends)
  return {1, now, limit - count - n, 0}
end
-- n <= limit, so the request fits the next window, which is empty.
return {0, now, limit - count, ends - now}
