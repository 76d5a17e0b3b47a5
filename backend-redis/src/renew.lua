-- Extend a grant's lease.
-- KEYS[1] the lock hash. ARGV[1] owner id, ARGV[2] the grant's token on this server,
-- ARGV[3] the new lease in milliseconds.
-- Returns 1 when extended, 0 when this grant no longer holds the lock.
if redis.call('hexists', KEYS[1], ARGV[1]) == 1
    and redis.call('hget', KEYS[1], '#token') == ARGV[2] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return 1
end
return 0
