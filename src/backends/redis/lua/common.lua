-- Shared by every script of the Redis backend (prepended to each; see
-- src/backends/redis/scripts.rs). ARGV[1] is the key prefix
-- ("rheo:<namespace>:"), ARGV[2] the stream's hash tag ("{<stream>}"), so
-- every key a script touches is in the stream's Cluster slot.
local B, T = ARGV[1], ARGV[2]
-- The group a script works on: its encoded name (in keys) and its name
-- (the Redis consumer group of each partition stream). Set by the script.
local G, GN = nil, nil

-- Integers as Redis arguments, never in exponent form.
local function s(n) return string.format('%d', n) end

local function meta() return B .. 'meta:' .. T end
local function skey(p) return B .. 's:' .. T .. ':' .. p end
local function idskey() return B .. 'ids:' .. T end
local function groupskey() return B .. 'groups:' .. T end
local function gkey() return B .. 'g:' .. T .. ':' .. G end
local function stkey(p) return B .. 'st:' .. T .. ':' .. G .. ':' .. p end
local function duekey(p) return B .. 'due:' .. T .. ':' .. G .. ':' .. p end
local function donekey(p) return B .. 'done:' .. T .. ':' .. G .. ':' .. p end
local function dlkey() return B .. 'dl:' .. T .. ':' .. G end
local function deadkey() return B .. 'dead:' .. T .. ':' .. G end
local function dlidkey() return B .. 'dlid:' .. T .. ':' .. G end

-- The sequence of an entry id "<sequence>-0".
local function seq_of(id) return tonumber(string.match(id, '^(%d+)-')) end

-- A field of an entry's flat [field, value, ...] array.
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

