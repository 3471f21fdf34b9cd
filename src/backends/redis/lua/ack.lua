-- Acknowledges deliveries, each only when still held under its lease id
-- (the check and the change in one script). ARGV[3]: encoded group, [4]:
-- group; then triples of partition, sequence, lease id. Returns -1/-2, or
-- one 1 (acked) or 0 (stale) per lease; moves the frontiers.
G, GN = ARGV[3], ARGV[4]
local miss = missing()
if miss ~= 0 then return miss end
local out = {}
-- Per partition: the argument indexes of its leases.
local parts, order = {}, {}
for i = 5, #ARGV, 3 do
  local p = ARGV[i]
  if not parts[p] then parts[p] = {}; order[#order + 1] = p end
  local t = parts[p]
  t[#t + 1] = i
  out[(i - 2) / 3] = 0
end
for _, p in ipairs(order) do
  local idx = parts[p]
  local seqs = {}
  for j, i in ipairs(idx) do seqs[j] = ARGV[i + 1] end
  local st = stkey(p)
  local raws = chunked_read('HMGET', st, seqs)
  local acked, qs = {}, {}
  local seen = {}
  for j, i in ipairs(idx) do
    local raw = raws[j]
    -- (Not twice, when one lease is given twice in a batch.)
    if raw and not seen[seqs[j]] and held(raw, ARGV[i + 2]) then
      seen[seqs[j]] = true
      acked[#acked + 1] = seqs[j]
      qs[#qs + 1] = tonumber(seqs[j])
      out[(i - 2) / 3] = 1
    end
  end
  if #acked > 0 then
    chunked('HDEL', {st}, acked)
    chunked('ZREM', {duekey(p)}, acked)
    -- In-order acks right above the frontier with nothing settled above
    -- it move the frontier directly; anything else goes through the done set.
    table.sort(qs)
    local f = frontier(p)
    local done = donekey(p)
    local direct = qs[1] == f + 1 and qs[#qs] == f + #qs and redis.call('ZCARD', done) == 0
    if direct then
      redis.call('HSET', gkey(), 'f:' .. p, s(f + #qs))
      -- (Positions settled before a replay by query may follow.)
      collapse(p)
    else
      local z = {}
      for _, q in ipairs(qs) do z[#z + 1] = q; z[#z + 1] = s(q) end
      chunked('ZADD', {done}, z)
      collapse(p)
    end
  end
end
return out
