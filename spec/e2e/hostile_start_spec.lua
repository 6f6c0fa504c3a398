-- lupin serve starts whole or not at all (issue 51, item 4): a listener
-- that cannot bind -- the public one, the admin one, or both given the same
-- address -- ends the process with exit status 3 and a message naming the
-- address and its role, on one worker and on two, before anything is served.
-- (Before, a failed admin bind was logged and the public port served on,
-- without admin, signal handlers or the other workers.)
local P = require "e2e.procs"
local support = require "support"

local CONFIG = {
  kind = "EndpointPickerConfig",
  plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
  schedulingProfiles = { { name = "default", plugins = {
    { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
  endpoints = { { name = "a", address = "127.0.0.1", port = 1 } },
}

local function sleep(s)
  os.execute("sleep " .. s)
end

-- lupin serve with the arguments given; its exit status once it exited, or
-- nil when it still runs after a bound no failed start comes near (a start
-- that failed exits in well under a second; one that serves never does).
local function serve(args)
  local path = support.write(P.dir .. "/hostile-start.json", P.json.encode(CONFIG))
  local p = P.start(("%s serve --config %s %s"):format(P.LUPIN, path, args))
  for _ = 1, 200 do
    local rc = P.read(p.rc)
    if rc then
      P.wait(p)
      return tonumber(rc:match("%d+")), p
    end
    sleep(0.05)
  end
  P.stop(p)
  return nil, p
end

-- a port some other process holds: the fixture model server's
local function taken()
  local up = P.upstream()
  return up, up.hostport
end

describe("lupin serve, a start that cannot bind", function()
  local up

  after_each(function()
    P.stop(up)
    up = nil
  end)

  for _, workers in ipairs({ 1, 2 }) do
    local w = " --workers " .. workers

    local function exits_3(rc, p, address, role)
      local err = P.read(p.err) or ""
      assert.equal(3, rc, "still running (it kept serving without what failed): " .. err)
      assert.matches("lupin serve: cannot listen on " .. address .. " (" .. role .. "): "
        .. "address already in use", err, 1, true)
      assert.falsy((P.read(p.out) or ""):find("listening on", 1, true), "it announced a start")
    end

    it("the same address for --listen and --admin: exit 3, workers " .. workers, function()
      -- a free port: the fixture's, once it is gone
      local free
      up, free = taken()
      P.stop(up)
      local rc, p = serve(("--listen %s --admin %s%s"):format(free, free, w))
      exits_3(rc, p, free, "admin")
      assert.matches("it is the --listen address too", P.read(p.err), 1, true)
      -- nothing listens there any more
      local status = P.get("http://" .. free .. "/v1/models", "--max-time 5")
      assert.equal(0, status)
    end)

    it("an admin port another process holds: exit 3, workers " .. workers, function()
      local admin
      up, admin = taken()
      local rc, p = serve(("--listen 127.0.0.1:0 --admin %s%s"):format(admin, w))
      exits_3(rc, p, admin, "admin")
      -- the holder keeps its port and answers
      assert.equal(200, (P.get("http://" .. admin .. "/v1/models")))
    end)

    it("a public port another process holds: exit 3, workers " .. workers, function()
      local listen
      up, listen = taken()
      local rc, p = serve(("--listen %s --admin 127.0.0.1:0%s"):format(listen, w))
      exits_3(rc, p, listen, "listen")
      assert.equal(200, (P.get("http://" .. listen .. "/v1/models")))
    end)
  end
end)
