-- The rooms of lupin serve and the calls between them, read from the object
-- files (nm): which room defines each symbol, which rooms use it.
--
--   luajit spec/gateway/rooms.lua [BUILD] [--flat] [--root SRC]
--
-- prints the cross-room references (caller file -> symbol -> callee room),
-- then "cross-room N, upward N".  --flat groups the files of the flat layout
-- (gateway/*.c before the split, in the tree at SRC) into the same rooms.  spec/gateway/rooms_spec.lua
-- uses it as a module.
local M = {}

-- The order, top to bottom: a room may call only rooms after it.
M.ORDER = { "cli", "process", "admin", "epp", "proxy", "endpoints", "http", "loop", "host" }
M.RANK = {}
for i, r in ipairs(M.ORDER) do
  M.RANK[r] = i
end

-- Today's flat files (gateway/<name>.c) by the room they belong to.
M.FLAT = {
  main = "cli", explain_cli = "cli", test = "cli",
  gateway = "process", workers = "process", replicas = "endpoints", settings = "process",
  lua_heap = "loop", watch = "process",
  admin = "admin", metrics_merge = "admin", process = "admin",
  proxy = "proxy", rewrite = "proxy", flow = "proxy", models = "proxy", objective = "proxy",
  explain = "proxy",
  upstream = "endpoints", resolve = "endpoints", scrape = "endpoints", health = "endpoints",
  server = "http", write = "loop", timer = "loop",
  buf = "host", prometheus = "host", metrics = "host",
}

-- The room of an object file: by its folder (build/gw/<room>/x.o, build/host/,
-- build/cli/; build/gw/x.o is the process room), or by FLAT.
function M.room(path, flat)
  local name = path:match("([^/]+)%.o$")
  if flat then
    return M.FLAT[name]
  end
  if path:match("/host/[^/]+%.o$") then
    return "host"
  elseif path:match("/cli/[^/]+%.o$") then
    return "cli"
  end
  local sub = path:match("/gw/([^/]+)/[^/]+%.o$")
  if sub then
    return sub
  end
  if path:match("/gw/[^/]+%.o$") then
    return "process"
  end
end

-- The objects of today's sources (stale objects of moved files are not
-- read): gateway/**.c in build/gw/, host/*.c in build/host/, cli/*.c in
-- build/cli/.  root: the source tree (build is relative to it unless
-- absolute).
local function objects(root, build)
  local list = {}
  local dir = build:sub(1, 1) == "/" and build or root .. "/" .. build
  local p = io.popen(("cd %s && find gateway host cli -name '*.c' 2>/dev/null | sort"):format(root))
  for src in p:lines() do
    local o = src:gsub("^gateway/", "gw/"):gsub("%.c$", ".o")
    list[#list + 1] = dir .. "/" .. o
  end
  p:close()
  return list
end

-- {caller = room, file, symbol, callee = room} for every reference from one
-- room to a symbol another room defines.
function M.edges(build, flat, root)
  local defined, used = {}, {}
  for _, o in ipairs(objects(root or ".", build)) do
    local room = M.room(o, flat)
    if room then
      local p = io.popen("nm " .. o)
      for line in p:lines() do
        local kind, sym = line:match("^%s*%x*%s+(%a)%s+(%S+)$")
        if kind == "U" then
          used[#used + 1] = { file = o:match("[^/]+/[^/]+$"), room = room, sym = sym }
        elseif kind and kind:match("[TDBR]") then
          defined[sym] = room
        end
      end
      p:close()
    end
  end
  local edges = {}
  for _, u in ipairs(used) do
    local callee = defined[u.sym]
    if callee and callee ~= u.room then
      edges[#edges + 1] = { caller = u.room, file = u.file, symbol = u.sym, callee = callee }
    end
  end
  return edges
end

function M.upward(e)
  return M.RANK[e.callee] < M.RANK[e.caller]
end

-- A cycle in the room graph, as a list of rooms, or nil.
function M.cycle(edges)
  local out = {}
  for _, e in ipairs(edges) do
    out[e.caller] = out[e.caller] or {}
    out[e.caller][e.callee] = true
  end
  local state, stack = {}, {}
  local function visit(r)
    state[r] = 1
    stack[#stack + 1] = r
    for n in pairs(out[r] or {}) do
      if state[n] == 1 then
        local c = {}
        for i = #stack, 1, -1 do
          table.insert(c, 1, stack[i])
          if stack[i] == n then
            break
          end
        end
        c[#c + 1] = n
        return c
      elseif not state[n] then
        local c = visit(n)
        if c then
          return c
        end
      end
    end
    stack[#stack] = nil
    state[r] = 2
  end
  for _, r in ipairs(M.ORDER) do
    if not state[r] then
      local c = visit(r)
      if c then
        return c
      end
    end
  end
end

function M.describe(e)
  return ("%s: %s -> %s (%s)%s"):format(e.file, e.caller, e.callee, e.symbol,
    M.upward(e) and "  UPWARD" or "")
end

if not pcall(debug.getlocal, 4, 1) then -- run as a script
  local build, flat, root = "build", false, "."
  local i = 1
  while arg[i] do
    if arg[i] == "--flat" then
      flat = true
    elseif arg[i] == "--root" then
      i = i + 1
      root = arg[i]
    else
      build = arg[i]
    end
    i = i + 1
  end
  local edges = M.edges(build, flat, root)
  local up, pairs_seen, room_edges = 0, {}, {}
  for _, e in ipairs(edges) do
    print(M.describe(e))
    if M.upward(e) then
      up = up + 1
    end
    local k = e.caller .. " -> " .. e.callee
    if not pairs_seen[k] then
      pairs_seen[k] = 0
      room_edges[#room_edges + 1] = k
    end
    pairs_seen[k] = pairs_seen[k] + 1
  end
  table.sort(room_edges)
  for _, k in ipairs(room_edges) do
    print(("  %-24s %d"):format(k, pairs_seen[k]))
  end
  local c = M.cycle(edges)
  print(("cross-room %d, upward %d, cycle: %s"):format(#edges, up,
    c and table.concat(c, " -> ") or "none"))
end

return M
