-- Read a lock's holder and lease in one atomic step.
-- KEYS[1] the lock hash.
-- Returns {} when free, else {owner, hold_count, token, fence, pttl, since} (fence 0 if none,
-- since 0 if unknown).
local fields = redis.call('hgetall', KEYS[1])
if #fields == 0 then
  return {}
end
local owner, count, token, fence, since = '', 0, 0, 0, 0
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  if f == '#token' then
    token = tonumber(v)
  elseif f == '#fence' then
    fence = tonumber(v)
  elseif f == '#since' then
    since = tonumber(v)
  else
    owner, count = f, tonumber(v)
  end
end
return {owner, count, token, fence, redis.call('pttl', KEYS[1]), since}
