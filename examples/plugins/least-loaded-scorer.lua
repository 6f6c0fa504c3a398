-- An example of a custom plugin: prefers endpoints with the least work,
-- waiting and running requests together.  Score = 1 / (1 + waiting + running·w).
---@type lupin.Plugin
return {
  type = "least-loaded-scorer",
  schema = {
    runningWeight = { type = "number", default = 1, min = 0,
      description = "how much a running request counts against a waiting one" },
  },

  score = function(self, _, endpoints)
    local w = self.params.runningWeight
    local scores = {}
    for i, ep in ipairs(endpoints) do
      scores[i] = 1 / (1 + ep.waiting_queue_size + w * ep.running_requests)
    end
    return scores
  end,
}
