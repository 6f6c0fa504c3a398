-- docs/nginx.md's walkthrough, followed as an operator would: its files (the
-- blocks marked <!-- file: PATH -->) go under a fresh root standing for /,
-- with Debian's nginx.conf around them (modules-enabled/ included at the
-- top, conf.d/ inside http {}); nginx -t passes, nginx serves through the
-- page's own plugin, a POST to the admin location reloads the page's edit
-- and refuses a broken one.  Only what cannot be the same here is changed:
-- the paths under that root, the port, the module's and lupin's folders.
local P = require "e2e.procs"
local S = require "support"
local N = require "e2e.nginx"
local json = P.json

local DOC = P.read(S.ROOT .. "/docs/nginx.md")

local function files()
  local out = {}
  for path, text in DOC:gmatch("<!%-%- file: (%S+) %-%->\n```%w*\n(.-)```") do
    out[#out + 1] = { path = path, text = text }
  end
  return out
end

-- Debian's /etc/nginx/nginx.conf, reduced to what the page relies on
local function debian_conf(root)
  return ([[
include %s/etc/nginx/modules-enabled/*.conf;
daemon off;
master_process on;
worker_processes 1;
%s
pid %s/nginx.pid;
error_log %s/error.log info;
events { worker_connections 256; }
http {
  access_log %s/access.log;
  client_body_temp_path %s/body;
  proxy_temp_path %s/proxy;
  fastcgi_temp_path %s/fastcgi;
  uwsgi_temp_path %s/uwsgi;
  scgi_temp_path %s/scgi;
  include %s/etc/nginx/conf.d/*.conf;
}
]]):format(root, (P.run("id -u")) == "0\n" and "user root;" or "", root, root, root, root, root,
    root, root, root, root)
end

describe("docs/nginx.md's walkthrough", function()
  if not N.available() then
    pending("no " .. N.MODULE .. " (make nginx-module, with nginx-dev installed)")
    return
  end

  local root, sim, ngx, base, config

  -- the page's files under root, listening on port
  local function lay_out(port)
    base = "http://127.0.0.1:" .. port
    local list = files()
    assert.equal(4, #list)
    for _, f in ipairs(list) do
      local text = f.text:gsub("/etc/nginx", root .. "/etc/nginx")
        :gsub("modules/ngx_http_lupin_module%.so", N.MODULE)
        :gsub("/usr/local/share/lupin", S.ROOT)
        :gsub("127%.0%.0%.1:8080", "127.0.0.1:" .. port)
        :gsub("port: 8001", "port: " .. sim.ports[1])
        :gsub("port: 8002", "port: " .. sim.ports[2])
      os.execute("mkdir -p " .. P.quote((root .. f.path):match("^(.*)/")))
      S.write(root .. f.path, text)
    end
  end

  setup(function()
    root = S.tmpdir()
    sim = P.sim("--model meta-llama/Llama-3.1-8B-Instruct --instant", 2)
    lay_out(P.port())
    config = root .. "/etc/nginx/lupin/lupin.yaml"
    S.write(root .. "/nginx.conf", debian_conf(root))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("nginx -t passes", function()
    local out, rc = P.run(N.cmd(root, "-t 2>&1"))
    assert.equal(0, rc, out)
    assert.matches("test is successful", out)
  end)

  it("serves through the page's plugin", function()
    -- nginx cannot listen on port 0: a port taken meanwhile is another try
    for _ = 1, 10 do
      ngx = P.start(N.cmd(root))
      ngx.dir = root
      local up = P.poll(function()
        return P.read(ngx.rc) and "exited"
          or P.get(base .. "/lupin_status", "--max-time 1") == 200 and "up"
      end, "nginx to listen")
      if up == "up" then
        break
      end
      local log = P.read(root .. "/error.log") or ""
      assert(log:find("Address already in use", 1, true), "nginx exited: " .. log)
      os.remove(root .. "/error.log")
      lay_out(P.port())
    end
    local code, h, body = P.post(base, "/v1/completions",
      { model = "meta-llama/Llama-3.1-8B-Instruct", prompt = "hello", max_tokens = 4 })
    assert.equal(200, code, body)
    assert.equal("1.00", h["x-queue-score"])
    assert.equal("text_completion", json.decode(body).object)
  end)

  it("reloads the page's edit through lupin's generations, and refuses a broken one", function()
    local text = P.read(config)
    S.write(config, (text:gsub("maxQueue: 4", "maxQueue: 2")))
    local code, _, body = P.post(base, "/lupin/reload", "")
    assert.equal(200, code, body)
    assert.same({ reloaded = true, generation = 2 },
      { reloaded = json.decode(body).reloaded, generation = json.decode(body).generation })
    S.write(config, (text:gsub("maxQueue: 4", "maxQueue: 0")))
    code, _, body = P.post(base, "/lupin/reload", "")
    assert.equal(400, code)
    assert.matches("lupin%.yaml:6: ", json.decode(body).error.message)
    assert.equal(200, (P.post(base, "/v1/completions",
      { model = "meta-llama/Llama-3.1-8B-Instruct", prompt = "again", max_tokens = 2 })))
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)
