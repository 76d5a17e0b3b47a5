-- Read a lock's holder and lease in one atomic step; with KEYS[2] and KEYS[3], a semaphore's
-- oldest live permit when the name is not held as a lock.
-- KEYS[1] the lock hash; KEYS[2] the holders and KEYS[3] the permit data (single server only).
-- Returns {} when free, else {owner, hold_count, token, fence, pttl, since, value} for a lock
-- (fence 0 if none, since 0 if unknown, value nil unless an election's leader proclaimed one
-- under this hold's token or fence), {owner, hold_count, token, 0, pttl, since, held, max} for
-- a semaphore.
local fields = redis.call('hgetall', KEYS[1])
if #fields == 0 then
  if not KEYS[3] then
    return {}
  end
  local now = now_ms()
  local held = sweep(KEYS[2], KEYS[3], now)
  if held == 0 then
    return {}
  end
  -- The oldest permit is the one with the lowest token.
  local data = redis.call('hgetall', KEYS[3])
  local max, owner, count, token, since = 0, nil, 0, 0, 0
  for i = 1, #data, 2 do
    if data[i] == '#max' then
      max = tonumber(data[i + 1])
    else
      local t, c, s = permit(data[i + 1])
      if not owner or tonumber(t) < token then
        owner, count, token, since = data[i], c, tonumber(t), tonumber(s)
      end
    end
  end
  if not owner then
    return {}
  end
  local pttl = tonumber(redis.call('zscore', KEYS[2], owner) or now) - now
  return {owner, count, token, 0, pttl, since, held, max}
end
local owner, count, token, fence, since, proclaimed = '', 0, 0, 0, 0, nil
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  if f == '#token' then
    token = tonumber(v)
  elseif f == '#fence' then
    fence = tonumber(v)
  elseif f == '#since' then
    since = tonumber(v)
  elseif f == '#value' then
    proclaimed = v
  else
    owner, count = f, tonumber(v)
  end
end
-- The value is stored as '<epoch>:<value>' and shown only under the epoch it was written for.
local value = false
if proclaimed then
  local epoch, rest = string.match(proclaimed, '^(%d+):(.*)$')
  if epoch and (tonumber(epoch) == token or tonumber(epoch) == fence) then
    value = rest
  end
end
return {owner, count, token, fence, redis.call('pttl', KEYS[1]), since, value}
