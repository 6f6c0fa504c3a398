-- Runs the one scheduling profile there is, once; it is the primary.
local NONE = {} -- no more profiles to run
---@type lupin.Plugin
return {
  type = "single-profile-handler",
  schema = {},

  -- the lists are made once: the engine only reads them
  new = function()
    return { lists = {} }
  end,

  pick_profiles = function(self, _, profiles, results)
    local name = next(profiles)
    if results[name] ~= nil then
      return NONE
    end
    local list = self.lists[name]
    if not list then
      list = { name }
      self.lists[name] = list
    end
    return list
  end,

  process_results = function(_, _, results)
    local primary = next(results) -- the one profile's name
    return primary
  end,
}
