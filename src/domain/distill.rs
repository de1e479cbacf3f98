//! Distilling a transcript as agent loops write them (OpenAI chat messages,
//! Anthropic messages) to what turnstore keeps: each exchange's question
//! and final answer (an import's `mode: "distill"`).
//!
//! One pass, oldest first. A user message's text (a string, or its `text`
//! parts) joins the pending question, consecutive ones after a blank line;
//! a user message with no text (Anthropic's `tool_result` blocks come in
//! user messages) is no question. An assistant (or `orchestrator`)
//! message's text is the answer so far: the last one before the next
//! question wins. A question that arrives once there is an answer closes
//! the exchange. Everything else is dropped and counted by reason: system
//! and developer prompts, tool and function results (`tool_result` blocks
//! and server tools' `…_tool_result`), tool calls (`tool_calls`,
//! `tool_use`, `…_tool_use`), thinking,
//! refusals, images and other parts, and a last question with no answer.
//!
//! A message may carry a `timestamp` (RFC 3339, with its zone): the
//! timestamps given must not go back, nor be later than now, and when one
//! exchange has times, all must (its first question's and its answer's).

use std::collections::BTreeMap;

use chrono::DateTime;
use serde_json::Value;

use crate::turn::Millis;

/// Why a message, or a part of one, was not kept.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Dropped {
    /// `system` and `developer` messages (and an assistant's words before
    /// any question).
    Instructions,
    /// `tool` and `function` messages, Anthropic `tool_result` blocks.
    ToolResult,
    /// `tool_calls`, `function_call`, Anthropic `tool_use` blocks.
    ToolCall,
    /// `thinking` and `redacted_thinking` blocks.
    Thinking,
    /// `refusal` parts (and `refusal` fields).
    Refusal,
    /// Images, audio, files: parts that are not text.
    NonText,
    /// An assistant text that a later one of the same exchange replaced.
    Superseded,
    /// A question with no answer after it (the transcript's last).
    Unanswered,
}

/// A distilled exchange: its question and answer, and the indexes of the
/// messages they came from (the first question's, the answer's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub question: String,
    pub answer: String,
    pub asked_at: usize,
    pub answered_at: usize,
    /// When it was asked and answered: the two messages' timestamps.
    pub times: Option<(Millis, Millis)>,
}

/// What a transcript distils to, and what it dropped: by reason, how many
/// and the first few message indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Distilled {
    pub exchanges: Vec<Exchange>,
    pub dropped: BTreeMap<Dropped, (u64, Vec<usize>)>,
}

/// The indexes of each reason's drops a report names.
pub const FIRST_INDEXES: usize = 5;

/// A message the distiller cannot read: its index, the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub field: String,
    pub message: &'static str,
}

impl Distilled {
    fn drop(&mut self, why: Dropped, at: usize) {
        let (n, first) = self.dropped.entry(why).or_default();
        *n += 1;
        if first.len() < FIRST_INDEXES {
            first.push(at);
        }
    }
}

