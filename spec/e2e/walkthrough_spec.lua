-- docs/writing-a-plugin.md, followed step by step: its files (the blocks
-- marked <!-- file: NAME -->) go to a fresh folder outside the repository;
-- `lupin test` passes there and fails on a broken plugin; `lupin check`
-- passes; `lupin serve` in front of lupin-sim serves the plugin and reloads
-- it after the page's edit (<!-- edit: NAME -->: the block replaces the line
-- of NAME that starts, indentation aside, with the same text up to its
-- first "(").
local P = require "e2e.procs"
local support = require "support"

local DOC = P.read(support.ROOT .. "/docs/writing-a-plugin.md")

-- kind ("file" or "edit") -> list of { name, text }
local function blocks(kind)
  local out = {}
  for name, text in DOC:gmatch("<!%-%- " .. kind .. ": (%S+) %-%->\n```%w*\n(.-)```") do
    out[#out + 1] = { name = name, text = text }
  end
  return out
end

local function edit(text, line)
  local prefix = line:match("^%s*([^(]+%()")
  assert(prefix, "the edit block has no '(': " .. line)
  local done = 0
  local out = text:gsub("[^\n]*\n", function(l)
    if l:match("^%s*(.*)$"):sub(1, #prefix) == prefix then
      done = done + 1
      return line
    end
  end)
  assert(done == 1, ("the edit's line %q matches %d lines, not 1"):format(prefix, done))
  return out
end

-- Writes like an editor: a new file renamed over the old one.
local function save(path, text)
  support.write(path .. ".tmp", text)
  assert(os.rename(path .. ".tmp", path))
end

-- Under `make test-asan` the busted that lupin test starts loads the
-- sanitized lupin_native.so: it needs the runtime preloaded, as this one.
local PRELOAD = os.getenv("LD_PRELOAD") and "env LD_PRELOAD=" .. P.quote(os.getenv("LD_PRELOAD"))
  .. " " or ""

local function lupin(args)
  return P.run(("%s%s %s 2>&1"):format(PRELOAD, P.LUPIN, args))
end

describe("docs/writing-a-plugin.md", function()
  local dir, plugin, original
  setup(function()
    dir = support.tmpdir() .. "/my-plugins"
    assert(dir:sub(1, #support.ROOT + 1) ~= support.ROOT .. "/", "the folder is outside the tree")
    os.execute("mkdir -p " .. P.quote(dir .. "/spec"))
    local files = blocks("file")
    assert.equal(3, #files)
    for _, f in ipairs(files) do
      support.write(dir .. "/" .. f.name, f.text)
    end
    plugin = dir .. "/queue-depth-scorer.lua"
    original = P.read(plugin)
  end)
  teardown(function()
    os.execute("rm -rf " .. P.quote(dir:match("^(.*)/")))
  end)

  it("step 3: lupin test passes on the page's plugin and spec", function()
    local out, rc = lupin("test " .. P.quote(dir))
    assert.equal(0, rc, out)
    assert.matches("5 successes / 0 failures / 0 errors", out, 1, true)
  end)

  it("step 3: lupin test fails on the broken plugin, naming the spec", function()
    assert.truthy(original:find("1 - math.min", 1, true))
    save(plugin, (original:gsub("1 %- math%.min", "math.min")))
    local out, rc = lupin("test " .. P.quote(dir))
    save(plugin, original)
    assert.equal(1, rc, out)
    assert.matches("scores short queues higher", out, 1, true)
    assert.matches("[1-9] failures?", out)
  end)

  it("step 4: lupin check passes on the page's config", function()
    local out, rc = lupin("check --config " .. P.quote(dir .. "/config.yaml"))
    assert.equal(0, rc, out)
    assert.matches("config.yaml: ok (2 endpoints)", out, 1, true)
  end)

  it("steps 5 and 6: serves the plugin and reloads it after the edit", function()
    local sim = P.sim("--model m --itl-ms 0", 2)
    local cfg = P.read(dir .. "/config.yaml"):gsub("port: 8001", "port: " .. sim.ports[1])
      :gsub("port: 8002", "port: " .. sim.ports[2])
    support.write(dir .. "/served.yaml", cfg)
    local gw = P.start(("%s serve --config %s --listen 127.0.0.1:0 --admin 127.0.0.1:0"):format(
      P.LUPIN, P.quote(dir .. "/served.yaml")))
    local ok, err = pcall(function()
      P.poll(function()
        gw.base = (P.read(gw.out) or ""):match("listening on (http://%S+)")
        return gw.base or P.read(gw.rc)
      end, "the gateway to listen")
      assert(gw.base, P.read(gw.err))
      local function header()
        local status, h, body = P.post(gw.base, "/v1/completions",
          { model = "m", prompt = "Hello", max_tokens = 5 })
        assert.equal(200, status, body)
        return h["x-queue-score"]
      end
      assert.equal("1.00", header())
      local edits = blocks("edit")
      assert.equal(1, #edits)
      save(plugin, edit(original, edits[1].text))
      local after = P.poll(function()
        local v = header()
        return v ~= "1.00" and v
      end, "the edited plugin to serve")
      assert.matches("^1%.00 sim%-[01]$", after)
      assert.matches("reload", P.read(gw.err), 1, true)
    end)
    P.stop(gw)
    P.stop(sim)
    save(plugin, original)
    assert(ok, err)
  end)
end)
