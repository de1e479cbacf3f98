//! `lua/rules.lua` against `store/rules.rs`: each Lua rule run on the
//! test's redis-server with random inputs, its answer compared with the
//! Rust twin's.

use std::cell::RefCell;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::{Script, Value};

use super::Server;
use crate::store::StoreError;
use crate::store::rules::{self, Access};

/// Runs `rule` (a Lua expression over ARGV, after rules.lua) with `args`.
fn lua(con: &RefCell<redis::Connection>, rule: &str, args: &[String]) -> String {
    let source = format!("{}\nreturn {rule}", include_str!("../lua/rules.lua"));
    let script = Script::new(&source);
    let mut invocation = script.prepare_invoke();
    for a in args {
        invocation.arg(a);
    }
    let v: Value = invocation.invoke(&mut con.borrow_mut()).unwrap();
    match v {
        Value::Nil => "none".into(),
        Value::Int(n) => n.to_string(),
        Value::BulkString(b) => String::from_utf8(b).unwrap(),
        Value::SimpleString(s) => s,
        Value::Array(items) => items
            .into_iter()
            .map(|i| match i {
                Value::BulkString(b) => String::from_utf8(b).unwrap(),
                Value::Int(n) => n.to_string(),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        other => format!("{other:?}"),
    }
}

fn flag(b: bool) -> String {
    if b { "1" } else { "0" }.into()
}

fn check<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    TestRunner::new(Config::with_cases(300))
        .run(&strategy, test)
        .unwrap();
}

/// A time (ms since the epoch), and a small offset from it: the rules
/// compare times, and their twins must agree at each boundary.
fn time() -> impl Strategy<Value = i64> {
    1_700_000_000_000i64..1_900_000_000_000
}

fn near() -> impl Strategy<Value = i64> {
    -3i64..=3
}

#[test]
fn the_lua_rules_answer_as_their_rust_twins() {
    let server = Server::start();
    let con = RefCell::new(server.connect());
    let user = || proptest::option::of(prop_oneof![Just("alice"), Just("bob")]);

    check((user(), user()), |(owner, caller)| {
        let rust = match rules::access(owner, caller) {
            Access::Mismatch => "mismatch",
            Access::Claim => "claim",
            Access::Keep => "keep",
        };
        let args = [
            owner.unwrap_or("").to_owned(),
            caller.unwrap_or("").to_owned(),
        ];
        let lua = lua(
            &con,
            "access(ARGV[1] ~= '' and ARGV[1] or false, ARGV[2])",
            &args,
        );
        prop_assert_eq!(lua, rust);
        Ok(())
    });

    check(
        (any::<bool>(), time(), 0u64..20_000, near()),
        |(claim, now, needed, off)| {
            let until = now + needed as i64 + off;
            let rust = rules::index_due(claim, until, now, Duration::from_millis(needed));
            let args = [
                flag(claim),
                until.to_string(),
                now.to_string(),
                needed.to_string(),
            ];
            let rule = "index_due(ARGV[1] == '1', tonumber(ARGV[2]), tonumber(ARGV[3]), \
                        tonumber(ARGV[4])) and 1 or 0";
            prop_assert_eq!(lua(&con, rule, &args), flag(rust));
            Ok(())
        },
    );

    check(
        (
            time(),
            proptest::option::of(near()),
            proptest::option::of(near()),
        ),
        |(reach, top, min)| {
            let top = top.map(|d| reach + d);
            let min = min.map_or(0, |d| reach + d);
            let rust = rules::index_time(reach, top, min);
            let args = [
                reach.to_string(),
                top.map_or(String::new(), |t| t.to_string()),
                min.to_string(),
            ];
            let rule = "string.format('%d', index_time(tonumber(ARGV[1]), tonumber(ARGV[2]), \
                        tonumber(ARGV[3])))";
            prop_assert_eq!(lua(&con, rule, &args), rust.to_string());
            Ok(())
        },
    );

    check(
        (any::<bool>(), time(), prop_oneof![near(), -2_000i64..2_000]),
        |(written, now, off)| {
            let moved_at = now - 1000 + off;
            let rust = rules::moves_to_top(written, moved_at, now);
            let args = [flag(written), moved_at.to_string(), now.to_string()];
            let rule =
                "moves_to_top(ARGV[1] == '1', tonumber(ARGV[2]), tonumber(ARGV[3])) and 1 or 0";
            prop_assert_eq!(lua(&con, rule, &args), flag(rust));
            Ok(())
        },
    );

    check((0u64..8, 1u64..8), |(live, cap)| {
        let args = [live.to_string(), cap.to_string()];
        let rule = "pending_full(tonumber(ARGV[1]), tonumber(ARGV[2])) and 1 or 0";
        prop_assert_eq!(lua(&con, rule, &args), flag(rules::pending_full(live, cap)));
        Ok(())
    });

    check((0u64..12, 1u64..12), |(count, max_turns)| {
        let args = [count.to_string(), max_turns.to_string()];
        let rule = "excess_turns(tonumber(ARGV[1]), tonumber(ARGV[2]))";
        let rust = rules::excess_turns(count, max_turns).to_string();
        prop_assert_eq!(lua(&con, rule, &args), rust);
        Ok(())
    });

    let seq = || 0u64..6;
    check(
        (
            seq(),
            proptest::option::of(seq()),
            seq(),
            seq(),
            proptest::option::of(seq()),
        ),
        |(stored, expected, through, newest, pending)| {
            let rust = match rules::summary_check(stored, expected, through, newest, pending) {
                Ok(()) => "none".to_owned(),
                Err(StoreError::SummaryConflict { stored }) => format!("conflict {stored}"),
                Err(StoreError::SummaryBeyond { newest }) => format!("beyond {newest}"),
                Err(StoreError::SummaryOverPending { pending }) => format!("pending {pending}"),
                Err(e) => format!("{e:?}"),
            };
            let args = [
                stored.to_string(),
                expected.map_or("-1".into(), |e| e.to_string()),
                through.to_string(),
                newest.to_string(),
                pending.map_or(String::new(), |p| p.to_string()),
            ];
            let rule = "summary_check(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), \
                        tonumber(ARGV[4]), tonumber(ARGV[5]))";
            prop_assert_eq!(lua(&con, rule, &args), rust);
            Ok(())
        },
    );
}
