-- Reopens the settled deliveries among the given positions. ARGV[3]:
-- encoded group, [4]: group, [5]: now; then triples of partition,
-- sequence, event id. A reopened delivery waits (claimable now, attempt 0).
-- Returns -1/-2 or how many were reopened.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local now = ARGV[5]
local total, fs = 0, {}
for i = 6, #ARGV, 3 do
  local p, q, id = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if not fs[p] then fs[p] = frontier(p) end
  local f = fs[p]
  local c = cursor(p, f)
  local pos = p .. ':' .. s(q)
  local open = redis.call('HEXISTS', stkey(p), s(q)) == 1
  local dead = redis.call('HEXISTS', deadkey(), pos) == 1
  local settled = not open and (q <= f or dead or redis.call('ZSCORE', donekey(p), s(q)) or q < c)
  if settled then
    undead(pos)
    redis.call('ZREM', donekey(p), s(q))
    redis.call('HSET', stkey(p), s(q), cjson.encode({s = 'W', a = '0', x = now, i = id, r = 'replay'}))
    redis.call('ZADD', duekey(p), now, s(q))
    if q - 1 < f then fs[p] = q - 1 end
    total = total + 1
  end
end
for p, f in pairs(fs) do redis.call('HSET', gkey(), 'f:' .. p, s(f)) end
return total
