#!/usr/bin/env python3
"""The core loop's two scripts, run on Redis alone: what a question costs
Redis, without the service (its CPU and its scheduling) in the way.

    bench/redis_loop.py PORT LUA_DIR [LUA_DIR...]

Each LUA_DIR is a tree's src/store/redis/lua; they are measured in turn,
ROUNDS times, interleaved. Each question is start_turn.lua (with the
history read bench/one_question.lua asks for: text, limit 20, max_tokens
4096) then finalize_turn.lua, with the arguments the service sends
(src/store/redis/turns.rs, reads.rs), over CONNS connections (processes),
for SECONDS, on SESSIONS sessions (fresh each run, so they grow from
empty; few sessions make long ones). Prints questions and Redis CPU µs a
question (from /proc ticks of PID, the server's pid) and Redis' µs a call
of each script (INFO commandstats).
The scripts run as a function library by FCALL, as the service calls them
on Redis 7 (EVALSHA=1: by EVALSHA, as on Redis 6). A LUA_DIR holding a
library.lua runs its functions <name>_start and <name>_finalize instead:
bench/floor is the floor issue 20 names, two functions that allocate a
seq, append, read the newest 20 records and slide TTLs, and store the
answer, with none of the service's guarantees.
No dependencies but Python 3: it speaks RESP itself.

LENGTH=L measures sessions of L turns: SESSIONS (then 64 by default)
sessions are filled with L questions each before the first round, and
the cap on a session's turns (max_turns) is L, so that every question
measured finds L turns, appends one and trims the oldest. ROOM (20) is
the read's limit in turns: LENGTH=5 ROOM=5 against LENGTH=1000 ROOM=5
is the same question (the same reply) on a short and a long session.

Two experiments, for designs measured in issue 20 (each with a LUA_DIR
prepared for it): DEFER=1 fetches the records of the page the start
returned with a plain HMGET (a walk that returns turn ids in place of
records); ENGINE=1 sends the start in a MULTI with a plain
ZREVRANGEBYSCORE of the newest 21 members, then fetches the records of
20 with a plain HMGET (a start without the walk: the read outside Lua).
"""

import hashlib
import multiprocessing as mp
import os
import random
import socket
import struct
import sys
import time

QUESTION = open(os.path.join(os.path.dirname(__file__), "question.txt")).read().strip()
ANSWER = open(os.path.join(os.path.dirname(__file__), "answer.txt")).read().strip()
# Counts the service stores for those texts in o200k_base (q, u; a, s, l).
Q, U = 24, 28
A, S, L = 120, 124, 123
SESSION_TTL, PENDING_TTL, MAX_PENDING = 7 * 86400000, 600000, 16
LENGTH = int(os.environ.get("LENGTH", "0"))
MAX_TURNS = LENGTH or 1000
ROOM = int(os.environ.get("ROOM", "20"))


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.s.makefile("rb")

    def call(self, *args):
        self.s.sendall(encode(*args))
        return self.read()

    def read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")


def scripts(lua):
    def src(*names):
        return "\n".join(open(os.path.join(lua, n)).read() for n in names)

    if os.path.exists(os.path.join(lua, "library.lua")):
        return {"library": src("library.lua")}

    # Since ae31d1d every session script begins with rules.lua.
    rules = ("rules.lua",) if os.path.exists(os.path.join(lua, "rules.lua")) else ()
    return {
        "start": src(*rules, "common.lua", "walk.lua", "start_turn.lua"),
        "finalize": src(*rules, "common.lua", "finalize_turn.lua"),
    }


def library(lua, name):
    """The two scripts as a function library, as the service loads them
    (src/store/redis/scripts.rs): the shared functions defined once, at
    load; KEYS and ARGV set by each call."""
    parts = [f"#!lua name={name}", "local KEYS, ARGV"]
    parts += [open(os.path.join(lua, n)).read() for n in ("rules.lua", "common.lua", "walk.lua")]
    for script, f in (("start_turn.lua", "start"), ("finalize_turn.lua", "finalize")):
        parts.append(f"local function {f}_body()\n{open(os.path.join(lua, script)).read()}\nend")
        parts.append(
            f"redis.register_function('{name}_{f}', function(keys, args) "
            f"KEYS, ARGV = keys, args; return {f}_body() end)"
        )
    return "\n".join(parts) + "\n"


