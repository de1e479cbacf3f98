"""The messages feed the real OpenAI SDK as they are (its HTTP is mocked:
no network), and type-check as its ``ChatCompletionMessageParam``."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import httpx2
import openai
from openai.types.chat import ChatCompletionMessageParam
from support import finished_turn, new_id

from turnstore import Client


class FakeOpenAI:
    """An OpenAI SDK client whose HTTP goes to a handler that records the
    request bodies and answers a fixed chat completion."""

    def __init__(self, answer: str) -> None:
        self.bodies: List[Dict[str, Any]] = []
        self.answer = answer
        transport = httpx2.MockTransport(self._handle)
        self.client = openai.OpenAI(
            api_key="sk-test",
            base_url="http://openai.test/v1",
            http_client=httpx2.Client(transport=transport),
            max_retries=0,
        )

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/chat/completions"
        self.bodies.append(json.loads(request.content))
        return httpx2.Response(
            200,
            json={
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-4o",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.answer},
                        "finish_reason": "stop",
                    }
                ],
            },
        )


def test_a_turn_prompt_goes_to_openai_as_is(client: Client) -> None:
    sid = new_id()
    finished_turn(client, sid, "What is a vector index?", "An index of embeddings.")
    llm = FakeOpenAI("Embed your documents, then insert them.")

    with client.turn("How do I build one?", session_id=sid) as turn:
        completion = llm.client.chat.completions.create(
            model="gpt-4o", messages=turn.prompt(system="Answer from the documents.")
        )
        answer = completion.choices[0].message.content
        assert answer is not None
        turn.finalize(answer)

    assert llm.bodies[0]["messages"] == [
        {"role": "system", "content": "Answer from the documents."},
        {"role": "user", "content": "What is a vector index?"},
        {"role": "assistant", "content": "An index of embeddings."},
        {"role": "user", "content": "How do I build one?"},
    ]
    history = client.get_history(sid, format="messages")
    assert history.messages is not None
    assert history.messages[-1] == {
        "role": "assistant",
        "content": "Embed your documents, then insert them.",
    }

    # The history's own message list is accepted as-is too.
    llm.client.chat.completions.create(model="gpt-4o", messages=history.to_openai_messages())
    assert llm.bodies[1]["messages"] == history.messages


def test_the_messages_are_typed_for_openai(client: Client) -> None:
    # What this test checks is mostly static: mypy --strict runs on it.
    sid = new_id()
    finished_turn(client, sid, "q", "a")
    history = client.get_history(sid, format="messages")
    messages: List[ChatCompletionMessageParam] = history.to_openai_messages(
        system="s", question="q2"
    )
    with client.turn("q2", session_id=sid) as turn:
        prompt: List[ChatCompletionMessageParam] = turn.prompt(system="s")
        turn.finalize("a2")
    assert messages == prompt
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
