-- The Lua half of the runtime: what the C core calls (core/runtime.c looks
-- up these hooks by name at start).
local capi = require "lupin.runtime.capi"
local cjson = require "cjson"
local config = require "lupin.config"
local datalayer = require "lupin.datalayer"
local engine = require "lupin.runtime.engine"
local enums = require "lupin.runtime.enums"
local explain = require "lupin.runtime.explain"
local fallback = require "lupin.runtime.fallback"
local flow = require "lupin.runtime.flow"
local generation = require "lupin.generation"
local leaks = require "lupin.runtime.leaks"
local log = require "lupin.log"
local openai = require "lupin.runtime.openai"
local points = require "lupin.generation.points"
local pool = require "lupin.runtime.pool"

local M = {}

--- The generation new requests are pinned to, and every generation alive
--- (for the admin API and for specs).
M.current = nil
M.generations = {}

function M.init(ud, opts)
  capi.bind(ud, opts.abi)
  log.level = opts.log_level -- messages above it are not even formatted
  math.randomseed(opts.seed)
  engine.init(opts)
  require("lupin.runtime.guard").install() -- before any plugin loads (lupin/guard.lua)

  local live = M.generations
  local hooks = {
    begin = engine.begin,
    schedule = engine.schedule,
    response_header = engine.response_header,
    response_chunk = engine.response_chunk,
    response_complete = engine.response_complete,
    finish = engine.finish,
    endpoint_add = pool.add,
    endpoint_remove = pool.remove,
    endpoint_labels = pool.set_labels,
    endpoint_adapters = pool.set_adapters,
    endpoint_health = pool.set_health,
    fallbacks = fallback.ranked,
    explain = explain.render,
    flow = flow.hook,
  }

  --- The dry scheduling cycle a reload runs before it swaps, over the
  --- endpoints in the pool now: nil, or the error naming plugin, file, line.
  local function dry_check(gen)
    local err, rec, point = engine.dry_run(gen)
    if err then
      return gen.errors:at(rec.path, "plugin %q (%s) failed in %s during the dry"
        .. " scheduling cycle: %s", rec.name, rec.type, point, err)
    end
  end

  function hooks.load(text, source, number)
    local cfg, err = config.parse(text, source)
    if not cfg then
      return nil, err
    end
    local gen
    gen, err = generation.build(cfg, opts, number, M.current)
    if not gen then
      return nil, err
    end
    gen.errors = cfg.errors
    gen.data, err = datalayer.build(cfg, gen)
    err = err or dry_check(gen)
    if err then
      generation.release(gen)
      return nil, err
    end
    gen.sections, gen.endpoints, gen.pools = cfg.sections, cfg.endpoints, cfg.pools
    gen.flow_control, gen.feature_gates = cfg.flow_control, cfg.feature_gates
    live[gen] = true
    -- the sources go to the C side, which hashes them into the digest; the
    -- generation does not keep the texts
    local sources = gen.sources
    gen.sources = nil
    return gen, sources, engine.flags(gen)
  end

  -- A built generation becomes current (at once, or at a staged reload's
  -- commit: until then the previous one serves and is what a build migrates
  -- from).
  function hooks.install(gen)
    M.current = gen
    flow.configure(gen)
  end

  function hooks.release(gen)
    live[gen] = nil
    generation.release(gen)
    -- Compiled traces hold their prototypes and the closures they call as
    -- constants: left alone they would keep the released generation's code
    -- and plugin state alive until the trace cache fills.  Reloads are rare;
    -- recompiling the current generation's hot paths is cheap.
    jit.flush()
  end

  function hooks.stats()
    return { live_request_tables = leaks.count() }
  end

  function hooks.plugin_stats()
    local out = {}
    for _, rec in ipairs(M.current and M.current.instances or {}) do
      for _, row in ipairs(points) do
        local point = row.name
        local st = rec.stats[point]
        if st and st.calls + st.errors > 0 then
          out[#out + 1] = { plugin = rec.name, type = rec.type, point = point,
            epp_point = row.epp or point,
            calls = st.calls, errors = st.errors, ns = st.ns, cuts = st.cuts,
            buckets = st.buckets,
            disabled = rec.disabled and 1 or 0 }
        end
      end
    end
    return out
  end

  function hooks.check_leaks()
    return leaks.check(live)
  end

  --- What a host asks beyond requests (core/host.c): its config sections,
  --- the endpoints a config or file lists, the plugin directories, a dry
  --- run, the memory limit.
  local host = {}

  function host.declare_section(name, list)
    return config.declare_section(name, list)
  end

  function host.section(name)
    local decl, values = config.sections[name], M.current and M.current.sections[name]
    if not (decl and values) then
      return nil
    end
    local out = {}
    for i, k in ipairs(decl.order) do
      out[i] = decl.fields[k].text and 0 or values[k]
    end
    return out
  end

  function host.section_text(name, field)
    local decl, values = config.sections[name], M.current and M.current.sections[name]
    if decl and values and decl.fields[field] and decl.fields[field].text then
      return values[field]
    end
  end

  function host.endpoints(file)
    if file then
      return config.endpoints_file(file)
    end
    return M.current and M.current.endpoints or {}
  end

  --- What the host scrapes from an endpoint and under which names
  --- (lupin_runtime_metric_source): its engine's mapping.
  function host.metric_source(name)
    local gen = M.current
    return gen and gen.data and datalayer.resolve(gen.data, pool.labels_of(name))
  end

  --- The engines' KV-cache events the generation's precise plugins want
  --- (lupin_runtime_kv_events): their settings, false for none, nil with
  --- no generation.
  function host.kv_events()
    local gen = M.current
    if not gen then
      return nil
    end
    return gen.data and gen.data.kv_events or false
  end

  --- The InferencePool the config file holds beside its config
  --- (lupin_runtime_config_pool): the one named name in namespace ns (a
  --- pool without a name or namespace matches any; name nil: the first).
  --- false and the pools it holds ("ns/name at file:line, ...") when none
  --- matches, or "".
  function host.pool(name, ns)
    local pools, others = M.current and M.current.pools or {}, {}
    for _, p in ipairs(pools) do
      if (name == nil or p.name == nil or p.name == name)
        and (ns == nil or p.namespace == nil or p.namespace == ns) then
        return p
      end
      others[#others + 1] = ("%s/%s at %s"):format(p.namespace or ns, p.name, p.where)
    end
    return false, table.concat(others, ", ")
  end

  function host.plugin_dirs()
    return M.current and M.current.plugin_dirs or {}
  end

  host.routes = openai.paths

  function host.dry_run() -- a host's first load ran before it had endpoints
    return M.current and dry_check(M.current)
  end

  function host.memory_limit(bytes)
    engine.set_memory_limit(bytes)
  end

  function hooks.host(op, ...)
    return host[op](...)
  end

  function hooks.eval(code)
    local f = assert(loadstring(code, "=eval"))
    local v = f()
    return type(v) == "string" and v or cjson.encode(v)
  end

  enums.core = opts.enums -- what the core gave, for specs
  enums.check(opts.enums, hooks)
  return hooks
end

return M
