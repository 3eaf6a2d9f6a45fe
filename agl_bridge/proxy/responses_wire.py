"""OpenAI's Responses API wire format for our chat results: the response object and its stream events.

`ResponsesWriter` writes one served request's answer — the whole `response` object, or the
stream's events as the items of `ChatService.stream` arrive — as JSON documents in the shape of
the `openai` package's own types (`openai.types.responses`: `Response`, `ResponseOutputMessage`,
`ResponseFunctionToolCall`, `ResponseUsage` and the `Response*Event`s; the tests validate every
document against them). They are written as plain dicts rather than built as those pydantic
models: building them (and LiteLLM's chat objects and its chat → Responses translation before
that) cost about half a millisecond of CPU per request, most of it validating what we had just
built, and the request's own fields the response repeats (`tools`, `reasoning`, `text`, ...) are
passed back as the client sent them, never re-validated against a version of the types.

The answer comes from the first choice (the route serves one). Its text is a `message` item with
one `output_text` part, present whenever the chat message has content (possibly empty); each tool
call is a `function_call` item after it. A response cut by its token limit is `incomplete`
(`incomplete_details.reason: "max_output_tokens"`). A stream opens with `response.created` and
`response.in_progress`, which are written together with the first event that carries output (a
client then wakes once for its first token, as for a chat completion's first chunk), adds the
message item at its first text, and ends with `response.completed` (or `response.incomplete`)
holding the same response a non-streamed request gets. Every event has its `sequence_number`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from agl_bridge.chat import AssistantMessage, PromptEncoding
from agl_bridge.proxy.bridge_stream import BridgeStreamWriter, compact_json
from agl_bridge.proxy.request import ChatResult

ECHOED_FIELDS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": None,
    "store": True,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
    "truncation": "disabled",
    "user": None,
}
"""The request's fields a response repeats, with what it says when the request left one out (every call is
recorded, so `store` is true; the text is plain; nothing is truncated; several tool calls may come at once)."""


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The Responses API's `usage`."""
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _status(message: AssistantMessage) -> str:
    return "incomplete" if message.finish_reason == "length" else "completed"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": parts}


def _function_calls(message: AssistantMessage) -> list[dict[str, Any]]:
    return [
        {
            "id": "fc_" + call.id,
            "type": "function_call",
            "status": "completed",
            "call_id": call.id,
            "name": call.function.name,
            "arguments": call.function.arguments,
        }
        for call in message.tool_calls
    ]


def new_message_id() -> str:
    """A fresh id for a `message` output item."""
    return f"msg_{uuid.uuid4().hex}"


class ResponsesWriter(BridgeStreamWriter):
    """Writes the answer to one Responses request: the whole response (`answer`) or its stream (`events`).

    `request` is the request's optional fields (the writer repeats `ECHOED_FIELDS` of them).
    """

    def __init__(self, response_id: str, model: str, created_at: int, request: Mapping[str, Any]) -> None:
        super().__init__()
        self._head: dict[str, Any] = {"id": response_id, "object": "response", "created_at": created_at}
        self._echoed: dict[str, Any] = {
            name: request[name] if request.get(name) is not None else default for name, default in ECHOED_FIELDS.items()
        }
        self._model = model
        self._message_id = new_message_id()
        self._sequence = 0
        self._text_open = False

    def document(self, message: AssistantMessage, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The `response` object for `message`, served from a prompt of `prompt_tokens` tokens."""
        status = _status(message)
        output = (
            [] if message.content is None else [_message_item(self._message_id, status, [_text_part(message.content)])]
        )
        return self._response(
            status,
            [*output, *_function_calls(message)],
            usage(prompt_tokens, completion_tokens),
        )

    def answer(self, result: ChatResult) -> bytes:
        """The whole response to a non-streamed request, as JSON."""
        return compact_json(
            self.document(result.choices[0].message, len(result.prompt_token_ids), result.completion_tokens)
        ).encode()

    # ------------------------------------------------------------------ stream events

    def _opening_events(self, encoding: PromptEncoding) -> str:
        in_progress = self._response("in_progress", [], None)
        return self._event("response.created", response=in_progress) + self._event(
            "response.in_progress", response=in_progress
        )

    def _event(self, kind: str, **fields: Any) -> str:
        sequence, self._sequence = self._sequence, self._sequence + 1
        return f"event: {kind}\ndata: {compact_json({'type': kind, 'sequence_number': sequence, **fields})}\n\n"

    def _text_delta(self, text: str) -> str:
        opened = "" if self._text_open else self._open_text()
        return opened + self._event(
            "response.output_text.delta",
            item_id=self._message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _open_text(self) -> str:
        self._text_open = True
        item = _message_item(self._message_id, "in_progress", [])
        return self._event("response.output_item.added", output_index=0, item=item) + self._event(
            "response.content_part.added",
            item_id=self._message_id,
            output_index=0,
            content_index=0,
            part=_text_part(""),
        )

    def _closing(self, result: ChatResult) -> str:
        """The rest of the stream: the last text, the message item's end, the tool calls, the finished response."""
        choice = result.choices[0]
        message = choice.message
        rest = result.final_pieces[0].text if result.final_pieces else ""
        events = [self._text_delta(rest) if rest else ""]
        if message.content is not None:
            if not self._text_open:
                events.append(self._open_text())
            position = dict(item_id=self._message_id, output_index=0, content_index=0)
            events.append(self._event("response.output_text.done", **position, text=message.content, logprobs=[]))
            events.append(self._event("response.content_part.done", **position, part=_text_part(message.content)))
        response = self.document(message, len(result.prompt_token_ids), result.completion_tokens)
        for index, item in enumerate(response["output"]):
            if item["type"] == "message":
                events.append(self._event("response.output_item.done", output_index=index, item=item))
                continue
            added = {**item, "status": "in_progress", "arguments": ""}
            events.append(self._event("response.output_item.added", output_index=index, item=added))
            at = dict(item_id=item["id"], output_index=index)
            events.append(self._event("response.function_call_arguments.delta", **at, delta=item["arguments"]))
            events.append(
                self._event(
                    "response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]
                )
            )
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        finished = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append(self._event(finished, response=response))
        return "".join(events)

    def _response(self, status: str, output: list[dict[str, Any]], used: dict[str, Any] | None) -> dict[str, Any]:
        return {
            **self._head,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self._model,
            "output": output,
            **self._echoed,
            "usage": used,
        }
