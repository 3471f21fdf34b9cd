-- Counts a group's deliveries: {in flight, waiting for a retry, dead
-- letters}. ARGV[3]: encoded group, [4]: group, [5]: now, [6]:
-- partitions (comma-separated). Returns -1/-2 or the three counts.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local now = tonumber(ARGV[5])
local inflight, waiting = 0, 0
for p in string.gmatch(ARGV[6], '[^,]+') do
  for _, raw in ipairs(redis.call('HVALS', stkey(p))) do
    local d = fence(raw)
    if d.s == 'L' then inflight = inflight + 1
    elseif tonumber(d.x) > now then waiting = waiting + 1 end
  end
end
return {inflight, waiting, redis.call('ZCARD', dlkey())}
