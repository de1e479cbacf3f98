-- wrk script for history reads: GET /v1/sessions/<id>/history?<QUERY> on a
-- session chosen at random among SESSIONS, one request after the other on
-- each connection. Prints one RESULT line (reads/s, p50, p99 from wrk's
-- own latency record, errors = non-2xx answers and transport errors, and the
-- mean response size).
-- Environment: SESSIONS (2000), SESSION_PREFIX (reads), QUERY ("").

local sessions = tonumber(os.getenv("SESSIONS") or "2000")
local prefix = os.getenv("SESSION_PREFIX") or "reads"
local query = os.getenv("QUERY") or ""

local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

errors, bytes = 0, 0

function init(args)
  math.randomseed(id * 7919 + os.time())
end

function request()
  local session = prefix .. "-" .. math.random(0, sessions - 1)
  return wrk.format("GET", "/v1/sessions/" .. session .. "/history?" .. query)
end

function response(status, hdrs, body)
  if status ~= 200 then
    errors = errors + 1
  end
  bytes = bytes + #body
end

function done(summary, latency, requests)
  local e, b = 0, 0
  for _, t in ipairs(threads) do
    e = e + t:get("errors")
    b = b + t:get("bytes")
  end
  e = e + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  local secs = summary.duration / 1000000
  local n = math.max(summary.requests, 1)
  io.write(string.format("RESULT reads_per_s=%.0f p50_ms=%.3f p99_ms=%.3f errors=%d reads=%d bytes_per_read=%d\n",
    summary.requests / secs, latency:percentile(50) / 1000, latency:percentile(99) / 1000, e,
    summary.requests, b / n))
end
