-- wrk script for "one question": start_turn with history (limit 20,
-- max_tokens 4096; a 120-byte question), then finalize_turn (a 600-byte
-- answer), one after the other on the thread's one connection, each
-- question on a session chosen at random among SESSIONS.
-- Run with as many threads as connections (-t N -c N) so each connection's
-- pair stays sequential. Per-question latency (start sent -> finalize
-- answered) is measured here with CLOCK_MONOTONIC.
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
local question = read("question.txt")
local answer_body = '{"final_answer":"' .. read("answer.txt") .. '"}'
local headers = { ["Content-Type"] = "application/json" }

local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

-- Per-thread state.
local state, session, turn, t0 = "start", nil, nil, 0
samples, questions, errors = {}, 0, 0

function init(args)
  math.randomseed(id * 7919 + os.time())
end

function request()
  if state == "start" then
    session = prefix .. "-" .. math.random(0, sessions - 1)
    t0 = now_us()
    local body = '{"session_id":"' .. session .. '","user_query":"' .. question
      .. '","history":{"limit":20,"max_tokens":4096}}'
    return wrk.format("POST", "/v1/turns", headers, body)
  end
  return wrk.format("POST", "/v1/sessions/" .. session .. "/turns/" .. turn .. "/finalize", headers, answer_body)
end

function response(status, hdrs, body)
  if state == "start" then
    turn = (status == 201 or status == 200) and body:match('"turn_id":"([^"]+)"')
    if turn then
      state = "finalize"
    else
      errors = errors + 1
    end
    return
  end
  state = "start"
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
  -- Non-2xx answers are counted above; add the transport errors.
  e = e + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  -- One machine-readable line; bench/run adds CPU and memory.
  io.write(string.format("RESULT questions_per_s=%.0f p50_ms=%.3f p99_ms=%.3f errors=%d questions=%d\n",
    q / secs, pct(0.50), pct(0.99), e, q))
end
