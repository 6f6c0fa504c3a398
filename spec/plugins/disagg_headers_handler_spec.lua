-- disagg-headers-handler: the sidecar's headers from the prefill and encode
-- profiles.  Vectors from llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_headers_handler_test.go
-- (named per test below).
local S = require "support"
local P = require "prefix_support"

-- test-handler runs every profile (sorted by name), decode primary: the
-- headers come from disagg-headers-handler alone.  The encode profile's
-- picker keeps two endpoints.
local function config(params, names)
  names = names or { "decode", "encode", "prefill" }
  local profiles = {}
  for i, name in ipairs(names) do
    profiles[i] = { name = name, plugins = { { pluginRef = name:find("encode") and "two"
      or "max-score-picker" } } }
  end
  return {
    plugins = {
      { type = "test-handler", parameters = { primary = "decode" } },
      { type = "disagg-headers-handler", parameters = params },
      { type = "max-score-picker" },
      { type = "max-score-picker", name = "two", parameters = { maxNumOfEndpoints = 2 } },
    },
    schedulingProfiles = profiles,
  }
end

describe("disagg-headers-handler", function()
  it("defaults to the profiles prefill and encode (TestHeadersHandlerFactory)", function()
    assert.same({ prefillProfile = "prefill", encodeProfile = "encode" },
      P.defaults("disagg-headers-handler"))
    assert.matches("parameters.encodeProfile: must be a string, got 1",
      P.config_error("disagg-headers-handler", { encodeProfile = 1 }))
  end)

  -- TestPreRequestPrefillProfileExists, TestPreRequestEncodeProfileExists
  it("names the prefill endpoint and the encode endpoints", function()
    local rt = S.loaded(config())
    S.endpoints(rt, 2)
    local _, _, res = P.request(rt, "hello")
    rt:free()
    assert.matches("^10%.0%.0%.%d:8000$", res.headers["x-prefiller-host-port"])
    assert.matches("^10%.0%.0%.%d:8000,10%.0%.0%.%d:8000$", res.headers["x-encoder-hosts-ports"])
  end)

  -- TestPreRequestPrefillIPv6Address, TestPreRequestEncodeIPv6Address: an IPv6
  -- address is bracketed, as net.JoinHostPort writes it
  it("brackets an IPv6 address in both headers", function()
    local rt = S.loaded(config())
    assert(rt:upsert({ name = "ep1", address = "fd00::1", port = 8000 }))
    local _, _, res = P.request(rt, "hello")
    rt:free()
    assert.equal("[fd00::1]:8000", res.headers["x-prefiller-host-port"])
    assert.equal("[fd00::1]:8000", res.headers["x-encoder-hosts-ports"])
  end)

  -- TestPreRequestCustomPrefillProfile, TestPreRequestEncodeCustomProfile,
  -- TestPreRequestPrefillProfileNotExists (its profiles are not the ones that ran)
  it("reads the profiles it is told to, and sets nothing for profiles that did not run", function()
    local names = { "decode", "my-encode", "my-prefill" }
    local rt = S.loaded(config({ prefillProfile = "my-prefill", encodeProfile = "my-encode" }, names))
    S.endpoints(rt, 2)
    local _, _, res = P.request(rt, "hello")
    rt:free()
    assert.matches("^10%.0%.0%.%d:8000$", res.headers["x-prefiller-host-port"])
    assert.matches("^10%.0%.0%.%d:8000,10%.0%.0%.%d:8000$", res.headers["x-encoder-hosts-ports"])
    rt = S.loaded(config({ prefillProfile = "p2", encodeProfile = "e2" }, names))
    S.endpoints(rt, 2)
    _, _, res = P.request(rt, "hello")
    rt:free()
    assert.equal(200, res.status)
    assert.is_nil(res.headers["x-prefiller-host-port"])
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
  end)
end)
