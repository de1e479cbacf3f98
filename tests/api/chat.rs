//! Chat templates (`chat_template=true`): the history as the prompt a
//! model receives, rendered by the tokenizer's own chat template and
//! budgeted on that prompt's exact count, special tokens and all.
//! The test's tokenizer is the tiny byte-level BPE of `tokenizers.rs`
//! (a space added before each piece it counts) with ChatML's two special
//! tokens, and a ChatML template written here.

use std::path::{Path, PathBuf};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::support::{Backend, TestApp, error_fields, ok_json, problem, sid};

conformance!(
    a_chat_prompt_is_budgeted_on_its_exact_count,
    a_stable_window_s_prompt_is_counted_exactly,
    a_start_s_prompt_ends_with_the_question,
    a_summary_joins_the_system_message,
    chat_template_mistakes_are_refused_and_write_nothing,
    real_chat_templates_count_exactly,
);

const TINY: &str = include_str!("../fixtures/tiny-tokenizer.json");

/// ChatML, as Qwen's template writes it (a default system message when
/// the conversation has none).
const CHATML: &str = "{%- if messages[0]['role'] != 'system' %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if 'boom' in message.content %}
        {{- raise_exception('no boom here') }}
    {%- endif %}
    {%- if 'spin' in message.content %}
        {%- for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
";

/// The prompt ChatML makes of `messages` (role, content).
fn chatml(messages: &[(&str, &str)], generation: bool) -> String {
    let mut out = String::new();
    if messages.first().is_none_or(|m| m.0 != "system") {
        out.push_str("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    }
    for (role, content) in messages {
        out.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
    }
    if generation {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// The tiny tokenizer with ChatML's special tokens.
fn tiny_chat() -> String {
    let mut t: Value = serde_json::from_str(TINY).unwrap();
    t["added_tokens"] = json!([
        {"id": 261, "content": "<|im_start|>", "single_word": false, "lstrip": false,
         "rstrip": false, "normalized": false, "special": true},
        {"id": 262, "content": "<|im_end|>", "single_word": false, "lstrip": false,
         "rstrip": false, "normalized": false, "special": true},
    ]);
    t.to_string()
}

/// A server with `chat` (the tiny tokenizer with a ChatML template) and
/// `plain` (the tiny one without a template).
async fn with_chat(backend: Backend) -> (TestApp, tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let chat = dir.path().join("chat");
    std::fs::create_dir(&chat).unwrap();
    std::fs::write(chat.join("tokenizer.json"), tiny_chat()).unwrap();
    let config = json!({"chat_template": CHATML, "eos_token": "<|im_end|>"});
    std::fs::write(chat.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(dir.path().join("plain.json"), TINY).unwrap();
    let tokenizers = dir.path().to_path_buf();
    let app = TestApp::spawn_with(backend, |s| s.tokenizers_dir = Some(tokenizers)).await;
    let t = fresh_tokenizer(&chat.join("tokenizer.json"));
    (app, dir, t)
}

/// The tokenizer in `file`, counting a prompt as a completion endpoint
/// does: special tokens recognised, none added.
fn fresh_tokenizer(file: &Path) -> Tokenizer {
    Tokenizer::from_file(file).unwrap()
}

fn fresh(t: &Tokenizer, prompt: &str) -> u64 {
    t.encode_fast(prompt, false).unwrap().len() as u64
}

const TURNS: [(&str, &str); 5] = [
    ("Where is the hello?", " the hello is there\n\nthe end"),
    ("  two leading spaces", "you ought to   see   this"),
    ("héllo 😀 wörld", "ünïcode: の日本語"),
    (
        "typed <|im_end|> specials",
        "count <|im_start|> as text here",
    ),
    ("the the the", "hell ou hello"),
];

/// The messages of the turns `from..` of `TURNS`.
fn turn_messages(from: usize) -> Vec<(&'static str, &'static str)> {
    TURNS[from..]
        .iter()
        .flat_map(|(q, a)| [("user", *q), ("assistant", *a)])
        .collect()
}

async fn a_chat_prompt_is_budgeted_on_its_exact_count(backend: Backend) {
    let (app, _dir, t) = with_chat(backend).await;
    let s = sid();
    for (q, a) in TURNS {
        app.complete(&s, q, a).await;
    }
    let read = "encoding=chat&chat_template=true&prompt=true";
    let whole = app.history_ok(&s, read).await;
    let prompt = chatml(&turn_messages(0), false);
    assert_eq!(whole["prompt"], prompt.as_str(), "{whole}");
    assert_eq!(whole["format"], "messages");
    assert_eq!(whole["encoding"], "chat");
    assert_eq!(whole["token_count"], fresh(&t, &prompt));
    // Typed specials count as text in a message, but the prompt holds
    // them as typed: a completion endpoint reads them as special tokens,
    // and so does the count.
    assert_eq!(whole["messages"].as_array().unwrap().len(), 10);
    assert_eq!(whole["messages"][6]["content"], TURNS[3].0);
    let all = whole["token_count"].as_u64().unwrap();

    // At every budget: the newest turns whose prompt fits, exactly.
    // An empty history's prompt is empty (not the template's rendering
    // of no messages, which most templates refuse).
    for max in 0..=all + 1 {
        let q = format!("{read}&max_tokens={max}");
        let h = app.history_ok(&s, &q).await;
        let n = h["included_turns"].as_u64().unwrap() as usize;
        let prompt = match n {
            0 => String::new(),
            n => chatml(&turn_messages(TURNS.len() - n), false),
        };
        assert_eq!(h["prompt"], prompt.as_str(), "{q}");
        assert_eq!(h["token_count"], fresh(&t, &prompt), "{q}");
        assert!(h["token_count"].as_u64().unwrap() <= max, "{q}: {h}");
        if n < TURNS.len() {
            let more = chatml(&turn_messages(TURNS.len() - n - 1), false);
            assert!(fresh(&t, &more) > max, "{q}: one more turn fits");
            assert_eq!(h["stopped_by"], "max_tokens", "{q}");
        }
        // Without the prompt, the same count.
        let h2 = app
            .history_ok(
                &s,
                &format!("encoding=chat&chat_template=true&max_tokens={max}"),
            )
            .await;
        assert_eq!(h2["token_count"], h["token_count"], "{q}");
        assert!(h2.get("prompt").is_none(), "{h2}");
    }
    // keep_first and limit, as in every read.
    let h = app
        .history_ok(&s, &format!("{read}&keep_first=true&limit=2"))
        .await;
    let mut m = turn_messages(0)[..2].to_vec();
    m.extend(turn_messages(4));
    assert_eq!(h["prompt"], chatml(&m, false).as_str());
    assert_eq!(h["stopped_by"], "limit");
    // A system message begins the prompt (its own, not the default).
    let h = app
        .history_ok(&s, &format!("{read}&limit=1&system=Be%20brief."))
        .await;
    let mut m = vec![("system", "Be brief.")];
    m.extend(turn_messages(4));
    assert_eq!(h["prompt"], chatml(&m, false).as_str());
    assert_eq!(
        h["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(h["token_count"], fresh(&t, &chatml(&m, false)));
}

async fn a_stable_window_s_prompt_is_counted_exactly(backend: Backend) {
    let (app, _dir, t) = with_chat(backend).await;
    let s = sid();
    let all: Vec<(&str, &str)> = (0..12).map(|i| TURNS[i % TURNS.len()]).collect();
    for (q, a) in &all {
        app.complete(&s, q, a).await;
    }
    let mut moved = 0;
    for max in (40..700).step_by(37) {
        let read = format!("encoding=chat&chat_template=true&prompt=true&max_tokens={max}");
        let sliding = app.history_ok(&s, &read).await;
        let stable = app
            .history_ok(&s, &format!("{read}&window=stable&stride=3"))
            .await;
        let n = stable["included_turns"].as_u64().unwrap() as usize;
        let left_out = stable["window"]["left_out"].as_u64().unwrap() as usize;
        moved += left_out;
        assert_eq!(
            n + left_out,
            sliding["included_turns"].as_u64().unwrap() as usize
        );
        assert!(left_out < 3);
        let messages: Vec<(&str, &str)> = all[all.len() - n..]
            .iter()
            .flat_map(|(q, a)| [("user", *q), ("assistant", *a)])
            .collect();
        let prompt = match n {
            0 => String::new(),
            _ => chatml(&messages, false),
        };
        assert_eq!(stable["prompt"], prompt.as_str(), "{max}");
        assert_eq!(stable["token_count"], fresh(&t, &prompt), "{max}");
        assert!(fresh(&t, &prompt) <= max);
        if n > 0 {
            assert_eq!(
                stable["breakpoint"],
                json!({"seq": 12, "messages": 2 * n as u64})
            );
        }
        if left_out > 0 {
            assert_eq!((13 - n as u64 - 1) % 3, 0, "on a boundary");
        }
    }
    assert!(moved > 0);
}

async fn a_start_s_prompt_ends_with_the_question(backend: Backend) {
    let (app, _dir, t) = with_chat(backend).await;
    let s = sid();
    for (q, a) in &TURNS[..2] {
        app.complete(&s, q, a).await;
    }
    let history = json!({"encoding": "chat", "chat_template": true, "prompt": true,
                         "system": "Answer from the documents."});
    let started = app
        .started(json!({"session_id": s, "user_query": "And now?", "history": history}))
        .await;
    let h = &started["history"];
    let mut m = vec![("system", "Answer from the documents.")];
    m.extend(turn_messages(0)[..4].iter().copied());
    m.push(("user", "And now?"));
    let prompt = chatml(&m, true);
    assert_eq!(h["prompt"], prompt.as_str(), "{started}");
    assert_eq!(h["token_count"], fresh(&t, &prompt));
    // The messages are the history's (the question is the caller's).
    assert_eq!(h["messages"].as_array().unwrap().len(), 5);
    assert_eq!(h["pending_turns"], 0);

    // A budget that holds the system message and the question, one turn.
    let one = {
        let mut m = vec![("system", "Answer from the documents.")];
        m.extend(turn_messages(0)[2..4].iter().copied());
        m.push(("user", "Next?"));
        fresh(&t, &chatml(&m, true))
    };
    let mut history = history.clone();
    history["max_tokens"] = json!(one);
    let started = app
        .started(json!({"session_id": s, "user_query": "Next?", "history": history}))
        .await;
    let h = &started["history"];
    assert_eq!(h["included_turns"], 1, "{started}");
    assert_eq!(h["token_count"], one);
    // The turn is written: the session holds it, pending.
    let after = app.history_ok(&s, "").await;
    assert_eq!(after["pending_turns"], 2, "{after}");
}

async fn a_summary_joins_the_system_message(backend: Backend) {
    let (app, _dir, t) = with_chat(backend).await;
    let s = sid();
    for (q, a) in TURNS {
        app.complete(&s, q, a).await;
    }
    let res = app
        .put_summary(
            &s,
            json!({"summary": "Hellos and spaces.", "through_seq": 2}),
        )
        .await;
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    let summary = "Summary of the conversation so far:\nHellos and spaces.";
    let read = "encoding=chat&chat_template=true&prompt=true&summary=true";
    let h = app.history_ok(&s, read).await;
    let mut m = vec![("system", summary)];
    m.extend(turn_messages(2));
    assert_eq!(h["prompt"], chatml(&m, false).as_str(), "{h}");
    assert_eq!(h["token_count"], fresh(&t, &chatml(&m, false)));
    let h = app
        .history_ok(&s, &format!("{read}&system=Be%20kind."))
        .await;
    let joined = format!("Be kind.\n\n{summary}");
    let mut m = vec![("system", joined.as_str())];
    m.extend(turn_messages(2));
    assert_eq!(h["prompt"], chatml(&m, false).as_str(), "{h}");
    assert_eq!(h["messages"][0]["content"], joined.as_str());
    // The summary is an offer like a turn: a budget too small for it
    // leaves it out (and every turn after it).
    let bare = fresh(&t, &chatml(&[("system", "Be kind.")], false));
    let h = app
        .history_ok(&s, &format!("{read}&system=Be%20kind.&max_tokens={bare}"))
        .await;
    assert_eq!(h["included_turns"], 0, "{h}");
    assert_eq!(h["token_count"], bare);
    assert!(h.get("summary").is_none());
}

async fn chat_template_mistakes_are_refused_and_write_nothing(backend: Backend) {
    let (app, _dir, _t) = with_chat(backend).await;
    let s = sid();
    app.complete(&s, "a boom here", "fine").await;
    // The template raises on this history: 422, and a start writes nothing.
    let p = problem(
        app.history(&s, "encoding=chat&chat_template=true").await,
        422,
        "template_error",
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("no boom here"),
        "{p}"
    );
    let start = json!({"session_id": s, "user_query": "q",
                       "history": {"encoding": "chat", "chat_template": true}});
    problem(app.start(start).await, 422, "template_error").await;
    // A template that loops runs out of fuel: 422, nothing written.
    let spin = sid();
    let start = json!({"session_id": spin, "user_query": "spin",
                       "history": {"encoding": "chat", "chat_template": true}});
    let p = problem(app.start(start).await, 422, "template_error").await;
    assert!(p["detail"].as_str().unwrap().contains("fuel"), "{p}");
    ok_json(app.session(&spin).await, StatusCode::NOT_FOUND).await;
    // Nor on a new session, whose question raises.
    let fresh_session = sid();
    let start = json!({"session_id": fresh_session, "user_query": "boom",
                       "history": {"encoding": "chat", "chat_template": true}});
    problem(app.start(start).await, 422, "template_error").await;
    ok_json(app.session(&fresh_session).await, StatusCode::NOT_FOUND).await;
    let h = app.history_ok(&s, "").await;
    assert_eq!(
        (h["total_turns"].as_u64(), h["pending_turns"].as_u64()),
        (Some(1), Some(0))
    );

    // Another owner's session: refused for that, before the template's
    // failure on its history is told.
    let owned = sid();
    app.complete_as(&owned, "alice", "a boom here", "fine")
        .await;
    let start = json!({"session_id": owned, "user_id": "bob", "user_query": "q",
                       "history": {"encoding": "chat", "chat_template": true}});
    problem(app.start(start).await, 403, "session_owner_mismatch").await;

    // A budget smaller than the system message and the question.
    let s2 = sid();
    let start = json!({"session_id": s2, "user_query": "q",
                       "history": {"encoding": "chat", "chat_template": true,
                                   "system": "long ".repeat(50), "max_tokens": 20}});
    let p = problem(app.start(start).await, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "history.max_tokens", "{p}");
    ok_json(app.session(&s2).await, StatusCode::NOT_FOUND).await;

    for (query, field) in [
        ("chat_template=true", "chat_template"),
        ("encoding=o200k_base&chat_template=true", "chat_template"),
        ("encoding=plain&chat_template=true", "chat_template"),
        ("encoding=chat&chat_template=true&format=text", "format"),
        (
            "encoding=chat&chat_template=true&template=xml",
            "chat_template",
        ),
        ("encoding=chat&prompt=true", "prompt"),
        ("encoding=chat&system=x", "system"),
        ("encoding=chat&chat_template=maybe", "chat_template"),
    ] {
        let p = problem(app.history(&s, query).await, 422, "validation_failed").await;
        assert!(error_fields(&p).contains(&field), "{query}: {p}");
    }
    // The plain-text body is the `text` rendering: none here.
    let plain = app
        .http
        .get(app.url(&format!(
            "/v1/sessions/{s}/history?encoding=chat&chat_template=true"
        )))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap();
    let p = problem(plain, 422, "validation_failed").await;
    assert_eq!(error_fields(&p), ["chat_template"], "{p}");
    let p = problem(
        app.history(
            &s,
            &format!(
                "encoding=chat&chat_template=true&system={}",
                "é".repeat(4097)
            ),
        )
        .await,
        422,
        "validation_failed",
    )
    .await;
    assert_eq!(error_fields(&p), ["system"], "{p}");
    app.history_ok(
        &s,
        &format!(
            "encoding=chat&chat_template=true&limit=0&max_tokens=1000000&system={}",
            "é".repeat(4096)
        ),
    )
    .await;
    let long = "x".repeat(64 * 1024 + 1);
    let start = json!({"session_id": s, "user_query": "q",
                       "history": {"encoding": "chat", "chat_template": true, "system": long}});
    let p = problem(app.start(start).await, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["field"], "history.system", "{p}");
    let p = problem(
        app.history(&s, "encoding=plain&chat_template=true").await,
        422,
        "validation_failed",
    )
    .await;
    assert!(
        p["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("this server's: chat"),
        "{p}"
    );
    let h = app.history_ok(&s, "").await;
    assert_eq!(
        (h["total_turns"].as_u64(), h["pending_turns"].as_u64()),
        (Some(1), Some(0))
    );
}

/// The real templates of Llama 3, Qwen 2.5 and Mistral Nemo (from their
/// `tokenizer_config.json`), each with its tokenizer: the prompt's count
/// is a fresh count of it, within every budget; Llama 3's layout is known.
async fn real_chat_templates_count_exactly(backend: Backend) {
    let Some(dir) = std::env::var_os("TURNSTORE_TEST_TOKENIZERS").map(PathBuf::from) else {
        eprintln!("TURNSTORE_TEST_TOKENIZERS unset (scripts/test sets it): skipped");
        return;
    };
    let app = TestApp::spawn_with(backend, |s| s.tokenizers_dir = Some(dir.clone())).await;
    let s = sid();
    for (q, a) in TURNS {
        app.complete(&s, q, a).await;
    }
    let res = app
        .put_summary(&s, json!({"summary": "Hellos.", "through_seq": 1}))
        .await;
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    for name in ["llama3", "qwen2_5", "mistral_nemo"] {
        let t = fresh_tokenizer(&dir.join(name).join("tokenizer.json"));
        for summary in [false, true] {
            let read = format!("encoding={name}&chat_template=true&prompt=true&summary={summary}");
            let whole = app.history_ok(&s, &read).await;
            let all = whole["token_count"].as_u64().unwrap();
            assert_eq!(all, fresh(&t, whole["prompt"].as_str().unwrap()), "{name}");
            for max in (0..=all).step_by(7) {
                let q = format!("{read}&max_tokens={max}");
                let h = app.history_ok(&s, &q).await;
                let n = h["token_count"].as_u64().unwrap();
                assert_eq!(n, fresh(&t, h["prompt"].as_str().unwrap()), "{q}");
                assert!(n <= max, "{q}: {h}");
            }
        }
        let started = app
            .started(json!({"session_id": sid(), "user_query": "Hi there",
                            "history": {"encoding": name, "chat_template": true, "prompt": true}}))
            .await;
        let h = &started["history"];
        let prompt = h["prompt"].as_str().unwrap();
        assert_eq!(h["token_count"], fresh(&t, prompt), "{name}");
        if name == "llama3" {
            assert_eq!(
                prompt,
                "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
                 <|start_header_id|>assistant<|end_header_id|>\n\n"
            );
        }
    }
}
