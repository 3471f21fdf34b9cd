-- Clears a group's state in some partitions and restarts each at a
-- frontier. ARGV[3]: encoded group, [4]: group; then pairs of partition
-- and frontier. Returns -1/-2 or 0.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
for i = 5, #ARGV, 2 do
  local p, f = ARGV[i], tonumber(ARGV[i + 1])
  redis.call('DEL', stkey(p), duekey(p), donekey(p))
  for _, pq in ipairs(dead_of(p)) do undead(pq[1]) end
  redis.call('HSET', gkey(), 'f:' .. p, s(f), 'c:' .. p, s(f + 1))
  redis.pcall('XGROUP', 'DESTROY', skey(p), GN)
  redis.call('XGROUP', 'CREATE', skey(p), GN, s(f) .. '-0', 'MKSTREAM')
end
return 0
