-- Extend a permit's lease to at least the given length from now; never shortened, as the
-- lock's renew.lua (another hold of the same owner may rely on the longer one).
-- KEYS[1] the holders, KEYS[2] the permit data. ARGV[1] owner id, ARGV[2] the grant's token,
-- ARGV[3] the lease in milliseconds.
-- Returns 1 when the grant holds its permit, 0 when it no longer does.
local now = now_ms()
local count, _, expiry = held_by(KEYS[1], KEYS[2], ARGV[1], ARGV[2], now)
if not count then
  return 0
end
local wanted = now + tonumber(ARGV[3])
if expiry < wanted then
  redis.call('zadd', KEYS[1], wanted, ARGV[1])
  settle(KEYS[1], KEYS[2])
end
return 1
