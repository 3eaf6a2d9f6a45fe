"""Validate and normalise OpenAI-style chat `messages` and `tools` before they reach a chat template.

The proxy receives these straight from agent code, so anything malformed must fail here with an
error the agent author can act on (`ChatFormatError.param` names the field, OpenAI-style), not
deep inside a Jinja template.

Normalisation rules (what the template sees):
- `developer` messages become `system` messages (chat templates of open models know no
  `developer` role, and would silently drop it otherwise).
- `content` given as a list of `{"type": "text", "text": ...}` parts is joined with "\\n", as vLLM
  does, so prompts match what a vLLM server would build.
- Unknown message keys (`refusal`, `audio`, `annotations`, ...) are dropped; `name`, assistant
  `reasoning_content` (read by Qwen3-style templates) and tool `tool_call_id` are kept.
- Tools are kept exactly as given (same key order: templates render them with `tojson`, so any
  reordering would change the prompt text).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ALLOWED_ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")
"""Message roles accepted by `normalize_messages`."""


class ChatFormatError(ValueError):
    """A request's messages, tools or template options are malformed.

    `param` names the offending field the way OpenAI does (`messages[2].role`,
    `tools[0].function.name`), so the proxy can answer with an OpenAI-style 400 error.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def normalize_messages(messages: object) -> list[dict[str, Any]]:
    """Check OpenAI chat `messages` and return plain dicts ready for `apply_chat_template`.

    Raises ChatFormatError naming the first bad field.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatFormatError(f"messages must be a list of message objects, got {type(messages).__name__}", "messages")
    if not messages:
        raise ChatFormatError("messages must contain at least one message", "messages")
    return [_normalize_message(message, f"messages[{i}]") for i, message in enumerate(messages)]


def normalize_tools(tools: object) -> list[dict[str, Any]] | None:
    """Check OpenAI `tools` (function tools only) and return canonical copies (`_canonical_tool`): the same
    tools render the same prompt whichever protocol carried them; None or [] gives None.

    Raises ChatFormatError naming the first bad field.
    """
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise ChatFormatError(f"tools must be a list of tool objects, got {type(tools).__name__}", "tools")
    normalized = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ChatFormatError(f"{param} must be an object, got {type(tool).__name__}", param)
        if tool.get("type") != "function":
            raise ChatFormatError(
                f"{param}.type must be 'function' (the only tool type supported), got {tool.get('type')!r}",
                f"{param}.type",
            )
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise ChatFormatError(
                f"{param}.function must be an object with at least a 'name', got {type(function).__name__}",
                f"{param}.function",
            )
        _require_name(function.get("name"), f"{param}.function.name")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ChatFormatError(
                f"{param}.function.description must be a string, got {type(description).__name__}",
                f"{param}.function.description",
            )
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ChatFormatError(
                f"{param}.function.parameters must be a JSON Schema object, got {type(parameters).__name__}",
                f"{param}.function.parameters",
            )
        normalized.append(_canonical_tool(_plain(tool)))
    return normalized or None


_FUNCTION_KEYS = ("name", "description", "parameters")


def _canonical_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """One tool as the chat template sees it whichever protocol carried it: `name`, `description`,
    `parameters` first (LiteLLM's Anthropic bridge puts `parameters` before `description`), and no
    `strict: false` (its Responses bridge adds one; false is the default and asks for nothing)."""
    function = tool["function"]
    ordered = {key: function[key] for key in _FUNCTION_KEYS if key in function}
    ordered |= {
        key: value
        for key, value in function.items()
        if key not in _FUNCTION_KEYS and not (key == "strict" and value is False)
    }
    return {"type": "function", "function": ordered, **{k: v for k, v in tool.items() if k not in ("type", "function")}}


def _normalize_message(message: object, param: str) -> dict[str, Any]:
    """One message: role check, content flattening, role-specific fields."""
    if not isinstance(message, Mapping):
        raise ChatFormatError(
            f"{param} must be an object with 'role' and 'content', got {type(message).__name__}", param
        )
    role = message.get("role")
    if role is None:
        raise ChatFormatError(f"{param}.role is required; expected one of {', '.join(ALLOWED_ROLES)}", f"{param}.role")
    if role not in ALLOWED_ROLES:
        raise ChatFormatError(
            f"{param}.role {role!r} is not supported; expected one of {', '.join(ALLOWED_ROLES)}", f"{param}.role"
        )
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}

    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise ChatFormatError(f"{param}.name must be a string, got {type(name).__name__}", f"{param}.name")
        out["name"] = name

    if role == "assistant":
        tool_calls = _normalize_tool_calls(message.get("tool_calls"), f"{param}.tool_calls")
        content = message.get("content")
        if content is None and not tool_calls:
            raise ChatFormatError(
                f"{param}.content is required for an assistant message without tool_calls; "
                "use an empty string for an empty reply",
                f"{param}.content",
            )
        out["content"] = None if content is None else _flatten_content(content, f"{param}.content")
        if tool_calls:
            out["tool_calls"] = tool_calls
        reasoning = message.get("reasoning_content")
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise ChatFormatError(
                    f"{param}.reasoning_content must be a string, got {type(reasoning).__name__}",
                    f"{param}.reasoning_content",
                )
            out["reasoning_content"] = reasoning
        return out

    if "content" not in message or message.get("content") is None:
        raise ChatFormatError(f"{param}.content is required for a {role} message (a string)", f"{param}.content")
    out["content"] = _flatten_content(message["content"], f"{param}.content")
    if role == "tool":
        tool_call_id = message.get("tool_call_id")
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise ChatFormatError(
                f"{param}.tool_call_id is required for a tool message: the id of the assistant tool call it answers",
                f"{param}.tool_call_id",
            )
        out["tool_call_id"] = tool_call_id
    return out


def _flatten_content(content: object, param: str) -> str:
    """A string, or a list of text parts joined with newlines; anything else is an error."""
    if isinstance(content, str):
        return content
    if isinstance(content, (bytes, Mapping)) or not isinstance(content, Sequence):
        raise ChatFormatError(f"{param} must be a string or a list of text parts, got {type(content).__name__}", param)
    texts = []
    for j, part in enumerate(content):
        part_param = f"{param}[{j}]"
        if not isinstance(part, Mapping):
            raise ChatFormatError(f"{part_param} must be an object like {{'type': 'text', 'text': ...}}", part_param)
        part_type = part.get("type")
        if part_type != "text":
            raise ChatFormatError(
                f"{part_param}.type is {part_type!r}, but only text content parts are supported "
                "(this model takes no images, audio or files)",
                f"{part_param}.type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ChatFormatError(
                f"{part_param}.text must be a string, got {type(text).__name__}", f"{part_param}.text"
            )
        texts.append(text)
    return "\n".join(texts)


def _normalize_tool_calls(tool_calls: object, param: str) -> list[dict[str, Any]]:
    """OpenAI assistant tool calls; `arguments` is kept as given (JSON string, or an object)."""
    if tool_calls is None:
        return []
    if isinstance(tool_calls, (str, bytes)) or not isinstance(tool_calls, Sequence):
        raise ChatFormatError(f"{param} must be a list of tool calls, got {type(tool_calls).__name__}", param)
    normalized = []
    for k, call in enumerate(tool_calls):
        call_param = f"{param}[{k}]"
        if not isinstance(call, Mapping):
            raise ChatFormatError(f"{call_param} must be an object, got {type(call).__name__}", call_param)
        call_type = call.get("type", "function")
        if call_type != "function":
            raise ChatFormatError(f"{call_param}.type must be 'function', got {call_type!r}", f"{call_param}.type")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ChatFormatError(f"{call_param}.id must be a string, got {type(call_id).__name__}", f"{call_param}.id")
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise ChatFormatError(
                f"{call_param}.function must be an object with 'name' and 'arguments'", f"{call_param}.function"
            )
        name = _require_name(function.get("name"), f"{call_param}.function.name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, (str, Mapping)):
            raise ChatFormatError(
                f"{call_param}.function.arguments must be a JSON string (or an object), got {type(arguments).__name__}",
                f"{call_param}.function.arguments",
            )
        entry: dict[str, Any] = {}
        if call_id is not None:
            entry["id"] = call_id
        entry["type"] = "function"
        entry["function"] = {
            "name": name,
            "arguments": arguments if isinstance(arguments, str) else _plain(arguments),
        }
        normalized.append(entry)
    return normalized


def _require_name(name: object, param: str) -> str:
    """A non-empty function name."""
    if not isinstance(name, str) or not name:
        raise ChatFormatError(f"{param} must be a non-empty string, got {name!r}", param)
    return name


def _plain(value: Any) -> Any:
    """Mappings as dicts, recursively, so templates and json.dumps see ordinary containers."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
