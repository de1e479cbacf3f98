-- wrk script for "one question" on Motorhead, as a RAG backend uses it:
-- GET the session's memory (the prompt's history, its window of
-- MOTORHEAD_MAX_WINDOW_SIZE messages), then POST the question and the
-- answer (the same 120- and 600-byte texts as bench/one_question.lua),
-- one after the other on the thread's one connection, each question on a
-- session chosen at random among SESSIONS. Run with -t N -c N.
-- Environment: SESSIONS (10000), SESSION_PREFIX (bench), BENCH_DIR (bench).

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
  int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000000 + tonumber(ts.tv_nsec) / 1000
end

local function read(name)
  local dir = os.getenv("BENCH_DIR") or "bench"
  local f = assert(io.open(dir .. "/" .. name, "r"))
  local s = f:read("*a"):gsub("%s+$", "")
  f:close()
  return s
end

local sessions = tonumber(os.getenv("SESSIONS") or "10000")
local prefix = os.getenv("SESSION_PREFIX") or "bench"
local pair = '{"messages":[{"role":"Human","content":"' .. read("question.txt")
  .. '"},{"role":"AI","content":"' .. read("answer.txt") .. '"}]}'
local headers = { ["Content-Type"] = "application/json" }

local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

local state, session, t0 = "get", nil, 0
samples, questions, errors = {}, 0, 0

function init(args)
  math.randomseed(id * 7919 + os.time())
end

function request()
  if state == "get" then
    session = prefix .. "-" .. math.random(0, sessions - 1)
    t0 = now_us()
    return wrk.format("GET", "/sessions/" .. session .. "/memory")
  end
  return wrk.format("POST", "/sessions/" .. session .. "/memory", headers, pair)
end

function response(status, hdrs, body)
  if state == "get" then
    if status == 200 then state = "post" else errors = errors + 1 end
    return
  end
  state = "get"
  if status == 200 then
    questions = questions + 1
    samples[questions] = now_us() - t0
  else
    errors = errors + 1
  end
end

function done(summary, latency, requests)
  local all, q, e = {}, 0, 0
  for _, t in ipairs(threads) do
    q = q + t:get("questions")
    e = e + t:get("errors")
    for _, v in ipairs(t:get("samples")) do
      all[#all + 1] = v
    end
  end
  table.sort(all)
  local function pct(p)
    if #all == 0 then return 0 end
    return all[math.max(1, math.ceil(#all * p))] / 1000
  end
  local secs = summary.duration / 1000000
  e = e + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format("RESULT questions_per_s=%.0f p50_ms=%.3f p99_ms=%.3f errors=%d questions=%d\n",
    q / secs, pct(0.50), pct(0.99), e, q))
end
