-- Acknowledges deliveries, each only when still held under its lease id
-- (the check and the change in one script). ARGV[3]: encoded group, [4]:
-- group; then triples of partition, sequence, lease id. Returns -1/-2, or
-- one 1 (acked) or 0 (stale) per lease; moves the frontiers.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local out, touched = {}, {}
for i = 5, #ARGV, 3 do
  local p, q, l = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = redis.call('HGET', stkey(p), q)
  local ok = 0
  if raw then
    local d = cjson.decode(raw)
    if d.s == 'L' and d.l == l then
      redis.call('HDEL', stkey(p), q)
      redis.call('ZREM', duekey(p), q)
      redis.call('XACK', skey(p), GN, q .. '-0')
      redis.call('ZADD', donekey(p), q, q)
      touched[p] = true
      ok = 1
    end
  end
  out[#out + 1] = ok
end
for p, _ in pairs(touched) do collapse(p) end
return out
