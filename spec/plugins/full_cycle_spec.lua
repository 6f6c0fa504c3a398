-- The built-in scorers together, end to end through one config: the issue's
-- full cycle, and the shipped default config's weights at work.
local S = require "support"
local P = require "prefix_support"

local ENDPOINTS = {
  { waiting_queue_size = 0, kv_cache_usage = 0.2, running_lora_adapters = "foo,bar", max_lora = 2 },
  { waiting_queue_size = 0, kv_cache_usage = 0.2, running_lora_adapters = "foo,critical",
    max_lora = 2 },
  { waiting_queue_size = 10, kv_cache_usage = 0.8 },
}

describe("full scheduling cycle", function()
  it("queue, KV, prefix and LoRA at weight 1 send model critical to the second endpoint, 2.8",
    function()
      local rt = S.loaded(P.config({ "queue-scorer", "kv-cache-utilization-scorer",
        "prefix-cache-scorer", "lora-affinity-scorer" }))
      S.endpoints(rt, 3, ENDPOINTS)
      local pick, scores = P.request(rt, "a prompt long enough for two blocks of sixty-four "
        .. "characters each, so that the prefix scorer has hashes to look up....",
        { model = "critical" })
      assert.equal("ep2", pick)
      -- queue + kv + prefix (nothing cached yet) + lora: ep2 1 + 0.8 + 0 + 1
      -- (critical is active); ep1 1 + 0.8 + 0 + 0 (two adapters of max 2: no
      -- room); ep3 0 + 0.2 + 0 + 0 (no adapter slots)
      assert.near(2.8, scores.ep2, 1e-9)
      assert.near(1.8, scores.ep1, 1e-9)
      assert.near(0.2, scores.ep3, 1e-9)
      rt:free()
    end)

  describe("examples/configs/epp-default.json", function()
    it("loads with the EPP's shipped weights: prefix 3, queue 2, KV 2, max-score", function()
      local rt = S.runtime()
      assert(rt:load("examples/configs/epp-default.json"))
      local shape = S.eval(rt, [[
        local p = require("lupin.runtime").current.profiles[1]
        local w = {}
        for _, s in ipairs(p.scorers) do w[s.rec.type] = s.weight end
        return { weights = w, picker = p.picker.type }]])
      assert.same({ weights = { ["prefix-cache-scorer"] = 3, ["queue-scorer"] = 2,
        ["kv-cache-utilization-scorer"] = 2 }, picker = "max-score-picker" }, shape)
      rt:free()
    end)

    it("follows the cache while the load is even, and leaves it when the queue grows", function()
      local rt = S.runtime()
      assert(rt:load("examples/configs/epp-default.json"))
      S.endpoints(rt, 3)
      local prompt = ("You are a careful assistant. "):rep(20) .. "Question: "
      local function pick(q)
        local req = rt:begin({ body = S.json.encode({ model = "m", prompt = prompt .. q }) })
        local res = req:schedule()
        req:finish("ok")
        return res.picks[1].name
      end
      local first = pick("one?")
      for i = 1, 5 do
        assert.equal(first, pick("follow-up " .. i))
      end
      -- the cached endpoint gets a long queue and full KV: 3 × hit < 2 + 2
      rt:set_metrics(first, { waiting_queue_size = 50, kv_cache_usage = 1 })
      assert.not_equal(first, pick("another"))
      rt:free()
    end)
  end)

  describe("examples/configs/default.json", function()
    -- Begins and schedules one request; returns it (still in flight) and its pick.
    local function begin(rt, prompt)
      local req = assert(rt:begin({ body = S.json.encode({ model = "m", prompt = prompt }) }))
      local res = req:schedule()
      assert.equal(200, res.status)
      return req, res.picks[1].name
    end

    it("is prefix-cache-scorer (weight 1) and bounded-load-picker", function()
      local rt = S.runtime()
      assert(rt:load("examples/configs/default.json"))
      local shape = S.eval(rt, [[
        local p = require("lupin.runtime").current.profiles[1]
        local w = {}
        for _, s in ipairs(p.scorers) do w[s.rec.type] = s.weight end
        return { weights = w, picker = p.picker.type }]])
      assert.same({ weights = { ["prefix-cache-scorer"] = 1 }, picker = "bounded-load-picker" },
        shape)
      rt:free()
    end)

    it("follows the cache while its load stays within the bound, then spreads", function()
      local rt = S.runtime()
      assert(rt:load("examples/configs/default.json"))
      S.endpoints(rt, 4)
      local prompt = ("You are a careful assistant. "):rep(20) .. "Question: "
      -- one at a time: every request follows the first to its endpoint
      local req, first = begin(rt, prompt .. "one?")
      req:finish("ok")
      for i = 1, 5 do
        local r, pick = begin(rt, prompt .. "follow-up " .. i)
        r:finish("ok")
        assert.equal(first, pick)
      end
      -- held in flight: each goes to an endpoint holding the prefix while its
      -- load stays within the least load + 1 + the mean, elsewhere once not;
      -- the first goes to the cached endpoint, and the 8 end up 2 on each
      local held, count = {}, {}
      for i = 1, 8 do
        local r, pick = begin(rt, prompt .. "burst " .. i)
        held[i], count[pick] = r, (count[pick] or 0) + 1
        if i == 1 then
          assert.equal(first, pick)
        end
      end
      assert.same({ ep1 = 2, ep2 = 2, ep3 = 2, ep4 = 2 }, count)
      for _, r in ipairs(held) do
        r:finish("ok")
      end
      rt:free()
    end)

    -- Stale metrics: scraped once, when ep1 looked idle and the others had 5
    -- waiting; then a burst of 16 requests before the next scrape.
    local function burst(config)
      local rt = S.runtime()
      assert(rt:load(config))
      S.endpoints(rt, 4, { { waiting_queue_size = 0 }, { waiting_queue_size = 5 },
        { waiting_queue_size = 5 }, { waiting_queue_size = 5 } })
      local held, count = {}, {}
      for i = 1, 16 do
        local r, pick = begin(rt, "unrelated prompt number " .. i .. (" with words"):rep(i))
        held[i], count[pick] = r, (count[pick] or 0) + 1
      end
      for _, r in ipairs(held) do
        r:finish("ok")
      end
      rt:free()
      return count
    end

    it("spreads a burst between two scrapes: what it sent since counts at once", function()
      -- the EPP's weights read only the scrape: the whole burst herds onto ep1
      assert.same({ ep1 = 16 }, burst("examples/configs/epp-default.json"))
      -- default: ep1 takes requests until its load (sent since the scrape)
      -- reaches the others' (5 scraped), then the burst spreads over all four
      local count = burst("examples/configs/default.json")
      for i = 1, 4 do
        assert.truthy((count["ep" .. i] or 0) >= 1, "ep" .. i .. " got none")
      end
      assert.truthy(count.ep1 <= 9, count.ep1)
    end)
  end)
end)
