-- Extend a grant's lease to at least the given length from now.
-- KEYS[1] the lock hash. ARGV[1] owner id, ARGV[2] the grant's token on this server,
-- ARGV[3] the lease in milliseconds.
-- Returns 1 when the grant holds the lock (its lease now ends no sooner than ARGV[3] from now),
--         0 when this grant no longer holds the lock.
-- A renewal never shortens the lease: another hold of the same owner (a re-entry, an earlier
-- extend) was promised the longer one, and its guard still counts on it.
if redis.call('hexists', KEYS[1], ARGV[1]) == 1
    and redis.call('hget', KEYS[1], '#token') == ARGV[2] then
  if redis.call('pttl', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('pexpire', KEYS[1], ARGV[3])
  end
  return 1
end
return 0
