//! Prompt-cache-friendly histories: stable windows (`window=stable`),
//! breakpoints, and the Anthropic Messages API shape (`format=anthropic`).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Backend, TestApp, count, error_fields, ok_json, problem, seqs, sid};

conformance!(
    a_stable_window_keeps_its_prefix_until_the_boundary,
    a_stable_window_keeps_the_summary_and_first_turn_in_front,
    a_start_reads_the_same_stable_window,
    stable_windows_count_templates_and_every_format_exactly,
    anthropic_is_a_messages_api_request,
    window_and_cache_control_are_validated,
    a_stable_read_makes_the_calls_a_sliding_one_does,
);

/// Turn `i` of a conversation of uneven turns (8 to 30 words a text).
fn texts(i: usize) -> (String, String) {
    let q = format!("Question {i}: {}?", "how does it work ".repeat(2 + i % 3));
    let a = format!(
        "Answer {i}. {}",
        "It depends on the index. ".repeat(1 + i * 7 % 5)
    );
    (q, a)
}

fn turns_of(h: &Value) -> usize {
    h["included_turns"].as_u64().unwrap() as usize
}

async fn a_stable_window_keeps_its_prefix_until_the_boundary(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let stride = 4;
    let (mut previous, mut jumps, mut full) = (None::<(u64, String)>, 0, 0);
    for i in 1..=36 {
        let (q, a) = texts(i);
        app.complete(&s, &q, &a).await;
        let budget = "max_tokens=420";
        let stable = format!("{budget}&window=stable&stride={stride}");
        let sliding = app.history_ok(&s, &format!("{budget}&format=turns")).await;
        let window = app.history_ok(&s, &format!("{stable}&format=turns")).await;
        let text = app.history_ok(&s, &stable).await;
        let rendered = text["rendered"].as_str().unwrap().to_owned();

        // The window is the sliding one without its oldest turns.
        let (all, shown) = (seqs(&sliding), seqs(&window));
        let left_out = window["window"]["left_out"].as_u64().unwrap() as usize;
        assert_eq!(shown[..], all[left_out..], "turn {i}");
        assert!(left_out < stride, "turn {i}: {left_out}");
        assert_eq!(window["stopped_by"], sliding["stopped_by"], "turn {i}");
        assert_eq!(window["window"]["stride"], stride as u64);
        let from = window["window"]["from_seq"].as_u64().unwrap();
        assert_eq!(from, shown[0]);
        if left_out > 0 {
            assert_eq!((from - 1) % stride as u64, 0, "turn {i}: on a boundary");
        }
        // Counted exactly; what it leaves out is unsummarized.
        assert_eq!(
            text["token_count"].as_u64().unwrap() as usize,
            count("o200k_base", &rendered)
        );
        assert_eq!(turns_of(&text), shown.len());
        let omitted = i - shown.len();
        match omitted {
            0 => assert_eq!(text["unsummarized"], Value::Null),
            n => assert_eq!(text["unsummarized"]["turns"], n as u64, "turn {i}"),
        }
        assert_eq!(
            text["breakpoint"],
            json!({"seq": i as u64, "bytes": rendered.len() as u64}),
            "turn {i}"
        );
        // The same first turn: the previous rendering is where this one
        // begins.
        if sliding["stopped_by"] != Value::Null {
            full += 1;
        }
        if let Some((was, before)) = &previous {
            if *was == from {
                assert!(rendered.starts_with(before.as_str()), "turn {i}");
            } else {
                jumps += 1;
            }
        }
        previous = Some((from, rendered));
    }
    // About one read in a stride begins elsewhere once the budget is full.
    assert!(full > 20, "{full}");
    assert!(jumps <= full / stride + 1, "{jumps} of {full}");
}

