-- Request state that outlives its request.  Every request table, and each of
-- its subtables and ctx objects, sits in a weak registry (the request's
-- manifest); what is still there after a full GC once its request ended is
-- held by someone, and a search from each plugin's globals and instance
-- names the holder.
local clear = require "table.clear"
local new_table = require "table.new"

local M = {}

-- One manifest per request, made at its begin: a weak-valued array of
--   [1] the request table, [2] its id, [3] the last slot used, [4] whether
--   it counts as a request (the dry run's does not),
-- then, from [5], each state object the request made (ctx, private table,
-- cycle table, shared table) followed by the name of the instance that owns
-- it, or false.  Objects are appended as they are made, so ending a request
-- costs nothing here: its state is ended once its request table is
-- collected or has an outcome.  Array stores into a table of the right size
-- are much cheaper than inserting every object into large weak-keyed
-- registries at each request's end.
local WEAK_VALUES = { __mode = "v" }
local graves = {} -- manifests, oldest first; swept as they grow
local n_graves, sweep_at = 0, 1024
-- Manifests whose request and state were all collected, kept for the next
-- requests: nothing refers to one any more (the ctxs that found their
-- request through it are gone, their registry entries cleared by the
-- collection that cleared its slots), so it is emptied and used again, two
-- allocations fewer per request.
local spare, n_spare = {}, 0
local SPARE_MAX = 1024

-- Keeps the manifests whose request or state is still alive; the others go
-- to the spares.
local function sweep()
  local n = 0
  for i = 1, n_graves do
    local m = graves[i]
    local keep = m[1] ~= nil
    if not keep then
      for j = 5, m[3], 2 do
        if m[j] ~= nil then
          keep = true
          break
        end
      end
    end
    graves[i] = nil
    if keep then
      n = n + 1
      graves[n] = m
    elseif n_spare < SPARE_MAX then
      clear(m)
      n_spare = n_spare + 1
      spare[n_spare] = m
    end
  end
  n_graves = n
  -- sweep again when the list has doubled: amortized O(1) per request
  sweep_at = n * 2 > 1024 and n * 2 or 1024
end

--- Resizes the list of manifests to what is still alive.
function M.compact()
  sweep()
  local g = new_table(n_graves, 0)
  for i = 1, n_graves do
    g[i] = graves[i]
  end
  graves = g
end

-- The most slots a manifest has used, seen on the one made before each new
-- one: manifests are made at that size (a guess at the first).
local most_used = 0

--- Starts the manifest of a request table (a counted request unless dry),
--- sized as the largest seen so far, at first for a ctx and a private table
--- per plugin instance; returns it.
function M.track(r, id, dry, instances)
  local prev = graves[n_graves]
  if prev and prev[3] > most_used then
    most_used = prev[3]
  end
  local m
  if n_spare > 0 then
    m, spare[n_spare], n_spare = spare[n_spare], nil, n_spare - 1
  else
    local size = most_used > 0 and most_used or 8 + 4 * instances
    m = setmetatable(new_table(size, 0), WEAK_VALUES)
  end
  m[1], m[2], m[3], m[4] = r, id, 4, not dry
  n_graves = n_graves + 1
  graves[n_graves] = m
  if n_graves >= sweep_at then
    sweep()
  end
  return m
end

--- Records a state object of request r, owned by the instance named owner
--- (or false: shared by several).
function M.own(r, obj, owner)
  local m = r.manifest
  local n = m[3]
  m[n + 1], m[n + 2], m[3] = obj, owner, n + 2
end

--- Calls fn(r) for each request table not yet ended.
function M.each_live(fn)
  for i = 1, n_graves do
    local m = graves[i]
    local r = m[1]
    if r and m[4] and not r.outcome then
      fn(r)
    end
  end
end

--- Request tables not yet reclaimed (live ones and garbage not yet swept).
function M.count()
  local n = 0
  for i = 1, n_graves do
    local m = graves[i]
    if m[1] and m[4] then
      n = n + 1
    end
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

-- The state of ended requests still alive after a full collection: a
-- request has ended once its table is collected or has an outcome.
local function survivors()
  collectgarbage()
  collectgarbage()
  local targets, owner, ids, n = {}, {}, {}, 0
  for i = 1, n_graves do
    local m = graves[i]
    local r, id = m[1], m[2]
    if r == nil or r.outcome then
      local found = false
      if r ~= nil then
        targets[r], found = id, true
      end
      for j = 5, m[3], 2 do
        local obj = m[j]
        if obj ~= nil then
          targets[obj], found = id, true
          if m[j + 1] then
            owner[obj] = m[j + 1]
          end
        end
      end
      if found and not ids[id] then
        ids[id] = true
        n = n + 1
      end
    end
  end
  return targets, owner, ids, n
end

--- Full GC, then names what holds state of ended requests.  A compiled
--- trace can keep a table it ran on as a constant until it is flushed: not
--- a plugin's doing, so a second look after jit.flush() decides.  The first
--- look's tables hold what they list, so they are dropped before the second
--- (kept, they made every survivor of the first look survive the second).
---@param generations table<table, boolean> the live generations
---@return integer requests, string report
function M.check(generations)
  spare, n_spare = {}, 0 -- a cache: what is measured after a check is what lives
  local targets, owner, ids, n = survivors()
  if n > 0 then
    targets, owner, ids = nil, nil, nil -- luacheck: ignore 311 (read by the collector)
    jit.flush()
    targets, owner, ids, n = survivors()
  end
  if n == 0 then
    return 0, ""
  end
  local skip = { [graves] = true, [owner] = true, [targets] = true, [ids] = true }
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
