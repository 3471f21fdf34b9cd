-- Claims up to `limit` deliveries in (partition, sequence) order: per
-- partition, first the pending ones whose lease expired or whose retry
-- wait ended (from the due set, on Rheo's clock), then new entries through
-- XREADGROUP. Each claim gets its fence (state, lease id, expiry) here.
-- A delivery whose lease expired on its last attempt is dead-lettered on
-- the way (at most `spent` of them; past that a partition stops).
-- ARGV[3]: encoded group, [4]: group, [5]: now, [6]: expiry, [7]: consumer,
-- [8]: limit, [9]: max attempts, [10]: spent budget, [11]: partitions
-- (comma-separated), [12...]: one lease id per possible claim.
-- Returns -1/-2 (stream/group missing) or {count, claims...}, each claim
-- {partition, sequence, attempt, lease id, fields}.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local now, exp, consumer = ARGV[5], ARGV[6], ARGV[7]
local limit, maxa, spent = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local out, n = {}, 0

local function lease(p, q, d, fields)
  n = n + 1
  d.s = 'L'
  d.a = tostring((tonumber(d.a) or 0) + 1)
  d.l = ARGV[11 + n]
  d.x = exp
  d.c = consumer
  redis.call('HSET', stkey(p), s(q), cjson.encode(d))
  redis.call('ZADD', duekey(p), exp, s(q))
  out[#out + 1] = {tonumber(p), s(q), d.a, d.l, fields}
end

for p in string.gmatch(ARGV[11], '[^,]+') do
  if n >= limit then break end
  local st, due, sk, done = stkey(p), duekey(p), skey(p), donekey(p)
  local stop, dead = false, false
  local cands = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, limit - n + spent)
  local qs = {}
  for _, m in ipairs(cands) do qs[#qs + 1] = tonumber(m) end
  table.sort(qs)
  local di = 1
  -- The due candidates below `bound` (all when nil), in sequence order.
  local function due_before(bound)
    while di <= #qs and n < limit and not stop do
      local q = qs[di]
      if bound and q >= bound then return end
      di = di + 1
      local raw = redis.call('HGET', st, s(q))
      if not raw then
        redis.call('ZREM', due, s(q))
      else
        local d = cjson.decode(raw)
        if d.s == 'L' and tonumber(d.a) >= maxa then
          if spent == 0 then stop = true; return end
          spent = spent - 1
          dead_letter(p, q, d.a, 'max_attempts: lease expired', d.i, now)
          dead = true
        else
          local e = redis.call('XRANGE', sk, s(q) .. '-0', s(q) .. '-0')
          if #e == 0 then
            -- Dropped by retention since: nothing to deliver.
            redis.call('HDEL', st, s(q))
            redis.call('ZREM', due, s(q))
          else
            redis.call('XCLAIM', sk, GN, consumer, 0, s(q) .. '-0', 'JUSTID')
            lease(p, q, d, e[1][2])
          end
        end
      end
    end
  end
  -- New entries, merged with the due candidates in sequence order (after
  -- a replay moved the cursor back, some pending ones lie above it).
  -- Settled positions the cursor passes again (acked since a replay, or
  -- dead-lettered ahead of it) are passed.
  local f0 = frontier(p)
  local rounds, exhausted = 0, false
  -- (In chunks of at least 64: after a replay, entries still in flight
  -- are read and passed; at most 16 chunks per partition and fetch, and
  -- the next fetch goes on from where this one stopped.)
  while not stop and not exhausted and n < limit and rounds < 16 do
    rounds = rounds + 1
    local want = math.max(limit - n, 64)
    local r = redis.call('XREADGROUP', 'GROUP', GN, consumer, 'COUNT', want, 'STREAMS', sk, '>')
    if not r then break end
    local entries = r[1][2]
    local last, k = nil, 1
    while k <= #entries do
      local e = entries[k]
      local q = seq_of(e[1])
      due_before(q)
      if stop or n >= limit then break end
      if redis.call('HEXISTS', st, s(q)) == 1 then
        -- Pending already: its state claims it.
      elseif q <= f0 or redis.call('ZSCORE', done, s(q)) then
        redis.call('XACK', sk, GN, e[1])
      else
        lease(p, q, {i = field(e[2], 'id')}, e[2])
      end
      last = q
      k = k + 1
    end
    if k <= #entries then
      -- Read but not reached: back to the group (its last-delivered id
      -- before them; out of the pending list unless in flight).
      for j = k, #entries do
        if redis.call('HEXISTS', st, s(seq_of(entries[j][1]))) == 0 then
          redis.call('XACK', sk, GN, entries[j][1])
        end
      end
      local back = last or (seq_of(entries[k][1]) - 1)
      redis.call('XGROUP', 'SETID', sk, GN, s(back) .. '-0')
      redis.call('HSET', gkey(), 'c:' .. p, s(back + 1))
      exhausted = true
    elseif last then
      redis.call('HSET', gkey(), 'c:' .. p, s(last + 1))
    end
    if #entries < want then exhausted = true end
  end
  due_before(nil)
  if dead then collapse(p) end
end
return {n, out}