async fn a_stable_window_keeps_the_summary_and_first_turn_in_front(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=24 {
        let (q, a) = texts(i);
        app.complete(&s, &q, &a).await;
    }
    let res = app
        .put_summary(
            &s,
            json!({"summary": "Alice compares vector indexes.", "through_seq": 2}),
        )
        .await;
    ok_json(res, StatusCode::OK).await;
    let query = "summary=true&keep_first=true&max_tokens=500&window=stable&stride=3";
    let turns = app.history_ok(&s, &format!("{query}&format=turns")).await;
    let shown = seqs(&turns);
    assert_eq!(shown[0], 3, "the first candidate after the summary");
    assert_eq!(turns["summary"]["through_seq"], 2);
    assert_eq!(turns["window"]["from_seq"], shown[1]);
    let sliding = app
        .history_ok(
            &s,
            "summary=true&keep_first=true&max_tokens=500&format=turns",
        )
        .await;
    let all = seqs(&sliding);
    let left_out = turns["window"]["left_out"].as_u64().unwrap() as usize;
    assert!(left_out > 0, "a boundary to move to: {all:?}");
    assert_eq!((shown[1] - 1) % 3, 0, "{shown:?}");
    assert_eq!(shown[1..], all[1 + left_out..]);

    let messages = app
        .history_ok(&s, &format!("{query}&format=messages"))
        .await;
    let m = messages["messages"].as_array().unwrap();
    assert_eq!(m[0]["role"], "system");
    assert_eq!(m.len(), 1 + 2 * shown.len());
    let counted: usize = m
        .iter()
        .map(|m| count("o200k_base", m["content"].as_str().unwrap()) + 4)
        .sum();
    assert_eq!(messages["token_count"].as_u64().unwrap() as usize, counted);
    assert_eq!(
        messages["breakpoint"],
        json!({"seq": 24, "messages": m.len() as u64})
    );
    // Every turn between the summary and the window is unsummarized but
    // the kept first.
    let u = &messages["unsummarized"];
    assert_eq!(
        (u["after_seq"].clone(), u["turns"].clone()),
        (json!(2), json!(shown[1] - 4))
    );
    assert_eq!(u["through_seq"], shown[1] - 1);
}

async fn a_start_reads_the_same_stable_window(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=15 {
        let (q, a) = texts(i);
        app.complete(&s, &q, &a).await;
    }
    let options = json!({"max_tokens": 300, "window": "stable", "stride": 5, "format": "turns"});
    let read = app
        .history_ok(&s, "max_tokens=300&window=stable&stride=5&format=turns")
        .await;
    let started = app
        .started(json!({"session_id": s, "user_query": "next?", "history": options}))
        .await;
    let h = &started["history"];
    assert_eq!(seqs(h), seqs(&read));
    assert_eq!(h["window"], read["window"]);
    assert_eq!(h["token_count"], read["token_count"]);
    assert!(read["window"]["left_out"].as_u64().unwrap() > 0, "{read}");
}

async fn stable_windows_count_templates_and_every_format_exactly(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=20 {
        let (q, a) = texts(i);
        app.complete(&s, &q, &a).await;
    }
    for max_tokens in [150, 333, 600] {
        let stable = format!("max_tokens={max_tokens}&window=stable&stride=3");
        for extra in ["template=xml", "template=markdown", "encoding=cl100k_base"] {
            let h = app.history_ok(&s, &format!("{stable}&{extra}")).await;
            let encoding = h["encoding"].as_str().unwrap();
            let rendered = h["rendered"].as_str().unwrap();
            assert_eq!(
                h["token_count"].as_u64().unwrap() as usize,
                count(encoding, rendered),
                "{extra}"
            );
            assert!(h["token_count"].as_u64().unwrap() <= max_tokens);
            assert_eq!(h["breakpoint"]["bytes"], rendered.len() as u64);
            let sliding = app
                .history_ok(&s, &format!("max_tokens={max_tokens}&{extra}"))
                .await;
            let left_out = h["window"]["left_out"].as_u64().unwrap();
            assert_eq!(turns_of(&h) as u64 + left_out, turns_of(&sliding) as u64);
        }
        let anthropic = app
            .history_ok(&s, &format!("{stable}&format=anthropic"))
            .await;
        let messages = app
            .history_ok(&s, &format!("{stable}&format=messages"))
            .await;
        assert_eq!(anthropic["token_count"], messages["token_count"]);
        assert_eq!(anthropic["window"], messages["window"]);
    }
}

