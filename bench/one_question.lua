-- wrk script for "one question": start_turn with history (limit 20,
-- max_tokens 4096; a 120-byte question), then finalize_turn (a 600-byte
-- answer), one after the other on the thread's one connection, each
-- question on a session chosen at random among SESSIONS.
-- Run with as many threads as connections (-t N -c N) so each connection's
-- pair stays sequential. Per-question latency (start sent -> finalize
-- answered) is measured here with CLOCK_MONOTONIC.
-- Environment: SESSIONS (10000), SESSION_PREFIX (bench), BENCH_DIR (bench).

local q = dofile((os.getenv("BENCH_DIR") or "bench") .. "/question_common.lua")

local question = q.read("question.txt")
local answer_body = '{"final_answer":"' .. q.read("answer.txt") .. '"}'
local headers = { ["Content-Type"] = "application/json" }

-- Per-thread state.
local state, session, turn, t0 = "start", nil, nil, 0

function request()
  if state == "start" then
    session = q.session()
    t0 = q.now_us()
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
  q.ended(status == 200, t0)
end
