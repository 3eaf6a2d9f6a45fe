"""The shape of Anthropic Messages and Responses bodies, checked before LiteLLM's translations see them.

LiteLLM's translations (1.106.2) trust the body's shape: `"messages": null` on `/v1/messages`, a string
where an object belongs, a content block without its fields, each crash them into a 500. The front
door checks the fields they read first (whatever the model: LiteLLM's own bridges crash alike), and
refuses a malformed one with a 400 naming it (`RequestError`), in the protocol's shape. Only shape is
checked here; what the fields mean is the chat service's to judge once they are translated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agl_bridge.proxy.request import RequestError

# Claude Code (2.1) also sends "system" turns inside `messages`; LiteLLM's bridge renders them as system messages.
_ANTHROPIC_ROLES = ("user", "assistant", "system")
_BLOCK_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "text": {"text": (str,)},
    "image": {"source": (dict,)},
    "document": {"source": (dict,)},
    "tool_use": {"id": (str,), "name": (str,), "input": (dict,)},
    "tool_result": {"tool_use_id": (str,)},
    "thinking": {"thinking": (str,)},
    "redacted_thinking": {"data": (str,)},
}
"""Anthropic content blocks the bridge translates, with the fields it reads (other types pass as they are)."""


def check_bridged(path: str, body: Mapping[str, Any]) -> None:
    """Refuse a `/v1/messages` (`/count_tokens`) or `/v1/responses` body LiteLLM cannot translate, naming the field."""
    if "metadata" in body and not isinstance(body["metadata"], dict):  # LiteLLM updates it in place
        raise RequestError("metadata must be an object (or left out)", "metadata")
    if path.endswith("/responses"):
        check_responses(body)
    else:
        check_anthropic(body, counting=path.endswith("/count_tokens"))


def check_anthropic(body: Mapping[str, Any], *, counting: bool = False) -> None:
    """Anthropic Messages: `messages`, `max_tokens` (not when `counting` tokens), `system`, the sampling fields,
    `tools`, `thinking`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: a non-empty list of {role, content} objects is required", "messages")
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        _object(message, where)
        if message.get("role") not in _ANTHROPIC_ROLES:
            raise RequestError(
                f"{where}.role must be 'user', 'assistant' or 'system', got {message.get('role')!r:.50}",
                f"{where}.role",
            )
        _content(message.get("content"), f"{where}.content", required=True)
    max_tokens = body.get("max_tokens")
    if (not counting or max_tokens is not None) and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise RequestError(f"max_tokens: an integer >= 1 is required, got {max_tokens!r:.50}", "max_tokens")
    _content(body.get("system"), "system", required=False)
    _optional(body, "stop_sequences", _list_of(str))
    _optional(body, "metadata", _is(dict))
    _optional(body, "thinking", _is(dict))
    _optional(body, "tool_choice", _is(dict))
    _anthropic_tool_choice(body.get("tool_choice"))
    _optional(body, "stream", _is(bool))
    _numbers(body, ("temperature", "top_p"), ("top_k",))
    for i, tool in _tools(body):
        _name(tool, i)
        _optional(tool, "input_schema", _is(dict), f"tools.{i}.")
        _optional(tool, "description", _is(str), f"tools.{i}.")


def _anthropic_tool_choice(choice: Mapping[str, Any] | None) -> None:
    """`tool_choice`: {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}."""
    if choice is None:
        return
    kind = choice.get("type")
    if kind not in ("auto", "any", "none", "tool"):
        raise RequestError(
            f"tool_choice.type must be 'auto', 'any', 'none' or 'tool', got {kind!r:.50}", "tool_choice.type"
        )
    if kind == "tool" and not isinstance(choice.get("name"), str):
        raise RequestError("tool_choice.name: the tool's name is required with type 'tool'", "tool_choice.name")


