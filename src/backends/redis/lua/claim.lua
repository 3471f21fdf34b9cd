-- Claims up to `limit` deliveries in (partition, sequence) order: per
-- partition, the pending ones whose lease expired or whose retry wait
-- ended (from the due set, on Rheo's clock) merged with new entries from
-- XREADGROUP. Each claim gets its fence (state, lease id, expiry) here,
-- and each claimed batch one due entry: `b<first lease id>:<ranges>`
-- (e.g. `b…:5-104,107`) scored by the batch's expiry, instead of one per
-- lease. A due entry is a hint: a position is claimable when its fence's
-- time (`x`) has come, whichever entry led to it; a renewal or a retry
-- wait adds the position's own entry (its sequence).
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
    -- Fences written at the end, in one HSET; the batch's due entry is
    -- built from the claimed sequences as ranges (they come in order).
    local hset, ranges, lo, hi, first_lid = {}, {}, nil, nil, nil
    local function add_range()
      if lo then ranges[#ranges + 1] = lo == hi and s(lo) or (s(lo) .. '-' .. s(hi)) end
    end
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
      first_lid = first_lid or lid
      if hi and q == hi + 1 then
        hi = q
      else
        add_range()
        lo, hi = q, q
      end
      out[#out + 1] = {tonumber(p), qs_, a, lid, fields}
    end
    local cands = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, limit - n + spent)
    -- The candidates: each position's own entry, and the positions of
    -- each due batch whose fence's time has come (a renewed lease in it
    -- has its own entry, later). Once in the list, in sequence order.
    local qs, seen, singles, batches = {}, {}, {}, {}
    -- Fences read while expanding batches, for due_before.
    local fences = {}
    local nowt = tonumber(now)
    for _, m in ipairs(cands) do
      if string.byte(m, 1) == 98 then
        local list = {}
        for part in string.gmatch(string.match(m, '^b[^:]*:(.*)$') or '', '[^,]+') do
          local a, b = string.match(part, '^(%d+)-(%d+)$')
          a, b = tonumber(a or part), tonumber(b or part)
          -- (A malformed entry, not one of ours, claims nothing and goes.)
          if a and b and b >= a and b - a < 10000 then
            -- (A batch holds at most one fetch's limit of positions.)
            for q = a, b do list[#list + 1] = s(q) end
          end
        end
        local raws = chunked_read('HMGET', st, list)
        local mine = {}
        for j, qs_ in ipairs(list) do
          if raws[j] and fence_time(raws[j]) <= nowt then
            local q = tonumber(qs_)
            fences[q] = raws[j]
            mine[#mine + 1] = q
            if not seen[q] then seen[q] = true; qs[#qs + 1] = q end
          end
        end
        batches[#batches + 1] = {m, mine}
      else
        local q = tonumber(m)
        if q then
          singles[#singles + 1] = q
          if not seen[q] then seen[q] = true; qs[#qs + 1] = q end
        end
      end
    end
    table.sort(qs)
    local di, handled = 1, {}
    -- The due candidates below `bound` (all when nil), in sequence order.
    local function due_before(bound)
      while di <= #qs and n < limit and not stop do
        local q = qs[di]
        if bound and q >= bound then return end
        di = di + 1
        -- (Reset below when the dead-letter budget stops the partition.)
        -- A handled position's own due entry goes at the end.
        handled[q] = true
        local raw = fences[q] or redis.call('HGET', st, s(q))
        -- (No fence: settled. A later time: renewed, or claimed again,
        -- since the entry was written. Nothing to claim either way.)
        if raw and fence_time(raw) <= nowt then
          local d = cjson.decode(raw)
          if d.s == 'L' and tonumber(d.a) >= maxa then
            if spent == 0 then handled[q] = nil; stop = true; return end
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
    -- Due entries used up: a position's own once it was reached, a batch's
    -- once every position of it that was due was reached (the rest keep
    -- it for the next claim).
    local zrem = {}
    for _, q in ipairs(singles) do
      if handled[q] then zrem[#zrem + 1] = s(q) end
    end
    for _, b in ipairs(batches) do
      local all = true
      for _, q in ipairs(b[2]) do
        if not handled[q] then all = false; break end
      end
      if all then zrem[#zrem + 1] = b[1] end
    end
    chunked('ZREM', {due}, zrem)
    add_range()
    if first_lid then
      redis.call('ZADD', due, exp, 'b' .. first_lid .. ':' .. table.concat(ranges, ','))
    end
    if dead then collapse(p) end
  end
end
return {n, out}
