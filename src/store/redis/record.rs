//! The byte formats of layout 5, as `lua/common.lua` describes them: turn
//! records (a header line, then the texts unescaped), English copies, and
//! the members of the turns zset (a turn id and its costs).

use std::str::FromStr;

use super::reply::corrupt;
use crate::domain::TurnId;
use crate::history::{Candidate, Content, Copies, Options};
use crate::store::StoreError;
use crate::tokens::{AnswerTokens, Encoding, QueryTokens, TurnCosts};
use crate::turn::{Millis, NewPendingTurn, TurnView};

/// Bytes of a turn id in keys and members.
pub const ID_LEN: usize = 16;
/// `>c1c1I4I4I4I4I4I4I4` after the id.
const MEMBER_LEN: usize = ID_LEN + 2 + 7 * 4;
/// A translated turn's member: `>BI4I4I4I4I4I4I4` more.
const EN_MEMBER_LEN: usize = MEMBER_LEN + 1 + 7 * 4;

pub fn id_bytes(id: &TurnId) -> Vec<u8> {
    id.as_uuid().as_bytes().to_vec()
}

/// A session's generation as the scripts return it (`generation` in
/// `lua/common.lua`): the 16 bytes of the turn id that created it, shown
/// as that UUID; else (a session older than generations) as it is.
pub fn generation(bytes: &[u8]) -> String {
    match <[u8; ID_LEN]>::try_from(bytes) {
        Ok(id) => TurnId::from_bytes(id).to_string(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// A generation a writer names, as the scripts compare it (the inverse of
/// `generation`; what names no generation stays as it is, and matches none).
pub fn generation_bytes(generation: &str) -> Vec<u8> {
    match TurnId::parse(generation) {
        Ok(id) => id_bytes(&id),
        Err(_) => generation.as_bytes().to_vec(),
    }
}

pub fn turn_id(bytes: &[u8]) -> Result<TurnId, StoreError> {
    let id: [u8; ID_LEN] = bytes
        .try_into()
        .map_err(|_| corrupt("a turn id is not 16 bytes"))?;
    Ok(TurnId::from_bytes(id))
}

/// A pending record without the seq the script puts in front:
/// `"<started_at> <key> <enc> <q> <u>\n<query>"`.
pub fn pending_tail(turn: &NewPendingTurn<'_>) -> Vec<u8> {
    let t = turn.tokens;
    let head = format!(
        "{} {} {} {} {}\n",
        turn.started_at,
        turn.idempotency_key.unwrap_or("-"),
        t.encoding.code() as char,
        t.query,
        t.user_line
    );
    let mut out = Vec::with_capacity(head.len() + turn.user_query.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(turn.user_query.as_bytes());
    out
}

/// The question's English copy as a pending turn keeps it, for the start
/// script: `"<q> <u>\n<copy>"`, or nothing.
pub fn pending_english(turn: &NewPendingTurn<'_>) -> Vec<u8> {
    let Some(e) = turn.english else {
        return Vec::new();
    };
    let mut out = format!("{} {}\n", e.tokens.query, e.tokens.user_line).into_bytes();
    out.extend_from_slice(e.text.as_bytes());
    out
}

/// A finalized turn's English copies: `"<question copy bytes or -> <answer
/// copy bytes or ->\n<question copy><answer copy>"`.
pub struct EnglishCopies {
    pub query: Option<String>,
    pub answer: Option<String>,
}

pub fn english(bytes: &[u8]) -> Result<EnglishCopies, StoreError> {
    let bad = || corrupt("a turn's English copies are malformed");
    let nl = bytes.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| bad())?;
    let (q, a) = header.split_once(' ').ok_or_else(bad)?;
    let size = |s: &str| -> Result<Option<usize>, StoreError> {
        match s {
            "-" => Ok(None),
            n => n.parse().map(Some).map_err(|_| bad()),
        }
    };
    let (q, a) = (size(q)?, size(a)?);
    let texts = &bytes[nl + 1..];
    let qn = q.unwrap_or(0);
    if qn + a.unwrap_or(0) != texts.len() {
        return Err(bad());
    }
    let (query, answer) = texts.split_at(qn);
    Ok(EnglishCopies {
        query: q.map(|_| text(query)).transpose()?,
        answer: a.map(|_| text(answer)).transpose()?,
    })
}

/// The header of a finalized record and its texts.
pub struct Finalized<'a> {
    pub seq: u64,
    pub started_at: Millis,
    pub finalized_at: Millis,
    /// The texts this record holds: whole, or their beginnings in a record
    /// a read cut (its header then says how much of the question it holds).
    pub query: &'a [u8],
    pub answer: &'a [u8],
}

/// `"<seq> <started_at> <finalized_at> <key> <query bytes>\n<query><answer>"`.
pub fn finalized(rec: &[u8]) -> Result<Finalized<'_>, StoreError> {
    let bad = || corrupt("a finalized record is malformed");
    let nl = rec.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
    let header = std::str::from_utf8(&rec[..nl]).map_err(|_| bad())?;
    let mut f = header.split(' ');
    let seq = field(f.next())?;
    let started_at = field(f.next())?;
    let finalized_at = field(f.next())?;
    let _key = f.next().ok_or_else(bad)?;
    let query_bytes: usize = field(f.next())?;
    let texts = &rec[nl + 1..];
    if query_bytes > texts.len() {
        return Err(bad());
    }
    let (query, answer) = texts.split_at(query_bytes);
    Ok(Finalized {
        seq,
        started_at,
        finalized_at,
        query,
        answer,
    })
}

fn field<T: FromStr>(s: Option<&str>) -> Result<T, StoreError> {
    s.and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt("a record header field is malformed"))
}

