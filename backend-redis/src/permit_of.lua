-- The permit an owner holds, for giving back a hold whose acquire's answer was lost.
-- KEYS[1] the holders, KEYS[2] the permit data. ARGV[1] owner id.
-- Returns {1, token, hold_count} when the owner holds a live permit, {0} when the name is held
-- as a semaphore but not by the owner, {} when it is not held as a semaphore.
local now = now_ms()
if sweep(KEYS[1], KEYS[2], now) == 0 then
  return {}
end
local v = redis.call('hget', KEYS[2], ARGV[1])
if not v then
  return {0}
end
local token, count = permit(v)
return {1, tonumber(token), count}
