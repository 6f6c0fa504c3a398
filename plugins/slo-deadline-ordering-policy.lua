-- llm-d-router's slo-deadline-ordering-policy: within a flow, the request
-- whose TTFT objective falls due first goes first.  Its deadline is its
-- arrival plus its x-llm-d-slo-ttft-ms (else x-slo-ttft-ms) milliseconds;
-- a request without one, or with a value that is not a positive number,
-- comes after every request with one.  Equal deadlines, and requests
-- without, go first come first served.
local slo = require "lupin.slo"

-- less() runs at every step of the queue's heap: each item's deadline is
-- worked out once, and goes with the item
local deadlines = setmetatable({}, { __mode = "k" })

local function deadline(item)
  local d = deadlines[item]
  if not d then
    local ms = item.headers and slo.ttft(item.headers)
    d = ms and item.enqueued_at + ms / 1000 or math.huge
    deadlines[item] = d
  end
  return d
end

---@type lupin.Plugin
return {
  type = "slo-deadline-ordering-policy",
  schema = {},

  less = function(_, a, b)
    local da, db = deadline(a), deadline(b)
    if da ~= db then
      return da < db
    end
    return a.seq < b.seq
  end,
}
