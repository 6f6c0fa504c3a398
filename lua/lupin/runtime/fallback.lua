-- Fallbacks: where a host sends a request whose picks failed before any
-- byte reached the client.  The picker's own list comes first (the C side
-- has it); after it, the rest of the primary profile's candidates -- the
-- endpoints its filters kept -- by the profile score the scorers gave them,
-- best first.  Nothing is scheduled again: pre_request ran once, for the
-- picks, and the picker's parameters (max-score-picker's maxNumOfEndpoints)
-- keep their EPP meaning.
local pool = require "lupin.runtime.pool"

local M = {}

--- The fallbacks of a scheduled request, flat: name, address, port, ...
--- Only endpoints that are candidates now (in the pool, not ejected).
function M.ranked(r)
  local out = {}
  local res = r.result
  local prof = res and res.profiles and res.profiles[res.primary]
  if not prof then
    return out
  end
  local picked = {}
  for _, ep in ipairs(res.endpoints) do
    picked[ep.id] = true
  end
  local idx = {}
  for i, ep in ipairs(prof.candidates) do
    if not picked[ep.id] and pool.is_candidate(ep) then
      idx[#idx + 1] = i
    end
  end
  local scores = prof.scores
  table.sort(idx, function(a, b)
    if scores[a] ~= scores[b] then
      return scores[a] > scores[b]
    end
    return a < b
  end)
  for _, i in ipairs(idx) do
    local ep = prof.candidates[i]
    out[#out + 1] = ep.name
    out[#out + 1] = ep.address
    out[#out + 1] = ep.port
  end
  return out
end

return M
