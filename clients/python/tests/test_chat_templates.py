"""Chat templates: a history budgeted and counted as the prompt a loaded
tokenizer's chat template makes of it (``chat_template``), that prompt
(``prompt``), its system message (``system``), and their errors."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Iterator, Tuple

import pytest
import pytest_asyncio
from support import Server, finished_turn, new_id, real_tokenizers, start_turnstore

from turnstore import AsyncClient, Client, HistoryOptions, ValidationError
from turnstore.models import SUMMARY_MESSAGE_PREFIX

CHAT = HistoryOptions(encoding="chat", chat_template=True, prompt=True)


def chatml(*messages: Tuple[str, str]) -> str:
    """What the ChatML template of ``chat_server`` renders of these messages."""
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)


@pytest.fixture
def cclient(chat_server: Server) -> Iterator[Client]:
    with Client(chat_server.url, initial_backoff=0.01, max_backoff=0.05) as c:
        yield c


@pytest_asyncio.fixture
async def caclient(chat_server: Server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(chat_server.url, initial_backoff=0.01, max_backoff=0.05) as c:
        yield c


def test_a_history_through_the_chat_template(cclient: Client) -> None:
    sid = new_id()
    finished_turn(cclient, sid, "What is HNSW?", "A graph index.")
    history = cclient.get_history(
        sid, encoding="chat", chat_template=True, prompt=True, system="Be brief."
    )
    assert history.prompt == chatml(
        ("system", "Be brief."), ("user", "What is HNSW?"), ("assistant", "A graph index.")
    )
    assert history.format == "messages" and history.encoding == "chat"
    assert history.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is HNSW?"},
        {"role": "assistant", "content": "A graph index."},
    ]
    assert isinstance(history.token_count, int) and history.token_count > 0
    assert history.included_turns == 1 and history.stopped_by is None

    # The same count without asking for the prompt, which is then absent.
    counted = cclient.get_history(sid, encoding="chat", chat_template=True, system="Be brief.")
    assert counted.prompt is None
    assert counted.token_count == history.token_count
    # Without chat_template, no prompt either.
    assert cclient.get_history(sid, encoding="chat", format="messages").prompt is None


def test_the_budget_counts_the_prompt(cclient: Client) -> None:
    sid = new_id()
    finished_turn(cclient, sid, "q1", "a1")
    finished_turn(cclient, sid, "q2", "a2")
    whole = cclient.get_history(sid, CHAT)
    assert whole.included_turns == 2
    cut = cclient.get_history(sid, CHAT, max_tokens=whole.token_count - 1)
    assert cut.included_turns == 1 and cut.stopped_by == "max_tokens"
    assert 0 < cut.token_count < whole.token_count
    assert cut.prompt == chatml(("user", "q2"), ("assistant", "a2"))


def test_a_summary_joins_the_system_message(cclient: Client) -> None:
    sid = new_id()
    finished_turn(cclient, sid, "q1", "a1")
    finished_turn(cclient, sid, "q2", "a2")
    cclient.put_summary(sid, "Asked q1.", 1)
    history = cclient.get_history(sid, CHAT, summary=True, system="Be brief.")
    system = f"Be brief.\n\n{SUMMARY_MESSAGE_PREFIX}Asked q1."
    assert history.messages is not None
    assert history.messages[0] == {"role": "system", "content": system}
    assert history.prompt == chatml(("system", system), ("user", "q2"), ("assistant", "a2"))


def test_a_start_ends_its_prompt_with_the_question(cclient: Client) -> None:
    sid = new_id()
    finished_turn(cclient, sid, "What is HNSW?", "A graph index.")
    started = cclient.start_turn("And IVF?", session_id=sid, history=CHAT)
    assert started.history is not None and started.history.prompt is not None
    assert started.history.prompt.endswith(
        "<|im_start|>user\nAnd IVF?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert started.history.prompt == (
        chatml(("user", "What is HNSW?"), ("assistant", "A graph index."), ("user", "And IVF?"))
        + "<|im_start|>assistant\n"
    )
    # The messages are the history's alone, without the new question.
    assert started.history.messages == [
        {"role": "user", "content": "What is HNSW?"},
        {"role": "assistant", "content": "A graph index."},
    ]

    # The turn helper passes the options through too.
    with cclient.turn("Which is faster?", session_id=sid, history=CHAT) as turn:
        assert turn.history is not None and turn.history.prompt is not None
        assert turn.history.prompt.endswith(
            "<|im_start|>user\nWhich is faster?<|im_end|>\n<|im_start|>assistant\n"
        )
        turn.abort()


def test_chat_template_needs_a_tokenizer_with_one(cclient: Client) -> None:
    sid = new_id()
    finished_turn(cclient, sid, "q", "a")
    with pytest.raises(ValidationError) as info:
        cclient.get_history(sid, encoding="o200k_base", chat_template=True)
    assert (info.value.status, info.value.code) == (422, "validation_failed")
    assert [e.field for e in info.value.errors] == ["chat_template"]

    # A start refused so writes nothing.
    with pytest.raises(ValidationError) as info:
        cclient.start_turn(
            "q2", session_id=sid, history=HistoryOptions(encoding="o200k_base", chat_template=True)
        )
    assert info.value.code == "validation_failed"
    assert [e.field for e in info.value.errors] == ["history.chat_template"]
    session = cclient.get_session(sid)
    assert (session.turn_count, session.pending_count) == (1, 0)


def test_prompt_and_system_need_chat_template(cclient: Client) -> None:
    with pytest.raises(ValidationError) as info:
        cclient.get_history(new_id(), encoding="chat", prompt=True, system="Be brief.")
    assert info.value.code == "validation_failed"
    assert sorted(e.field for e in info.value.errors) == ["prompt", "system"]
    with pytest.raises(ValidationError) as info:
        cclient.get_history(new_id(), encoding="chat", chat_template=True, format="turns")
    assert [e.field for e in info.value.errors] == ["format"]


async def test_the_async_client_reads_the_prompt(caclient: AsyncClient) -> None:
    sid = new_id()
    started = await caclient.start_turn("q", session_id=sid)
    await caclient.finalize_turn(sid, started.turn_id, "a")
    history = await caclient.get_history(sid, CHAT, system="S")
    assert history.prompt == chatml(("system", "S"), ("user", "q"), ("assistant", "a"))
    with pytest.raises(ValidationError) as info:
        await caclient.get_history(sid, encoding="cl100k_base", chat_template=True)
    assert [e.field for e in info.value.errors] == ["chat_template"]


# --- the real templates, against Hugging Face's renderer ---------------------

# Texts a prompt must carry byte for byte: several scripts, emoji, runs of
# spaces and newlines, code, and strings of special tokens.
CORPUS = [
    ("Größenänderung ça marche; 東京の天気は? Привет 👍🏽🎉", "  Leading spaces,\n\n\ttabs and\nlines  "),
    ("```python\ndef f(x):\n    return x ** 2\n```", "fn main() {\n    println!(\"{}\", 42);\n}"),
    ("typed <|eot_id|> and <|im_end|> and [INST]", "  answer with trailing spaces   "),
]


def hugging_face_render(template: str, config: Dict[str, Any], **context: Any) -> str:
    """What transformers' ``apply_chat_template`` renders: its Jinja
    environment (``trim_blocks``, ``lstrip_blocks``, loop controls, a
    ``tojson`` as ``json.dumps``, ``raise_exception``, ``strftime_now``) and
    the special tokens of the config as variables."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime.now(datetime.timezone.utc).strftime(f)
    specials = {}
    for name in ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]:
        token = config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            specials[name] = token
    return env.from_string(template).render(tools=None, documents=None, **specials, **context)


