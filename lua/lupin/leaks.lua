-- Request state that outlives its request.  Every request table, and each of
-- its subtables and ctx objects once the request ends, sits in a weak
-- registry; whatever is still there after a full GC is held by someone, and
-- a search from each plugin's globals and instance names the holder.
local M = {}

local tables = setmetatable({}, { __mode = "k" }) -- request table -> true
local ended = setmetatable({}, { __mode = "k" }) -- state of ended requests -> request id

function M.track(r)
  tables[r] = true
end

function M.ended(r)
  local id = r.id
  ended[r] = id
  for _, c in pairs(r.ctxs) do
    ended[c] = id
  end
  for _, t in pairs(r.plugins) do
    ended[t] = id
  end
  for _, t in pairs(r.profiles) do
    ended[t] = id
  end
  if r.shared then
    ended[r.shared] = id
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
    for k, v in next, root do
      search(k, s, path .. "{key}", depth + 1, nested)
      local key = type(k) == "string" and "." .. k or "[" .. tostring(k) .. "]"
      search(v, s, path .. key, depth + 1, nested)
    end
    local mt = debug.getmetatable(root)
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
  local skip = { [tables] = true, [ended] = true, [targets] = true, [ids] = true }
  local lines, blamed = {}, {}
  local function report(who, roots)
    local s = { targets = targets, skip = skip, seen = {}, found = {} }
    for _, root in ipairs(roots) do
      search(root[2], s, root[1], 0, false)
    end
    for _, f in ipairs(s.found) do
      if not blamed[f.obj] then
        blamed[f.obj] = true
        if not f.nested then
          lines[#lines + 1] = ("%s holds state of ended request %s at %s"):format(who,
            targets[f.obj], f.path)
        end
      end
    end
  end
  for gen in pairs(generations) do
    for _, rec in ipairs(gen.instances) do
      report(("plugin %q (%s)"):format(rec.name, rec.type),
        { { "globals", rec.env }, { "self", rec.obj }, { "module", rec.module } })
    end
  end
  for name, mod in pairs(package.loaded) do
    report(("module %q"):format(name), { { name, mod } })
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