/// Checks `h` against the Messages API's request schema (its reference:
/// `system` a string or text blocks; `messages` of `role` user or
/// assistant, alternating from a user message, `content` a string or
/// content blocks; a text block `{"type": "text", "text", "cache_control"?}`
/// with non-blank text; `cache_control` `{"type": "ephemeral", "ttl"?}`):
/// what a request may hold beside `model` and `max_tokens`, no other
/// field. Returns the texts in order, and where the breakpoints are.
fn messages_api_request(h: &Value) -> (Vec<String>, Vec<String>) {
    let (mut texts, mut marks) = (Vec::new(), Vec::new());
    let obj = h.as_object().unwrap();
    for key in obj.keys() {
        assert!(["system", "messages"].contains(&key.as_str()), "{key}");
    }
    let mut block = |b: &Value, at: String| {
        let b = b.as_object().unwrap();
        for key in b.keys() {
            assert!(
                ["type", "text", "cache_control"].contains(&key.as_str()),
                "{key}"
            );
        }
        assert_eq!(b["type"], "text");
        let text = b["text"].as_str().unwrap();
        assert!(!text.trim().is_empty(), "a blank block at {at}");
        texts.push(text.to_owned());
        if let Some(c) = b.get("cache_control") {
            assert_eq!(c, &json!({"type": "ephemeral"}));
            marks.push(at);
        }
    };
    if let Some(system) = obj.get("system") {
        for (i, b) in system.as_array().unwrap().iter().enumerate() {
            block(b, format!("system.{i}"));
        }
    }
    let messages = obj["messages"].as_array().unwrap();
    for (i, m) in messages.iter().enumerate() {
        let m = m.as_object().unwrap();
        assert_eq!(m.len(), 2, "role and content: {m:?}");
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        assert_eq!(m["role"], role, "alternating from a user message");
        let content = m["content"].as_array().unwrap();
        assert!(!content.is_empty());
        for (j, b) in content.iter().enumerate() {
            block(b, format!("messages.{i}.content.{j}"));
        }
    }
    assert!(marks.len() <= 4, "at most four breakpoints a request");
    (texts, marks)
}

