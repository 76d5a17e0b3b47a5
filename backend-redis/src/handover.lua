-- Give up a grant's last hold and grant the lock to another owner in the same step: a hand-over
-- between two tasks of one client, one request where a release and an acquire take two.
-- KEYS[1] the lock hash, KEYS[2] the name's fencing counter.
-- ARGV[1] the releasing owner, ARGV[2] its grant's token on this server, ARGV[3] the new owner,
-- ARGV[4] the new owner's lease in milliseconds.
-- Returns {1, token} when handed over (the new grant's token: a fresh one from the counter),
--         {0, holds left} when the grant had more than one hold (one was given up, as by a
--         release, and nothing was passed on),
--         {-1} when the grant does not hold the lock (then nothing changes).
-- Nobody is told: the lock never comes free, so other clients' waiters have nothing to try.
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not count or redis.call('hget', KEYS[1], '#token') ~= ARGV[2] then
  return {-1}
end
if count > 1 then
  return {0, redis.call('hincrby', KEYS[1], ARGV[1], -1)}
end
local token = redis.call('incr', KEYS[2])
local now = redis.call('time')
local since = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('del', KEYS[1])
redis.call('hset', KEYS[1], ARGV[3], 1, '#token', token, '#since', since)
redis.call('pexpire', KEYS[1], ARGV[4])
return {1, token}
