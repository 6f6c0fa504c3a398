-- The C core's enum values the Lua half uses, by name: lupin_outcome and the
-- request flags (core/lupin.h), what a generation observes (core/internal.h)
-- and the hooks core/runtime.c calls.  The modules take their constants from
-- here (locals the compiler folds); M.check compares this file with the
-- values the core hands over at start and refuses to run on any difference,
-- as capi.lua does for struct layouts.
local M = {
  outcome = { ok = 0, rejected = 1, no_endpoint = 2, plugin_error = 3, upstream_error = 4,
    cancelled = 5, timeout = 6, invalid_request = 7, queue_ttl = 8, queue_full = 9, shed = 10,
    evicted = 11 },
  request_flag = { explain = 1, dry_run = 2 },
  gen_flag = { observes_response = 1, has_finish = 2, observes_chunks = 4,
    observes_complete = 8, times_response = 16 },
}

--- An outcome's name by its value (lupin_outcome_name's).
M.outcome_name = {}
for name, v in pairs(M.outcome) do
  M.outcome_name[v] = name
end

local function differ(group, mine, theirs)
  for name, v in pairs(theirs) do
    if mine[name] ~= v then
      return ("C/Lua enum mismatch: %s.%s is %s in C, %s in lua/lupin/runtime/enums.lua")
        :format(group, name, v, tostring(mine[name]))
    end
  end
  for name, v in pairs(mine) do
    if theirs[name] == nil then
      return ("C/Lua enum mismatch: %s.%s is %s in lua/lupin/runtime/enums.lua, not in C")
        :format(group, name, v)
    end
  end
end

--- Errors unless the core's enums (core/abi.c) are this file's, and unless
--- hooks (the functions lupin.runtime hands the core) are the core's hooks.
---@param c table the core's { outcome=, request_flag=, gen_flag=, hook= }
---@param hooks table<string, function>
function M.check(c, hooks)
  for _, group in ipairs({ "outcome", "request_flag", "gen_flag" }) do
    local err = differ(group, M[group], c[group])
    if err then
      error(err, 0)
    end
  end
  for name in pairs(hooks) do
    if c.hook[name] == nil then
      error(("lupin.runtime hands the core a hook %q it never calls (core/internal.h, LUPIN_HOOKS)")
        :format(name), 0)
    end
  end
end

return M
