//! Counting the bench's question and answer on one and on two threads at
//! once: tiktoken-rs' encoder (its regex's pools serve one thread fast and
//! the others through a lock) against `Encoding::count` (tokens/counter.rs:
//! one regex, a search cache per thread). `cargo run --release --example count_threads`.
use std::time::Instant;
use turnstore::tokens::Encoding;
fn main() {
    let q = std::fs::read_to_string("bench/question.txt").unwrap();
    let a = std::fs::read_to_string("bench/answer.txt").unwrap();
    let bpe = tiktoken_rs::o200k_base_singleton();
    Encoding::O200kBase.warm_up();
    let n = 200_000;
    for threads in [1, 2, 1, 2] {
        for which in ["tiktoken", "counter"] {
            let t = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        let mut sum = 0usize;
                        for _ in 0..n {
                            sum += if which == "tiktoken" {
                                bpe.encode_ordinary(&q).len() + bpe.encode_ordinary(&a).len()
                            } else {
                                (Encoding::O200kBase.count(&q) + Encoding::O200kBase.count(&a))
                                    as usize
                            };
                        }
                        std::hint::black_box(sum);
                    });
                }
            });
            println!(
                "{which} threads={threads} {:.2} us per q+a per thread",
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            );
        }
    }
}
