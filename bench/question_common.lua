-- Shared by the wrk scripts that time one question made of two requests
-- (one_question.lua, motorhead_question.lua), loaded with dofile: the
-- clock, the texts, the sessions, the per-thread tallies and the RESULT
-- line. Sets the globals wrk calls (setup, init, done) and the tallies
-- done reads from each thread (samples, questions, errors).
-- Environment: SESSIONS (10000), SESSION_PREFIX (bench), BENCH_DIR (bench).

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
  int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")

local M = {}

function M.now_us()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000000 + tonumber(ts.tv_nsec) / 1000
end

-- A text of the bench directory, without its trailing whitespace.
function M.read(name)
  local dir = os.getenv("BENCH_DIR") or "bench"
  local f = assert(io.open(dir .. "/" .. name, "r"))
  local s = f:read("*a"):gsub("%s+$", "")
  f:close()
  return s
end

local sessions = tonumber(os.getenv("SESSIONS") or "10000")
local prefix = os.getenv("SESSION_PREFIX") or "bench"

-- A session chosen at random among SESSIONS.
function M.session()
  return prefix .. "-" .. math.random(0, sessions - 1)
end

-- The question begun at `t0` (now_us) ended: answered or not.
function M.ended(ok, t0)
  if ok then
    questions = questions + 1
    samples[questions] = M.now_us() - t0
  else
    errors = errors + 1
  end
end

samples, questions, errors = {}, 0, 0

local threads = {}
function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(id * 7919 + os.time())
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
  -- Non-2xx answers are counted by the scripts; add the transport errors.
  e = e + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  -- One machine-readable line; bench/lib.sh's measure adds CPU and memory.
  io.write(string.format("RESULT questions_per_s=%.0f p50_ms=%.3f p99_ms=%.3f errors=%d questions=%d\n",
    q / secs, pct(0.50), pct(0.99), e, q))
end

return M