def load(admin, lua, i):
    """How each script is called: ("FCALL", name) or ("EVALSHA", sha)."""
    found = scripts(lua)
    if "library" in found:  # its own functions, <name>_start and <name>_finalize
        name = admin.call("FUNCTION", "LOAD", "REPLACE", found["library"]).decode()
    elif not os.environ.get("EVALSHA"):
        name = admin.call("FUNCTION", "LOAD", "REPLACE", library(lua, f"redis_loop_{i}")).decode()
    else:
        calls = {}
        for script, body in found.items():
            calls[script] = ("EVALSHA", admin.call("SCRIPT", "LOAD", body).decode())
            assert calls[script][1] == hashlib.sha1(body.encode()).hexdigest()
        return calls
    return {"start": ("FCALL", f"{name}_start"), "finalize": ("FCALL", f"{name}_finalize")}


def pack(fmt, *xs):
    return struct.pack(fmt, *xs)


def walk_args():
    # after, before, room, max_tokens, max_bytes, max q, max a, header,
    # inner sum, newest inner, newest last, bytes; encoding; text, keep
    # first, newest may change, English, copies, summary, describe, budget;
    # a window's stride (0: sliding)
    return (
        pack(">dddddddddddd", 0, -1, ROOM, 4096, 1 << 40, 0, 0, 0, 0, -1, 0, 0)
        + b"o"
        + bytes([1, 0, 1, 0, 0, 0, 1, 1])
        + pack(">d", 0)
    )


def worker(port, shas, prefix, sessions, seconds, seed, out, fill=None):
    try:
        done = run(port, shas, prefix, sessions, seconds, seed, fill)
    finally:
        # A failed worker still answers (0), so that the run ends and says why.
        out.put(locals().get("done", 0))


def run(port, shas, prefix, sessions, seconds, seed, fill=None):
    """Questions on random sessions for `seconds`, or, with `fill` (a
    range of session numbers), LENGTH questions on each of those."""
    rnd = random.Random(seed)
    c = Conn(port)
    walk = walk_args()
    done = 0
    end = time.time() + seconds
    order = [s for s in fill for _ in range(LENGTH)] if fill is not None else None
    while (done < len(order)) if order is not None else (time.time() < end):
        sid = f"{prefix}-{order[done] if order is not None else rnd.randrange(sessions)}"
        keys = [f"{prefix}:{{{sid}}}:{k}" for k in ("h", "r", "s", "f", "l")]
        now = int(time.time() * 1000)
        tid = os.urandom(16)
        numbers = pack(">dddddd", now, SESSION_TTL, PENDING_TTL, MAX_PENDING, 0, 0) + b"\x01"
        tail = f"{now} - o {Q} {U}\n{QUESTION}"
        if os.environ.get("ENGINE"):
            # The read outside Lua: the start and the newest members in one
            # MULTI, then the records of those that fit.
            c.s.sendall(
                encode("MULTI")
                + encode(*shas["start"], 5, *keys, numbers, "", tid, tail, "", "", "", "", walk)
                + encode("ZREVRANGEBYSCORE", keys[2], "(1000000000000", "-inf", "LIMIT", 0, 21)
                + encode("EXEC")
            )
            c.read()
            c.read()
            c.read()
            r, members = c.read()
            if members:
                c.call("HMGET", keys[1], *[m[:16] for m in members[:20]])
        else:
            r = c.call(*shas["start"], 5, *keys, numbers, "", tid, tail, "", "", "", "", walk)
        if r[0] != b"ok":
            raise RuntimeError(f"start_turn: {r[:2]}")
        if os.environ.get("DEFER") and isinstance(r[5], list) and r[5][5]:
            ids = [m[:16] for m in r[5][5][0::4]]
            c.call("HMGET", keys[1], *ids)
        numbers = pack(">ddddddddd", int(time.time() * 1000), SESSION_TTL, A, S, L, MAX_TURNS, 0, 0, 0)
        r = c.call(*shas["finalize"], 5, *keys, numbers, tid, ANSWER, "o", "")
        if r[0] != b"ok":
            raise RuntimeError(f"finalize_turn: {r[:2]}")
        done += 1
    return done


