-- Building a generation from a parsed config: load the plugin files, check
-- parameters, instantiate, assemble the profiles and apply the EPP's defaults.
local budget = require "lupin.runtime.budget"
local capi = require "lupin.runtime.capi"
local readonly = require "lupin.runtime.readonly"
local loader = require "lupin.generation.loader"
local parsers = require "lupin.runtime.parsers"
local log = require "lupin.log"
local schema = require "lupin.schema"
local unsupported = require "lupin.config.unsupported"

local M = {}

-- The extension points (lupin.points), read at each build: a row added to
-- the table is a point of the next generation.
local points = require "lupin.generation.points"

-- plugin(ref): another instance of the generation by name, looked up when
-- called, so a plugin may name one declared after it (upstream's deciders):
-- call it from init on, not from new.
local function plugin_env(name, type_, gen, at)
  return {
    name = name,
    type = type_,
    now = capi.now,
    plugin = function(ref)
      local rec = gen.by_name[ref]
      if rec then
        -- read-only: a plugin may call another's methods (a decider), not
        -- rewrite its fields
        return readonly.view(rec.obj), rec.type
      end
    end,
    log = function(level, fmt, ...)
      log.log(level, "[" .. name .. "] " .. tostring(fmt), ...)
    end,
    -- a warning at a parameter's line of the config ("kvEventsConfig.concurrency")
    warn = function(field, fmt, ...)
      log.warn("%s", at(field, "plugin %q (%s): " .. tostring(fmt), name, type_, ...))
    end,
  }
end

local function record(name, type_, obj, m, params, path, budgets)
  local rec = { name = name, type = type_, obj = obj, env = m.env, module = m.mod,
    params = params, path = path, stats = {}, points = {}, cuts = 0,
    call_budget = budgets.call_ms / 1000, lifecycle_budget = budgets.lifecycle_ms / 1000,
    call_grace = budgets.call_ms / 1000 * budget.GRACE,
    disable_after = budgets.disable_after }
  for _, row in ipairs(points) do
    local point = row.name
    local f = obj[point]
    if type(f) == "function" then
      rec[point] = f
      -- buckets: calls by duration (lupin.engine's PLUGIN_BOUNDS, the last: longer)
      rec.stats[point] = { calls = 0, errors = 0, ns = 0, cuts = 0,
        buckets = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 } }
      -- the instance hooks and finish do not make a plugin part of a request
      if row.layer ~= "instance" and point ~= "finish" then
        rec.points[#rec.points + 1] = point
      end
    end
  end
  return rec
end

local Builder = {}
Builder.__index = Builder

function Builder:module(type_, path)
  local m = self.modules[type_]
  if m then
    return m
  end
  local file = self.files[type_]
  if not file and unsupported.why(type_) then
    return nil, self.E:at(path ~= "" and path .. ".type" or "", "%s", unsupported.why(type_))
  end
  if not file then
    return nil, self.E:at(path ~= "" and path .. ".type" or "", "unknown plugin type %q; known types: %s"
      .. " (plugin directories: %s)", type_, table.concat(self.types, ", "),
      table.concat(self.dirs, ", "))
  end
  local builtin = file:sub(1, #self.builtin_dir + 1) == self.builtin_dir .. "/"
  local mod, env, text = loader.load(file, type_, self.budgets.lifecycle_ms, builtin)
  if not mod then
    return nil, self.E:at(path, "cannot load plugin type %q: %s", type_, env)
  end
  m = { mod = mod, env = env, file = file, text = text }
  self.modules[type_] = m
  return m
end

-- An instance's budgets: the config's "budgets", then its own maxCallMs and
-- maxLifecycleMs.
function Builder:budgets_of(p)
  local b = self.budgets
  return { call_ms = p and p.max_call_ms or b.call_ms,
    lifecycle_ms = p and p.max_lifecycle_ms or b.lifecycle_ms,
    disable_after = b.disable_after }
end

function Builder:instantiate(name, type_, raw_params, path, p)
  local m, err = self:module(type_, path)
  if not m then
    return nil, err
  end
  local budgets = self:budgets_of(p)
  local seconds = budgets.lifecycle_ms / 1000
  -- the schema is the plugin's table, metamethods and all: under its budget
  local vok, v, vcut = budget.pcall(seconds, function()
    return { schema.validate(m.mod.schema, raw_params) }
  end)
  if not vok then
    return nil, self.E:at(path, "plugin %q (%s): checking its parameters %s", name, type_,
      vcut and ("exceeded its budget of %g ms"):format(budgets.lifecycle_ms)
      or "failed: " .. budget.describe(v))
  end
  local params, perr, field = v[1], v[2], v[3]
  if not params then
    return nil, self.E:at(path .. ".parameters" .. (field and "." .. field or ""), "%s", perr)
  end
  for _, fb in ipairs(v[4] or {}) do
    log.warn("%s", self.E:at(path .. ".parameters." .. fb.field, "plugin %q (%s): %s out of"
      .. " range, using %s instead, as the EPP does", name, type_, tostring(fb.given),
      tostring(fb.used)))
  end
  local obj = { params = params }
  if m.mod.new then
    local ok, res, cut = budget.pcall(budgets.lifecycle_ms / 1000, m.mod.new, params,
      plugin_env(name, type_, self.gen, function(param, ...)
        return self.E:at(path .. ".parameters." .. param, ...)
      end))
    if cut then
      return nil, self.E:at(path, "plugin %q (%s) failed to start: new exceeded its budget of"
        .. " %g ms", name, type_, budgets.lifecycle_ms)
    elseif not ok then
      return nil, self.E:at(path, "plugin %q (%s) failed to start: %s", name, type_,
        budget.describe(res))
    elseif type(res) ~= "table" then
      return nil, self.E:at(path, "plugin %q (%s): new must return a table, got %s", name, type_,
        type(res))
    end
    obj = res
  end
  if getmetatable(obj) == nil then
    setmetatable(obj, { __index = m.mod })
  end
  local rok, rec, rcut = budget.pcall(seconds, record, name, type_, obj, m, params, path, budgets)
  if not rok then -- the instance's own metamethods answered for its points
    return nil, self.E:at(path, "plugin %q (%s) failed to start: %s", name, type_,
      rcut and ("reading its extension points exceeded its budget of %g ms"):format(
        budgets.lifecycle_ms) or budget.describe(rec))
  end
  local gen = self.gen
  gen.instances[#gen.instances + 1] = rec
  rec.slot = #gen.instances -- where a request keeps its ctx (lupin.ctx)
  gen.by_name[name] = rec
  return rec
end

--- The instance the EPP would add by default: the existing one of that name
--- and type, or a new one with default parameters.
function Builder:default(type_)
  local rec = self.gen.by_name[type_]
  if rec and rec.type == type_ then
    return rec
  end
  return self:instantiate(rec and type_ .. "-default" or type_, type_, nil, "")
end

local function is_profile_plugin(rec)
  return rec.filter or rec.score or rec.pick
end

-- A plugin upstream runs as a data producer (its module says so), which
-- upstream's configs list in profiles too.
local function is_data_producer(rec)
  return type(rec.module) == "table" and rawget(rec.module, "data_producer") == true
end

function Builder:profile(name, refs, path)
  local E, gen = self.E, self.gen
  local prof = { name = name, filters = {}, scorers = {}, picker = nil, plugins = {} }
  for _, ref in ipairs(refs) do
    local rec = gen.by_name[ref.ref]
    if not is_profile_plugin(rec) and parsers.CLAIMS[rec.type] then
      -- upstream's loader takes it and its profile keeps only filters,
      -- scorers and pickers: the entry does nothing
      log.warn("%s", E:at(ref.path, "plugin %q (%s) is a parser, not a filter, scorer or"
        .. " picker; its entry in profile %q is ignored (as upstream): list parsers under"
        .. " requestHandler.parsers", rec.name, rec.type, name))
    elseif not is_profile_plugin(rec) and is_data_producer(rec) then
      -- upstream lists its data producers (a tokenizer) in profiles too
      log.warn("%s", E:at(ref.path, "plugin %q (%s) produces data before the profiles run;"
        .. " its entry in profile %q is ignored", rec.name, rec.type, name))
    elseif not is_profile_plugin(rec) then
      -- upstream's profile keeps what filters, scores or picks and drops
      -- the rest without a word: lupin says so
      log.warn("%s", E:at(ref.path, "plugin %q (%s) is not a filter, scorer or picker; its"
        .. " entry in profile %q is ignored (as upstream): remove it", rec.name, rec.type, name))
    end
    if rec.filter then
      prof.filters[#prof.filters + 1] = rec
    end
    if rec.score then
      prof.scorers[#prof.scorers + 1] = { rec = rec, weight = ref.weight or 1 }
    end
    if rec.pick then
      if prof.picker then
        return nil, E:at(ref.path, "profile %q has two pickers, %q and %q; keep one", name,
          prof.picker.name, rec.name)
      end
      prof.picker = rec
    end
    if is_profile_plugin(rec) then
      prof.plugins[#prof.plugins + 1] = rec.name
    end
  end
  if not prof.picker then
    local rec, err = self:default("max-score-picker")
    if not rec then
      return nil, err
    end
    prof.picker = rec
    prof.plugins[#prof.plugins + 1] = rec.name
  end
  prof.view = setmetatable({}, {
    __index = { name = name, plugins = prof.plugins },
    __newindex = function() error("profiles are read-only", 2) end,
  })
  gen.profiles[#gen.profiles + 1] = prof
  gen.profile_by_name[name] = prof
  gen.profile_views[name] = prof.view
  return prof, path
end

function Builder:profiles(cfg)
  local profiles = cfg.profiles
  if #profiles == 0 then
    -- As the EPP: one profile with every filter, scorer and picker.  What it
    -- lacks is lupin's default routing (examples/configs/default.json, chosen
    -- on bench/routing's matrix): bounded-load-picker rather than the EPP's
    -- max-score-picker, and prefix-cache-scorer when no scorer is configured.
    local refs, scorer, picker = {}, false, false
    for _, rec in ipairs(self.gen.instances) do
      if is_profile_plugin(rec) then
        refs[#refs + 1] = { ref = rec.name, path = rec.path }
        scorer, picker = scorer or rec.score ~= nil, picker or rec.pick ~= nil
      end
    end
    local missing = { scorer = not scorer and "prefix-cache-scorer",
      picker = not picker and "bounded-load-picker" }
    for _, role in ipairs({ "scorer", "picker" }) do
      if missing[role] then
        local rec, err = self:default(missing[role])
        if not rec then
          return err
        end
        refs[#refs + 1] = { ref = rec.name, path = "" }
      end
    end
    profiles = { { name = "default", refs = refs, path = "" } }
  end
  for _, p in ipairs(profiles) do
    local prof, err = self:profile(p.name, p.refs, p.path)
    if not prof then
      return err
    end
  end
end

function Builder:handler()
  local E, gen = self.E, self.gen
  local handlers = {}
  for _, rec in ipairs(gen.instances) do
    if rec.pick_profiles then
      handlers[#handlers + 1] = rec
    end
  end
  if #handlers > 1 then
    local names = {}
    for i, h in ipairs(handlers) do
      names[i] = h.name
    end
    return E:at(handlers[2].path, "several profile handlers (%s); keep exactly one",
      table.concat(names, ", "))
  end
  local n = #gen.profiles
  if #handlers == 0 then
    if n > 1 then
      return E:at("schedulingProfiles", "%d profiles but no profile handler; add one to"
        .. ' "plugins", e.g. {"type": "pd-profile-handler"}', n)
    end
    local rec, err = self:default("single-profile-handler")
    if not rec then
      return err
    end
    handlers[1] = rec
  end
  local h = handlers[1]
  if h.type == "single-profile-handler" and n > 1 then
    return E:at(h.path, "single-profile-handler runs one profile but %d are defined; use a"
      .. " multi-profile handler such as pd-profile-handler, or keep one profile", n)
  end
  gen.handler = h
end

-- Flow control's plugin references (lupin.flow_config): an instance of the
-- config, or, as the EPP does, a default instance of the type so named.
local FLOW_ROLES = { fairness = "pick_flow", ordering = "less", detector = "saturated" }
local FLOW_WHAT = { fairness = "a fairness policy", ordering = "an ordering policy",
  detector = "a saturation detector" }

function Builder:flow_ref(name, path, role)
  local rec = self.gen.by_name[name]
  if not rec then
    if not self.files[name] then
      return nil, self.E:at(path or "flowControl", "no plugin named %q: add it to plugins"
        .. " (%s such as %s)", name, FLOW_WHAT[role], role == "detector"
        and "utilization-detector, concurrency-detector"
        or role == "fairness" and "global-strict-fairness-policy, round-robin-fairness-policy"
        or "fcfs-ordering-policy, edf-ordering-policy")
    end
    local err
    rec, err = self:default(name)
    if not rec then
      return nil, err
    end
  end
  if type(rec.obj[FLOW_ROLES[role]]) ~= "function" then
    return nil, self.E:at(path or "flowControl", "plugin %q (%s) is not %s: it has no %s method",
      rec.name, rec.type, FLOW_WHAT[role], FLOW_ROLES[role])
  end
  return rec
end

function Builder:flow(cfg)
  local f = cfg.flow
  if not f then
    return
  end
  local err
  local flow = { ttl = f.ttl, max_bytes = f.max_bytes, max_requests = f.max_requests,
    objectives = f.objectives, bands = {}, levels = f.levels, gc = f.gc, eviction = f.eviction }
  if f.detector_params and not self.gen.by_name[f.detector] then -- GIE v1's thresholds
    local _, ierr = self:instantiate(f.detector, f.detector, f.detector_params, f.detector_path)
    if ierr then
      return ierr
    end
  end
  flow.detector, err = self:flow_ref(f.detector, f.detector_path, "detector")
  if err then
    return err
  end
  local function resolve(b)
    local out = { priority = b.priority, max_bytes = b.max_bytes, max_requests = b.max_requests,
      ttl = b.ttl }
    out.fairness, err = self:flow_ref(b.fairness, b.fairness_path, "fairness")
    if not err then
      out.ordering, err = self:flow_ref(b.ordering, b.ordering_path, "ordering")
    end
    return out
  end
  flow.default_band = resolve(f.default_band)
  flow.negative_band = f.negative_band and resolve(f.negative_band)
  for i, b in ipairs(f.bands) do
    if err then
      break
    end
    flow.bands[i] = resolve(b)
  end
  if err then
    return err
  end
  self.gen.flow = flow
end

--- The saturationDetector section: GIE v1's thresholds become a
--- saturation-detector instance (lupin's admission plugin for the same
--- detector), llm-d-router's pluginRef must name one.
function Builder:saturation(cfg)
  local s = cfg.saturation
  if not s then
    return
  end
  if s.ref then
    local rec = self.gen.by_name[s.ref]
    -- with flow control on, its gate's detector (lupin.flow); else admission's
    if cfg.flow and type(rec.obj.saturated) == "function" then
      return
    end
    if rec.type ~= "saturation-detector" then
      return self.E:at(s.path .. ".pluginRef", "plugin %q (%s) is not a saturation detector;"
        .. " lupin's is saturation-detector (the EPP's utilization-detector thresholds)",
        rec.name, rec.type)
    end
    return
  end
  local rec = self.gen.by_name["saturation-detector"]
  if rec then
    return self.E:at(s.path, "saturationDetector thresholds and a %q plugin: they are the same"
      .. " detector; keep one", rec.name)
  end
  local _, err = self:instantiate("saturation-detector", "saturation-detector", s.params, s.path)
  return err
end

function Builder:index_points()
  local gen = self.gen
  -- request control: every instance having the point, in config order
  for _, row in ipairs(points) do
    if row.layer == "request" then
      local list = {}
      for _, rec in ipairs(gen.instances) do
        if rec[row.name] then
          list[#list + 1] = rec
        end
      end
      gen.points[row.name] = list
    end
  end
  -- plugins with finish and no extension point observe every request
  for _, rec in ipairs(gen.instances) do
    if rec.finish and #rec.points == 0 then
      gen.observers[#gen.observers + 1] = rec
    end
  end
end

local function call_hook(rec, hook, arg)
  if not rec[hook] then
    return true
  end
  local ok, err, cut = budget.pcall(rec.lifecycle_budget, rec[hook], rec.obj, arg)
  if cut then
    return false, ("%s exceeded its budget of %g ms"):format(hook, rec.lifecycle_budget * 1000)
  end
  return ok, not ok and budget.describe(err) or nil
end

--- Runs init, then migrate(old) where an instance of the same name and type
--- existed in the previous generation.
function Builder:start(previous)
  for i, rec in ipairs(self.gen.instances) do
    local ok, err = call_hook(rec, "init")
    local old = previous and previous.by_name[rec.name]
    if ok and old and old.type == rec.type then
      ok, err = call_hook(rec, "migrate", old.obj)
    end
    if not ok then
      for j = i - 1, 1, -1 do
        call_hook(self.gen.instances[j], "shutdown")
      end
      return self.E:at(rec.path, "plugin %q (%s) failed to start: %s", rec.name, rec.type, err)
    end
  end
end

--- What the generation was built from, for its digest (core/runtime.c hashes
--- these strings in order): the config (canonical JSON, lupin.config), then
--- each plugin file loaded, by type, as its path and text.
function Builder:sources(cfg)
  local out, types = { cfg.text or "" }, {}
  for t in pairs(self.modules) do
    types[#types + 1] = t
  end
  table.sort(types)
  for _, t in ipairs(types) do
    local m = self.modules[t]
    out[#out + 1] = m.file .. "\0"
    out[#out + 1] = m.text or ""
  end
  return out
end

--- Builds a generation.  Returns it, or nil and an error naming file and line.
---@param cfg table from lupin.config.parse
---@param opts table runtime options (home, plugin_dirs)
---@param number integer
---@param previous table? the generation being replaced
function M.build(cfg, opts, number, previous)
  local dirs = { opts.home .. "/plugins" }
  for _, d in ipairs(opts.plugin_dirs or {}) do
    dirs[#dirs + 1] = d
  end
  for _, d in ipairs(cfg.plugin_dirs) do
    dirs[#dirs + 1] = d
  end
  local files, types = loader.catalog(dirs)
  local b = setmetatable({ E = cfg.errors, files = files, types = types, modules = {}, dirs = dirs,
    builtin_dir = dirs[1],
    budgets = cfg.budgets or { call_ms = budget.DEFAULT_CALL_MS,
      lifecycle_ms = budget.DEFAULT_LIFECYCLE_MS, disable_after = 0 },
    gen = { number = number, source = cfg.source, loaded_at = capi.now(), instances = {},
      by_name = {}, profiles = {}, profile_by_name = {}, profile_views = {}, points = {},
      observers = {}, parsers = cfg.parsers, objectives = cfg.objectives or {} } }, Builder)

  for _, p in ipairs(cfg.plugins) do
    local rec, err = b:instantiate(p.name, p.type, p.params, p.path, p)
    if not rec then
      return nil, err
    end
  end
  local err = b:saturation(cfg) or b:profiles(cfg) or b:handler() or b:flow(cfg)
  if err then
    return nil, err
  end
  b:index_points()
  err = b:start(previous)
  if err then
    return nil, err
  end
  b.gen.plugin_dirs = dirs
  b.gen.sources = b:sources(cfg)
  return b.gen
end

--- Runs the shutdown hooks of a generation nothing uses any more.
function M.release(gen)
  for _, rec in ipairs(gen.instances) do
    local ok, err = call_hook(rec, "shutdown")
    if not ok then
      log.error("plugin %s (%s): shutdown failed: %s", rec.name, rec.type, err)
    end
  end
end

return M
