-- Dead-letters one position whatever its state (an operator's skip).
-- ARGV[3]: encoded group, [4]: group, [5]: partition, [6]: sequence, [7]:
-- reason, [8]: now, [9]: the event's id ("" when unknown). Returns -1/-2,
-- 1 (dead-lettered), 0 (a dead letter already) or -4 (settled already).
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local p, q = ARGV[5], tonumber(ARGV[6])
if redis.call('HEXISTS', deadkey(), p .. ':' .. s(q)) == 1 then return 0 end
local f = frontier(p)
local c = cursor(p, f)
local raw = redis.call('HGET', stkey(p), s(q))
if q <= f or redis.call('ZSCORE', donekey(p), s(q)) or (not raw and q < c) then return -4 end
local attempts, eid = '0', ARGV[9]
if raw then
  local d = fence(raw)
  attempts = d.a
  if d.i then eid = d.i end
end
if eid == '' then eid = nil end
dead_letter(p, q, attempts, ARGV[7], eid, ARGV[8])
collapse(p)
return 1
