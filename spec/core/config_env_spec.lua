-- ${VAR} and ${VAR:-default} in a config, expanded from the environment
-- before it is parsed, as the upstream deploy scripts' envsubst does: through
-- lupin check, with the variables set for it alone.
local S = require "support"

local CONFIG = [[
# the port below comes from ${DEPLOY_ENV}, a comment: not expanded
plugins:
- type: token-load-scorer
  parameters:
    queueThresholdTokens: ${LUPIN_SPEC_TOKENS}
- type: max-score-picker
  parameters: {}   # $${NOT_A_VARIABLE} stays as it is in a string: "$${X}"
schedulingProfiles:
- name: ${LUPIN_SPEC_PROFILE:-default}
  plugins:
  - pluginRef: token-load-scorer
  - pluginRef: max-score-picker
]]

local function check(env, text)
  local dir = S.tmpdir()
  S.write(dir .. "/c.yaml", text or CONFIG)
  local p = io.popen(("env -u LUPIN_SPEC_TOKENS -u LUPIN_SPEC_PROFILE %s LUPIN_HOME=%s"
    .. " %s/lupin check --config %s/c.yaml 2>&1; echo rc=$?"):format(env, S.ROOT, S.BUILD, dir))
  local out = p:read("*a")
  p:close()
  return out
end

describe("config ${VAR} expansion", function()
  it("expands a set variable, and a default when one is unset or empty", function()
    local out = check("LUPIN_SPEC_TOKENS=1000")
    assert.matches("rc=0", out, 1, true)
    out = check("LUPIN_SPEC_TOKENS=1000 LUPIN_SPEC_PROFILE=")
    assert.matches("rc=0", out, 1, true)
  end)

  it("parses what it expanded: a bad value is the field's error", function()
    local out = check("LUPIN_SPEC_TOKENS=lots")
    assert.matches("c.yaml:5: plugins[0].parameters.queueThresholdTokens", out, 1, true)
    assert.matches("rc=1", out, 1, true)
  end)

  it("names an unset variable without a default at its line", function()
    local out = check("")
    assert.matches("c.yaml:5: ${LUPIN_SPEC_TOKENS}: the environment variable LUPIN_SPEC_TOKENS"
      .. " is not set: set it, or give a default (${LUPIN_SPEC_TOKENS:-value})", out, 1, true)
    assert.matches("rc=1", out, 1, true)
  end)

  it("refuses what is not a variable's name", function()
    local out = check("", "plugins: [{type: max-score-picker, name: ${1x}}]\n")
    assert.matches("c.yaml:1: ${1x}: not a variable: write ${NAME} or ${NAME:-default}", out, 1,
      true)
  end)
end)
