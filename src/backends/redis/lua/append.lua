-- Appends a batch, all or nothing. ARGV[3]: the number of events; then 10
-- arguments per event: partition, id, id given (1/0), timestamp (ms),
-- key, type, which of key/type are present ("k", "t", "kt" or ""),
-- metadata (JSON, "" when empty), payload field name, payload.
-- Returns one string per event: "s:<p>:<seq>" stored, "d:<p>:<seq>:<ts>"
-- a duplicate of a stored event, "k:<index>" a duplicate of an earlier
-- event of the batch; or -1 when the stream is missing.
if missing() ~= 0 then return -1 end
local n = tonumber(ARGV[3])
local W = 10
local plan, seen, count = {}, {}, {}
for i = 1, n do
  local a = 3 + (i - 1) * W
  local p, id, given = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local hit = nil
  if given == '1' then hit = redis.call('HGET', idskey(), id) end
  if hit then
    plan[i] = 'd:' .. hit
  elseif given == '1' and seen[id] then
    plan[i] = 'k:' .. seen[id]
  else
    if given == '1' then seen[id] = i end
    plan[i] = false
    count[p] = (count[p] or 0) + 1
  end
end
local nxt, bytes = {}, {}
for p, c in pairs(count) do
  nxt[p] = redis.call('HINCRBY', meta(), 'hw:' .. p, c) - c + 1
end
for i = 1, n do
  if not plan[i] then
    local a = 3 + (i - 1) * W
    local p, id, given, ts = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    local has = ARGV[a + 7]
    local q = nxt[p]
    nxt[p] = q + 1
    local f = {'id', id, 'timestamp', ts}
    if string.find(has, 'k', 1, true) then f[#f + 1] = 'key'; f[#f + 1] = ARGV[a + 5] end
    if string.find(has, 't', 1, true) then f[#f + 1] = 'type'; f[#f + 1] = ARGV[a + 6] end
    if ARGV[a + 8] ~= '' then f[#f + 1] = 'metadata'; f[#f + 1] = ARGV[a + 8] end
    f[#f + 1] = ARGV[a + 9]; f[#f + 1] = ARGV[a + 10]
    redis.call('XADD', skey(p), s(q) .. '-0', unpack(f))
    local size = 32
    for _, v in ipairs(f) do size = size + #v end
    bytes[p] = (bytes[p] or 0) + size
    if given == '1' then redis.call('HSET', idskey(), id, p .. ':' .. s(q) .. ':' .. ts) end
    plan[i] = 's:' .. p .. ':' .. s(q)
  end
end
-- Stored bytes, once per partition (one write, not one per event).
for p, b in pairs(bytes) do redis.call('HINCRBY', meta(), 'bytes:' .. p, b) end
return plan
