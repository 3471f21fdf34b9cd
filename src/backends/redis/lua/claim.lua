-- Claims up to `limit` deliveries in (partition, sequence) order: per
-- partition, the pending ones whose lease expired or whose retry wait
-- ended (from the due set, on Rheo's clock) merged with new positions from
-- the group's cursor up to the high watermark. It decides and records the
-- claims only: the caller reads the claimed entries with XRANGE, outside
-- Lua (ADR 0024), since turning entries into Lua tables and back was most
-- of a claim's time. Each claim gets its fence (attempt, lease id, expiry) here,
-- and each claimed batch one due entry: `b<first lease id>:<ranges>`
-- (e.g. `b…:5-104,107`) scored by the batch's expiry, instead of one per
-- lease. A due entry is a hint: a position is claimable when its fence's
-- time (`x`) has come, whichever entry led to it; a renewal or a retry
-- wait adds the position's own entry (its sequence).
-- A delivery whose lease expired on its last attempt is dead-lettered on
-- the way (at most `spent` of them; past that a partition stops).
-- ARGV[3]: encoded group, [4]: group, [5]: now, [6]: expiry, [7]: limit,
-- [8]: spent budget, [9]: partitions to look at (comma-separated; those
-- the group does not consume are passed), [10...]: one lease id per
-- possible claim.
-- Returns -1/-2 (stream/group missing) or {count, {partition, ranges,
-- attempts, ...}}: per partition with claims, its claimed sequences as
-- ranges (`5-104,107`, in claim order) and the attempts that are not the
-- first (`105:2,107:3`). The n-th claim holds the n-th lease id given, so
-- the reply carries no lease ids and no table per claim (building those
-- was a third of a claim's time).
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local now, exp = ARGV[5], ARGV[6]
local limit, spent = tonumber(ARGV[7]), tonumber(ARGV[8])
local maxa = tonumber(redis.call('HGET', gkey(), 'max'))
local out, n = {}, 0

for p in string.gmatch(ARGV[9], '[^,]+') do
  if n >= limit then break end
  local g = redis.call('HMGET', gkey(), 'f:' .. p, 'c:' .. p)
  if g[1] then
    local st, due, sk, done = stkey(p), duekey(p), skey(p), donekey(p)
    local f0 = tonumber(g[1])
    local stop, dead = false, false
    -- Fences written at the end, in one HSET; the batch's due entry is
    -- built from the claimed sequences as ranges (they come in order).
    local hset, ranges, lo, hi, first_lid, again = {}, {}, nil, nil, nil, {}
    local function add_range()
      if lo then ranges[#ranges + 1] = lo == hi and s(lo) or (s(lo) .. '-' .. s(hi)) end
    end
    -- A fence: `d` (a reclaimed delivery's, kept with its attempt, event
    -- id and reason) or, for a first delivery, compact text built here.
    local function lease(q, d)
      n = n + 1
      local qs_ = s(q)
      local lid = ARGV[9 + n]
      local a, text
      if d then
        d.s = 'L'
        d.a = tostring((tonumber(d.a) or 0) + 1)
        d.l = lid
        d.x = exp
        -- (Fences of earlier versions named the consumer; nothing read it.)
        d.c = nil
        a = d.a
        text = fence_text(d)
      else
        a = '1'
        text = 'L1:' .. lid .. ':' .. exp
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
      if a ~= '1' then again[#again + 1] = qs_ .. ':' .. a end
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
          local d = fence(raw)
          if d.s == 'L' and tonumber(d.a) >= maxa then
            if spent == 0 then handled[q] = nil; stop = true; return end
            spent = spent - 1
            dead_letter(p, q, d.a, 'max_attempts: lease expired', d.i, now)
            dead = true
          else
            -- (An entry deleted by hand is found missing by the caller,
            -- which acks the lease: settled, nothing to deliver.)
            lease(q, d)
          end
        end
      end
    end
    -- New positions, merged with the due candidates in sequence order
    -- (after a replay moved the cursor back, some pending ones lie above
    -- it): every sequence from the cursor to the high watermark is an
    -- entry (entry ids are the sequences). Settled positions the cursor
    -- passes again (acked since a replay, or dead-lettered ahead of it)
    -- are passed, and fenced ones left to their fence. In chunks of at
    -- least 64, at most 16 per partition and fetch; the next goes on.
    local hw = tonumber(redis.call('HGET', meta(), 'hw:' .. p) or '0')
    local c0 = tonumber(g[2] or s(f0 + 1))
    local nextq = math.max(c0, f0 + 1)
    local rounds = 0
    local pending_states = redis.call('HLEN', st) > 0
    local settled_above = redis.call('ZCARD', done) > 0
    while not stop and n < limit and rounds < 16 and nextq <= hw do
      rounds = rounds + 1
      local top = math.min(hw, nextq + math.max(limit - n, 64) - 1)
      local seqs = {}
      for q = nextq, top do seqs[#seqs + 1] = s(q) end
      local has, sets = {}, {}
      if pending_states then has = chunked_read('HMGET', st, seqs) end
      if settled_above then sets = chunked_read('ZMSCORE', done, seqs) end
      for k = 1, #seqs do
        local q = nextq
        if #qs >= di then due_before(q) end
        if stop or n >= limit then break end
        -- Fenced: its fence claims it. Settled: passed.
        if not (has[k] or q <= f0 or sets[k]) then lease(q, nil) end
        nextq = q + 1
      end
    end
    if nextq ~= c0 then
      redis.call('HSET', gkey(), 'c:' .. p, s(nextq))
      -- Redis's own group follows (XINFO GROUPS shows how far it is).
      redis.pcall('XGROUP', 'SETID', sk, GN, s(nextq - 1) .. '-0')
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
      local rs = table.concat(ranges, ',')
      redis.call('ZADD', due, exp, 'b' .. first_lid .. ':' .. rs)
      out[#out + 1] = tonumber(p)
      out[#out + 1] = rs
      out[#out + 1] = table.concat(again, ',')
    end
    if dead then collapse(p) end
  end
end
return {n, out}
