-- Decision time from the server's clock, in microseconds since the Unix epoch:
-- every client shares it, whatever its own clock says. About 2^50.6 in 2026,
-- below 2^51 until 2041 and below 2^53 (a double's exact range) until 2255.
local replayed_time = false
local function clock(ARGV)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
