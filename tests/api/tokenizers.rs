//! Tokenizers from files (`TURNSTORE_TOKENIZERS_DIR`): `encoding=NAME`
//! counts with a Hugging Face tokenizer, exactly, under the budget rule.
//! The test's tokenizer is a small byte-level BPE that adds a space before
//! every text it counts, so the counts of parts do not add up to the
//! count of the parts joined (as with SentencePiece tokenizers): only
//! counts of whole renderings keep the budget.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::support::{Backend, TestApp, ok_json, problem, sid};

conformance!(
    a_loaded_tokenizer_keeps_the_budget_exactly,
    a_loaded_tokenizer_s_stable_window_is_counted_exactly,
    real_vocabularies_keep_the_budget_exactly,
    a_loaded_tokenizer_is_named_by_models_and_listed,
    unknown_encodings_and_templates_are_refused,
);

/// A small byte-level BPE (its merges make "the", " the", "he" and "ll"
/// tokens) that adds a space before each text.
const TINY: &str = include_str!("../fixtures/tiny-tokenizer.json");

/// The tokenizer in `file`, counting as the server does: no special
/// tokens added, typed ones counted as text.
fn load(file: &Path) -> Tokenizer {
    let mut t = Tokenizer::from_file(file).unwrap();
    t.set_encode_special_tokens(true);
    t
}

/// A fresh count of `text`.
fn fresh(t: &Tokenizer, text: &str) -> usize {
    t.encode_fast(text, false).unwrap().len()
}

