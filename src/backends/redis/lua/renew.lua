-- Extends leases still held. ARGV[3]: encoded group, [4]: group, [5]: new
-- expiry; then triples of partition, sequence, lease id. Returns -1/-2 or
-- one 1/0 per lease.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local out = {}
for i = 6, #ARGV, 3 do
  local p, q, l = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = redis.call('HGET', stkey(p), q)
  local ok = 0
  if raw then
    local d = fence(raw)
    if d.s == 'L' and d.l == l then
      d.x = ARGV[5]
      redis.call('HSET', stkey(p), q, fence_text(d))
      redis.call('ZADD', duekey(p), ARGV[5], q)
      ok = 1
    end
  end
  out[#out + 1] = ok
end
return out