/// Distils `messages` (JSON objects, oldest first), at `now`. Malformed
/// messages are all reported, by index, and nothing is distilled.
pub fn distill(messages: &[Value], now: Millis) -> Result<Distilled, Vec<Malformed>> {
    let mut out = Distilled::default();
    let mut errors = Vec::new();
    let times = match timestamps(messages, now) {
        Ok(t) => t,
        Err(e) => {
            errors.extend(e);
            Vec::new()
        }
    };
    let time = |i: usize| times.get(i).copied().flatten();
    // The question being asked (its text and first index), and the answer
    // so far (its text and index).
    let mut question: Option<(String, usize)> = None;
    let mut answer: Option<(String, usize)> = None;
    for (i, m) in messages.iter().enumerate() {
        let field = |name: &str| format!("messages[{i}].{name}");
        let Some(obj) = m.as_object() else {
            errors.push(Malformed {
                field: format!("messages[{i}]"),
                message: "must be an object",
            });
            continue;
        };
        let Some(role) = obj.get("role").and_then(Value::as_str) else {
            errors.push(Malformed {
                field: field("role"),
                message: "must be a string",
            });
            continue;
        };
        let texts = match texts(obj.get("content"), i, &mut out) {
            Ok(t) => t,
            Err(message) => {
                errors.push(Malformed {
                    field: field("content"),
                    message,
                });
                continue;
            }
        };
        match role {
            "user" => {
                if texts.is_empty() {
                    continue; // tool results only: no question
                }
                if let Some((a, at)) = answer.take() {
                    let (q, asked_at) = question.take().expect("an answer follows a question");
                    out.exchanges.push(Exchange {
                        question: q,
                        answer: a,
                        asked_at,
                        answered_at: at,
                        times: time(asked_at).zip(time(at)),
                    });
                }
                match question.as_mut() {
                    Some((q, _)) => {
                        q.push_str("\n\n");
                        q.push_str(&texts);
                    }
                    None => question = Some((texts, i)),
                }
            }
            "assistant" | "orchestrator" => {
                if obj.get("tool_calls").is_some_and(|c| !c.is_null())
                    || obj.get("function_call").is_some_and(|c| !c.is_null())
                {
                    out.drop(Dropped::ToolCall, i);
                }
                if obj.get("refusal").is_some_and(|r| !r.is_null()) {
                    out.drop(Dropped::Refusal, i);
                }
                if texts.is_empty() {
                    continue;
                }
                if question.is_none() {
                    // An assistant's opening words answer nothing.
                    out.drop(Dropped::Instructions, i);
                    continue;
                }
                if let Some((_, before)) = answer.replace((texts, i)) {
                    out.drop(Dropped::Superseded, before);
                }
            }
            "system" | "developer" => out.drop(Dropped::Instructions, i),
            "tool" | "function" => out.drop(Dropped::ToolResult, i),
            _ => errors.push(Malformed {
                field: field("role"),
                message: "must be user, assistant, orchestrator, system, developer, tool or function",
            }),
        }
    }
    match (question, answer) {
        (Some((q, asked_at)), Some((a, at))) => out.exchanges.push(Exchange {
            question: q,
            answer: a,
            asked_at,
            answered_at: at,
            times: time(asked_at).zip(time(at)),
        }),
        (Some((_, asked_at)), None) => out.drop(Dropped::Unanswered, asked_at),
        _ => {}
    }
    // Times for every exchange, or for none.
    if errors.is_empty() && out.exchanges.iter().any(|e| e.times.is_some()) {
        for e in out.exchanges.iter().filter(|e| e.times.is_none()) {
            let at = if time(e.asked_at).is_none() {
                e.asked_at
            } else {
                e.answered_at
            };
            errors.push(Malformed {
                field: format!("messages[{at}].timestamp"),
                message: "is needed: when one question or answer has a timestamp, all do",
            });
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(out)
}

/// Each message's `timestamp` (absent or null: none), in milliseconds; the
/// ones given must not go back, nor be later than `now`.
fn timestamps(messages: &[Value], now: Millis) -> Result<Vec<Option<Millis>>, Vec<Malformed>> {
    let mut out = Vec::with_capacity(messages.len());
    let mut errors = Vec::new();
    let mut latest: Option<Millis> = None;
    for (i, m) in messages.iter().enumerate() {
        let given = match m.get("timestamp") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        };
        let Some(given) = given else {
            out.push(None);
            continue;
        };
        let mut fail = |message| {
            errors.push(Malformed {
                field: format!("messages[{i}].timestamp"),
                message,
            })
        };
        let at = given
            .as_str()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.timestamp_millis());
        match at {
            None => fail("must be an RFC 3339 date-time with its zone, like 2026-11-27T09:30:00Z"),
            Some(t) if t < 0 => fail("must not be before 1970"),
            Some(t) if t > now => fail("must not be later than now"),
            Some(t) if latest.is_some_and(|l| t < l) => {
                fail("must not be earlier than the timestamp before it")
            }
            Some(t) => latest = Some(t),
        }
        out.push(at);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The text of a message's content (`null`, a string, or an array of
/// parts whose `text` parts are joined by a blank line); other parts are
/// counted as dropped.
fn texts(content: Option<&Value>, at: usize, out: &mut Distilled) -> Result<String, &'static str> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.trim().to_owned()),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err("must be a string, an array of parts or null"),
    };
    let mut text = String::new();
    for p in parts {
        let kind = p
            .get("type")
            .and_then(Value::as_str)
            .ok_or("each part must have a type")?;
        match kind {
            "text" | "input_text" | "output_text" => {
                let t = p
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or("a text part must have a text")?;
                let t = t.trim();
                if !t.is_empty() {
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(t);
                }
            }
            // Anthropic's server tools: `server_tool_use`, `mcp_tool_use`,
            // `web_search_tool_result`, …
            k if k == "tool_result" || k.ends_with("_tool_result") => {
                out.drop(Dropped::ToolResult, at)
            }
            k if k == "tool_use" || k.ends_with("_tool_use") => out.drop(Dropped::ToolCall, at),
            "thinking" | "redacted_thinking" => out.drop(Dropped::Thinking, at),
            "refusal" => out.drop(Dropped::Refusal, at),
            _ => out.drop(Dropped::NonText, at),
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// 2026-11-27T12:00:00Z.
    const NOW: Millis = 1_795_780_800_000;

    fn name(d: &Dropped) -> String {
        serde_json::to_value(d)
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn pairs(d: &Distilled) -> Vec<(&str, &str)> {
        d.exchanges
            .iter()
            .map(|e| (e.question.as_str(), e.answer.as_str()))
            .collect()
    }

    /// An OpenAI agent loop, as the Chat Completions reference writes one.
    #[test]
    fn an_openai_agent_loop_keeps_questions_and_final_answers() {
        let messages = json!([
            {"role": "system", "content": "You answer from the documents."},
            {"role": "developer", "content": "Cite sources."},
            {"role": "user", "content": [{"type": "text", "text": "What is HNSW?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "content": null,
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "search", "arguments": "{\"q\":\"HNSW\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "HNSW is a graph index…"},
            {"role": "assistant", "content": "A graph index for nearest neighbours."},
            {"role": "user", "content": "And IVF?"},
            {"role": "user", "content": "Briefly."},
            {"role": "assistant", "content": null, "refusal": "I cannot."},
            {"role": "assistant", "content": "Clusters, then a search in the nearest ones."},
            {"role": "user", "content": "Thanks, and PQ?"}
        ]);
        let d = distill(messages.as_array().unwrap(), NOW).unwrap();
        assert_eq!(
            pairs(&d),
            [
                ("What is HNSW?", "A graph index for nearest neighbours."),
                (
                    "And IVF?\n\nBriefly.",
                    "Clusters, then a search in the nearest ones."
                ),
            ]
        );
        assert_eq!(
            (d.exchanges[1].asked_at, d.exchanges[1].answered_at),
            (6, 9)
        );
        let reasons: Vec<(String, u64, Vec<usize>)> = d
            .dropped
            .iter()
            .map(|(k, (n, at))| (name(k), *n, at.clone()))
            .collect();
        assert_eq!(
            reasons,
            [
                ("instructions".into(), 2, vec![0, 1]),
                ("tool_result".into(), 1, vec![4]),
                ("tool_call".into(), 1, vec![3]),
                ("refusal".into(), 1, vec![8]),
                ("non_text".into(), 1, vec![2]),
                ("unanswered".into(), 1, vec![10]),
            ]
        );
    }

    /// An Anthropic tool loop, as the Messages reference writes one: the
    /// tool results come back in user messages, which are no questions.
    #[test]
    fn an_anthropic_tool_loop_is_one_exchange() {
        let messages = json!([
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "abc"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18°C, cloudy"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "18°C and cloudy."}]},
            {"role": "user", "content": [{"type": "text", "text": "Umbrella?"},
                                          {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
            {"role": "assistant", "content": "Not needed."}
        ]);
        let d = distill(messages.as_array().unwrap(), NOW).unwrap();
        assert_eq!(
            pairs(&d),
            [
                ("What's the weather in Paris?", "18°C and cloudy."),
                ("Umbrella?", "Not needed."),
            ]
        );
        let names: Vec<String> = d.dropped.keys().map(name).collect();
        assert_eq!(
            names,
            [
                "tool_result",
                "tool_call",
                "thinking",
                "non_text",
                "superseded"
            ]
        );
        assert_eq!(d.dropped[&Dropped::Superseded], (1, vec![1]));
    }

    #[test]
    fn malformed_messages_are_all_named() {
        let messages = json!([
            "hello",
            {"content": "no role"},
            {"role": "user", "content": 42},
            {"role": "wizard", "content": "hi"},
            {"role": "user", "content": [{"text": "no type"}]}
        ]);
        let errors = distill(messages.as_array().unwrap(), NOW).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "messages[0]",
                "messages[1].role",
                "messages[2].content",
                "messages[3].role",
                "messages[4].content"
            ]
        );
    }

    #[test]
    fn timestamps_become_the_exchanges_times() {
        let messages = json!([
            {"role": "system", "content": "s", "timestamp": "2026-11-27T09:00:00Z"},
            {"role": "user", "content": "q1", "timestamp": "2026-11-27T09:00:01Z"},
            {"role": "assistant", "content": "a1", "timestamp": "2026-11-27T10:00:02.5+01:00"},
            {"role": "user", "content": "q2", "timestamp": "2026-11-27T09:01:00Z"},
            {"role": "assistant", "content": "a2", "timestamp": "2026-11-27T09:01:00Z"}
        ]);
        let d = distill(messages.as_array().unwrap(), NOW).unwrap();
        let at = |s| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        assert_eq!(
            d.exchanges.iter().map(|e| e.times).collect::<Vec<_>>(),
            [
                Some((at("2026-11-27T09:00:01Z"), at("2026-11-27T09:00:02.5Z"))),
                Some((at("2026-11-27T09:01:00Z"), at("2026-11-27T09:01:00Z"))),
            ]
        );
        let none = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]);
        assert_eq!(
            distill(none.as_array().unwrap(), NOW).unwrap().exchanges[0].times,
            None
        );
    }

    #[test]
    fn timestamps_must_parse_go_forward_and_be_given_for_all() {
        let fields = |messages: Value| -> Vec<(String, &'static str)> {
            distill(messages.as_array().unwrap(), NOW)
                .unwrap_err()
                .into_iter()
                .map(|e| (e.field, e.message))
                .collect()
        };
        let errors = fields(json!([
            {"role": "user", "content": "q", "timestamp": "yesterday"},
            {"role": "assistant", "content": "a", "timestamp": 1764230400},
            {"role": "user", "content": "q", "timestamp": "2026-11-27T09:00:00Z"},
            {"role": "assistant", "content": "a", "timestamp": "2026-11-27T08:59:59Z"},
            {"role": "user", "content": "q", "timestamp": "2027-01-01T00:00:00Z"},
            {"role": "assistant", "content": "a", "timestamp": "1969-12-31T23:59:59Z"}
        ]));
        let named: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            named,
            [
                "messages[0].timestamp",
                "messages[1].timestamp",
                "messages[3].timestamp",
                "messages[4].timestamp",
                "messages[5].timestamp"
            ]
        );
        assert!(errors[2].1.contains("earlier"), "{errors:?}");
        assert!(errors[3].1.contains("later than now"), "{errors:?}");
        // One exchange with times, one without: the one without is named.
        let errors = fields(json!([
            {"role": "user", "content": "q", "timestamp": "2026-11-27T09:00:00Z"},
            {"role": "assistant", "content": "a", "timestamp": "2026-11-27T09:00:01Z"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "timestamp": "2026-11-27T09:00:02Z"}
        ]));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, "messages[2].timestamp");
    }

    #[test]
    fn strict_pairs_distil_to_themselves() {
        let messages = json!([
            {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}
        ]);
        let d = distill(messages.as_array().unwrap(), NOW).unwrap();
        assert_eq!(pairs(&d), [("q1", "a1"), ("q2", "a2")]);
        assert!(d.dropped.is_empty());
    }
}
