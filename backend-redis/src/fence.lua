-- RedLock only: record the token derived over all instances on this one, while the grant still
-- holds it here, so that any later grant whose majority includes this instance counts past it.
-- KEYS[1] the lock hash, KEYS[2] the name's fencing counter.
-- ARGV[1] owner id, ARGV[2] the grant's token on this server, ARGV[3] the derived token.
-- Returns 1 when recorded, 0 when this grant no longer holds the lock here.
if redis.call('hexists', KEYS[1], ARGV[1]) == 0
    or redis.call('hget', KEYS[1], '#token') ~= ARGV[2] then
  return 0
end
local derived = tonumber(ARGV[3])
if tonumber(redis.call('get', KEYS[2]) or '0') < derived then
  redis.call('set', KEYS[2], ARGV[3])
end
redis.call('hset', KEYS[1], '#fence', ARGV[3])
return 1
