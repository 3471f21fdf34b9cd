-- Claims up to `limit` deliveries in (partition, sequence) order: per
-- partition, the pending ones whose lease expired or whose retry wait
-- ended (from the due set, on Rheo's clock) merged with new entries from
-- XREADGROUP. Each claim gets its fence (state, lease id, expiry) here.
-- A delivery whose lease expired on its last attempt is dead-lettered on
-- the way (at most `spent` of them; past that a partition stops).
-- ARGV[3]: encoded group, [4]: group, [5]: now, [6]: expiry, [7]: consumer,
-- [8]: limit, [9]: spent budget, [10]: partitions to look at
-- (comma-separated; those the group does not consume are passed),
-- [11...]: one lease id per possible claim.
-- Returns -1/-2 (stream/group missing) or {count, claims...}, each claim
-- {partition, sequence, attempt, lease id, fields}.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local now, exp, consumer = ARGV[5], ARGV[6], ARGV[7]
local limit, spent = tonumber(ARGV[8]), tonumber(ARGV[9])
local maxa = tonumber(redis.call('HGET', gkey(), 'max'))
local consumer_json = cjson.encode(consumer)
local out, n = {}, 0

for p in string.gmatch(ARGV[10], '[^,]+') do
  if n >= limit then break end
  local g = redis.call('HMGET', gkey(), 'f:' .. p, 'c:' .. p)
  if g[1] then
    local st, due, sk, done = stkey(p), duekey(p), skey(p), donekey(p)
    local f0 = tonumber(g[1])
    local stop, dead = false, false
    -- Fences written at the end, in one HSET and one ZADD.
    local hset, zadd = {}, {}
    -- A fence: `d` (a reclaimed delivery's, kept with its attempt, event
    -- id and reason) or, for a first delivery, built as text (no table to
    -- encode: most claims are first deliveries).
    local function lease(q, d, fields)
      n = n + 1
      local qs_ = s(q)
      local lid = ARGV[10 + n]
      local a, text
      if d then
        d.s = 'L'
        d.a = tostring((tonumber(d.a) or 0) + 1)
        d.l = lid
        d.x = exp
        d.c = consumer
        a = d.a
        text = cjson.encode(d)
      else
        a = '1'
        text = '{"s":"L","a":"1","l":"' .. lid .. '","x":"' .. exp .. '","c":' .. consumer_json .. '}'
      end
      hset[#hset + 1] = qs_
      hset[#hset + 1] = text
      zadd[#zadd + 1] = exp
      zadd[#zadd + 1] = qs_
      out[#out + 1] = {tonumber(p), qs_, a, lid, fields}
    end
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
              -- Gone (deleted by hand): settled, nothing to deliver.
              redis.call('HDEL', st, s(q))
              redis.call('ZREM', due, s(q))
              redis.call('ZADD', done, s(q), s(q))
              dead = true
            else
              redis.call('XCLAIM', sk, GN, consumer, 0, s(q) .. '-0', 'JUSTID')
              lease(q, d, e[1][2])
            end
          end
        end
      end
    end
    -- New entries, merged with the due candidates in sequence order (after
    -- a replay moved the cursor back, some pending ones lie above it).
    -- Settled positions the cursor passes again (acked since a replay, or
    -- dead-lettered ahead of it) are passed. In chunks of at least 64: after
    -- a replay, entries still in flight are read and passed; at most 16
    -- chunks per partition and fetch, the next fetch goes on from there.
    local rounds, exhausted = 0, false
    local pending_states = redis.call('HLEN', st) > 0
    local settled_above = redis.call('ZCARD', done) > 0
    while not stop and not exhausted and n < limit and rounds < 16 do
      rounds = rounds + 1
      local want = math.max(limit - n, 64)
      local r = redis.call('XREADGROUP', 'GROUP', GN, consumer, 'COUNT', want, 'STREAMS', sk, '>')
      if not r then break end
      local entries = r[1][2]
      local seqs = {}
      for j, e in ipairs(entries) do seqs[j] = s(seq_of(e[1])) end
      local has, sets = {}, {}
      if pending_states then has = chunked_read('HMGET', st, seqs) end
      if settled_above then sets = chunked_read('ZMSCORE', done, seqs) end
      local passed = {}
      local last, k = nil, 1
      while k <= #entries do
        local e = entries[k]
        local q = tonumber(seqs[k])
        if #qs >= di then due_before(q) end
        if stop or n >= limit then break end
        if has[k] then
          -- Pending already: its state claims it.
        elseif q <= f0 or sets[k] then
          passed[#passed + 1] = e[1]
        else
          lease(q, nil, e[2])
        end
        last = q
        k = k + 1
      end
      chunked('XACK', {sk, GN}, passed)
      if k <= #entries then
        -- Read but not reached: back to the group (its last-delivered id
        -- before them; out of the pending list unless in flight).
        local back_ids = {}
        for j = k, #entries do
          if not has[j] then back_ids[#back_ids + 1] = entries[j][1] end
        end
        chunked('XACK', {sk, GN}, back_ids)
        local back = last or (tonumber(seqs[k]) - 1)
        redis.call('XGROUP', 'SETID', sk, GN, s(back) .. '-0')
        redis.call('HSET', gkey(), 'c:' .. p, s(back + 1))
        exhausted = true
      elseif last then
        redis.call('HSET', gkey(), 'c:' .. p, s(last + 1))
      end
      if #entries < want then exhausted = true end
    end
    due_before(nil)
    chunked('HSET', {st}, hset)
    chunked('ZADD', {due}, zadd)
    if dead then collapse(p) end
  end
end
return {n, out}
