-- The EPP's header-based testing filter: keeps only the endpoints named in
-- the `test-epp-endpoint-selection` request header, a comma-separated list
-- of addresses (an endpoint's IP, ip:port or name; an IP keeps every port on
-- it), in the header's order.
-- Without the header nothing is kept, as in the EPP (the request gets a 503
-- naming this filter).  Meant for tests and debugging, not production.
local HEADER = "test-epp-endpoint-selection"

---@type lupin.Plugin
return {
  type = "header-based-testing-filter",
  schema = {},

  filter = function(_, ctx, endpoints)
    local value = ctx.request.headers[HEADER]
    local kept, taken = {}, {}
    if not value then
      return kept
    end
    for want in value:gmatch("[^,]+") do
      want = want:match("^%s*(.-)%s*$")
      for _, ep in ipairs(endpoints) do
        if not taken[ep] and (ep.address == want or ep.hostport == want or ep.name == want) then
          taken[ep] = true
          kept[#kept + 1] = ep
        end
      end
    end
    return kept
  end,
}