fn text(bytes: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("a stored text is not UTF-8"))
}

/// A finalized turn whole, as finalize answers it.
pub fn view(id: TurnId, rec: &[u8], en: Option<&[u8]>) -> Result<TurnView, StoreError> {
    let f = finalized(rec)?;
    let copies = en.map(english).transpose()?;
    let (user_query_en, final_answer_en) = copies.map_or((None, None), |c| (c.query, c.answer));
    Ok(TurnView {
        turn_id: id,
        seq: f.seq,
        user_query: text(f.query)?,
        final_answer: text(f.answer)?,
        started_at: f.started_at,
        finalized_at: f.finalized_at,
        user_query_en,
        final_answer_en,
    })
}

/// A member of the turns zset: the turn id, its costs, the costs of what
/// `lang=en` renders (a translated turn: which copies it has, 1 the
/// question's, 2 the answer's), and for each of the question's and the
/// answer's counts whether it was recorded under a retired letter (see
/// [`Encoding::code`]) and must be taken again (the walk hands such turns
/// over: their letters are not the read's).
pub struct Member {
    pub turn_id: TurnId,
    pub costs: TurnCosts,
    pub english: Option<(u8, TurnCosts)>,
    pub retired: bool,
}

pub fn member(bytes: &[u8]) -> Result<Member, StoreError> {
    if bytes.len() != MEMBER_LEN && bytes.len() != EN_MEMBER_LEN {
        return Err(corrupt("a turns member is malformed"));
    }
    let encoding = |b: u8| match (Encoding::from_code(b), Encoding::from_legacy_code(b)) {
        (Some(e), _) => Ok((e, false)),
        (None, Some(e)) => Ok((e, true)),
        (None, None) => Err(corrupt("unknown encoding letter")),
    };
    let (query_encoding, query_legacy) = encoding(bytes[ID_LEN])?;
    let (answer_encoding, answer_legacy) = encoding(bytes[ID_LEN + 1])?;
    let costs_at = |at: usize| {
        let n = |i: usize| {
            let at = at + 4 * i;
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        TurnCosts {
            query: QueryTokens {
                encoding: query_encoding,
                query: n(0),
                user_line: n(1),
            },
            answer: AnswerTokens {
                encoding: answer_encoding,
                answer: n(2),
                assistant_sep: n(3),
                assistant_last: n(4),
            },
            query_bytes: n(5),
            answer_bytes: n(6),
        }
    };
    Ok(Member {
        turn_id: turn_id(&bytes[..ID_LEN])?,
        costs: costs_at(ID_LEN + 2),
        english: (bytes.len() == EN_MEMBER_LEN)
            .then(|| (bytes[MEMBER_LEN], costs_at(MEMBER_LEN + 1))),
        retired: query_legacy || answer_legacy,
    })
}

/// What a history read does with the English copies of translated turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Translations {
    /// `lang=en`: render them instead of the originals.
    pub english: bool,
    /// A `turns` read: its Turn objects show them (beside the originals,
    /// or beside themselves with `lang=en`).
    pub shown: bool,
}

impl Translations {
    pub fn of(read: &Options) -> Self {
        Translations {
            english: read.english,
            shown: read.format.shows_copies(),
        }
    }
}

