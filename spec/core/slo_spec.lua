-- lupin.slo, used directly: llm-d's SLO headers read and refused, and where
-- the predicted-latency plugins find the request's predictions.
local slo = require "lupin.slo"

local TTFT, TPOT = "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"

describe("lupin.slo", function()
  it("names the key and llm-d-router's headers", function()
    assert.equal("predicted-latency", slo.KEY)
    assert.equal(TTFT, slo.TTFT_HEADER)
    assert.equal(TPOT, slo.TPOT_HEADER)
    assert.equal("x-slo-ttft-ms", slo.OLD_TTFT_HEADER)
    assert.equal("x-slo-tpot-ms", slo.OLD_TPOT_HEADER)
  end)

  it("reads positive decimal milliseconds", function()
    for text, want in pairs({ ["150"] = 150, ["12.5"] = 12.5, [".5"] = 0.5, ["2e3"] = 2000,
      ["+7"] = 7, [" 40 "] = 40, ["1E-1"] = 0.1 }) do
      local ttft, tpot, err = slo.parse({ [TTFT] = text, [TPOT] = text })
      assert.equal(want, ttft, text)
      assert.equal(want, tpot, text)
      assert.is_nil(err)
    end
  end)

  it("gives nil for an objective the request does not set", function()
    assert.same({}, { slo.parse({}) })
    local ttft, tpot = slo.parse({ [TPOT] = "20" })
    assert.is_nil(ttft)
    assert.equal(20, tpot)
    ttft, tpot = slo.parse({ [TTFT] = "300" })
    assert.equal(300, ttft)
    assert.is_nil(tpot)
  end)

  it("reads the older names, the canonical one winning when both are set", function()
    assert.same({ 100, 10 }, { slo.parse({ ["x-slo-ttft-ms"] = "100", ["x-slo-tpot-ms"] = "10" }) })
    assert.same({ 50, 5 }, { slo.parse({ ["x-slo-ttft-ms"] = "100", [TTFT] = "50",
      ["x-slo-tpot-ms"] = "10", [TPOT] = "5" }) })
    -- the canonical one wins even when it is the bad one
    local _, _, err = slo.parse({ [TTFT] = "soon", ["x-slo-ttft-ms"] = "100" })
    assert.equal('x-llm-d-slo-ttft-ms must be a positive number of milliseconds, got "soon"', err)
  end)

  for _, bad in ipairs({ "", "abc", "0", "-3", "0.0", "nan", "inf", "-inf", "1e400", "1e-400",
    "0x10", "1e", ".", "5-3", "12ms" }) do
    it(("refuses %q, naming the header and what it takes"):format(bad), function()
      local ttft, tpot, err = slo.parse({ [TTFT] = bad, [TPOT] = "10" })
      assert.is_nil(ttft)
      assert.is_nil(tpot)
      assert.equal(('x-llm-d-slo-ttft-ms must be a positive number of milliseconds, got "%s"')
        :format(bad), err)
      _, _, err = slo.parse({ ["x-slo-tpot-ms"] = bad })
      assert.equal(('x-slo-tpot-ms must be a positive number of milliseconds, got "%s"')
        :format(bad), err)
    end)
  end

  it("names the TTFT header first when both are bad", function()
    local _, _, err = slo.parse({ [TTFT] = "a", [TPOT] = "b" })
    assert.matches("^x%-llm%-d%-slo%-ttft%-ms .* got \"a\"$", err)
  end)

  it("quotes a long or odd value short and escaped", function()
    local _, _, err = slo.parse({ [TTFT] = ("9"):rep(30) .. 'x"\\\t' .. ("z"):rep(100) })
    assert.equal('x-llm-d-slo-ttft-ms must be a positive number of milliseconds, got "'
      .. ("9"):rep(30) .. 'x\\x22\\x5c\\x09zzzzzz..."', err)
  end)

  it("reads each objective on its own", function()
    assert.equal(120, slo.ttft({ [TTFT] = "120", [TPOT] = "bad" }))
    local v, err = slo.ttft({ [TTFT] = "0", [TPOT] = "5" })
    assert.is_nil(v)
    assert.matches("x-llm-d-slo-ttft-ms", err, 1, true)
    assert.equal(5, slo.tpot({ [TTFT] = "bad", ["x-slo-tpot-ms"] = "5" }))
    assert.is_nil(slo.tpot({}))
    assert.is_nil(slo.ttft({}))
  end)

  it("finds the predictions under its key, nil without a producer", function()
    local pl = { slo = { ttft = 100 }, streaming = true, prefix = {}, endpoints = {} }
    assert.equal(pl, slo.predictions({ shared = { [slo.KEY] = pl } }))
    assert.is_nil(slo.predictions({ shared = {} }))
    assert.is_nil(slo.predictions({ shared = { ["prefix-cache-scorer"] = {} } }))
  end)
end)
