"""Replays long conversations through a turnstore and reports how much of
each start's history begins with the previous start's (what a provider's
prompt cache can serve), per read option. Run by bench/windows; standard
library only.

Each conversation: TURNS turns of seeded random texts of realistic sizes
(questions of 40 to 400 characters, answers of 200 to 2,500, words of
English length). Each turn is a start reading the history with the
variant's options, then a finalize. For each start after the first, with
the previous start's history of the same conversation:

  share     the history begins with the previous one (its rendering, or
            its messages for format=anthropic)
  prefix    characters the two share from the beginning, as a share of
            the history's
  tokens    the history's token_count
  turns     the turns it includes

averaged over the starts whose budget was full (stopped_by set: once a
sliding window begins to slide) and over all of them.
"""

import json
import os
import random
import sys
import urllib.request

BASE = sys.argv[1]
TURNS = int(os.environ.get("TURNS", "200"))
CONVERSATIONS = int(os.environ.get("CONVERSATIONS", "10"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "4000"))
VARIANTS = {
    "sliding": {},
    "stable5": {"window": "stable", "stride": 5},
    "stable10": {"window": "stable", "stride": 10},
    "stable15": {"window": "stable", "stride": 15},
    "stable20": {"window": "stable", "stride": 20},
    "anthropic15": {"window": "stable", "stride": 15, "format": "anthropic",
                    "cache_control": True},
}
picked = os.environ.get("VARIANTS")
if picked:
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in picked.split()}

WORDS = ("the index a vector of to and in that is for it with as on be by this are "
         "which query document embedding recall latency search nearest neighbour graph "
         "cluster memory disk shard replica chunk token model prompt answer question "
         "because however therefore usually depends between performance accuracy").split()


def text(rng, lo, hi):
    n = int(min(hi, max(lo, rng.lognormvariate(0, 0.6) * (lo + hi) / 3)))
    out = []
    while sum(len(w) + 1 for w in out) < n:
        out.append(rng.choice(WORDS))
    s = " ".join(out)
    return s[0].upper() + s[1:] + "."


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def common(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def replay(name, options, conversation):
    rng = random.Random(conversation)
    session = f"bench-{name}-{conversation}-{os.getpid()}"
    history = dict(options, max_tokens=MAX_TOKENS)
    previous, rows = None, []
    for _ in range(TURNS):
        q, a = text(rng, 40, 400), text(rng, 200, 2500)
        started = post("/v1/turns", {"session_id": session, "user_query": q, "history": history})
        h = started["history"]
        if "anthropic" in h:
            shown = [b["text"] for m in h["anthropic"]["messages"] for b in m["content"]]
            flat = "\n".join(shown)
        else:
            shown = flat = h["rendered"]
        if previous is not None and flat:
            begins = shown[:len(previous[0])] == previous[0]
            rows.append((h["stopped_by"] is not None, begins,
                         common(previous[1], flat) / len(flat), h["token_count"],
                         h["included_turns"]))
        previous = (shown, flat)
        post(f"/v1/sessions/{session}/turns/{started['turn_id']}/finalize", {"final_answer": a})
    return rows


def mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


print(f"{CONVERSATIONS} conversations of {TURNS} turns, max_tokens={MAX_TOKENS}")
print(f"{'variant':<12} {'starts':>6} {'full':>5} {'share(full)':>11} {'prefix(full)':>12} "
      f"{'share(all)':>10} {'tokens':>7} {'turns':>6}")
for name, options in VARIANTS.items():
    rows = [r for c in range(CONVERSATIONS) for r in replay(name, options, c)]
    full = [r for r in rows if r[0]]
    print(f"{name:<12} {len(rows):>6} {len(full):>5} {100 * mean([r[1] for r in full]):>10.1f}% "
          f"{100 * mean([r[2] for r in full]):>11.1f}% {100 * mean([r[1] for r in rows]):>9.1f}% "
          f"{mean([r[3] for r in rows]):>7.0f} {mean([r[4] for r in rows]):>6.2f}")
    sys.stdout.flush()
