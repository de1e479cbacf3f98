# Shared by the bench scripts (sourced, from the repository's root): tools,
# processes and CPU accounting.

# need TOOL...: installs what is missing with apt-get (CI and new machines
# start bare).
need() {
  local tool
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "bench: installing $tool with apt-get" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null
    fi
  done
}

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# start_redis: a redis-server on loopback TCP, no persistence: RPORT, REDIS_PID.
start_redis() {
  RPORT=$(free_port)
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" &
  REDIS_PID=$!; pids+=("$REDIS_PID"); wait_port "$RPORT"
}

# start_turnstore [VAR=value...]: the release binary on that Redis, with
# more settings: TPORT, TS_PID.
start_turnstore() {
  TPORT=$(free_port)
  env RUST_LOG=warn TURNSTORE_LISTEN="127.0.0.1:$TPORT" TURNSTORE_REDIS_URL="redis://127.0.0.1:$RPORT" "$@" \
    target/release/turnstore > "$work/turnstore.log" 2>&1 &
  TS_PID=$!; pids+=("$TS_PID"); wait_port "$TPORT"
}

# CPU ticks a process has used (user + system).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# measure SCRIPT PORT SERVER_PID CONNS COUNT_FIELD [VAR=value...]: wrk with
# SCRIPT for WARMUP then DURATION seconds; prints the script's RESULT line
# with the CPU of the server, Redis and wrk, and the server's and Redis' CPU
# µs per COUNT_FIELD (the RESULT's count of what was done). LAST_RATE: the
# RESULT's first figure.
measure() {
  local script=$1 port=$2 spid=$3 conns=$4 field=$5
  shift 5
  env "$@" BENCH_DIR=bench wrk -t "$conns" -c "$conns" -d "${WARMUP}s" -s "$script" "http://127.0.0.1:$port" > /dev/null
  local s0 r0 s1 r1 out
  s0=$(ticks "$spid"); r0=$(ticks "$REDIS_PID")
  # wrk's own CPU: the `times` of a subshell whose only child is wrk.
  out=$( (env "$@" BENCH_DIR=bench wrk -t "$conns" -c "$conns" -d "${DURATION}s" -s "$script" "http://127.0.0.1:$port"; times) )
  s1=$(ticks "$spid"); r1=$(ticks "$REDIS_PID")
  local cpu_s cpu_r cpu_w
  cpu_s=$(( (s1 - s0) * 100 / (HZ * DURATION) )); cpu_r=$(( (r1 - r0) * 100 / (HZ * DURATION) ))
  cpu_w=$(echo "$out" | tail -1 | awk -v d="$DURATION" '{
      split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", (u[1]*60 + u[2] + s[1]*60 + s[2]) * 100 / d }')
  out=$(echo "$out" | grep '^RESULT')
  LAST_RATE=$(echo "$out" | sed 's/^RESULT [a-z_]*=\([0-9]*\).*/\1/')
  local done us_s us_r rss
  done=$(echo "$out" | sed "s/.* $field=\([0-9]*\).*/\1/")
  us_s=$(( (s1 - s0) * 1000000 / HZ / (done > 0 ? done : 1) ))
  us_r=$(( (r1 - r0) * 1000000 / HZ / (done > 0 ? done : 1) ))
  LAST_US_SERVER=$us_s; LAST_US_REDIS=$us_r
  rss=$(awk '/VmHWM/ {print $2/1024 " MB"}' "/proc/$spid/status")
  printf 'c=%-3s %s cpu_server=%s%% cpu_redis=%s%% cpu_wrk=%s%% server_us_per_op=%s redis_us_per_op=%s server_peak_rss=%s\n' \
    "$conns" "${out#RESULT }" "$cpu_s" "$cpu_r" "$cpu_w" "$us_s" "$us_r" "$rss"
}
