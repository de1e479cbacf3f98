//! Data-layout migrations on a real redis-server: data written in layout 1,
//! `serve` refusing it, `turnstore migrate` (1 -> 2 -> 3), and the data read
//! back over HTTP.

use std::process::Command;

use serde_json::{Value, json};
use turnstore::domain::TurnId;
use turnstore::history::{AnswerTokens, Encoding, QueryTokens};
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
    }
}

fn finalized(seq: u64, q: &str, a: &str, at: i64) -> FinalizedTurn {
    FinalizedTurn {
        start: pending(seq, q, at),
        end: Finalization {
            final_answer: a.into(),
            finalized_at: at + 1,
            tokens: AnswerTokens::count(Encoding::O200kBase, a),
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
         layout 1 -> 3"
    );
    assert_eq!(out(&again).trim(), "layout 3 -> 3");
    let stored = redis.cli(&["HGETALL", "turnstore:{legacy-1}:t"])
        + &redis.cli(&["HGETALL", "turnstore:{legacy-1}:p"]);
    assert!(!stored.contains(r#""id":""#), "{stored}");
    assert!(!stored.contains(r#""e":"o200k_base""#), "{stored}");
    assert!(
        stored.contains(r#"Not {\"id\":\"x\",\"n\":{\"e\":\"o200k_base\""#),
        "{stored}"
    );
    assert_eq!(
        redis.cli(&["EXISTS", "turnstore:{legacy-1}:meta"]).trim(),
        "0"
    );
    let ttl: i64 = redis
        .cli(&["PTTL", "turnstore:{legacy-1}:t"])
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
    redis.cli(&["SET", "turnstore:layout", "4"]);

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
        "3",
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
         layout 1 -> 3"
    );
    for s in &sessions {
        let key = format!("turnstore:{{{s}}}:m");
        let owner = cluster.owner(cluster.keyslot(&key));
        assert_eq!(
            cluster.nodes[owner].cli(&["EXISTS", &key]).trim(),
            "1",
            "{s}"
        );
    }
}
