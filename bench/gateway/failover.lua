-- wrk script for bench/gateway/failover.sh: one completion per request, each
-- with its own prompt (a random prefix), so the default config's prefix
-- scorer spreads requests over the endpoints instead of keeping one prompt's
-- requests on the endpoint that cached it.
local model = os.getenv("LUPIN_BENCH_MODEL") or "meta-llama/Llama-3.1-8B-Instruct"
local counter = 0

function init()
  math.randomseed(os.time() + math.floor((os.clock() * 1e6) % 1e6))
end

function request()
  counter = counter + 1
  local body = string.format('{"model":"%s","prompt":"%d-%d tell me a story about lupins",'
    .. '"max_tokens":16}', model, math.random(1, 1e9), counter)
  return wrk.format("POST", "/v1/completions", { ["Content-Type"] = "application/json" }, body)
end
