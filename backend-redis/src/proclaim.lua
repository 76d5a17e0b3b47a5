-- Proclaim an election leader's value under its grant: written only while the grant holds the
-- lock (the condition renew.lua and release.lua check), into the lock hash itself, so the value
-- lives exactly as long as the hold (released, expired, handed over: gone with the hash).
-- KEYS[1] the lock hash. ARGV[1] owner id, ARGV[2] the grant's token on this server,
-- ARGV[3] the epoch (the grant's token; under RedLock the derived one), ARGV[4] the value,
-- ARGV[5] the name's release channel.
-- Returns 1 when written (observers told), 0 when this grant no longer holds the lock.
if redis.call('hexists', KEYS[1], ARGV[1]) == 0
    or redis.call('hget', KEYS[1], '#token') ~= ARGV[2] then
  return 0
end
redis.call('hset', KEYS[1], '#value', ARGV[3] .. ':' .. ARGV[4])
redis.call('publish', ARGV[5], 'proclaimed')
return 1
