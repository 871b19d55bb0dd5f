-- Test builds only: the decision time is the last argument, so a test can replay
-- one timeline through this script and through the in-process limiter.
local now = tonumber(ARGV[#ARGV])
-- Expiry runs on the server's real clock, not on the replayed one: an hour of
-- slack keeps a replayed key alive however slowly the test replays it.
local expiry_slack_ms = 3600000
