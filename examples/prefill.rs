//! Fills Redis with sessions of N finalized turns (120-byte questions,
//! 600-byte answers) through turnstore's own Redis store, so the layout and
//! token counts are exactly what the service writes.
//! Usage: `prefill <redis-url> <session-prefix> <sessions> <turns-per-session>`
//! Environment: `PREFILL_USER` makes every session that user's;
//! `PREFILL_SUMMARY_THROUGH=N` gives each session a summary
//! (`bench/summary.txt`) of its first N turns.

use std::sync::Arc;

use turnstore::Settings;
use turnstore::domain::{SessionId, TurnId, UserId};
use turnstore::metrics::Metrics;
use turnstore::store::{StartTurn, Store, SummaryWrite};
use turnstore::tokens::{AnswerTokens, QueryTokens, SummaryTokens};
use turnstore::turn::{Finalization, NewPendingTurn, now_millis};

pub const QUESTION: &str = include_str!("../bench/question.txt");
pub const ANSWER: &str = include_str!("../bench/answer.txt");
pub const SUMMARY: &str = include_str!("../bench/summary.txt");

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, prefix, sessions, turns] = &args[..] else {
        eprintln!("usage: prefill <redis-url> <session-prefix> <sessions> <turns-per-session>");
        std::process::exit(2);
    };
    let (sessions, turns): (usize, u32) = (sessions.parse().unwrap(), turns.parse().unwrap());
    let settings = Settings {
        redis_url: Some(url.clone()),
        max_turns: turns.max(1000),
        store_timeout: std::time::Duration::from_secs(30),
        ..Settings::default()
    };
    let store: Arc<dyn Store> = turnstore::app::build_store(&settings, &Metrics::new())
        .await
        .expect("store");
    let encoding = settings.encoding;
    let q_tokens = QueryTokens::count(encoding, QUESTION.trim_end());
    let a_tokens = AnswerTokens::count(encoding, ANSWER.trim_end());
    let user = std::env::var("PREFILL_USER")
        .ok()
        .map(|u| UserId::parse(u).expect("PREFILL_USER is a user id"));
    let summary_through: u64 = std::env::var("PREFILL_SUMMARY_THROUGH")
        .map(|n| n.parse().expect("PREFILL_SUMMARY_THROUGH is a number"))
        .unwrap_or(0);
    let s_tokens = SummaryTokens::count(encoding, SUMMARY.trim_end());
    let workers = 32;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (store, prefix, user) = (store.clone(), prefix.clone(), user.clone());
            tokio::spawn(async move {
                for s in (w..sessions).step_by(workers) {
                    let session = SessionId::parse(format!("{prefix}-{s}")).unwrap();
                    for _ in 0..turns {
                        let turn_id = TurnId::generate();
                        let started = store
                            .start_turn(StartTurn {
                                session_id: &session,
                                user_id: user.as_ref(),
                                turn: NewPendingTurn {
                                    turn_id: &turn_id,
                                    user_query: QUESTION.trim_end(),
                                    started_at: now_millis(),
                                    idempotency_key: None,
                                    tokens: &q_tokens,
                                    english: None,
                                },
                                idempotency: None,
                                history: None,
                                new_session: false,
                                now: now_millis(),
                            })
                            .await
                            .expect("start");
                        let end = Finalization {
                            final_answer: ANSWER.trim_end().to_string(),
                            finalized_at: now_millis(),
                            tokens: a_tokens,
                            english: None,
                        };
                        store
                            .finalize_turn(&session, started.turn_id, &end)
                            .await
                            .expect("finalize");
                    }
                    if summary_through > 0 {
                        store
                            .put_summary(SummaryWrite {
                                session_id: &session,
                                user_id: None,
                                text: SUMMARY.trim_end(),
                                through_seq: summary_through,
                                expected_through_seq: None,
                                expected_generation: None,
                                tokens: &s_tokens,
                                now: now_millis(),
                            })
                            .await
                            .expect("summary");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    println!("prefilled {sessions} sessions x {turns} turns under {prefix}-*");
}
