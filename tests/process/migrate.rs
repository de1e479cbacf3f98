//! Data-layout migrations on a real redis-server: data written in layouts 1
//! and 3 by hand, as those versions wrote it, `serve` refusing it,
//! `turnstore migrate`, and the data read back over HTTP.

use std::process::Command;

use serde_json::{Value, json};
use turnstore::domain::TurnId;
use turnstore::tokens::{AnswerTokens, Encoding, QueryTokens};
use turnstore::turn::{Finalization, FinalizedTurn, PendingTurn, now_millis};

use crate::harness::{Redis, Turnstore};

fn turnstore(args: &[&str], redis: &Redis) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_turnstore"))
        .args(args)
        .env_clear()
        .env("TURNSTORE_REDIS_URL", redis.url())
        .env("TURNSTORE_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap()
}

fn pending(seq: u64, q: &str, at: i64) -> PendingTurn {
    PendingTurn {
        seq,
        turn_id: TurnId::generate(),
        user_query: q.into(),
        started_at: at,
        idempotency_key: None,
        tokens: QueryTokens::count(Encoding::O200kBase, q),
        english: None,
    }
}

fn finalized(seq: u64, q: &str, a: &str, at: i64) -> FinalizedTurn {
    FinalizedTurn {
        start: pending(seq, q, at),
        end: Finalization {
            final_answer: a.into(),
            finalized_at: at + 1,
            tokens: AnswerTokens::count(Encoding::O200kBase, a),
            english: None,
        },
    }
}

/// A pending record as layouts 1 and 2 wrote it: with its turn id, and the
/// encoding of its counts.
fn legacy_pending(t: &PendingTurn) -> String {
    format!(
        r#"{{"s":{},"id":"{}","q":{},"t":{},"n":{{"e":"o200k_base","q":{},"u":{}}}}}"#,
        t.seq,
        t.turn_id,
        json!(t.user_query),
        t.started_at,
        t.tokens.query,
        t.tokens.user_line
    )
}

fn legacy_finalized(t: &FinalizedTurn) -> String {
    let e = &t.end;
    format!(
        r#"{{"p":{},"f":{{"a":{},"t":{},"n":{{"e":"o200k_base","a":{},"s":{},"l":{}}}}}}}"#,
        legacy_pending(&t.start),
        json!(e.final_answer),
        e.finalized_at,
        e.tokens.answer,
        e.tokens.assistant_sep,
        e.tokens.assistant_last
    )
}

