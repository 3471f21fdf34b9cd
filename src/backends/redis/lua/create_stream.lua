-- Creates a stream's meta hash. ARGV[3]: partition count, ARGV[4]: created
-- (ms), ARGV[5]: retention (JSON), ARGV[6]: indexes (JSON array). Returns
-- 0, or -3 when the stream exists.
if redis.call('HSETNX', meta(), 'partitions', ARGV[3]) == 0 then return -3 end
redis.call('HSET', meta(), 'created', ARGV[4], 'retention', ARGV[5], 'indexes', ARGV[6])
for p = 0, tonumber(ARGV[3]) - 1 do
  redis.call('HSET', meta(), 'hw:' .. p, 0, 'bytes:' .. p, 0)
end
return 0
