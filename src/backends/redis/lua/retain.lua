-- One step of a retention pass. ARGV[3]: the most entries to delete per
-- partition in this call; then pairs of partition and new log start.
-- First every group behind a new start moves to it (what it had not
-- settled below it is counted as skipped); then the entries below each
-- start go (XTRIM MINID, exact), with their ids and bytes.
-- Returns {skips, dropped}: skips as {group, partition, count}, dropped as
-- {partition, first, last, bytes, more (1 when entries below the start
-- are left for another call)}.
if missing() ~= 0 then return -1 end
local batch = tonumber(ARGV[3])
local skips, dropped = {}, {}
local plan = {}
for i = 4, #ARGV, 2 do plan[#plan + 1] = {ARGV[i], tonumber(ARGV[i + 1])} end
local groups = redis.call('HGETALL', groupskey())
-- On a cluster the caller declares every key it expects the script to
-- touch (KEYS[2] onwards): a group it did not know of means nothing is
-- done and it calls again (-4), so no key goes undeclared.
if #KEYS > 1 then
  local declared = {}
  for _, k in ipairs(KEYS) do declared[k] = true end
  for gi = 2, #groups, 2 do
    G = groups[gi]
    if not declared[gkey()] then return -4 end
  end
end
for gi = 1, #groups, 2 do
  GN, G = groups[gi], groups[gi + 1]
  if redis.call('EXISTS', gkey()) == 1 then
    local skipped = 0
    for _, ps in ipairs(plan) do
      local p, start = ps[1], ps[2]
      local fs = redis.call('HGET', gkey(), 'f:' .. p)
      local below = start - 1
      if fs and tonumber(fs) < below then
        local f = tonumber(fs)
        local c = cursor(p, f)
        local open, open_fresh = 0, 0
        for _, k in ipairs(redis.call('HKEYS', stkey(p))) do
          local q = tonumber(k)
          if q <= below then
            open = open + 1
            if q >= math.max(f + 1, c) then open_fresh = open_fresh + 1 end
            redis.call('HDEL', stkey(p), k)
            redis.call('ZREM', duekey(p), k)
            redis.call('XACK', skey(p), GN, k .. '-0')
          end
        end
        -- Unsettled below the new start: the fences, and the positions at
        -- or above the cursor neither settled nor fenced (a fence can lie
        -- above the cursor after a replay: counted once).
        local fresh = math.max(f + 1, c)
        local settled_fresh = 0
        if fresh <= below then
          settled_fresh = redis.call('ZCOUNT', donekey(p), s(fresh), s(below))
        end
        local n = open + math.max(0, below + 1 - fresh - settled_fresh - open_fresh)
        redis.call('ZREMRANGEBYSCORE', donekey(p), '-inf', s(below))
        redis.call('HSET', gkey(), 'f:' .. p, s(below))
        if c < start then
          redis.call('HSET', gkey(), 'c:' .. p, s(start))
          redis.call('XGROUP', 'SETID', skey(p), GN, s(below) .. '-0')
        end
        collapse(p)
        if n > 0 then
          skipped = skipped + n
          skips[#skips + 1] = {GN, tonumber(p), n}
        end
      end
    end
    if skipped > 0 then redis.call('HINCRBY', gkey(), 'skipped', skipped) end
  end
end
G, GN = nil, nil
for _, ps in ipairs(plan) do
  local p, start = ps[1], ps[2]
  local sk = skey(p)
  local es = redis.call('XRANGE', sk, '-', '(' .. s(start) .. '-0', 'COUNT', batch)
  if #es > 0 then
    local bytes = 0
    for _, e in ipairs(es) do
      local size = 32
      for _, v in ipairs(e[2]) do size = size + #v end
      bytes = bytes + size
      local id = field(e[2], 'id')
      if id then
        local at = redis.call('HGET', idskey(), id)
        local here = p .. ':' .. string.sub(e[1], 1, #e[1] - 2) .. ':'
        if at and string.sub(at, 1, #here) == here then
          redis.call('HDEL', idskey(), id)
        end
      end
    end
    local first, last = seq_of(es[1][1]), seq_of(es[#es][1])
    redis.call('XTRIM', sk, 'MINID', s(last + 1) .. '-0')
    redis.call('HINCRBY', meta(), 'bytes:' .. p, -bytes)
    local more = 0
    if #es == batch and last + 1 < start then more = 1 end
    dropped[#dropped + 1] = {tonumber(p), first, last, bytes, more}
  end
end
return {skips, dropped}
