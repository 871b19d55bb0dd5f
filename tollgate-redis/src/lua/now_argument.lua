-- Test builds only: the decision time is the last argument, so a test can replay
-- one timeline through this script and through the in-process limiter.
local now = tonumber(ARGV[#ARGV])
local replayed_time = true
