-- Decides a list of requests, in order, at one server time. Request i is on
-- KEYS[i] with six arguments from ARGV[6 * (i - 1) + 1]: kind (1 token bucket,
-- 2 fixed window, 3 sliding window counter, 4 sliding log), n, three terms of
-- the kind's configuration, and 1 when it ends its group (else 0).
--
-- A group is all-or-nothing: every request of it is checked against the state
-- the groups before it left, and only when all would be admitted are they
-- all written. Checks only read and writes only write, so a refused or damaged
-- request anywhere in a group leaves every key of the group untouched. The
-- requests of one group name different keys (the clients make sure): each is
-- checked against the state as it was before the group.
--
-- Reply: four items per request, in order, in one flat array. Admitted (or,
-- in a group that was refused, one that would have been): 1, time, count, 0;
-- refused: 0, time, count, wait; a key these scripts did not write: -1 or -2,
-- the message, 0, 0. Whether a group was charged follows: it was exactly when
-- every request of it has status 1.
--
-- The counters' keys are read once per call and written once, at its end
-- (`read_counter`, `flush`): a key decided many times in one call costs one
-- read and one write.

-- A check returns the reply and, when it admits, what it writes: a counter's
-- new field values and the time its key expires, or (the log) the function
-- that writes.

-- GCRA: the state is the theoretical arrival time (TAT), when the bucket is full
-- again. Terms: interval (us per permit), tolerance (capacity * interval).
-- Values: now < 2^51, tolerance <= 2^51, so TAT <= now + tolerance < 2^52.
local function token_bucket(key, n, interval, tolerance)
  local state, tat, err = gcra_state(key, tolerance)
  if not state then
    return err
  end
  -- A server clock that stepped back only lowers `limit`: it can deny, never
  -- over-admit.
  local base = math.max(tat, now)
  local next_tat = base + n * interval
  local limit = now + tolerance
  if next_tat <= limit then
    -- At the TAT the bucket is full: the same as a missing key.
    return {1, now, idiv(limit - next_tat, interval), 0}, {next_tat}, next_tat
  end
  -- Denied means tat > now, so at now + wait the base is still tat and
  -- next_tat equals the limit: the wait is exact.
  return {0, now, idiv(limit - base, interval), next_tat - limit}
end

-- Fixed window: the index of the window last written and its count. Terms:
-- window (us), limit. Windows are aligned to the Unix epoch.
local function fixed_window(key, n, window, limit)
  local state, err = read_counter(key, FW)
  if not state then
    return err
  end
  -- A window after the current one was written before the server clock
  -- stepped back, or with another window length: it must end within the
  -- key's expiry, or it would count against a window that never closes.
  if state[1] and state[2] > idiv(now, window) then
    local latest
    latest, err = counter_horizon(key, state)
    if not latest then
      return err
    end
    if (state[2] + 1) * window > latest then
      return {-2, 'field w is window ' .. int(state[2]) .. ' of ' .. int(window) ..
        ' us, which ends after the key expires (damaged, or another window length)'}
    end
  end
  local index, count
  if state[1] and now < (state[2] + 1) * window then
    -- The stored window, or a reading older than it (a server clock that
    -- stepped back): time stands still, a closed window never reopens.
    index, count = state[2], state[3]
  else
    index, count = idiv(now, window), 0
  end
  local ends = (index + 1) * window
  if count + n <= limit then
    return {1, now, limit - count - n, 0}, {index, count + n}, ends
  end
  -- n <= limit, so the request fits the next window, which is empty.
  return {0, now, limit - count, ends - now}
end

-- The weighted two-window counter: the previous window's count, weighted by
-- its overlap with the sliding window, plus the current count, stays within
-- the limit. Terms: window T (us), limit N, with N * T <= 2^51 so that every
-- product below (at most 3 * N * T) stays exact.
local function sliding_window(key, n, t, limit)
  local state, err = read_counter(key, SW)
  if not state then
    return err
  end
  local current = idiv(now, t)
  -- Window k's state matters until window k + 2 starts, when the key expires.
  -- A window after the current one was written before the server clock
  -- stepped back, or with another window length: its state must not outlive
  -- the key.
  if state[1] and state[2] > current then
    local latest
    latest, err = counter_horizon(key, state)
    if not latest then
      return err
    end
    if (state[2] + 2) * t > latest then
      return {-2, 'field k is window ' .. int(state[2]) .. ' of ' .. int(t) ..
        ' us, whose state outlives the key (damaged, or another window length)'}
    end
  end
  -- k: the newest window; c: its count; p: the count of window k - 1.
  local k, c, p
  local stale = false
  if not state[1] then
    k, c, p = current, 0, 0
  elseif current <= state[2] then
    k, c, p = state[2], state[3], state[4]
    -- A reading older than the newest window (the server clock stepped back)
    -- is denied until time catches up.
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
      -- From window k + 2 on, window k weighs nothing.
      return {1, now, available(elapsed, c + n), 0}, {k, c + n, p}, start + 2 * t
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
end

