-- An operator frees the permit with a given token, whatever its hold count.
-- KEYS[1] the holders, KEYS[2] the permit data. ARGV[1] the token, ARGV[2] the release channel.
-- Returns 1 when that permit was live and is freed (waiters told), 0 when the semaphore has no
-- live permit with that token, -1 when the name is not held as a semaphore (the caller then
-- looks at the lock).
if sweep(KEYS[1], KEYS[2], now_ms()) == 0 then
  return -1
end
local fields = redis.call('hgetall', KEYS[2])
for i = 1, #fields, 2 do
  if fields[i] ~= '#max' and permit(fields[i + 1]) == ARGV[1] then
    free(KEYS[1], KEYS[2], fields[i], ARGV[2])
    return 1
  end
end
return 0
