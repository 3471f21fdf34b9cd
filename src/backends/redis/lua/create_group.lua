-- Creates a group. ARGV[3]: encoded name, ARGV[4]: name, ARGV[5]: created
-- (ms), ARGV[6]: max attempts, ARGV[7]: settings (JSON); then pairs of
-- partition and starting frontier. Returns 0, -1 (no stream) or -3 (the
-- group exists).
G, GN = ARGV[3], ARGV[4]
if missing() == -1 then return -1 end
if redis.call('HSETNX', gkey(), 'max', ARGV[6]) == 0 then return -3 end
redis.call('HSET', gkey(), 'created', ARGV[5], 'settings', ARGV[7], 'skipped', 0, 'marks', 0)
-- What an earlier group of this name left (deleted by hand) is not this one's.
redis.call('DEL', dlkey(), deadkey(), dlidkey())
for i = 8, #ARGV, 2 do
  local p, f = ARGV[i], tonumber(ARGV[i + 1])
  redis.call('HSET', gkey(), 'f:' .. p, s(f), 'c:' .. p, s(f + 1))
  redis.call('DEL', stkey(p), duekey(p), donekey(p))
  redis.pcall('XGROUP', 'DESTROY', skey(p), GN)
  redis.call('XGROUP', 'CREATE', skey(p), GN, s(f) .. '-0', 'MKSTREAM')
end
redis.call('HSET', groupskey(), GN, G)
return 0