-- The exact sliding log: a sorted set with one member per admitted permit,
-- scored by its stamp (us). Members are zero-padded ticket numbers, so equal
-- stamps sort by ticket and the newest member is always last. A marker member
-- at -inf tags the format; no time range ever includes it. Terms: window T
-- (us), limit N, history (us, >= T: how long entries are kept, so that the
-- window can later grow up to it without forgetting permits).
local MARKER = '~tollgate-sl1'
local function sliding_log(key, n, window, limit, history)
  history = number(history)
  -- Every check comes before the first write: a damaged log is reported (the
  -- reply names the member) and left untouched.
  local first = redis.pcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if type(first) == 'table' and first.err then
    return {-1, first.err}
  end
  local tagged = first[1] ~= nil
  local latest
  if tagged then
    if first[1] ~= MARKER then
      if redis.call('ZSCORE', key, MARKER) then
        return {-2, 'member ' .. string.format('%q', first[1]) .. ' ranks before the ' .. MARKER .. ' marker'}
      end
      return {-2, 'a sorted set without the ' .. MARKER .. ' marker'}
    end
    if first[2] ~= '-inf' then
      return {-2, 'the ' .. MARKER .. ' marker has score ' .. first[2] .. ', not -inf'}
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
  if newest[1] and newest[1] ~= MARKER then
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
      local member = string.format('%016d', ticket + i)
      if redis.call('ZSCORE', key, member) then
        return {-2, 'member ' .. member .. ' exists at an older stamp than member ' ..
          string.format('%016d', ticket) .. ' (tickets must grow with stamps)'}
      end
    end
    return {1, stamp, math.max(0, limit - used - n), 0}, function()
      -- Drop the entries older than the history, except the last N with this
      -- admission: a reading from a server clock that stepped back may find
      -- those in its window again (as the in-process log's ring of N would).
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
        batch[#batch + 1] = string.format('%016d', ticket + i)
        -- unpack() has a stack limit: add in chunks.
        if #batch >= 1000 or i == n then
          redis.call('ZADD', key, unpack(batch))
          batch = {}
        end
      end
      if not tagged then
        redis.call('ZADD', key, '-inf', MARKER)
      end
      expire_later(key, stamp + history)
    end
  end

  -- The (used + n - N)-th oldest permit in the window must leave it first.
  local k = used + n - limit
  local entry = redis.call('ZRANGEBYSCORE', key, since, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)
  local leaves, why = parse_uint(entry[2], MAX_TIME)
  if not leaves then
    return {-2, 'the score of member ' .. string.format('%q', tostring(entry[1])) .. ' ' .. why}
  end
  return {0, now, math.max(0, limit - used), leaves + window - now}
end

local KINDS = {token_bucket, fixed_window, sliding_window, sliding_log}
-- The counters' formats, by kind (the log writes for itself).
local FORMATS = {TB, FW, SW}

-- Appends a decision's reply to the call's: four items a decision, {status,
-- time or message, count, value}.
local function answer(replies, reply)
  local at = #replies
  replies[at + 1] = reply[1]
  replies[at + 2] = reply[2]
  replies[at + 3] = reply[3] or 0
  replies[at + 4] = reply[4] or 0
end

-- Writes what one admitted request of a group keeps: a counter's values
-- (written at the end of the call), or the log's function.
local function commit(key, write, expires, format)
  if format then
    write_counter(key, format, write, expires)
  else
    write()
  end
end

-- Decides the call's requests (see the top of this file).
local function decide(KEYS, ARGV)
  begin(ARGV)
  local replies = {}
  -- A call of several reads its counters' keys in one MGET.
  if #KEYS > 1 then
    local counters = {}
    for i = 1, #KEYS do
      if FORMATS[number(ARGV[6 * (i - 1) + 1])] then
        counters[#counters + 1] = KEYS[i]
      end
    end
    if #counters > 1 then
      prefetch(counters)
    end
  end

  -- The writes of the group being decided: key, value (or function), expiry,
  -- format.
  local writes = {}
  local whole = true
  for i = 1, #KEYS do
    local at = 6 * (i - 1)
    local kind_number = number(ARGV[at + 1])
    local kind = KINDS[kind_number]
    if not kind then
      return redis.error_reply('tollgate: unknown limiter kind ' .. tostring(ARGV[at + 1]))
    end
    local key = KEYS[i]
    -- The third term is the log's alone, which reads it as a number.
    local reply, write, expires = kind(key, number(ARGV[at + 2]), number(ARGV[at + 3]),
      number(ARGV[at + 4]), ARGV[at + 5])
    answer(replies, reply)
    local ends = ARGV[at + 6] == '1'
    if reply[1] ~= 1 then
      whole = false
    elseif ends and #writes == 0 then
      -- The last request of its group and the only one to write: the group is
      -- whole if nothing before it was refused. (Most groups are one request.)
      if whole then
        commit(key, write, expires, FORMATS[kind_number])
      end
    else
      writes[#writes + 1] = {key, write, expires, FORMATS[kind_number]}
    end
    if ends then
      -- The group ends here: written whole, or not at all.
      if whole then
        for _, w in ipairs(writes) do
          commit(w[1], w[2], w[3], w[4])
        end
      end
      if #writes > 0 then
        writes = {}
      end
      whole = true
    end
  end
  flush()
  return replies
end