-- A fence (a position's delivery state, in the `st:` hash) is either
-- compact text for a lease, `L<attempt>:<lease id>:<expiry>` (most fences:
-- every claim writes one per lease, every ack reads one; ADR 0026), or JSON
-- for anything else (a waiting delivery, or a lease that keeps an event id
-- or reason from its earlier attempts): s (state, L or W), a (attempt),
-- l (lease id), x (expiry or ready time), i (event id), r (reason).
local function fence(raw)
  if string.byte(raw, 1) == 76 then
    local a, l, x = string.match(raw, '^L(%d+):([^:]+):(%d+)$')
    return {s = 'L', a = a, l = l, x = x}
  end
  return cjson.decode(raw)
end

-- A fence's text: compact for a lease that carries nothing else.
local function fence_text(d)
  if d.s == 'L' and d.i == nil and d.r == nil then
    return 'L' .. d.a .. ':' .. d.l .. ':' .. d.x
  end
  return cjson.encode(d)
end

-- When a fence is due: a lease's expiry, a waiting delivery's ready time
-- (0 when it has none).
local function fence_time(raw)
  if string.byte(raw, 1) == 76 then return tonumber(string.match(raw, ':(%d+)$')) or 0 end
  return tonumber(string.match(raw, '"x":"(%d+)"')) or 0
end

-- -1: the stream is missing; -2: the group is missing; 0: both exist.
local function missing()
  if redis.call('EXISTS', meta()) == 0 then return -1 end
  if G and redis.call('EXISTS', gkey()) == 0 then return -2 end
  return 0
end

local function frontier(p) return tonumber(redis.call('HGET', gkey(), 'f:' .. p) or '0') end
local function cursor(p, f) return tonumber(redis.call('HGET', gkey(), 'c:' .. p) or s(f + 1)) end

-- Calls `cmd` with `head` (a table of leading arguments) and the items of
-- `list`, `per` items per call (Lua's unpack takes a few thousand values
-- at most). For writes, each call is one command; a script's reads and
-- checks come before its first write, so nothing fails half way.
local function chunked(cmd, head, list, per)
  per = per or 1000
  local i = 1
  while i <= #list do
    local args = {}
    for _, h in ipairs(head) do args[#args + 1] = h end
    for j = i, math.min(i + per - 1, #list) do args[#args + 1] = list[j] end
    redis.call(cmd, unpack(args))
    i = i + per
  end
end

-- A read of many keys or members (HMGET, ZMSCORE), in chunks; the
-- replies concatenated.
local function chunked_read(cmd, key, list)
  local out = {}
  local i = 1
  while i <= #list do
    local args = {}
    for j = i, math.min(i + 999, #list) do args[#args + 1] = list[j] end
    local r = redis.call(cmd, key, unpack(args))
    for j = 1, #args do out[#out + 1] = r[j] end
    i = i + 1000
  end
  return out
end

-- The most positions one frontier move looks at below the cursor.
local COLLAPSE_STEPS = 65536

-- Moves partition p's frontier as far as the settled positions above it
-- go: those in the done set, and those below the cursor without a fence
-- (between frontier and cursor a position is unsettled exactly when it
-- has a fence). At most COLLAPSE_STEPS positions of the second kind per
-- call (after a replay by query lowered the frontier far); the next
-- settle goes on.
local function collapse(p)
  local f = frontier(p)
  local start = f
  local c = cursor(p, f)
  local done, st = donekey(p), stkey(p)
  local steps = 0
  while true do
    local xs = redis.call('ZRANGE', done, 0, 255)
    local gap = false
    for _, m in ipairs(xs) do
      local q = tonumber(m)
      if q == f + 1 then f = q
      elseif q > f then gap = true; break end
    end
    redis.call('ZREMRANGEBYSCORE', done, '-inf', s(f))
    local moved = false
    while f + 1 < c and steps < COLLAPSE_STEPS do
      steps = steps + 1
      if redis.call('HEXISTS', st, s(f + 1)) == 1 then break end
      f = f + 1
      moved = true
    end
    if not moved and (gap or #xs < 256) then break end
    if steps >= COLLAPSE_STEPS then break end
  end
  if f ~= start then redis.call('HSET', gkey(), 'f:' .. p, s(f)) end
end

-- Dead-letters position (p, q) of the group: listed in order (the group's
-- mark counter), settled for the frontier, its state and pending entry gone.
local function dead_letter(p, q, attempts, reason, eid, now)
  local pos = p .. ':' .. s(q)
  if not eid then
    local e = redis.call('XRANGE', skey(p), s(q) .. '-0', s(q) .. '-0')
    if e[1] then eid = field(e[1][2], 'id') end
  end
  local rec = {r = reason, a = tostring(attempts), t = now}
  if eid then rec.i = eid end
  redis.call('HSET', deadkey(), pos, cjson.encode(rec))
  local m = redis.call('HINCRBY', gkey(), 'marks', 1)
  redis.call('ZADD', dlkey(), m, pos)
  if eid then redis.call('HSET', dlidkey(), eid, pos) end
  redis.call('HDEL', stkey(p), s(q))
  redis.call('ZREM', duekey(p), s(q))
  redis.call('XACK', skey(p), GN, s(q) .. '-0')
  redis.call('ZADD', donekey(p), s(q), s(q))
end

-- True when a fence is a lease held under `lease` (a lease id as the
-- client formats it: no colon). Compact: the text between the first two
-- colons is the lease id, read in place. JSON: a plain search (a JSON
-- string never holds a bare quote, so neither pattern can match inside a
-- value).
local function held(raw, lease)
  if string.byte(raw, 1) == 76 then
    local c = string.find(raw, ':', 2, true)
    return c ~= nil and string.find(raw, lease, c + 1, true) == c + 1 and string.byte(raw, c + 1 + #lease) == 58
  end
  return string.find(raw, '"s":"L"', 1, true) ~= nil and string.find(raw, '"l":"' .. lease .. '"', 1, true) ~= nil
end

-- Removes the dead letter at pos (a replay or reset reopened it).
local function undead(pos)
  local raw = redis.call('HGET', deadkey(), pos)
  if not raw then return false end
  local d = cjson.decode(raw)
  if d.i then redis.call('HDEL', dlidkey(), d.i) end
  redis.call('HDEL', deadkey(), pos)
  redis.call('ZREM', dlkey(), pos)
  return true
end

-- The dead letters of partition p: {pos, sequence} pairs.
local function dead_of(p)
  local out = {}
  local prefix = p .. ':'
  for _, pos in ipairs(redis.call('HKEYS', deadkey())) do
    if string.sub(pos, 1, #prefix) == prefix then
      out[#out + 1] = {pos, tonumber(string.sub(pos, #prefix + 1))}
    end
  end
  return out
end