async fn anthropic_is_a_messages_api_request(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    let empty = app
        .history_ok(&s, "format=anthropic&cache_control=true")
        .await;
    assert_eq!(empty["anthropic"], json!({"messages": []}));
    assert_eq!(empty["breakpoint"], Value::Null);
    assert_eq!(empty["token_count"], 0);
    for i in 1..=6 {
        let (q, a) = texts(i);
        app.complete(&s, &q, &a).await;
    }
    let plain = app.history_ok(&s, "format=anthropic").await;
    let (texts, marks) = messages_api_request(&plain["anthropic"]);
    assert!(marks.is_empty());
    assert_eq!(plain["format"], "anthropic");
    assert!(plain.get("messages").is_none() && plain.get("rendered").is_none());
    assert_eq!(plain.get("breakpoint"), None, "not asked for");
    let messages = app.history_ok(&s, "format=messages").await;
    let same: Vec<String> = messages["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(texts, same, "the texts of format=messages");
    assert_eq!(plain["token_count"], messages["token_count"]);

    let res = app
        .put_summary(
            &s,
            json!({"summary": "Alice asked six questions.", "through_seq": 2}),
        )
        .await;
    ok_json(res, StatusCode::OK).await;
    let marked = app
        .history_ok(
            &s,
            "format=anthropic&summary=true&cache_control=true&max_tokens=250",
        )
        .await;
    let (texts, marks) = messages_api_request(&marked["anthropic"]);
    let n = marked["anthropic"]["messages"].as_array().unwrap().len();
    assert_eq!(
        marks,
        [
            "system.0".to_owned(),
            format!("messages.{}.content.0", n - 1)
        ]
    );
    assert!(
        texts[0].ends_with("Alice asked six questions."),
        "{texts:?}"
    );
    let counted: usize = texts.iter().map(|t| count("o200k_base", t) + 4).sum();
    assert_eq!(marked["token_count"].as_u64().unwrap() as usize, counted);
    assert!(counted <= 250);
    assert_eq!(
        marked["breakpoint"],
        json!({"seq": 6, "messages": n as u64})
    );
}

async fn window_and_cache_control_are_validated(backend: Backend) {
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for (query, fields) in [
        ("stride=3", vec!["stride"]),
        ("window=stable&stride=0", vec!["stride"]),
        ("window=stable&stride=10001", vec!["stride"]),
        ("cache_control=true", vec!["cache_control"]),
        ("format=messages&cache_control=true", vec!["cache_control"]),
        ("format=anthropic&template=xml", vec!["format"]),
        ("format=anthropic&chat_template=true", vec!["format"]),
    ] {
        let p = problem(app.history(&s, query).await, 422, "validation_failed").await;
        let named = error_fields(&p);
        for f in &fields {
            assert!(named.contains(f), "{query}: {named:?}");
        }
    }
    let p = problem(
        app.history(&s, "window=fixed").await,
        422,
        "validation_failed",
    )
    .await;
    assert!(error_fields(&p).contains(&"window"), "{p}");
    // In a start, the fields are named under `history.`, and nothing is
    // written.
    let res = app
        .start(json!({"session_id": s, "user_query": "q", "history": {"stride": 2}}))
        .await;
    let p = problem(res, 422, "validation_failed").await;
    assert_eq!(error_fields(&p), ["history.stride"]);
    let info = app.session(&s).await;
    assert_eq!(info.status(), StatusCode::NOT_FOUND);
    // window=sliding is the default, and says nothing more.
    let h = app.history_ok(&s, "window=sliding").await;
    assert!(h.get("window").is_none() && h.get("breakpoint").is_none());
    // Plain text has no field for them.
    let res = app
        .http
        .get(app.url(&format!("/v1/sessions/{s}/history?format=anthropic")))
        .header("accept", "text/plain")
        .send()
        .await
        .unwrap();
    problem(res, 422, "validation_failed").await;
}

/// Scripts Redis ran for its clients so far (all nodes): a read's round
/// trips.
fn commands(app: &TestApp) -> u64 {
    let scripts = ["evalsha", "eval", "fcall", "fcall_ro"];
    app.redis_info_sum("commandstats", |l| {
        let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
        scripts.contains(&name).then(|| {
            let calls = stats
                .split("calls=")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            calls.parse::<u64>().unwrap()
        })
    })
}

async fn a_stable_read_makes_the_calls_a_sliding_one_does(backend: Backend) {
    if backend == Backend::Memory {
        return;
    }
    let app = TestApp::spawn(backend).await;
    let s = sid();
    for i in 1..=20 {
        let (q, a) = texts(i);
        app.complete(&s, &q, &a).await;
    }
    // The walk describes what a stable window leaves out as it ends: no
    // script call more than a sliding read.
    let mut made = Vec::new();
    for query in ["limit=8", "limit=8&window=stable&stride=5"] {
        let before = commands(&app);
        let h = app.history_ok(&s, query).await;
        made.push((commands(&app) - before, h));
    }
    let (sliding, stable) = (&made[0].1, &made[1].1);
    assert_eq!(stable["window"]["left_out"], 3, "from 16: {stable}");
    assert_eq!(made[0].0, made[1].0, "calls");
    assert_eq!(sliding["unsummarized"]["turns"], 12);
    assert_eq!(
        stable["unsummarized"],
        json!({"after_seq": 0, "through_seq": 15, "turns": 15, "tokens": stable["unsummarized"]["tokens"]})
    );
    assert!(
        stable["unsummarized"]["tokens"].as_u64().unwrap()
            > sliding["unsummarized"]["tokens"].as_u64().unwrap()
    );
    // And with a start, a summary and keep_first.
    let res = app
        .put_summary(&s, json!({"summary": "Earlier turns.", "through_seq": 3}))
        .await;
    ok_json(res, StatusCode::OK).await;
    let options =
        json!({"limit": 6, "window": "stable", "stride": 4, "summary": true, "keep_first": true});
    let read = app
        .history_ok(
            &s,
            "limit=6&window=stable&stride=4&summary=true&keep_first=true",
        )
        .await;
    let started = app
        .started(json!({"session_id": s, "user_query": "next?", "history": options}))
        .await;
    assert_eq!(started["history"]["unsummarized"], read["unsummarized"]);
    assert_eq!(started["history"]["window"], read["window"]);
}
