-- llm-d-router's topology-extractor: where each endpoint runs (host, rack,
-- zone, region), read from its labels, for topology-affinity-filter and
-- topology-affinity-scorer.  Each parameter names the label of one field;
-- an empty name means the Kubernetes default.  Upstream also takes the
-- host from the pod's spec.hostname when the label is absent; lupin's
-- endpoints carry their labels only, so an endpoint without the label has
-- no host.  It schedules nothing: the topology plugins ask it.
-- The fields in level order: host (1) to region (4).
local FIELDS = { "hostname", "rack", "zone", "region" }
local DEFAULTS = {
  hostname = "kubernetes.io/hostname",
  rack = "topology.kubernetes.io/rack",
  zone = "topology.kubernetes.io/zone",
  region = "topology.kubernetes.io/region",
}

local function label(field)
  return { type = "string", default = DEFAULTS[field],
    description = ("the endpoint label holding its %s"):format(field) }
end

---@type lupin.Plugin
return {
  type = "topology-extractor",
  schema = { hostname = label("hostname"), rack = label("rack"), zone = label("zone"),
    region = label("region") },

  new = function(p)
    local self = {}
    for _, field in ipairs(FIELDS) do
      self[field] = p[field] ~= "" and p[field] or DEFAULTS[field]
    end
    return self
  end,

  --- The endpoint's topology, { hostname, rack, zone, region } (a field
  --- absent when its label is), or nil when it has none of the labels.
  topology = function(self, ep)
    local labels = ep.labels
    local h, r, z, g = labels[self.hostname], labels[self.rack], labels[self.zone],
      labels[self.region]
    if (h or "") == "" and (r or "") == "" and (z or "") == "" and (g or "") == "" then
      return nil
    end
    return { hostname = h, rack = r, zone = z, region = g }
  end,

  --- The tightest level at which the endpoint's labels hold the peer's
  --- topology's non-empty value: 1 (host) to 4 (region), else 5.  An empty
  --- value never matches, not even another empty one.
  level = function(self, peer, ep)
    local labels = ep.labels
    for i, field in ipairs(FIELDS) do
      local v = peer[field]
      if v and v ~= "" and labels[self[field]] == v then
        return i
      end
    end
    return 5
  end,
}
