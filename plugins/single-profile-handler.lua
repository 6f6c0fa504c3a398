-- Runs the one scheduling profile there is, once; it is the primary.
---@type lupin.Plugin
return {
  type = "single-profile-handler",
  schema = {},

  pick_profiles = function(_, _, profiles, results)
    local name = next(profiles)
    if results[name] ~= nil then
      return {}
    end
    return { name }
  end,

  process_results = function(_, _, results)
    return { primary = next(results) }
  end,
}
