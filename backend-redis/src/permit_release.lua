-- Give up one hold of a permit.
-- KEYS[1] the holders, KEYS[2] the permit data. ARGV[1] owner id, ARGV[2] the grant's token,
-- ARGV[3] the name's release channel.
-- Returns the holds left (0: the permit was freed and waiters told), or -1 when this grant
-- holds no live permit (expired, removed, released before): then nothing changes.
local count, since = held_by(KEYS[1], KEYS[2], ARGV[1], ARGV[2], now_ms())
if not count then
  return -1
end
if count > 1 then
  redis.call('hset', KEYS[2], ARGV[1], pack(ARGV[2], count - 1, since))
  return count - 1
end
free(KEYS[1], KEYS[2], ARGV[1], ARGV[3])
return 0
