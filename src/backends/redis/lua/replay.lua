-- Reopens every settled delivery after a sequence, per partition. ARGV[3]:
-- encoded group, [4]: group; then triples of partition, "from" (reopen
-- what is after it) and the high watermark read before. In-flight
-- deliveries keep their leases. Returns -1/-2 or how many were reopened.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local total = 0
for i = 5, #ARGV, 3 do
  local p, from, hw = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local f = frontier(p)
  local c = cursor(p, f)
  local upper = math.min(hw, c - 1)
  local open = 0
  for _, k in ipairs(redis.call('HKEYS', stkey(p))) do
    local q = tonumber(k)
    if q > from and q < c and q <= hw then open = open + 1 end
  end
  -- Settled at or above the cursor: below the frontier (dead-lettered
  -- ahead of the cursor, then passed) or in the done set (acked after an
  -- earlier replay moved the cursor back, or dead-lettered ahead of it).
  local lo = math.max(c, from + 1)
  local above = math.max(0, math.min(f, hw) - lo + 1)
  local lo_done = math.max(lo, f + 1)
  if lo_done <= hw then above = above + redis.call('ZCOUNT', donekey(p), s(lo_done), s(hw)) end
  for _, pq in ipairs(dead_of(p)) do
    if pq[2] > from then undead(pq[1]) end
  end
  total = total + math.max(0, upper - from - open) + above
  redis.call('ZREMRANGEBYSCORE', donekey(p), '(' .. s(from), '+inf')
  if from < f then redis.call('HSET', gkey(), 'f:' .. p, s(from)) end
  if from + 1 < c then
    redis.call('HSET', gkey(), 'c:' .. p, s(from + 1))
    redis.call('XGROUP', 'SETID', skey(p), GN, s(from) .. '-0')
  end
end
return total
