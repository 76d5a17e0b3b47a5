-- Shared by the permit scripts (prepended to each). A semaphore of several permits is two keys
-- under the name's hash tag: the holders, a sorted set of owner ids scored by the expiry of
-- each one's lease (ms since the epoch, by the server's TIME), and the permit data, a hash of
-- '#max' and owner -> 'token:hold_count:since'. Both keys expire with the latest lease, so they
-- exist exactly while a permit may be live; the lock script needs one EXISTS to see them.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A permit's data: its token (as stored, a decimal string), hold count and grant time.
local function permit(v)
  local token, count, since = string.match(v, '^(%d+):(%d+):(%d+)$')
  return token, tonumber(count), since
end

local function pack(token, count, since)
  return token .. ':' .. string.format('%d', count) .. ':' .. since
end

-- Both keys expire with the latest lease, or go when no holder is left. A lease that already
-- ended takes the keys at once (PEXPIREAT in the past deletes).
local function settle(holders, data)
  local last = redis.call('zrange', holders, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('del', holders, data)
  else
    -- As an integer: a score may come back in a float's notation.
    local at = string.format('%d', tonumber(last[2]))
    redis.call('pexpireat', holders, at)
    redis.call('pexpireat', data, at)
  end
end

-- Drops the holders whose lease ended before `now` (a lease is live up to its expiry, as a
-- key's is) and returns how many are live. No holder left: both keys go.
local function sweep(holders, data, now)
  local before = '(' .. string.format('%d', now)
  local dead = redis.call('zrangebyscore', holders, '-inf', before)
  -- unpack is bounded by Lua's C stack: in slices.
  for i = 1, #dead, 1000 do
    redis.call('hdel', data, unpack(dead, i, math.min(i + 999, #dead)))
  end
  if #dead > 0 then
    redis.call('zremrangebyscore', holders, '-inf', before)
  end
  local live = redis.call('zcard', holders)
  if live == 0 then
    redis.call('del', holders, data)
  end
  return live
end

-- Whether `owner` holds a live permit under `token` at `now`: its data, or nil.
local function held_by(holders, data, owner, token, now)
  local v = redis.call('hget', data, owner)
  local expiry = redis.call('zscore', holders, owner)
  if not v or not expiry or tonumber(expiry) < now then
    return nil
  end
  local t, count, since = permit(v)
  if t ~= token then
    return nil
  end
  return count, since, tonumber(expiry)
end

-- Frees `owner`'s permit and tells the name's waiters.
local function free(holders, data, owner, channel)
  redis.call('zrem', holders, owner)
  redis.call('hdel', data, owner)
  settle(holders, data)
  redis.call('publish', channel, 'released')
end