/// An entry of a history page: a member, its record (maybe cut) and, for a
/// whole turn longer than a record's head, its tail (the rest of the
/// question, then of the answer); the English copies when the read needs
/// them (see [`Translations`]).
pub fn candidate(
    member_bytes: &[u8],
    rec: &[u8],
    tail: Option<&[u8]>,
    en: Option<&[u8]>,
    read: Translations,
) -> Result<Candidate, StoreError> {
    let m = member(member_bytes)?;
    let f = finalized(rec)?;
    let (query, answer) = match tail {
        None => (f.query.to_vec(), f.answer.to_vec()),
        Some(tail) => {
            let rest = (m.costs.query_bytes as usize)
                .checked_sub(f.query.len())
                .filter(|r| *r <= tail.len())
                .ok_or_else(|| corrupt("a record's tail and its member disagree"))?;
            (
                [f.query, &tail[..rest]].concat(),
                [f.answer, &tail[rest..]].concat(),
            )
        }
    };
    let content = |bytes: Vec<u8>, full: u32| {
        if bytes.len() > full as usize {
            return Err(corrupt("a record and its member disagree"));
        }
        Content::from_prefix(bytes, full as usize)
            .ok_or_else(|| corrupt("a stored text is not UTF-8"))
    };
    let copies = en.map(english).transpose()?;
    let mut candidate = Candidate {
        turn_id: m.turn_id,
        seq: f.seq,
        started_at: f.started_at,
        finalized_at: f.finalized_at,
        user_query: Content::whole(""),
        final_answer: Content::whole(""),
        costs: m.costs,
        recount: m.retired,
        copies: Copies::default(),
    };
    let needs_copies = m.english.is_some();
    match (copies, read.english) {
        (None, _) if needs_copies && read.english => {
            return Err(corrupt("a translated turn came without its copies"));
        }
        (Some(c), true) => {
            let (flags, costs) = m
                .english
                .ok_or_else(|| corrupt("English copies of an untranslated turn"))?;
            candidate.costs = costs;
            if read.shown {
                candidate.copies = Copies {
                    user_query: c.query.clone().map(Content::whole),
                    final_answer: c.answer.clone().map(Content::whole),
                };
            }
            candidate.user_query = match (flags & 1 != 0, c.query) {
                (true, Some(q)) => Content::whole(q),
                (false, None) => content(query, m.costs.query_bytes)?,
                _ => return Err(corrupt("a turn's copies and its member disagree")),
            };
            candidate.final_answer = match (flags & 2 != 0, c.answer) {
                (true, Some(a)) => Content::whole(a),
                (false, None) => content(answer, m.costs.answer_bytes)?,
                _ => return Err(corrupt("a turn's copies and its member disagree")),
            };
        }
        (copies, _) => {
            candidate.user_query = content(query, m.costs.query_bytes)?;
            candidate.final_answer = content(answer, m.costs.answer_bytes)?;
            if let Some(c) = copies {
                candidate.copies = Copies {
                    user_query: c.query.map(Content::whole),
                    final_answer: c.answer.map(Content::whole),
                };
            }
        }
    }
    Ok(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Options, select};

    #[test]
    fn pending_tails_hold_the_counts_and_the_raw_text() {
        let id = TurnId::generate();
        let tokens = QueryTokens::count(Encoding::Cl100kBase, "a \"quoted\"\nline");
        let tail = pending_tail(&NewPendingTurn {
            turn_id: &id,
            user_query: "a \"quoted\"\nline",
            started_at: 17,
            idempotency_key: Some("k-1"),
            tokens: &tokens,
            english: None,
        });
        let expected = format!(
            "17 k-1 c {} {}\na \"quoted\"\nline",
            tokens.query, tokens.user_line
        );
        assert_eq!(tail, expected.as_bytes());
    }

    #[test]
    fn finalized_records_split_at_the_question_length() {
        let rec = "3 10 20 - 5\nhello\nworld".as_bytes();
        let f = finalized(rec).unwrap();
        assert_eq!((f.seq, f.started_at, f.finalized_at), (3, 10, 20));
        assert_eq!((f.query, f.answer), (&b"hello"[..], &b"\nworld"[..]));
        assert!(finalized(b"3 10 20 - 9\nshort").is_err());
        assert!(finalized(b"no header").is_err());
    }

    fn member_bytes(letters: [u8; 2], counts: [u32; 7]) -> Vec<u8> {
        let mut m = id_bytes(&TurnId::generate());
        m.extend_from_slice(&letters);
        for c in counts {
            m.extend_from_slice(&c.to_be_bytes());
        }
        m
    }

    #[test]
    fn counts_under_retired_letters_are_taken_again() {
        let (q, a) = ("Why?\n\n", "Because.\n\n");
        let rec = format!("1 10 20 - {}\n{q}{a}", q.len());
        // As stored before joints were counted before a letter: too short.
        let stale = [1, 1, 1, 1, 1, q.len() as u32, a.len() as u32];
        for (enc, retired) in [
            (Encoding::P50kBase, b'p'),
            (Encoding::P50kEdit, b'e'),
            (Encoding::R50kBase, b'r'),
        ] {
            let c = candidate(
                &member_bytes([retired; 2], stale),
                rec.as_bytes(),
                None,
                None,
                Translations::default(),
            )
            .unwrap();
            assert_eq!(c.costs.query.encoding, enc);
            assert!(c.recount);
            let o = Options {
                limit: 10,
                ..Options::everything(enc)
            };
            let s = select([c.clone(), Candidate { seq: 2, ..c }].into_iter(), &o);
            let text = crate::history::render_text(&s.turns);
            assert_eq!(s.token_count, enc.count(&text), "{enc:?}");
            // Current letters are trusted as they are.
            let c = candidate(
                &member_bytes([enc.code(); 2], stale),
                rec.as_bytes(),
                None,
                None,
                Translations::default(),
            )
            .unwrap();
            assert!(!c.recount);
        }
        assert!(
            candidate(
                &member_bytes(*b"xx", stale),
                rec.as_bytes(),
                None,
                None,
                Translations::default()
            )
            .is_err()
        );
    }
}
