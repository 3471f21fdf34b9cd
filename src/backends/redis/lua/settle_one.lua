-- Dead-letters or reschedules one held delivery. ARGV[3]: encoded group,
-- [4]: group, [5]: partition, [6]: sequence, [7]: lease id, [8]: the
-- attempt the caller decided on ("" for any), [9]: "dead" or "wait",
-- [10]: reason, [11]: now, [12]: when a waiting delivery is claimable.
-- Returns -1/-2, 1 (done) or 0 (stale).
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local p, q, l = ARGV[5], ARGV[6], ARGV[7]
local raw = redis.call('HGET', stkey(p), q)
if not raw then return 0 end
local d = fence(raw)
if d.s ~= 'L' or d.l ~= l or (ARGV[8] ~= '' and d.a ~= ARGV[8]) then return 0 end
if ARGV[9] == 'dead' then
  dead_letter(p, tonumber(q), d.a, ARGV[10], d.i, ARGV[11])
  collapse(p)
else
  d.s = 'W'
  d.l = nil
  d.c = nil
  d.x = ARGV[12]
  d.r = ARGV[10]
  redis.call('HSET', stkey(p), q, cjson.encode(d))
  redis.call('ZADD', duekey(p), ARGV[12], q)
end
return 1
