//! The walk's budget (`lua/walk.lua`) is the Lua twin of the one rule in
//! `history::select`: checked here against it directly. Random turn costs
//! and bounds (limit, max_tokens, max_bytes, format, keep_first, a summary
//! in front), the walk run on a real redis-server over sessions holding
//! those costs, and its choice (the turns it returns and the bound it
//! stops at) compared with the `Selector`'s over the same candidates. End
//! to end, the service's own selection would hide a walk that took too
//! many turns; here nothing does.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::Value;

use super::Server;
use crate::history::{Format, Options, Selector, StoppedBy};
use crate::store::redis::reads::{Page, PageEnd, first_budget, walk_args};
use crate::store::redis::record::{self, Translations};
use crate::store::redis::reply::Reply;
use crate::store::redis::scripts::Scripts;
use crate::tokens::{Encoding, SummaryTokens};

/// A finalized turn's stored costs: q, u, a, s, l, question and answer bytes.
type Costs = [u32; 7];

#[derive(Debug, Clone)]
struct Case {
    turns: Vec<Costs>,
    limit: usize,
    max_tokens: u32,
    max_bytes: u64,
    format: Format,
    keep_first: bool,
    /// alone, joined, message, bytes, and how many turns it covers.
    summary: Option<(u32, u32, u32, u64, usize)>,
}

fn case() -> impl Strategy<Value = Case> {
    let costs = (
        0u32..40,
        1u32..50,
        0u32..60,
        1u32..70,
        1u32..70,
        0u32..300,
        0u32..300,
    )
        .prop_map(|(q, u, a, s, l, qb, ab)| [q, u, a, s, l, qb, ab]);
    (
        proptest::collection::vec(costs, 0..14),
        1usize..16,
        0u32..700,
        0u64..4000,
        proptest::sample::select(&Format::ALL[..]),
        any::<bool>(),
        proptest::option::of((0u32..120, 0u32..120, 0u32..120, 0u64..600, 0usize..6)),
    )
        .prop_map(
            |(turns, limit, max_tokens, max_bytes, format, keep_first, summary)| Case {
                summary: summary.map(|(a, j, m, b, k)| (a, j, m, b, k.min(turns.len()))),
                turns,
                limit,
                max_tokens,
                max_bytes,
                format,
                keep_first,
            },
        )
}

fn turn_id(seq: u64) -> [u8; 16] {
    (u128::from(seq) + 1).to_be_bytes()
}

fn member(seq: u64, c: &Costs) -> Vec<u8> {
    let mut m = turn_id(seq).to_vec();
    m.extend_from_slice(b"oo");
    for n in c {
        m.extend_from_slice(&n.to_be_bytes());
    }
    m
}

fn record(seq: u64, c: &Costs) -> Vec<u8> {
    let mut r = format!("{seq} 1 2 - {}\n", c[5]).into_bytes();
    r.extend(std::iter::repeat_n(b'q', c[5] as usize));
    r.extend(std::iter::repeat_n(b'a', c[6] as usize));
    r
}

impl Case {
    fn options(&self) -> Options {
        Options {
            limit: self.limit,
            max_tokens: self.max_tokens,
            max_bytes: self.max_bytes,
            format: self.format,
            keep_first: self.keep_first,
            summary: self.summary.is_some(),
            ..Options::everything(Encoding::O200kBase)
        }
    }

    /// Writes the session under `{tag}` keys (meta, records, turns).
    fn write(&self, con: &mut redis::Connection, tag: &str) -> [String; 3] {
        let keys = ["h", "r", "s"].map(|k| format!("{{{tag}}}{k}"));
        let n = self.turns.len();
        let mut pipe = redis::pipe();
        pipe.hset_multiple(&keys[0], &[("next_seq", n), ("n", n)])
            .hset(&keys[0], "g", "gen");
        for (i, c) in self.turns.iter().enumerate() {
            let seq = i as u64 + 1;
            pipe.zadd(&keys[2], member(seq, c), seq).hset(
                &keys[1],
                &turn_id(seq)[..],
                record(seq, c),
            );
        }
        if let Some((alone, joined, message, bytes, covers)) = self.summary {
            let header = format!("1 o 0 {alone} {joined} {message} {bytes}");
            pipe.hset(&keys[0], "st", covers)
                .hset(&keys[0], "sh", header)
                .hset(&keys[0], "sm", "s".repeat(bytes as usize));
        }
        pipe.query::<()>(con).unwrap();
        keys
    }

    /// The walk's choice: the seqs it returns, oldest first, and where it stopped.
    fn walk(
        &self,
        con: &mut redis::Connection,
        scripts: &Scripts,
        keys: &[String; 3],
    ) -> (Vec<u64>, Option<StoppedBy>) {
        let o = self.options();
        let args = walk_args(&o, first_budget(&o), 0, None, o.keep_first, true);
        let v: Value = scripts
            .history
            .script
            .key(&keys[0])
            .key(&keys[1])
            .key(&keys[2])
            .arg(1000)
            .arg(args)
            .invoke(con)
            .unwrap();
        let mut r = Reply::array(v).unwrap();
        let _owner = r.next().unwrap();
        let _pending = r.next().unwrap();
        let page = Page::parse(r.next().unwrap(), Translations::default()).unwrap();
        let mut seqs: Vec<u64> = page.entries.iter().rev().map(|c| c.seq).collect();
        if let Some(first) = &page.first {
            seqs.insert(0, first.seq);
        }
        let stopped = match page.status {
            PageEnd::Done => None,
            PageEnd::Stop(why) => Some(why),
            PageEnd::More(_) => panic!("a page holds every turn here"),
        };
        (seqs, stopped)
    }

    /// The rule's choice over the same candidates.
    fn select(&self) -> (Vec<u64>, Option<StoppedBy>) {
        let o = self.options();
        let covered = self.summary.map_or(0, |s| s.4);
        let mut candidates = self.turns.iter().enumerate().skip(covered).map(|(i, c)| {
            let seq = i as u64 + 1;
            record::candidate(
                &member(seq, c),
                &record(seq, c),
                None,
                None,
                Translations::default(),
            )
            .unwrap()
        });
        let mut s = Selector::new(&o);
        let open = self
            .summary
            .is_none_or(|(alone, joined, message, bytes, _)| {
                let tokens = SummaryTokens {
                    encoding: Encoding::O200kBase,
                    text: 0,
                    alone,
                    joined,
                    message,
                };
                s.open_with(o.format.prelude(&"x".repeat(bytes as usize), &tokens))
            });
        let reserved =
            !(open && o.keep_first) || candidates.next().is_none_or(|f| s.reserve_first(f));
        if open && reserved {
            for c in candidates.rev() {
                if !s.offer(c) {
                    break;
                }
            }
        }
        let sel = s.finish();
        (
            sel.turns.iter().map(|t| t.turn.seq).collect(),
            sel.stopped_by,
        )
    }
}

#[test]
fn the_walk_takes_what_the_rule_takes() {
    let server = Server::start();
    let con = std::cell::RefCell::new(server.connect());
    let scripts = Scripts::new();
    let mut runner = TestRunner::new(Config::with_cases(1500));
    let n = std::cell::Cell::new(0u64);
    runner
        .run(&case(), |case| {
            n.set(n.get() + 1);
            let con = &mut *con.borrow_mut();
            let keys = case.write(con, &format!("twin{}", n.get()));
            let walked = case.walk(con, &scripts, &keys);
            prop_assert_eq!(walked, case.select(), "{:?}", case);
            Ok::<(), TestCaseError>(())
        })
        .unwrap();
}