/// A session as layout 1 stored it: long key suffixes, no version key.
fn write_layout_1_session(
    redis: &Redis,
    session: &str,
    user: &str,
) -> (Vec<FinalizedTurn>, PendingTurn) {
    let now = now_millis();
    let turns = vec![
        finalized(
            1,
            // Text that looks like the keys migration 0003 removes: it must stay.
            r#"What is our refund policy? Not {"id":"x","n":{"e":"o200k_base","q":1}}."#,
            "30 days, no questions asked.",
            now - 5000,
        ),
        finalized(
            2,
            "And for digital goods?",
            "14 days, if not downloaded.",
            now - 3000,
        ),
    ];
    let open = pending(3, "Can I get a refund after 20 days?", now - 1000);
    let k = |suffix: &str| format!("turnstore:{{{session}}}:{suffix}");
    let (now_s, ttl) = (now.to_string(), "600000");
    redis.cli(&[
        "HSET",
        &k("meta"),
        "user_id",
        user,
        "created_at",
        &now_s,
        "last_active_at",
        &now_s,
        "next_seq",
        "3",
        "indexed_at",
        &now_s,
    ]);
    for t in &turns {
        let id = t.start.turn_id.to_string();
        let json = legacy_finalized(t);
        redis.cli(&["HSET", &k("turns"), &id, &json]);
        redis.cli(&["ZADD", &k("order"), &t.seq().to_string(), &id]);
    }
    let id = open.turn_id.to_string();
    redis.cli(&["HSET", &k("pending"), &id, &legacy_pending(&open)]);
    redis.cli(&["ZADD", &k("deadlines"), &(now + 600_000).to_string(), &id]);
    for suffix in ["meta", "turns", "order", "pending", "deadlines"] {
        redis.cli(&["PEXPIRE", &k(suffix), ttl]);
    }
    redis.cli(&["ZADD", &format!("turnstore:user:{user}"), &now_s, session]);
    (turns, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_1_data_is_migrated_and_served() {
    // Arrange: a session in layout 1, plus 1000 more sessions (several SCAN pages).
    let redis = Redis::unix();
    let (turns, open) = write_layout_1_session(&redis, "legacy-1", "legacy-user");
    redis.cli(&[
        "EVAL",
        "for i = 1, 1000 do redis.call('HSET', 'turnstore:{bulk-' .. i .. '}:meta', 'created_at', '1', 'last_active_at', '1', 'next_seq', '0') end",
        "0",
    ]);

    // Act & Assert: serve refuses the old layout and names the fix.
    let refused = turnstore(&[], &redis);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("turnstore migrate"), "{stderr}");

    let first = turnstore(&["migrate"], &redis);
    let again = turnstore(&["migrate"], &redis);
    let out = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        first.status.success(),
        "{}{}",
        out(&first),
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(
        out(&first).trim(),
        "0002_short_session_keys: 1001 sessions, 1005 keys moved, 0 conflicts\n\
         0003_compact_turn_records: 1001 sessions, 3 records rewritten, 0 conflicts\n\
         0004_budget_without_loading: 1001 sessions, 3 records rewritten, 0 conflicts\n\
         0005_sums_and_english_copies: 1001 sessions, 1 sums written, 0 conflicts\n\
         layout 1 -> 5"
    );
    assert_eq!(out(&again).trim(), "layout 5 -> 5");
    let stored = redis.cli(&["HGETALL", "turnstore:{legacy-1}:r"]);
    assert!(
        stored.contains(r#"Not {"id":"x","n":{"e":"o200k_base","q":1}}."#),
        "the text a user wrote stays as it was: {stored}"
    );
    for gone in ["meta", "m", "t"] {
        let key = format!("turnstore:{{legacy-1}}:{gone}");
        assert_eq!(redis.cli(&["EXISTS", &key]).trim(), "0", "{key}");
    }
    let ttl: i64 = redis
        .cli(&["PTTL", "turnstore:{legacy-1}:r"])
        .trim()
        .parse()
        .unwrap();
    assert!(
        ttl > 0 && ttl <= 600_000,
        "the TTL moved with the key: {ttl}"
    );

    // The migrated session reads and writes through the API.
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", redis.url())]);
    let http = reqwest::Client::new();
    let h: Value = http
        .get(format!("{}/v1/sessions/legacy-1/history", ts.base()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expected = format!(
        "### Conversation history:\nUser: {}\nAssistant: {}\n\nUser: {}\nAssistant: {}",
        turns[0].start.user_query,
        turns[0].end.final_answer,
        turns[1].start.user_query,
        turns[1].end.final_answer
    );
    assert_eq!(h["rendered"], expected.as_str());
    assert_eq!(h["token_count"], Encoding::O200kBase.count(&expected));
    assert_eq!(
        (h["user_id"].clone(), h["pending_turns"].clone()),
        (json!("legacy-user"), json!(1))
    );
    let fin = http
        .post(format!(
            "{}/v1/sessions/legacy-1/turns/{}/finalize",
            ts.base(),
            open.turn_id
        ))
        .json(&json!({"final_answer": "Yes, within 30 days."}))
        .send()
        .await
        .unwrap();
    assert_eq!(fin.status(), 200, "{}", ts.log());
    let next: Value = http
        .post(format!("{}/v1/turns", ts.base()))
        .json(&json!({"session_id": "legacy-1", "user_id": "legacy-user", "user_query": "Thanks"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(next["seq"], 4);
    let list: Value = http
        .get(format!("{}/v1/users/legacy-user/sessions", ts.base()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sessions"][0]["session_id"], "legacy-1");
    assert_eq!(list["sessions"][0]["turn_count"], 3);
}

#[test]
fn a_newer_layout_is_refused() {
    // Arrange
    let redis = Redis::unix();
    let newer = (turnstore::store::redis::LAYOUT + 1).to_string();
    redis.cli(&["SET", "turnstore:layout", &newer]);

    // Act
    let serve = turnstore(&[], &redis);
    let migrate = turnstore(&["migrate"], &redis);

    // Assert
    for o in [&serve, &migrate] {
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("newer"),
            "{o:?}"
        );
    }
}

#[test]
fn a_fresh_store_is_marked_with_the_current_layout() {
    // Arrange
    let redis = Redis::unix();

    // Act
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", redis.url())]);

    // Assert
    assert_eq!(
        redis.cli(&["GET", "turnstore:layout"]).trim(),
        turnstore::store::redis::LAYOUT.to_string(),
        "{}",
        ts.log()
    );
}

#[test]
fn migrate_scans_every_master_of_a_cluster() {
    // Arrange: 30 layout-1 sessions, spread over three masters by their slots.
    let cluster = crate::harness::RedisCluster::start(3);
    let sessions: Vec<String> = (0..30).map(|i| format!("c-legacy-{i}")).collect();
    for s in &sessions {
        let key = format!("turnstore:{{{s}}}:meta");
        let owner = cluster.owner(cluster.keyslot(&key));
        cluster.nodes[owner].cli(&["HSET", &key, "created_at", "1", "next_seq", "0"]);
    }
    let masters_used: std::collections::HashSet<usize> = sessions
        .iter()
        .map(|s| cluster.owner(cluster.keyslot(&format!("turnstore:{{{s}}}:meta"))))
        .collect();
    assert_eq!(masters_used.len(), 3);

    // Act
    let out = Command::new(env!("CARGO_BIN_EXE_turnstore"))
        .arg("migrate")
        .env_clear()
        .env("TURNSTORE_REDIS_CLUSTER_NODES", cluster.urls().join(","))
        .output()
        .unwrap();

    // Assert
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "0002_short_session_keys: 30 sessions, 30 keys moved, 0 conflicts\n\
         0003_compact_turn_records: 30 sessions, 0 records rewritten, 0 conflicts\n\
         0004_budget_without_loading: 30 sessions, 0 records rewritten, 0 conflicts\n\
         0005_sums_and_english_copies: 30 sessions, 0 sums written, 0 conflicts\n\
         layout 1 -> 5"
    );
    for s in &sessions {
        let key = format!("turnstore:{{{s}}}:h");
        let owner = cluster.owner(cluster.keyslot(&key));
        assert_eq!(
            cluster.nodes[owner].cli(&["EXISTS", &key]).trim(),
            "1",
            "{s}"
        );
    }
}

/// A pending record as layout 3 wrote it: compact JSON, no turn id, no
/// encoding when it is o200k_base.
fn layout_3_pending(t: &PendingTurn) -> Value {
    let mut n = json!({"q": t.tokens.query, "u": t.tokens.user_line});
    if t.tokens.encoding != Encoding::O200kBase {
        n["e"] = json!(t.tokens.encoding.name());
    }
    let mut p = json!({"s": t.seq, "q": t.user_query, "t": t.started_at, "n": n});
    if let Some(k) = &t.idempotency_key {
        p["k"] = json!(k);
    }
    p
}

fn layout_3_finalized(t: &FinalizedTurn) -> String {
    let e = &t.end;
    let mut n =
        json!({"a": e.tokens.answer, "s": e.tokens.assistant_sep, "l": e.tokens.assistant_last});
    if e.tokens.encoding != Encoding::O200kBase {
        n["e"] = json!(e.tokens.encoding.name());
    }
    json!({"p": layout_3_pending(&t.start), "f": {"a": e.final_answer, "t": e.finalized_at, "n": n}})
        .to_string()
}

/// Writes a session as layout 3 stored it, through a plain Redis client.
fn write_layout_3_session(
    redis: &Redis,
    session: &str,
    user: &str,
    turns: &[FinalizedTurn],
    pending: &[(PendingTurn, i64)],
) {
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let k = |suffix: &str| format!("turnstore:{{{session}}}:{suffix}");
    let now = now_millis();
    let next_seq = turns.len() + pending.len();
    let mut pipe = redis::pipe();
    pipe.hset_multiple(
        k("m"),
        &[
            ("user_id", user.to_string()),
            ("created_at", (now - 10_000).to_string()),
            ("last_active_at", now.to_string()),
            ("next_seq", next_seq.to_string()),
            ("indexed_at", now.to_string()),
        ],
    );
    for t in turns {
        let id = t.start.turn_id.to_string();
        pipe.hset(k("t"), &id, layout_3_finalized(t))
            .zadd(k("o"), &id, t.seq());
        if let Some(key) = &t.start.idempotency_key {
            pipe.hset(k("i"), key, format!("{id} {} hash-{key}", t.seq()));
        }
    }
    for (p, deadline) in pending {
        let id = p.turn_id.to_string();
        pipe.hset(k("p"), &id, layout_3_pending(p).to_string())
            .zadd(k("d"), &id, *deadline);
        if let Some(key) = &p.idempotency_key {
            pipe.hset(k("i"), key, format!("{id} {} hash-{key}", p.seq));
        }
    }
    for suffix in ["m", "t", "o", "p", "d", "i"] {
        pipe.pexpire(k(suffix), 600_000);
    }
    let () = pipe.query(&mut c).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_3_data_is_migrated_and_served() {
    // Arrange: layout 3's data, each kind of record in it: turns counted in
    // two encodings, idempotency keys, a live and an expired pending turn, a
    // session larger than one migration page, and a session its owner's
    // index missed (the defect layout 4 fixes: it must be listed again).
    let redis = Redis::unix();
    redis.cli(&["SET", "turnstore:layout", "3"]);
    let now = now_millis();
    let mut first = finalized(
        1,
        "Quote \"this\"\nand {that}: ünï 🙂",
        "Answer.\n\n- a\n- b",
        now - 9000,
    );
    first.start.idempotency_key = Some("key-1".into());
    let mut second = finalized(2, "Second?", "Yes.", now - 8000);
    second.start.tokens = QueryTokens::count(Encoding::Cl100kBase, "Second?");
    second.end.tokens = AnswerTokens::count(Encoding::Cl100kBase, "Yes.");
    let mut open = pending(3, "Still open?", now - 1000);
    open.idempotency_key = Some("key-3".into());
    let stale = pending(4, "Expired", now - 900_000);
    write_layout_3_session(
        &redis,
        "l3-a",
        "l3-user",
        &[first.clone(), second.clone()],
        &[(open.clone(), now + 600_000), (stale.clone(), now - 1)],
    );
    // Answers longer than a layout-4 record's head (4 KiB a text).
    let long_answer = "words and more words ".repeat(300);
    let big: Vec<FinalizedTurn> = (1..=300)
        .map(|i| finalized(i, &format!("question {i}"), &long_answer, now))
        .collect();
    write_layout_3_session(&redis, "l3-big", "l3-user", &big, &[]);
    write_layout_3_session(&redis, "l3-unlisted", "l3-user", &big[..1], &[]);
    redis.cli(&["ZADD", "turnstore:user:l3-user", &now.to_string(), "l3-a"]);
    redis.cli(&["ZADD", "turnstore:user:l3-user", &now.to_string(), "l3-big"]);

    // Act
    let refused = turnstore(&[], &redis);
    let migrated = turnstore(&["migrate"], &redis);

    // Assert: the report, and what the old keys became.
    assert!(!refused.status.success());
    let stdout = String::from_utf8_lossy(&migrated.stdout);
    assert!(
        migrated.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "0004_budget_without_loading: 3 sessions, 305 records rewritten, 0 conflicts\n\
         0005_sums_and_english_copies: 3 sessions, 3 sums written, 0 conflicts\n\
         layout 3 -> 5"
    );
    assert_eq!(redis.cli(&["EXISTS", "turnstore:user:l3-user"]).trim(), "0");
    assert_eq!(redis.cli(&["EXISTS", "turnstore:{l3-big}:o"]).trim(), "0");
    let ttl: i64 = redis
        .cli(&["PTTL", "turnstore:{l3-big}:s"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 600_000, "{ttl}");

    // The sessions serve as before.
    let ts = Turnstore::spawn(&[("TURNSTORE_REDIS_URL", redis.url())]);
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let req = http.get(format!("{}{path}", ts.base()));
        async move {
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 200);
            res.json::<Value>().await.unwrap()
        }
    };
    let h = get("/v1/sessions/l3-a/history").await;
    let expected = format!(
        "### Conversation history:\nUser: {}\nAssistant: {}\n\nUser: Second?\nAssistant: Yes.",
        first.start.user_query, first.end.final_answer
    );
    assert_eq!(h["rendered"], expected.as_str(), "{}", ts.log());
    assert_eq!(h["token_count"], Encoding::O200kBase.count(&expected));
    assert_eq!(
        (h["pending_turns"].clone(), h["stopped_by"].clone()),
        (json!(1), json!(null))
    );
    let whole =
        get("/v1/sessions/l3-big/history?limit=1000&max_tokens=10000000&format=turns").await;
    assert_eq!(whole["included_turns"], 300);
    assert_eq!(whole["turns"][299]["seq"], 300);
    assert_eq!(whole["turns"][0]["user_query"], "question 1");
    assert_eq!(whole["turns"][299]["final_answer"], long_answer.as_str());
    let tail =
        get("/v1/sessions/l3-big/history?limit=2&format=messages&encoding=cl100k_base").await;
    let counted: usize = tail["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Encoding::Cl100kBase.count(m["content"].as_str().unwrap()) as usize + 4)
        .sum();
    assert_eq!(tail["token_count"], counted);

    let finalize = |id: TurnId| {
        let req = http
            .post(format!(
                "{}/v1/sessions/l3-a/turns/{id}/finalize",
                ts.base()
            ))
            .json(&json!({"final_answer": "Now closed."}));
        async move { req.send().await.unwrap().status() }
    };
    assert_eq!(finalize(open.turn_id).await, 200);
    assert_eq!(finalize(stale.turn_id).await, 404);
    for key in ["key-1", "key-3"] {
        let reused = http
            .post(format!("{}/v1/turns", ts.base()))
            .header("idempotency-key", key)
            .json(&json!({"session_id": "l3-a", "user_query": "another body"}))
            .send()
            .await
            .unwrap();
        assert_eq!(reused.status(), 422, "{key} still names its turn");
    }
    let list = get("/v1/users/l3-user/sessions").await;
    let mut listed: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, ["l3-a", "l3-big", "l3-unlisted"]);
}