/// The count of a response's rendering, as the format budgets it.
fn count_of(t: &Tokenizer, h: &Value) -> usize {
    match h["format"].as_str().unwrap() {
        "messages" => h["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| fresh(t, m["content"].as_str().unwrap()) + 4)
            .sum(),
        _ => fresh(t, h["rendered"].as_str().unwrap()),
    }
}

/// A server with the tiny tokenizer as `tiny`, and a model table.
async fn with_tiny(backend: Backend, models: &str) -> (TestApp, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tokenizers")).unwrap();
    let file = dir.path().join("tokenizers/tiny.json");
    std::fs::write(&file, TINY).unwrap();
    std::fs::write(dir.path().join("models.txt"), models).unwrap();
    let (tokenizers, table) = (dir.path().join("tokenizers"), dir.path().join("models.txt"));
    let app = TestApp::spawn_with(backend, |s| {
        s.tokenizers_dir = Some(tokenizers);
        s.models = Some(table);
    })
    .await;
    (app, dir, file)
}

const TEXTS: [(&str, &str); 6] = [
    ("Where is the hello?", " the hello is there\n\nthe end"),
    ("  two leading spaces", "you ought to   see   this"),
    ("héllo 😀 wörld", "ünïcode: の日本語"),
    ("the the the", "hell ou hello"),
    (
        "code: fn main() { println!(\"hi\"); }",
        "```rust\nfn x() {}\n```",
    ),
    ("last <|endoftext|> question", "last answer"),
];

async fn a_loaded_tokenizer_keeps_the_budget_exactly(backend: Backend) {
    let (app, _dir, file) = with_tiny(backend, "").await;
    let s = sid();
    for (q, a) in TEXTS {
        app.complete(&s, q, a).await;
    }
    let tiny = load(&file);
    let all = sweep(&app, &s, "tiny", &tiny, TEXTS.len() as u64, 3).await;

    // A start's history counts alike; text/plain says the encoding.
    let budget = all / 2;
    let started = app
        .started(json!({"session_id": s, "user_query": "q7",
                        "history": {"encoding": "tiny", "max_tokens": budget}}))
        .await;
    let h = &started["history"];
    assert_eq!(h["encoding"], "tiny", "{started}");
    assert_eq!(
        h["token_count"].as_u64().unwrap() as usize,
        count_of(&tiny, h)
    );
    assert!(h["token_count"].as_u64().unwrap() <= u64::from(budget));
    // Reads at once, each counting on the blocking pool (a few at a
    // time, the others waiting): every one answered, exactly.
    let queries: Vec<String> = (0..12)
        .map(|i| format!("encoding=tiny&format=text&max_tokens={}", budget + i % 3))
        .collect();
    let reads = queries.iter().map(|q| app.history_ok(&s, q));
    for (i, h) in futures_util::future::join_all(reads)
        .await
        .iter()
        .enumerate()
    {
        let n = h["token_count"].as_u64().unwrap();
        assert_eq!(n as usize, count_of(&tiny, h), "{h}");
        assert!(n <= u64::from(budget) + (i % 3) as u64, "{h}");
    }
    let plain = app
        .http
        .get(app.url(&format!("/v1/sessions/{s}/history?encoding=tiny")))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.headers()["x-encoding"], "tiny");
    let n: usize = plain.headers()["x-token-count"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(n, fresh(&tiny, &plain.text().await.unwrap()));
}

async fn a_loaded_tokenizer_s_stable_window_is_counted_exactly(backend: Backend) {
    let (app, _dir, file) = with_tiny(backend, "").await;
    let tiny = load(&file);
    let s = sid();
    for i in 0..18 {
        let (q, a) = TEXTS[i % TEXTS.len()];
        app.complete(&s, q, a).await;
    }
    let mut moved = 0;
    for format in ["text", "messages", "anthropic"] {
        for max in (20..400).step_by(23) {
            let read = format!("encoding=tiny&format={format}&max_tokens={max}");
            let sliding = app.history_ok(&s, &read).await;
            let stable = app
                .history_ok(&s, &format!("{read}&window=stable&stride=4"))
                .await;
            let left_out = stable["window"]["left_out"].as_u64().unwrap();
            moved += left_out;
            let n = stable["included_turns"].as_u64().unwrap();
            assert_eq!(n + left_out, sliding["included_turns"].as_u64().unwrap());
            assert!(left_out < 4, "{stable}");
            let from = stable["window"]["from_seq"].as_u64().unwrap_or(0);
            if left_out > 0 {
                assert_eq!((from - 1) % 4, 0, "{stable}");
                assert_eq!(from, 19 - n, "the newest turns");
            }
            assert_eq!(stable["stopped_by"], sliding["stopped_by"], "{read}");
            let counted = match format {
                "anthropic" => stable["anthropic"]["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| fresh(&tiny, m["content"][0]["text"].as_str().unwrap()) + 4)
                    .sum(),
                _ => count_of(&tiny, &stable),
            };
            assert_eq!(
                stable["token_count"].as_u64().unwrap() as usize,
                counted,
                "{read}"
            );
            assert!(counted <= max as usize);
            let u = stable["unsummarized"]["turns"].as_u64().unwrap_or(0);
            assert_eq!(u, 18 - n, "{read}: {stable}");
        }
    }
    assert!(moved > 0, "some window left turns out");
}

/// Reads of `s` (holding `turns` turns) in `encoding` (counted by `t`)
/// at every `step`th budget up to all of it, in every format, with
/// and without keep_first: each count is a fresh count of what is
/// returned, within the budget, and one more turn would not fit. Returns
/// the count of the whole history.
async fn sweep(
    app: &TestApp,
    s: &str,
    encoding: &str,
    t: &Tokenizer,
    turns: u64,
    step: usize,
) -> u32 {
    let whole = app
        .history_ok(s, &format!("encoding={encoding}&max_tokens=1000000"))
        .await;
    let all = whole["token_count"].as_u64().unwrap() as u32;
    assert_eq!(whole["encoding"], encoding, "{whole}");
    assert_eq!(whole["included_turns"], turns, "{whole}");
    assert_eq!(all as usize, count_of(t, &whole), "{whole}");
    for format in ["text", "messages", "turns"] {
        for keep_first in [false, true] {
            let mut last_included = 0;
            for max in (0..=all + 2).step_by(step) {
                let read = format!("encoding={encoding}&format={format}&keep_first={keep_first}");
                let q = format!("{read}&max_tokens={max}");
                let h = app.history_ok(s, &q).await;
                let n = h["token_count"].as_u64().unwrap() as usize;
                let included = h["included_turns"].as_u64().unwrap();
                if format != "turns" {
                    assert_eq!(n, count_of(t, &h), "{q}: {h}");
                }
                assert!(n <= max as usize, "{q}: {h}");
                assert!(
                    included >= last_included,
                    "more room keeps no fewer: {q}: {h}"
                );
                last_included = included;
                if included == turns {
                    assert_eq!(h["stopped_by"], Value::Null, "{q}: {h}");
                    continue;
                }
                assert_eq!(h["stopped_by"], "max_tokens", "{q}: {h}");
                assert_eq!(h["unsummarized"]["turns"], turns - included, "{q}: {h}");
                assert_eq!(h["unsummarized"]["tokens"], Value::Null, "{q}: {h}");
                // The next turn the rule would offer does not fit.
                let more = format!("{read}&max_tokens=1000000&limit={}", included + 1);
                let bigger = app.history_ok(s, &more).await;
                assert!(
                    bigger["token_count"].as_u64().unwrap() > u64::from(max),
                    "{q}: {h}\nwith one more turn: {bigger}"
                );
            }
        }
    }
    all
}

/// Multilingual, emoji, whitespace-heavy and code texts.
const CORPUS: [(&str, &str); 8] = [
    (
        "What does the retriever return for a query?",
        "The top 20 chunks, ranked by cosine similarity, then re-ranked.",
    ),
    (
        "Wie funktioniert die Größenänderung? Ça marche aussi en français ?",
        "Ja — und oui : l'index est reconstruit à chaque écriture.",
    ),
    (
        "東京の天気はどうですか？",
        "晴れです。気温は二十度です。 😀🎉👍🏽",
    ),
    (
        "   leading spaces\tand\ttabs\n\n\nand blank lines   ",
        "trailing spaces    \n    indented\n\t\tmore",
    ),
    (
        "fn main() {\n    println!(\"{}\", 42);\n}",
        "```python\ndef f(x):\n    return x ** 2  # square\n```",
    ),
    (
        "Привет, как дела? مرحبا كيف حالك؟",
        "Всё хорошо. بخير، شكرا. שלום",
    ),
    (
        "<|begin_of_text|><|eot_id|> [INST] typed special tokens [/INST] <s></s>",
        "<|im_start|>user\nhi<|im_end|>",
    ),
    (
        "1234567890 3.14159 -42 1e10 0xFF",
        "URLs: https://example.com/a?b=c&d=e#f and mail@example.org",
    ),
];

/// The real tokenizers `scripts/fetch-tokenizers` brings (Llama 3, Qwen
/// 2.5 and Mistral Nemo, byte-level; Llama 2 and Gemma, SentencePiece):
/// `scripts/test` sets
/// `TURNSTORE_TEST_TOKENIZERS` to where they are. Without it (a bare
/// `cargo test`) there is nothing to count with, and the test says so.
async fn real_vocabularies_keep_the_budget_exactly(backend: Backend) {
    let Some(dir) = std::env::var_os("TURNSTORE_TEST_TOKENIZERS").map(PathBuf::from) else {
        eprintln!("TURNSTORE_TEST_TOKENIZERS unset (scripts/test sets it): skipped");
        return;
    };
    let app = TestApp::spawn_with(backend, |s| s.tokenizers_dir = Some(dir.clone())).await;
    let s = sid();
    for (q, a) in CORPUS {
        app.complete(&s, q, a).await;
    }
    for name in ["llama3", "qwen2_5", "llama2", "gemma", "mistral_nemo"] {
        let file = dir.join(name).join("tokenizer.json");
        assert!(
            file.exists(),
            "{} is missing: run scripts/fetch-tokenizers",
            file.display()
        );
        let t = load(&file);
        let all = sweep(&app, &s, name, &t, CORPUS.len() as u64, 23).await;
        assert!(all > 100, "{name}: {all}");
        with_a_summary(&app, name, &t).await;
        // A message that begins with a newline is not another turn's
        // part after one ("User: x\n" in a text rendering), though the
        // counts kept of both are of "\nUser: x\n".
        let (a, b) = (sid(), sid());
        app.complete(&a, "x", "y").await;
        app.complete(&b, "\nUser: x\n", "y").await;
        app.history_ok(&a, &format!("encoding={name}&format=text"))
            .await;
        let h = app
            .history_ok(&b, &format!("encoding={name}&format=messages"))
            .await;
        assert_eq!(
            h["token_count"].as_u64().unwrap() as usize,
            count_of(&t, &h),
            "{h}"
        );
    }
}

/// A history with a summary (of two multilingual turns) before six turns:
/// read with it at every 17th budget, in `text` and `messages`, each
/// count is a fresh count of what is returned, within the budget.
async fn with_a_summary(app: &TestApp, encoding: &str, t: &Tokenizer) {
    let s = sid();
    for (q, a) in CORPUS {
        app.complete(&s, q, a).await;
    }
    let summary = format!("{}\n{}", CORPUS[1].1, CORPUS[2].1);
    let res = app
        .put_summary(&s, json!({"summary": summary, "through_seq": 2}))
        .await;
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    for format in ["text", "messages"] {
        let read = format!("encoding={encoding}&format={format}&summary=true");
        let whole = app
            .history_ok(&s, &format!("{read}&max_tokens=1000000"))
            .await;
        let all = whole["token_count"].as_u64().unwrap();
        assert_eq!(whole["included_turns"], 6, "{whole}");
        for max in (0..=all + 2).step_by(17) {
            let q = format!("{read}&max_tokens={max}");
            let h = app.history_ok(&s, &q).await;
            let n = h["token_count"].as_u64().unwrap();
            assert_eq!(n as usize, count_of(t, &h), "{q}: {h}");
            assert!(n <= max, "{q}: {h}");
        }
    }
}

async fn a_loaded_tokenizer_is_named_by_models_and_listed(backend: Backend) {
    let (app, _dir, file) = with_tiny(backend, "tiny-* = tiny\n").await;
    let s = sid();
    app.complete(&s, "hello", "the world").await;

    let h = app.history_ok(&s, "model=tiny-7b-instruct").await;
    assert_eq!(h["encoding"], "tiny", "{h}");
    let summary = json!({"summary": "the story so far", "through_seq": 1});
    let res = app
        .http
        .put(app.url(&format!("/v1/sessions/{s}/summary")))
        .json(&summary)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    let h = app
        .history_ok(&s, "encoding=tiny&format=turns&summary=true")
        .await;
    assert_eq!(
        h["summary"]["token_count"],
        fresh(&load(&file), "the story so far"),
        "{h}"
    );

    let doc: Value = app
        .http
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let known = &doc["components"]["schemas"]["Encoding"]["enum"];
    assert_eq!(known.as_array().unwrap().last().unwrap(), "tiny", "{known}");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"turnstore_tokenizer_memory_bytes{tokenizer="tiny"}"#),
        "{metrics}"
    );
    // The messages read counted its parts (a message each) and keeps them.
    app.history_ok(&s, "encoding=tiny&format=messages").await;
    let metrics = app.metrics().await;
    for name in [
        "turnstore_tokenizer_parts",
        "turnstore_tokenizer_parts_counted_total",
    ] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!(r#"{name}{{tokenizer="tiny"}}"#)))
            .unwrap_or_else(|| panic!("{name}: {metrics}"));
        let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 2, "{line}");
    }
}

async fn unknown_encodings_and_templates_are_refused(backend: Backend) {
    let (app, _dir, _file) = with_tiny(backend, "").await;
    let s = sid();
    app.complete(&s, "q1", "a1").await;

    let unknown = app.history(&s, "encoding=llama3").await;
    let templated = app.history(&s, "encoding=tiny&template=xml").await;
    let start = app
        .start(json!({"session_id": s, "user_query": "q2",
                      "history": {"encoding": "nope"}}))
        .await;

    let p = problem(unknown, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "encoding", "{p}");
    let message = p["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("o200k_base") && message.contains("tiny"),
        "{p}"
    );
    let p = problem(templated, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "template", "{p}");
    let p = problem(start, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "history.encoding", "{p}");
    let info = ok_json(app.session(&s).await, StatusCode::OK).await;
    assert_eq!(info["pending_count"], 0, "nothing was written: {info}");
}
