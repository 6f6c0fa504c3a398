-- The EPP's edf-ordering-policy: within a flow, earliest deadline first.  A
-- request's deadline is its arrival plus its TTL (x-lupin-request-ttl, else
-- flowControl.defaultRequestTTL); requests without one come after all those
-- with one, first come first served among themselves.
---@type lupin.Plugin
return {
  type = "edf-ordering-policy",
  schema = {},

  less = function(_, a, b)
    if a.deadline ~= b.deadline then
      return a.deadline < b.deadline
    end
    return a.seq < b.seq
  end,
}