def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main():
    port, pid, dirs = int(sys.argv[1]), int(os.environ["PID"]), sys.argv[2:]
    conns = int(os.environ.get("CONNS", "4"))
    seconds = float(os.environ.get("SECONDS_", os.environ.get("DURATION", "5")))
    sessions = int(os.environ.get("SESSIONS", "64" if LENGTH else "10000"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    hz = os.sysconf("SC_CLK_TCK")
    admin = Conn(port)
    loaded = []
    for i, d in enumerate(dirs):
        loaded.append((d, load(admin, d, i)))
    totals = {d: [0, 0.0] for d in dirs}

    def prefix_of(i, rnd):
        # Sessions of LENGTH turns are filled once, and kept.
        return f"rl{i}r{0 if LENGTH else rnd}-{os.getpid()}"

    def drive(shas, prefix, seconds, seed, fill=False):
        """CONNS workers' questions for `seconds` (or, filling, LENGTH on
        each session), summed."""
        q = mp.Queue()
        procs = [
            mp.Process(
                target=worker,
                args=(port, shas, prefix, sessions, seconds, seed + k, q, range(k, sessions, conns) if fill else None),
            )
            for k in range(conns)
        ]
        for p in procs:
            p.start()
        n = sum(q.get() for _ in procs)
        for p in procs:
            p.join()
        return n

    if LENGTH:
        for i, (d, shas) in enumerate(loaded):
            n = drive(shas, prefix_of(i, 0), 0, 0, fill=True)
            if n != sessions * LENGTH:
                raise RuntimeError(f"{d}: filled {n} of {sessions * LENGTH} turns")
    for rnd in range(rounds):
        for i, (d, shas) in enumerate(loaded):
            admin.call("CONFIG", "RESETSTAT")
            prefix = prefix_of(i, rnd)
            t0 = ticks(pid)
            n = drive(shas, prefix, seconds, rnd * 100)
            cpu_us = (ticks(pid) - t0) / hz * 1e6
            stats = admin.call("INFO", "commandstats").decode()
            per = {}
            for line in stats.splitlines():
                if line.startswith(("cmdstat_evalsha:", "cmdstat_fcall:")):
                    kv = dict(x.split("=") for x in line.split(":", 1)[1].split(","))
                    per["call"] = float(kv["usec_per_call"])
            # Each script's µs a call, from a one-second SLOWLOG sample.
            admin.call("SLOWLOG", "RESET")
            admin.call("CONFIG", "SET", "slowlog-max-len", "1000000")
            admin.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
            drive(shas, prefix, 1.0, rnd * 100 + conns)
            admin.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")
            names = {v[1]: k for k, v in shas.items()}
            calls, usec = {}, {}
            for entry in admin.call("SLOWLOG", "GET", "-1"):
                args = entry[3]
                if args[0].lower() in (b"evalsha", b"fcall"):
                    name = names.get(args[1].decode(), "other")
                    calls[name] = calls.get(name, 0) + 1
                    usec[name] = usec.get(name, 0) + entry[2]
            admin.call("SLOWLOG", "RESET")
            per.update({k: usec[k] / calls[k] for k in calls})
            us = cpu_us / max(n, 1)
            totals[d][0] += n
            totals[d][1] += us
            print(f"{d} round={rnd + 1} questions={n} redis_cpu_us_per_q={us:.1f} us_per_call={per.get('call', 0):.1f} start={per.get('start', 0):.1f} finalize={per.get('finalize', 0):.1f}")
            sys.stdout.flush()
    for d in dirs:
        n, us = totals[d]
        print(f"# {d}: {n / rounds / seconds:.0f} questions/s, {us / rounds:.1f} Redis CPU us a question")


if __name__ == "__main__":
    main()
