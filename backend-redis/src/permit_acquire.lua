-- Take (or re-enter) one permit of a semaphore of ARGV[3] permits.
-- KEYS[1] the name's lock hash, KEYS[2] its fencing counter (shared with the lock, so every
-- permit's token is above every earlier token of the name), KEYS[3] the holders, KEYS[4] the
-- permit data. ARGV[1] owner id, ARGV[2] lease in milliseconds, ARGV[3] max.
-- Returns {1, token, hold_count} when granted,
--         {0, ms until the soonest lease ends} when every permit is held by others,
--         {2, max} when the name is held with another max (1: held as a lock).
if redis.call('exists', KEYS[1]) == 1 then
  return {2, 1}
end
local owner, ttl, max = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local held = sweep(KEYS[3], KEYS[4], now)
if held > 0 then
  local stored = tonumber(redis.call('hget', KEYS[4], '#max'))
  if not stored then
    -- Holders without their data (removed behind their backs): no one can use them.
    redis.call('del', KEYS[3], KEYS[4])
    held = 0
  elseif stored ~= max then
    return {2, stored}
  end
end
if held > 0 then
  local mine = redis.call('hget', KEYS[4], owner)
  if mine then
    local token, count, since = permit(mine)
    redis.call('hset', KEYS[4], owner, pack(token, count + 1, since))
    -- A re-entry never shortens the lease another hold of the same owner relies on.
    local expiry = now + ttl
    if tonumber(redis.call('zscore', KEYS[3], owner) or 0) < expiry then
      redis.call('zadd', KEYS[3], expiry, owner)
      settle(KEYS[3], KEYS[4])
    end
    return {1, tonumber(token), count + 1}
  end
  if held >= max then
    local soonest = redis.call('zrange', KEYS[3], 0, 0, 'WITHSCORES')
    return {0, tonumber(soonest[2]) - now}
  end
end
local token = redis.call('incr', KEYS[2])
local since = string.format('%d', now)
redis.call('hset', KEYS[4], '#max', ARGV[3], owner, pack(string.format('%d', token), 1, since))
redis.call('zadd', KEYS[3], now + ttl, owner)
settle(KEYS[3], KEYS[4])
return {1, token, 1}
