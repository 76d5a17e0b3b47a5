-- Acquire (or re-enter) a lock.
-- KEYS[1] the lock hash: owner -> hold count, plus '#token' (this server's fencing counter value
--         at the grant), '#since' (the server's clock at the grant, in ms since the epoch) and,
--         under RedLock, '#fence' (the token derived over all instances).
-- KEYS[2] the name's fencing counter. Never deleted: it must outlive release and expiry.
-- KEYS[3] the name's permit data, which exists exactly while the name is held as a semaphore
--         of several permits (see permits.lua).
-- ARGV[1] owner id, ARGV[2] lease in milliseconds, ARGV[3] '1' when the owner id is the
--         acquisition's own: a hold of it here was left by an earlier attempt of the same
--         acquisition whose answer was lost, and is granted afresh (a new token, one hold)
--         rather than re-entered, so a release of it still on its way cannot take this grant.
-- Returns {1, token, hold_count, fence} when granted (fence 0 if none was written),
--         {0, pttl} when another owner holds it (pttl < 0: no expiry known),
--         {2, max} when the name is held as a semaphore of max permits.
if redis.call('exists', KEYS[1]) == 1 then
  if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return {0, redis.call('pttl', KEYS[1])}
  end
  if ARGV[3] ~= '1' then
    local count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    -- A re-entry never shortens the lease another hold of the same owner relies on.
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('pexpire', KEYS[1], ARGV[2])
    end
    local token = tonumber(redis.call('hget', KEYS[1], '#token'))
    local fence = tonumber(redis.call('hget', KEYS[1], '#fence') or '0')
    return {1, token, count, fence}
  end
  redis.call('del', KEYS[1])
end
-- The one check the lock pays for semaphores, and only when the lock is free.
if redis.call('exists', KEYS[3]) == 1 then
  return {2, tonumber(redis.call('hget', KEYS[3], '#max') or '0')}
end
local token = redis.call('incr', KEYS[2])
local now = redis.call('time')
local since = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('hset', KEYS[1], ARGV[1], 1, '#token', token, '#since', since)
redis.call('pexpire', KEYS[1], ARGV[2])
return {1, token, 1, 0}
