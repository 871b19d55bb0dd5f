-- Test builds only: the decision time is the call's last argument, so a test
-- can replay one timeline through these scripts and through the in-process
-- limiter.
local replayed_time = true
local function clock(ARGV)
  return tonumber(ARGV[#ARGV])
end
