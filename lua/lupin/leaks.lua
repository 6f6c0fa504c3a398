-- Request state that outlives its request.  Every request table, and each of
-- its subtables and ctx objects once the request ends, sits in a weak
-- registry; whatever is still there after a full GC is held by someone, and
-- a search from each plugin's globals and instance names the holder.
local weak = require "lupin.weak"

local M = {}

local tables = weak.keys() -- request table -> true
local ended = weak.keys() -- state of ended requests -> request id
local owner = weak.keys() -- private tables and ctxs -> instance name

--- Resizes the registries to what they hold now.
function M.compact()
  tables, ended, owner = weak.rebuilt(tables), weak.rebuilt(ended), weak.rebuilt(owner)
end

function M.track(r)
  tables[r] = true
end

function M.ended(r)
  local id = r.id
  ended[r] = id
  for rec, c in pairs(r.ctxs) do
    ended[c] = id
    owner[c] = rec.name
  end
  for name, t in pairs(r.plugins) do
    ended[t] = id
    owner[t] = name
  end
  for _, t in pairs(r.profiles) do
    ended[t] = id
  end
  if r.shared then
    ended[r.shared] = id
  end
end

--- Calls fn(r) for each request table not yet ended.
function M.each_live(fn)
  for r in pairs(tables) do
    if not ended[r] then
      fn(r)
    end
  end
end

--- Request tables not yet reclaimed (live ones and garbage not yet swept).
function M.count()
  local n = 0
  for _ in pairs(tables) do
    n = n + 1
  end
  return n
end

-- Depth-first from root; records each target reached with the path to it.
-- Targets reached through another target are marked nested: one leak, one line.
local function search(root, s, path, depth, nested)
  local t = type(root)
  if depth > 12 or s.seen[root] or s.skip[root] or (t ~= "table" and t ~= "function") then
    return
  end
  s.seen[root] = true
  if s.targets[root] then
    s.found[#s.found + 1] = { path = path, obj = root, nested = nested }
    nested = true
  end
  if t == "table" then
    -- weak references hold nothing
    local mt = debug.getmetatable(root)
    local mode = mt and rawget(mt, "__mode") or ""
    local weak_k, weak_v = mode:find("k", 1, true), mode:find("v", 1, true)
    for k, v in next, root do
      if not weak_k then
        search(k, s, path .. "{key}", depth + 1, nested)
      end
      if not weak_v then
        local key = type(k) == "string" and "." .. k or "[" .. tostring(k) .. "]"
        search(v, s, path .. key, depth + 1, nested)
      end
    end
    if mt then
      search(mt, s, path .. "<metatable>", depth + 1, nested)
    end
  elseif debug.getinfo(root, "S").what ~= "C" then
    local i = 1
    while true do
      local name, v = debug.getupvalue(root, i)
      if not name then
        break
      end
      search(v, s, path .. "<upvalue " .. name .. ">", depth + 1, nested)
      i = i + 1
    end
  end
end

--- Full GC, then names what holds state of ended requests.
---@param generations table<table, boolean> the live generations
---@return integer requests, string report
function M.check(generations)
  collectgarbage()
  collectgarbage()
  local targets, ids, n = {}, {}, 0
  for obj, id in pairs(ended) do
    targets[obj] = id
    if not ids[id] then
      ids[id] = true
      n = n + 1
    end
  end
  if n == 0 then
    return 0, ""
  end
  local skip = { [tables] = true, [ended] = true, [owner] = true, [targets] = true,
    [ids] = true }
  local lines, blamed = {}, {}
  -- who: fn(obj) naming the holder; a plugin file's globals are shared by its
  -- instances, so there the owner of the leaked table names the instance
  local function report(who, roots)
    local s = { targets = targets, skip = skip, seen = {}, found = {} }
    for _, root in ipairs(roots) do
      search(root[2], s, root[1], 0, false)
    end
    for _, f in ipairs(s.found) do
      if not blamed[f.obj] then
        blamed[f.obj] = true
        if not f.nested then
          lines[#lines + 1] = ("%s holds state of ended request %s at %s"):format(who(f.obj),
            targets[f.obj], f.path)
        end
      end
    end
  end
  for gen in pairs(generations) do
    local types = {}
    for _, rec in ipairs(gen.instances) do
      local label = ("plugin %q (%s)"):format(rec.name, rec.type)
      report(function() return label end, { { "self", rec.obj } })
      types[rec.type] = types[rec.type] or rec
    end
    for type_, rec in pairs(types) do
      report(function(obj)
        return owner[obj] and ("plugin %q (%s)"):format(owner[obj], type_)
          or ("plugin type %q"):format(type_)
      end, { { "globals", rec.env }, { "module", rec.module } })
    end
  end
  for name, mod in pairs(package.loaded) do
    local label = ("module %q"):format(name)
    report(function() return label end, { { name, mod } })
  end
  for obj, id in pairs(targets) do
    if not blamed[obj] then
      blamed[obj] = true
      lines[#lines + 1] = ("state of ended request %s is held by something outside the plugins"
        .. " (registry or C)"):format(id)
    end
  end
  table.sort(lines)
  return n, table.concat(lines, "\n")
end

return M
