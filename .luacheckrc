-- luacheck config: LuaJIT, busted specs, and one fixture that is broken on purpose.
std = "luajit"
max_line_length = 120
files["spec"] = { std = "+busted" }
exclude_files = { "spec/fixtures/plugins/test-broken-syntax.lua" }
-- wrk's scripting API: the script sets these globals for wrk to call
files["bench/gateway/post.lua"] = { globals = { "wrk", "init", "delay", "done", "request", "response" } }
files["bench/gateway/failover.lua"] = { globals = { "wrk", "init", "request" } }
-- the OpenResty peer runs in lua-nginx-module
files["bench/openresty/peer.lua"] = { globals = { "ngx" } }
