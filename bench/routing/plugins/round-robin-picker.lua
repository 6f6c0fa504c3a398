-- Round-robin over the candidates, ignoring scores: the baseline a plain
-- reverse proxy (nginx's default upstream balancing) gives.  Candidates are
-- ordered by ip:port so the rotation does not depend on their list order.
local function by_hostport(a, b)
  return a.hostport < b.hostport
end

return {
  type = "round-robin-picker",
  schema = {},

  new = function()
    return { next = 0 }
  end,

  pick = function(self, _, scored)
    local eps = {}
    for i, ep in ipairs(scored.endpoints) do
      eps[i] = ep
    end
    table.sort(eps, by_hostport)
    local i = self.next % #eps
    self.next = self.next + 1
    return { eps[i + 1] }
  end,
}