def check_responses(body: Mapping[str, Any]) -> None:
    """Responses: `input`, `instructions`, the output limit and sampling fields, `tools`, `reasoning`, `text`."""
    given = body.get("input")
    if isinstance(given, list):
        for i, item in enumerate(given):
            _object(item, f"input.{i}")
            kind = item.get("type", "message")
            if not isinstance(kind, str):
                raise RequestError(f"input.{i}.type must be a string", f"input.{i}.type")
            if kind == "message" and not isinstance(item.get("role"), str):
                raise RequestError(f"input.{i}.role must be a string", f"input.{i}.role")
            if kind == "message":
                _response_content(item.get("content"), f"input.{i}.content")
            elif kind == "function_call":
                for name in ("call_id", "name", "arguments"):
                    if not isinstance(item.get(name), str):
                        raise RequestError(f"input.{i}.{name} must be a string", f"input.{i}.{name}")
            elif kind == "function_call_output":
                if not isinstance(item.get("call_id"), str):
                    raise RequestError(f"input.{i}.call_id must be a string", f"input.{i}.call_id")
                if not isinstance(item.get("output"), str | list):
                    raise RequestError(f"input.{i}.output must be a string or a list", f"input.{i}.output")
    elif not isinstance(given, str):
        raise RequestError("input: a string or a list of input items is required", "input")
    _optional(body, "instructions", _is(str))
    _optional(body, "previous_response_id", _is(str))
    _optional(body, "reasoning", _is(dict))
    _optional(body, "text", _is(dict))
    _optional(body, "metadata", _is(dict))
    _optional(body, "truncation", _is(str))
    _optional(body, "store", _is(bool))
    _optional(body, "stream", _is(bool))
    _optional(body, "tool_choice", _is(str, dict))
    _numbers(body, ("temperature", "top_p"), ("max_output_tokens",))
    for i, tool in _tools(body):
        if not isinstance(tool.get("type"), str):
            raise RequestError(f"tools.{i}.type must be a string", f"tools.{i}.type")
        if tool["type"] != "function":
            continue  # LiteLLM's bridge passes on or drops the tool kinds it knows
        _name(tool, i)
        _optional(tool, "parameters", _is(dict), f"tools.{i}.")
        _optional(tool, "strict", _is(bool), f"tools.{i}.")


def _tools(body: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """`tools` as (index, tool object) pairs, checked to be a list of objects (none when absent)."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of tool objects", "tools")
    for i, tool in enumerate(tools):
        _object(tool, f"tools.{i}")
    return list(enumerate(tools))


def _name(tool: Mapping[str, Any], index: int) -> None:
    if not isinstance(tool.get("name"), str):
        raise RequestError(f"tools.{index}.name must be a string", f"tools.{index}.name")


def _content(content: object, where: str, *, required: bool) -> None:
    """Anthropic content: a string or a list of typed blocks with their fields."""
    if content is None and not required:
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content blocks", where)
    for i, block in enumerate(content):
        at = f"{where}.{i}"
        _object(block, at)
        kind = block.get("type")
        if not isinstance(kind, str):
            raise RequestError(f"{at}.type must be a string (e.g. 'text')", f"{at}.type")
        for name, types in _BLOCK_FIELDS.get(kind, {}).items():
            if not isinstance(block.get(name), types):
                raise RequestError(f"{at}.{name} is required for a {kind} block", f"{at}.{name}")
        if kind == "tool_result":
            _content(block.get("content"), f"{at}.content", required=False)


def _response_content(content: object, where: str) -> None:
    """Responses message content: a string or a list of typed parts."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content parts", where)
    for i, part in enumerate(content):
        _object(part, f"{where}.{i}")
        if not isinstance(part.get("type"), str):
            raise RequestError(f"{where}.{i}.type must be a string", f"{where}.{i}.type")
        if part["type"] in ("input_text", "output_text", "text") and not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.{i}.text must be a string", f"{where}.{i}.text")


def _object(value: object, where: str) -> None:
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be an object, got {type(value).__name__}", where)


def _is(*types: type) -> Callable[[object], bool]:
    return lambda value: isinstance(value, types)


def _list_of(kind: type) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and all(isinstance(item, kind) for item in value)


def _optional(body: Mapping[str, Any], name: str, valid: Callable[[object], bool], prefix: str = "") -> None:
    value = body.get(name)
    if value is not None and not valid(value):
        raise RequestError(f"{prefix}{name} has the wrong type ({type(value).__name__})", f"{prefix}{name}")


def _numbers(body: Mapping[str, Any], floats: tuple[str, ...], ints: tuple[str, ...]) -> None:
    for name in floats:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise RequestError(f"{name} must be a number, got {value!r:.50}", name)
    for name in ints:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RequestError(f"{name} must be an integer >= 1, got {value!r:.50}", name)