@pytest.fixture(scope="module")
def real_server() -> Iterator[Tuple[Server, Path]]:
    tokenizers = Path(real_tokenizers())
    srv = start_turnstore("memory", {"TURNSTORE_TOKENIZERS_DIR": str(tokenizers)})
    yield srv, tokenizers
    srv.stop()


@pytest.mark.parametrize("name", ["llama3", "qwen2_5", "mistral_nemo"])
def test_real_templates_render_and_count_as_hugging_face_does(
    real_server: Tuple[Server, Path], name: str
) -> None:
    from tokenizers import Tokenizer

    server, tokenizers = real_server
    config = json.loads((tokenizers / name / "tokenizer_config.json").read_text("utf-8"))
    template = config["chat_template"]
    tokenizer = Tokenizer.from_file(str(tokenizers / name / "tokenizer.json"))

    def count(prompt: str) -> int:
        return len(tokenizer.encode(prompt, add_special_tokens=False).ids)

    with Client(server.url) as client:
        sid = new_id()
        for q, a in CORPUS:
            finished_turn(client, sid, q, a)
        client.put_summary(sid, "An earlier talk  about\nGröße.", 1)
        for options in [
            HistoryOptions(encoding=name, chat_template=True, prompt=True),
            HistoryOptions(encoding=name, chat_template=True, prompt=True, summary=True),
            HistoryOptions(encoding=name, chat_template=True, prompt=True, summary=True, system="Be brief, 简洁."),
            HistoryOptions(encoding=name, chat_template=True, prompt=True, limit=1, max_tokens=10_000),
        ]:
            h = client.get_history(sid, options)
            messages = [dict(m) for m in h.messages or []]
            assert h.prompt == hugging_face_render(
                template, config, messages=messages, add_generation_prompt=False
            ), options
            assert h.token_count == count(h.prompt), options
        started = client.start_turn(
            "And  now, 東京? <|im_start|>",
            session_id=sid,
            history=HistoryOptions(encoding=name, chat_template=True, prompt=True, system="Sys."),
        )
        sh = started.history
        assert sh is not None and sh.prompt is not None
        messages = [dict(m) for m in sh.messages or []]
        messages.append({"role": "user", "content": "And  now, 東京? <|im_start|>"})
        assert sh.prompt == hugging_face_render(
            template, config, messages=messages, add_generation_prompt=True
        )
        assert sh.token_count == count(sh.prompt)
