-- wrk script for "one question" on Motorhead, as a RAG backend uses it:
-- GET the session's memory (the prompt's history, its window of
-- MOTORHEAD_MAX_WINDOW_SIZE messages), then POST the question and the
-- answer (the same 120- and 600-byte texts as bench/one_question.lua),
-- one after the other on the thread's one connection, each question on a
-- session chosen at random among SESSIONS. Run with -t N -c N.
-- Environment: SESSIONS (10000), SESSION_PREFIX (bench), BENCH_DIR (bench).

local q = dofile((os.getenv("BENCH_DIR") or "bench") .. "/question_common.lua")

local pair = '{"messages":[{"role":"Human","content":"' .. q.read("question.txt")
  .. '"},{"role":"AI","content":"' .. q.read("answer.txt") .. '"}]}'
local headers = { ["Content-Type"] = "application/json" }

local state, session, t0 = "get", nil, 0

function request()
  if state == "get" then
    session = q.session()
    t0 = q.now_us()
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
  q.ended(status == 200, t0)
end
