-- llm-d-router's topology-affinity-filter: in the prefill profile, keeps
-- the candidates at least as close to the decode pick (the peer) as
-- minAffinity: same host, rack, zone or region, by topology-extractor's
-- reading of their labels.  A candidate without the field compared never
-- matches.  It fails open, as upstream: every candidate is kept when the
-- peer is unknown (no P/D, or a peer without topology) and when none is
-- close enough, since locality is a preference, not a reason to fail.
local disagg = require "lupin.disagg"

---@type lupin.Plugin
return {
  type = "topology-affinity-filter",
  schema = {
    minAffinity = { type = "string", default = "host", enum = { "host", "rack", "zone", "region" },
      description = "keep candidates sharing this level, or a tighter one, with the peer" },
    topologyProducerName = { type = "string", default = "topology-extractor",
      description = "the topology-extractor to read topologies from" },
  },

  new = function(p, env)
    return { min = disagg.LEVELS[p.minAffinity], producer_name = p.topologyProducerName, env = env }
  end,

  init = function(self)
    self.producer = disagg.topology_producer(self.env, "topologyProducerName", self.producer_name)
  end,

  filter = function(self, ctx, endpoints)
    local producer = self.producer
    local peer = disagg.peer_topology(ctx, producer)
    if not peer then
      return endpoints
    end
    local kept, min = {}, self.min
    for _, ep in ipairs(endpoints) do
      if producer:level(peer, ep) <= min then
        kept[#kept + 1] = ep
      end
    end
    return #kept > 0 and kept or endpoints
  end,
}
