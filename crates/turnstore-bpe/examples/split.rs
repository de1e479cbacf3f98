//! o200k's count of bench/question.txt and bench/answer.txt, with the
//! ASCII cuts and with the regex alone, in interleaved rounds:
//!     cargo run --release -p turnstore-bpe --example split
//! Prints each text's µs a count (the median round) both ways.

use std::hint::black_box;
use std::time::Instant;

use turnstore_bpe::{Pattern, Ranks, Splitter, tables};

fn main() {
    let ranks = Ranks::from_table(tables::O200K_BASE, usize::MAX);
    let splitter = Splitter::new(Pattern::O200k);
    let question = include_str!("../../../bench/question.txt").trim();
    let answer = include_str!("../../../bench/answer.txt").trim();
    let count = |text: &str, ascii: bool| {
        let mut n = 0;
        splitter.split_as(text, ascii, |piece| n += ranks.piece(piece));
        n
    };
    for (name, text) in [("question", question), ("answer", answer)] {
        assert_eq!(count(text, true), count(text, false));
        let (mut fast, mut regex) = (Vec::new(), Vec::new());
        for round in 0..40 {
            for ascii in [round % 2 == 0, round % 2 == 1] {
                let iters = 20_000;
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(count(black_box(text), ascii));
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
                if ascii { fast.push(us) } else { regex.push(us) }
            }
        }
        fast.sort_by(f64::total_cmp);
        regex.sort_by(f64::total_cmp);
        println!(
            "{name} ({} bytes, {} tokens): {:.2} µs with the ASCII cuts, {:.2} µs with the regex alone",
            text.len(),
            count(text, true),
            fast[fast.len() / 2],
            regex[regex.len() / 2]
        );
    }
}
