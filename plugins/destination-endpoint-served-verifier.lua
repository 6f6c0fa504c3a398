-- GIE's conformance plugin: tells the client, in
-- x-conformance-test-served-endpoint, which endpoint the data plane says
-- served the request (x-gateway-destination-endpoint-served, which both
-- lupin serve and lupin epp hand to plugins among the response headers),
-- so the conformance suite can check the routing it asked for.
local SERVED = "x-gateway-destination-endpoint-served"
local RESULT = "x-conformance-test-served-endpoint"

---@type lupin.Plugin
return {
  type = "destination-endpoint-served-verifier",
  schema = {},

  response_header = function(_, ctx, response)
    local served = response.headers[SERVED]
    ctx:set_response_header(RESULT, served or "fail: missing destination endpoint served metadata")
  end,
}
