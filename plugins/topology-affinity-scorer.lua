-- llm-d-router's topology-affinity-scorer: in the prefill profile, scores
-- each candidate by how close it is to the decode pick (the peer), where
-- the KV cache goes: same host 1, same rack 0.2, same zone 0.05, same
-- region 0.02, else 0 (upstream's fixed curve, after the bandwidth of each
-- hop: NVLink on a host, one switch in a rack, more beyond).  Every
-- candidate scores 0 when the peer is unknown (no P/D, or a peer without
-- topology); one without the field compared does not match on it.
local disagg = require "lupin.disagg"

local SCORES = { 1, 0.2, 0.05, 0.02, 0 } -- by level: host, rack, zone, region, none

---@type lupin.Plugin
return {
  type = "topology-affinity-scorer",
  schema = {
    topologyProducerName = { type = "string", default = "topology-extractor",
      description = "the topology-extractor to read topologies from" },
  },

  new = function(p, env)
    return { producer_name = p.topologyProducerName, env = env }
  end,

  init = function(self)
    self.producer = disagg.topology_producer(self.env, "topologyProducerName", self.producer_name)
  end,

  score = function(self, ctx, endpoints)
    local producer = self.producer
    local peer = disagg.peer_topology(ctx, producer)
    local scores = {}
    for i, ep in ipairs(endpoints) do
      scores[i] = peer and SCORES[producer:level(peer, ep)] or 0
    end
    return scores
  end,
}
