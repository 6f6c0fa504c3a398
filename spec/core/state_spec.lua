-- The per-request state tree: private per plugin instance, cycle per
-- profile, shared request-wide, subtables made on first use.
local S = require "support"

local function seen(rt, name, key)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name[%q].obj[%q] ]]):format(
    name, key or "seen"))
end

local function field(rt, name, key)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name[%q].obj[%q] ]]):format(
    name, key))
end

describe("per-request state", function()
  local rt
  after_each(function()
    rt:free()
  end)

  -- profiles A and B run in that order; s1 is in both, s1b (a second instance
  -- of the same type) and s2 only in A
  local config = {
    plugins = {
      { type = "test-handler", name = "h" },
      { type = "test-filter", name = "f" },
      { type = "test-scorer", name = "s1" },
      { type = "test-scorer", name = "s1b" },
      { type = "test-scorer", name = "s2" },
      { type = "test-picker", name = "p" },
    },
    schedulingProfiles = {
      { name = "A", plugins = { { pluginRef = "f" }, { pluginRef = "s1" }, { pluginRef = "s1b" },
        { pluginRef = "s2" }, { pluginRef = "p" } } },
      { name = "B", plugins = { { pluginRef = "s1" }, { pluginRef = "p" } } },
    },
  }

  it("isolates each profile's cycle state and shares it within the profile", function()
    rt = S.loaded(config)
    S.endpoints(rt, 2)
    assert.equal(200, S.lifecycle(rt).status)
    local s1, s1b, s2 = seen(rt, "s1"), seen(rt, "s1b"), seen(rt, "s2")
    -- within A: each scorer sees the mark left by the one before it
    assert.same({ "A", false, "f" }, { s1[1].profile, s1[1].cycle_mark, s1[1].filtered_by })
    assert.same({ "A", "A/s1" }, { s1b[1].profile, s1b[1].cycle_mark })
    assert.same({ "A", "A/s1b" }, { s2[1].profile, s2[1].cycle_mark })
    -- B starts from an empty cycle: nothing of A is visible
    assert.same({ "B", false, false }, { s1[2].profile, s1[2].cycle_mark, s1[2].filtered_by })
    -- and B's writes did not reach A's table
    assert.same({ A = "A/s2", B = "B/s1" }, field(rt, "s1", "final"))
    -- outside a profile run, ctx.cycle is nil
    assert.is_false(field(rt, "s1", "cycle_in_finish"))
  end)

  it("gives one private table per instance: shared across profiles, not across instances",
    function()
      rt = S.loaded(config)
      S.endpoints(rt, 2)
      S.lifecycle(rt)
      local s1, s1b = seen(rt, "s1"), seen(rt, "s1b")
      assert.equal(1, s1[1].private_calls) -- s1 in A
      assert.equal(2, s1[2].private_calls) -- s1 in B: the same private table
      assert.equal(1, s1b[1].private_calls) -- same type, other instance: its own
      -- and a new request starts from fresh private state
      S.lifecycle(rt)
      s1 = seen(rt, "s1")
      assert.equal(1, s1[3].private_calls)
      assert.equal(2, s1[4].private_calls)
    end)

  it("creates subtables only when a plugin first uses them", function()
    rt = S.runtime()
    assert(rt:load("examples/configs/minimal.json"))
    S.endpoints(rt, 2)
    local req = rt:begin({})
    assert.equal(200, req:schedule().status)
    local shape = S.eval(rt, [[
      local out = {}
      require("lupin.runtime.leaks").each_live(function(r)
        out.shared = r.shared ~= nil
        out.plugins = false -- a private table: the ctx's second slot
        for _, c in pairs(r.ctxs) do
          out.plugins = out.plugins or rawget(c, 2) ~= nil
        end
        out.profiles = r.profiles ~= false and next(r.profiles) ~= nil
      end)
      return out]])
    assert.same({ shared = false, plugins = false, profiles = false }, shape)
    req:finish("ok")
  end)

  it("lets plugins share request-wide data through ctx.shared", function()
    rt = S.loaded(config)
    S.endpoints(rt, 2)
    local req = rt:begin({ id = "shared-1" })
    req:schedule()
    -- every fixture appends to ctx.shared.journal: one journal, all plugins
    local journal = S.eval(rt, [[
      local out
      require("lupin.runtime.leaks").each_live(function(r) out = r.shared.journal end)
      return out]])
    assert.same({ "pick_profiles", "filter:f:A", "score:s1:A", "score:s1b:A", "score:s2:A",
      "pick:p:A", "pick_profiles", "score:s1:B", "pick:p:B", "pick_profiles" }, journal)
    req:finish("ok")
  end)

  it("gives the profile handler its own results on each call: its writes reach nothing",
    function()
      local c = { plugins = {}, schedulingProfiles = config.schedulingProfiles }
      for i, p in ipairs(config.plugins) do
        c.plugins[i] = p
      end
      c.plugins[1] = { type = "test-handler", name = "h", parameters = { scribble = true } }
      rt = S.loaded(c)
      S.endpoints(rt, 2)
      local req = rt:begin({})
      local res = req:schedule()
      assert.equal(200, res.status)
      assert.is_true(#res.picks >= 1)
      local saw = S.eval(rt, [[
        local out
        require("lupin.runtime.leaks").each_live(function(r)
          out = { saw = r.shared.handler_saw, primary = r.result.primary,
            kept = type(r.result.profiles.A), bogus = r.result.profiles.bogus ~= nil }
        end)
        return out]])
      -- each call sees the profiles that ran, as results, whatever the last
      -- call wrote over them
      assert.same({ "", "A=table", "A=table,B=table", "A=table,B=table" }, saw.saw)
      assert.same({ primary = "A", kept = "table", bogus = false },
        { primary = saw.primary, kept = saw.kept, bogus = saw.bogus })
      req:finish("ok")
    end)

  it("answers a ctx only in its own request's calls: not kept past them, not in another's",
    function()
      local dir = S.tmpdir()
      S.write(dir .. "/spec-ctx-keeper.lua", [[
        local function try(f)
          local ok, err = pcall(f)
          return ok and "ok" or tostring(err):match("ctx used [^(]*")
            or tostring(err):match("rawset: .*") or tostring(err)
        end
        return {
          type = "spec-ctx-keeper",
          new = function() return { kept = {}, saw = {} } end,
          prepare = function(self, ctx)
            ctx.shared.mine = ctx.request.id
            self.kept[#self.kept + 1] = ctx
          end,
          score = function(self, ctx, endpoints)
            local prev = self.kept[#self.kept - 1]
            local saw = { own = try(function() return ctx.shared.mine end) }
            if prev then -- the request before, still in flight
              saw.other = try(function() return prev.shared.mine end)
              saw.other_method = try(function() return prev:set_header("x-a", "1") end)
              saw.other_name = prev.name
            end
            -- a slot cannot be written over with another's: a ctx is the runtime's
            local slot = rawget(ctx, 3)
            saw.forged = try(function() rawset(ctx, 3, slot + 1) end)
            saw.restored = try(function() return ctx.shared.mine end)
            self.saw[#self.saw + 1] = saw
            local out = {}
            for i = 1, #endpoints do out[i] = 0 end
            return out
          end,
          finish = function(self, ctx)
            self.saw[#self.saw + 1] = { finish = try(function() return ctx.request.id end) }
          end,
        }]])
      rt = S.loaded({
        plugins = { { type = "spec-ctx-keeper", name = "k" }, { type = "max-score-picker", name = "p" } },
        schedulingProfiles = { { name = "A", plugins = { { pluginRef = "k" }, { pluginRef = "p" } } } },
      }, { plugin_dirs = { dir } })
      S.endpoints(rt, 2) -- (with one endpoint, nothing is scored)
      -- forget the dry run that checked the generation before it served
      S.eval(rt, [[local k = require("lupin.runtime").current.by_name.k.obj
        k.kept, k.saw = {}, {}
        return 0]])
      local one = rt:begin({ path = "/v1/completions", body = '{"prompt":"a"}' })
      assert.equal(200, one:schedule().status)
      local two = rt:begin({ path = "/v1/completions", body = '{"prompt":"b"}' })
      assert.equal(200, two:schedule().status)
      one:finish("ok")
      two:finish("ok")
      local saw = seen(rt, "k", "saw")
      local ended = "ctx used after its request ended "
      local refused = "rawset: the table is the runtime's and read-only to plugins"
      assert.same({ own = "ok", forged = refused, restored = "ok" }, saw[1])
      assert.same({ own = "ok", other = ended, other_method = ended, other_name = "k",
        forged = refused, restored = "ok" }, saw[2])
      assert.same({ { finish = "ok" }, { finish = "ok" } }, { saw[3], saw[4] })
      -- and after the requests, from outside any call
      assert.matches("ctx used after its request ended", S.eval(rt, [[
        local k = require("lupin.runtime").current.by_name.k.obj
        local ok, err = pcall(function() return k.kept[1].request end)
        return tostring(ok) .. " " .. tostring(err)]]), 1, true)
      os.execute("rm -rf " .. dir)
    end)

  it("never hands a plugin the request table", function()
    rt = S.loaded(config)
    S.endpoints(rt, 1)
    local req = rt:begin({})
    req:schedule()
    -- the ctx object's own slots are only its name, its private table and
    -- the number of its slot in the request
    local keys = S.eval(rt, [[
      local out = {}
      require("lupin.runtime.leaks").each_live(function(r)
        for _, c in pairs(r.ctxs) do
          for k, v in pairs(c) do
            assert(v ~= r, "a ctx exposes the request table")
            out[tostring(k)] = type(v)
          end
          assert(getmetatable(c) == "ctx", "a ctx exposes its metatable")
        end
      end)
      return out]])
    for k, t in pairs(keys) do
      local want = ({ ["1"] = "string", ["2"] = "table", ["3"] = "number" })[k]
      assert.equal(want, t, "unexpected ctx field " .. k .. " (" .. t .. ")")
    end
    assert.equal("number", keys["3"])
    req:finish("ok")
  end)
end)
