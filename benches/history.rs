//! Rendering and budgeting: 20, 200 and 1000 turns of realistic sizes (a
//! 120-byte question, a 600-byte answer), in each format and both encodings.
//! `o200k_base` is the default, so its counts come from the stored turns;
//! `cl100k_base` has to tokenize on read. Also the counts a start and a
//! finalize take of their new text. And a templated read of the newest 20
//! (`xml`, `markdown`) against `text`, with the caches warm (a
//! repeated read) and cold. Run: `cargo bench --bench history`.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use turnstore::domain::TurnId;
use turnstore::history::template::{Caches, Globals, Template, Templates, select_template};
use turnstore::history::{Candidate, Content, Format, Options, Rendering, select};
use turnstore::tokens::{AnswerTokens, Encoding, QueryTokens, TurnCosts};

const QUESTION: &str = "How do I rotate the API keys of our staging cluster without downtime, and who needs to approve it first?";
const ANSWER: &str = "Rotate keys in three steps. First, add the new key to TURNSTORE_API_KEYS next to the old one and roll the deployment, so every instance accepts both. Second, switch each client to the new key; watch the 401 rate in Prometheus while you do. Third, remove the old key and roll again. No request fails, because at every moment each instance accepts the key every client sends. Approval: the on-call SRE signs off on staging; production also needs the service owner. Keep the old key for a day in the secret store in case you must roll back, then delete it.";

/// Stored turns as a store offers them, oldest first.
fn turns(n: u64) -> Vec<Candidate> {
    let enc = Encoding::O200kBase;
    let q = QUESTION[..QUESTION.len().min(120)].to_string();
    (1..=n)
        .map(|seq| {
            let q = format!("{q} {seq}");
            let costs = TurnCosts::new(
                &q,
                QueryTokens::count(enc, &q),
                ANSWER,
                AnswerTokens::count(enc, ANSWER),
            );
            Candidate {
                turn_id: TurnId::generate(),
                seq,
                started_at: 1,
                finalized_at: 2,
                user_query: Content::whole(q),
                final_answer: Content::whole(ANSWER),
                costs,
                recount: false,
                copies: Default::default(),
            }
        })
        .collect()
}

/// Selects and renders, as a read does once the store offers candidates.
fn read(candidates: &[Candidate], opts: &Options) -> usize {
    let s = select(candidates.iter().cloned(), opts);
    match opts.format.render(None, s.turns) {
        Rendering::Text(text) => text.len(),
        Rendering::Messages(messages) => messages.len(),
        Rendering::Turns(turns) => turns.len(),
        Rendering::Anthropic(history) => history.messages.len(),
    }
}

const GLOBALS: Globals<'static> = Globals {
    session_id: "bench-session",
    user_id: Some("bench-user"),
};

/// Selects and renders with a template, counting through the process-wide
/// cache as the service does.
fn read_templated(candidates: &[Candidate], opts: &Options, template: &Template) -> usize {
    select_template(candidates.iter().cloned(), opts, template, &GLOBALS, None)
        .map(|s| s.rendered.len() + s.token_count as usize)
        .unwrap_or(0)
}

fn options(limit: usize, max_tokens: u32, format: Format, encoding: Encoding) -> Options {
    Options {
        limit,
        max_tokens,
        max_bytes: 4 * 1024 * 1024,
        format,
        ..Options::everything(encoding)
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("render");
    for n in [20u64, 200, 1000] {
        let all = turns(n);
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for format in [Format::Text, Format::Messages, Format::Turns] {
                let opts = options(n as usize, 10_000_000, format, encoding);
                let id = BenchmarkId::new(format!("{}/{format:?}", encoding.name()), n);
                group.bench_with_input(id, &opts, |b, opts| {
                    b.iter(|| black_box(read(black_box(&all), opts)))
                });
            }
        }
        // The hot path of the service: the default budget over the newest 20.
        let opts = options(20, 4096, Format::Text, Encoding::O200kBase);
        let newest_20 = &all[all.len().saturating_sub(20)..];
        group.bench_with_input(BenchmarkId::new("default-20x4096", n), &opts, |b, opts| {
            b.iter(|| black_box(read(black_box(newest_20), opts)))
        });
    }
    group.finish();

    // A templated read of the newest 20 against `text`: warm is a repeated
    // read (every turn's rendering and count cached: look up, join and
    // sum), cold renders every turn and tokenizes every segment and joint
    // once. `text` o200k sums stored counts;
    // `text` cl100k tokenizes each turn on every read.
    let mut group = c.benchmark_group("template");
    let templates = Templates::load(None).expect("the built-ins compile");
    let newest_20 = turns(20);
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let enc = encoding.name();
        let opts = options(20, 1_000_000, Format::Text, encoding);
        group.bench_function(format!("{enc}/text-20"), |b| {
            b.iter(|| black_box(read(black_box(&newest_20), &opts)))
        });
        for name in ["xml", "markdown"] {
            let Some(template) = templates.get(name) else {
                continue;
            };
            group.bench_function(format!("{enc}/{name}-20/warm"), |b| {
                b.iter(|| black_box(read_templated(black_box(&newest_20), &opts, template)))
            });
            group.bench_function(format!("{enc}/{name}-20/cold"), |b| {
                b.iter_batched(
                    || Caches::global().clear(),
                    |()| black_box(read_templated(black_box(&newest_20), &opts, template)),
                    BatchSize::PerIteration,
                )
            });
        }
    }
    group.finish();

    // What a start and a finalize pay to count their new text, against one
    // plain tiktoken pass over it.
    let mut group = c.benchmark_group("count");
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let name = encoding.name();
        group.bench_function(format!("{name}/question"), |b| {
            b.iter(|| black_box(QueryTokens::count(encoding, black_box(QUESTION))))
        });
        group.bench_function(format!("{name}/answer"), |b| {
            b.iter(|| black_box(AnswerTokens::count(encoding, black_box(ANSWER))))
        });
        group.bench_function(format!("{name}/one-pass-answer"), |b| {
            b.iter(|| black_box(encoding.count(black_box(ANSWER))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
