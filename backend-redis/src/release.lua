-- Give up one hold of a grant.
-- KEYS[1] the lock hash. ARGV[1] owner id, ARGV[2] the grant's token on this server,
-- ARGV[3] the name's release channel.
-- Returns the holds left (0: the lock was deleted and waiters told), or -1 when this grant does
-- not hold the lock (expired, taken over, released before): then nothing changes.
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not count or redis.call('hget', KEYS[1], '#token') ~= ARGV[2] then
  return -1
end
if count > 1 then
  return redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[3], 'released')
return 0
