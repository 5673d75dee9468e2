-- Store cards where they are newer: a later revision, or a later position of the same one.
-- KEYS: due, data. ARGV: (member, rev, pos, card, score)... ; card '' removes the member
-- unless a revision no older than rev is stored; score 'k<send instant>' keeps a stored
-- member's score (a change adopted by a claimed fire: its run keeps the lease, and a run taking
-- the claim over once it lapsed needs the card's send instant within reach), raised to the
-- card's send instant if the score is a time before it; a fair queue's tag is kept as it is.
-- Without a stored score the member is leasable from the send instant ('' : from pos). A few
-- commands a call, whatever its size. Returns {stored, earliest score set or -1}.
local due, data = KEYS[1], KEYS[2]
local TIMED = 1000000000000  -- scores from here on are times (epoch ms); below: queue tags
local members = {}
for i = 1, #ARGV, 5 do members[#members + 1] = ARGV[i] end
local got = bulk('HMGET', data, members)
local held = {}  -- member -> {rev, pos} as this call leaves it (a member may come twice)
for k, member in ipairs(members) do
  if got[k] and not held[member] then
    local r, p = string.match(got[k], '^(%d+)|(%d+)|')
    held[member] = {tonumber(r), tonumber(p)}
  end
end
local stored, first = 0, -1
local sets, scores, drops = {}, {}, {}
for k, member in ipairs(members) do
  local i = 5 * k - 4
  local rev, pos, card = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local raw = ARGV[i + 4]
  local keep = raw == '' or string.sub(raw, 1, 1) == 'k'
  local score = pos
  if raw ~= '' then score = tonumber(keep and string.sub(raw, 2) or raw) end
  local crev, cpos = -1, -1
  if held[member] then crev, cpos = held[member][1], held[member][2] end
  if card == '' then
    if held[member] and crev < rev then
      drops[#drops + 1] = member
      held[member] = nil
    end
  elseif rev > crev or (rev == crev and pos > cpos) then
    sets[#sets + 1] = member
    sets[#sets + 1] = card
    local kept = keep and tonumber(redis.call('ZSCORE', due, member))
    if not (kept and (kept < TIMED or kept >= score)) then
      scores[#scores + 1] = score
      scores[#scores + 1] = member
      if first < 0 or score < first then first = score end
    end
    held[member] = {rev, pos}
    stored = stored + 1
  end
end
apply(due, data, drops, sets, scores)
return {stored, first}
