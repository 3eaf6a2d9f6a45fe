"""OpenAI chat messages -> exact prompt token ids, and sampled token ids -> an OpenAI assistant message.

Prompts always go through the tokenizer's own chat template (`apply_chat_template`, rendered to
text and tokenized without added special tokens, which is what `apply_chat_template(tokenize=True)`
does). With a `TokenCache`, assistant messages that were sampled earlier in the same rollout are
mapped back to the exact ids that were sampled, so that each prompt extends the previous prompt +
response token for token; where that is impossible the prompt says so in `prefix_breaks` instead
of hiding it.

How an assistant message is mapped back: let T be the rendered prompt and P_i the rendering of
`messages[:i]` with the generation prompt (what the model was prompted with when it produced
message i). If T starts with P_i, message i's rendering starts at len(P_i). A remembered response
whose decoded text starts there, and ends at the turn's end-of-turn marker (it ends with the stop
token itself, or the marker follows it in T when it stopped by length), is spliced in as its
sampled ids; the text between splices is tokenized normally. Cutting at len(P_i) reproduces the
earlier prompt's ids exactly (that prompt was the tokenization of P_i, with the same earlier
splices), which is what makes the extension exact.

A response that ended on another stop token than the template's end of turn (the model sampled
`<|endoftext|>` where the template closes turns with `<|im_end|>`) is spliced in whole, stop token
included, and the template's marker follows it as an observation token: the prompt then holds one
more token than the template's own rendering, and still extends prompt + response exactly (the
trainer trains on the ids that were sampled, and the next turn merges instead of splitting).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agl_bridge.chat.messages import ChatFormatError, normalize_messages, normalize_tools
from agl_bridge.chat.text_bound import TextBound, text_bound
from agl_bridge.chat.token_cache import CachedResponse, TokenCache, decode_exact, prompt_digest
from agl_bridge.chat.tool_calls import ToolCall, ToolCallError, parse_tool_calls

FinishReason = Literal["stop", "length", "tool_calls"]
PrefixBreakKind = Literal["rendered_differently", "not_prefix_stable", "template_error"]

MIN_CARRIED_CHARS = 16
"""An answer shorter than this is not looked for in later messages (short texts recur by chance)."""

CARRY_SCAN_ENTRIES = 32
"""How many of a rollout's newest remembered answers a request is searched for (bounds the cost)."""

# End-of-turn tokens of common chat formats; those present in a tokenizer's added vocabulary are
# stop tokens in addition to its eos_token (Qwen models end turns with <|im_end|> but may also emit
# <|endoftext|>, and their generation configs list both).
_KNOWN_END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
)

# apply_chat_template's own parameters: passing them through chat_template_kwargs would silently
# change how the prompt is built rather than what the template sees.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)

_SNIPPET_CONTEXT = 40


@dataclass(frozen=True)
class ReusedSpan:
    """An assistant message whose prompt tokens are the exact sampled ids of an earlier response."""

    message_index: int
    token_start: int
    num_tokens: int


@dataclass(frozen=True)
class PrefixBreak:
    """An assistant message from this rollout that could not be mapped back to its sampled ids.

    The prompt then does not extend the earlier prompt + response token for token at that
    message; `kind` is machine-readable, `reason` says what the template did differently.
    """

    message_index: int
    kind: PrefixBreakKind
    reason: str


@dataclass
class PromptEncoding:
    """A prompt as token ids for the sampler, with the rendered text and how the cache was used."""

    token_ids: list[int]
    text: str
    reused: list[ReusedSpan] = field(default_factory=list)
    prefix_breaks: list[PrefixBreak] = field(default_factory=list)
    carries: list[int] = field(default_factory=list)
    """Store sequences of earlier calls whose answer text a non-assistant message carries (`carried_calls`)."""


@dataclass
class AssistantMessage:
    """A sampled response as an OpenAI assistant message.

    `text` is the decoded response without its end-of-turn token (what `content` and
    `tool_calls` were parsed from); `tool_call_errors` lists `<tool_call>` blocks that did not
    parse and were therefore left in `content`.
    """

    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: FinishReason
    text: str
    tool_call_errors: list[ToolCallError] = field(default_factory=list)
    stop_string: str | None = None
    """The request's stop string the text was cut at (None: it ended otherwise)."""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `choices[].message` object (`tool_calls` only when there are some)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


class PromptTooLongError(ChatFormatError):
    """A rendered prompt that cannot fit `max_tokens` whatever its tokenization (found before tokenizing it)."""

    def __init__(self, chars: int, min_tokens: int, max_tokens: int) -> None:
        super().__init__(
            f"the prompt is {chars} characters long, which is at least {min_tokens} tokens for this model's "
            f"tokenizer, but at most {max_tokens} fit in its context window; shorten the messages "
            "(e.g. truncate long tool outputs)",
            "messages",
        )
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens


@dataclass(frozen=True)
class _Candidate:
    """A remembered response that can be spliced in at one assistant message."""

    entry: CachedResponse
    token_ids: tuple[int, ...]
    text_length: int
    exact: bool  # False: the stop token differs from the template's marker; only the content ids are reused


class ChatCodec:
    """Messages -> prompt ids and sampled ids -> assistant messages, for one tokenizer and its chat template.

    `extra_stop_token_ids` adds end-of-turn ids the tokenizer does not declare.
    `tool_call_arguments_as_dict` parses tool-call `arguments` strings into objects before
    rendering, for templates (Llama 3.x style) that dump them with `tojson` (as vLLM does).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        extra_stop_token_ids: Sequence[int] = (),
        tool_call_arguments_as_dict: bool = False,
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat_template; load a tokenizer that ships one or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.tool_call_arguments_as_dict = tool_call_arguments_as_dict
        self._stop_token_ids = _find_stop_token_ids(tokenizer, extra_stop_token_ids)
        self._marker_by_id = {tid: decode_exact(tokenizer, [tid]) for tid in self._stop_token_ids}
        # Longest first, so a marker that is a prefix of another never wins by accident.
        self._markers = tuple(sorted({m for m in self._marker_by_id.values() if m}, key=len, reverse=True))

    @functools.cached_property
    def text_bound(self) -> TextBound:
        """The fewest tokens a text can be for this tokenizer (see `agl_bridge.chat.text_bound`)."""
        return text_bound(self.tokenizer)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn; pass them as `SamplingParams.stop`."""
        return self._stop_token_ids

    @property
    def stop_token_texts(self) -> tuple[str, ...]:
        """The text of each end-of-turn token, longest first (what streaming must never send)."""
        return self._markers

    # ---- prompts -------------------------------------------------------------------------

    def render(
        self,
        messages: object,
        tools: object = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat template's text for `messages` (validated and normalised first)."""
        msgs = normalize_messages(messages)
        return self._render(
            self._for_template(msgs),
            normalize_tools(tools),
            add_generation_prompt,
            _template_kwargs(chat_template_kwargs),
        )

    def encode_prompt(
        self,
        messages: object,
        tools: object = None,
        *,
        token_cache: TokenCache | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> PromptEncoding:
        """Prompt token ids for `messages` (+ `tools`), ending with the assistant generation prompt.

        Without a cache hit the ids are exactly `apply_chat_template(..., tokenize=True)`'s. With
        `token_cache`, assistant messages sampled earlier in this rollout keep their sampled ids
        (see the module docstring). Raises ChatFormatError for malformed input, or when the chat
        template rejects the conversation.
        """
        return self.encode_normalized(
            normalize_messages(messages),
            normalize_tools(tools),
            token_cache=token_cache,
            chat_template_kwargs=chat_template_kwargs,
        )

    def encode_normalized(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        token_cache: TokenCache | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> PromptEncoding:
        """`encode_prompt` for messages and tools that `normalize_messages` / `normalize_tools` returned.

        For callers that validated the request already (the proxy normalises each request once).
        With `max_tokens`, a rendered prompt too long to have at most that many tokens (by the
        tokenizer's `text_bound`) raises `PromptTooLongError` before it is tokenized.
        """
        kwargs = _template_kwargs(chat_template_kwargs)
        template_msgs = self._for_template(messages)
        text = self._render(template_msgs, tools, True, kwargs)
        if max_tokens is not None:
            least = self.text_bound.min_tokens(text)
            if least > max_tokens:
                raise PromptTooLongError(len(text), least, max_tokens)
        entries = token_cache.entries() if token_cache is not None else []
        if not entries:
            return PromptEncoding(token_ids=self._tokenize(text), text=text)
        assert token_cache is not None  # entries are only non-empty with a cache
        encoded = self._encode_with_cache(text, messages, template_msgs, tools, kwargs, token_cache, entries)
        encoded.carries = self.carried_calls(messages, entries)
        return encoded

    def carried_calls(self, messages: list[dict[str, Any]], entries: list[CachedResponse]) -> list[int]:
        """The recorded calls among `entries` (the newest `CARRY_SCAN_ENTRIES`) whose answer text appears
        inside a message of another role than assistant: a summary sent back as a user message, a
        sub-agent's answer as a tool result. Found by text, which survives the answer being tokenized
        anew (its sampled ids rarely do); answers shorter than `MIN_CARRIED_CHARS` are not looked for."""
        pieces = [_content_text(msg.get("content")) for msg in messages if msg["role"] != "assistant"]
        haystack = "\x00".join(piece for piece in pieces if piece)
        if not haystack:
            return []
        found = set()
        for entry in entries[-CARRY_SCAN_ENTRIES:]:
            if entry.call is None:
                continue
            answer = self._strip_end_marker(entry.token_ids, entry.text).strip()
            if len(answer) >= MIN_CARRIED_CHARS and answer in haystack:
                found.add(entry.call[0])
        return sorted(found)

    def knows_every_response(self, messages: list[dict[str, Any]], token_cache: TokenCache) -> bool:
        """Whether every assistant message of `messages` (normalised) is a response `token_cache` remembers.

        False means the cache may be behind the conversation: another proxy sampled a turn, or this
        one restarted. Messages the agent wrote itself also answer False; the caller's catch-up then
        finds nothing new.
        """
        wanted = [msg for msg in messages if msg["role"] == "assistant"]
        if not wanted:
            return True
        known = {self._entry_signature(entry) for entry in token_cache.entries()}
        return all(_message_signature(m.get("content"), m.get("tool_calls") or []) in known for m in wanted)

    def _encode_with_cache(
        self,
        text: str,
        msgs: list[dict[str, Any]],
        template_msgs: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        token_cache: TokenCache,
        entries: list[CachedResponse],
    ) -> PromptEncoding:
        """Tokenize `text`, splicing in remembered ids where assistant messages render as sampled."""
        ids: list[int] = []
        cursor = 0  # text before this offset is already in `ids`
        reused: list[ReusedSpan] = []
        breaks: list[PrefixBreak] = []
        for i, msg in enumerate(msgs):
            if msg["role"] != "assistant":
                continue
            start, failure = self._message_start(text, template_msgs[:i], tools, kwargs, cursor)
            candidates = self._candidates(text, start, entries) if start is not None else []
            if not candidates:
                # Messages the agent wrote itself (few-shot examples, edited replies) have no sampled
                # ids, so not mapping them back is no break; only our own responses are reported.
                ours = self._sampled_entry_for(msg, entries)
                if ours is not None:
                    kind, reason = failure or _rendered_differently(ours.text, text[start:])
                    breaks.append(PrefixBreak(message_index=i, kind=kind, reason=reason))
                continue
            assert start is not None  # candidates are only found at a known start
            piece = self._tokenize(text[cursor:start])
            chosen = self._choose(candidates, ids, piece)
            ids.extend(piece)
            reused.append(ReusedSpan(message_index=i, token_start=len(ids), num_tokens=len(chosen.token_ids)))
            ids.extend(chosen.token_ids)
            cursor = start + chosen.text_length
            token_cache.touch(chosen.entry)
        ids.extend(self._tokenize(text[cursor:]))
        return PromptEncoding(token_ids=ids, text=text, reused=reused, prefix_breaks=breaks)

    def _candidates(self, text: str, start: int, entries: list[CachedResponse]) -> list[_Candidate]:
        """Remembered responses whose text is rendered at `start` and ends where the turn's marker is."""
        candidates = []
        for entry in entries:
            if not entry.text:
                continue  # would "match" at every message without covering any text
            marker = self._marker_by_id.get(entry.token_ids[-1]) or ""
            ends_with_stop = bool(marker) and entry.text.endswith(marker)
            if text.startswith(entry.text, start):
                if ends_with_stop or self._marker_at(text, start + len(entry.text)):
                    candidates.append(_Candidate(entry, entry.token_ids, len(entry.text), exact=True))
            elif ends_with_stop:
                core = entry.text[: -len(marker)]
                if (
                    text.startswith(core, start)
                    and self._marker_at(text, start + len(core))
                    and decode_exact(self.tokenizer, entry.token_ids[:-1]) == core
                ):
                    # The turn ended on another stop token (`<|endoftext|>`) than the template's end of turn:
                    # keep every sampled id, stop token included, and let the template's marker follow as
                    # an observation token, so the prompt still extends prompt + response exactly.
                    candidates.append(_Candidate(entry, entry.token_ids, len(core), exact=False))
        return candidates

    def _choose(self, candidates: list[_Candidate], ids: list[int], piece: list[int]) -> _Candidate:
        """Pick one candidate: the response sampled for exactly this prompt (`ids + piece`), else the latest.

        Different ids for the same text happen when a rollout samples the same reply twice (a retry,
        n > 1); the prompt digest recorded by `remember` then tells which one this message is.
        """
        if len({c.token_ids for c in candidates}) == 1:
            return max(candidates, key=lambda c: (c.exact, c.entry.seq))
        digest = prompt_digest(ids + piece)
        return max(candidates, key=lambda c: (c.entry.prompt_digest == digest, c.exact, c.text_length, c.entry.seq))

    def _message_start(
        self,
        text: str,
        before: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
        cursor: int,
    ) -> tuple[int | None, tuple[PrefixBreakKind, str] | None]:
        """Where the assistant message after `before` starts in `text`, or why that is unknown.

        It starts at len(P), P being `before` rendered with the generation prompt: exactly the
        text the model was prompted with when it sampled this message.
        """
        try:
            prefix = self._render(before, tools, True, kwargs)
        except ChatFormatError as exc:
            return None, (
                "template_error",
                f"the chat template cannot render the conversation before this message ({exc}), so where "
                "its sampled tokens start is unknown; the message was re-encoded from the template's text",
            )
        if not text.startswith(prefix) or len(prefix) < cursor:
            return None, (
                "not_prefix_stable",
                "the chat template is not prefix-stable here: the messages before this one plus the generation "
                "prompt (what the model was prompted with) render as text that is not a prefix of this prompt "
                f"({_first_difference(prefix, text)}); the message was re-encoded from the template's text",
            )
        return len(prefix), None

    def _sampled_entry_for(self, msg: dict[str, Any], entries: list[CachedResponse]) -> CachedResponse | None:
        """The remembered response `msg` was decoded from, if any (content and tool calls compared loosely)."""
        signature = _message_signature(msg.get("content"), msg.get("tool_calls") or [])
        for entry in reversed(entries):
            if self._entry_signature(entry) == signature:
                return entry
        return None

    def _entry_signature(self, entry: CachedResponse) -> tuple[Any, ...]:
        """What the agent would send back for `entry`, compared loosely (see _message_signature)."""
        return _text_signature(self._strip_end_marker(entry.token_ids, entry.text))

    def _marker_at(self, text: str, pos: int) -> str | None:
        """The end-of-turn marker starting at `pos` in `text`, if any."""
        for marker in self._markers:
            if text.startswith(marker, pos):
                return marker
        return None

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        kwargs: dict[str, Any],
    ) -> str:
        """apply_chat_template to text; template failures become ChatFormatError (the client's 400)."""
        from jinja2 import TemplateError

        try:
            rendered = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
            )
        except (TemplateError, TypeError, ValueError) as exc:  # ValueError: transformers, e.g. nothing to render
            raise ChatFormatError(
                f"the model's chat template could not render these messages: {exc}", "messages"
            ) from exc
        if not isinstance(rendered, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(rendered).__name__}, expected str")
        return rendered

    def _tokenize(self, text: str) -> list[int]:
        """Token ids of rendered template text; special-token markup in it becomes special tokens."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _for_template(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages as the template should see them (tool-call arguments parsed when configured)."""
        if not self.tool_call_arguments_as_dict:
            return msgs
        out = []
        for i, msg in enumerate(msgs):
            if not msg.get("tool_calls"):
                out.append(msg)
                continue
            calls = []
            for k, call in enumerate(msg["tool_calls"]):
                arguments = call["function"]["arguments"]
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except ValueError as exc:
                        raise ChatFormatError(
                            f"messages[{i}].tool_calls[{k}].function.arguments is not valid JSON ({exc}); "
                            "it must be the JSON text of an object",
                            f"messages[{i}].tool_calls[{k}].function.arguments",
                        ) from exc
                calls.append({**call, "function": {**call["function"], "arguments": arguments}})
            out.append({**msg, "tool_calls": calls})
        return out

    # ---- responses -----------------------------------------------------------------------

    def decode_response(
        self, token_ids: Sequence[int], stop_reason: str, *, stop_strings: Sequence[str] = ()
    ) -> AssistantMessage:
        """The OpenAI assistant message for sampled `token_ids` that stopped for `stop_reason`.

        The trailing end-of-turn token is not part of the content; `<tool_call>` blocks become
        `tool_calls`. With `stop_strings` (the request's `stop`), the text ends before the first
        one, as OpenAI does. finish_reason is "length" when the sampler hit max_tokens, otherwise
        "tool_calls" when there are calls, else "stop".
        """
        if stop_reason not in ("stop", "length"):
            raise ValueError(f"stop_reason must be 'stop' or 'length', got {stop_reason!r}")
        ids = [int(t) for t in token_ids]
        text = self._strip_end_marker(ids, decode_exact(self.tokenizer, ids))
        found = [(i, s) for s in stop_strings if (i := text.find(s)) >= 0]
        stop_string = None
        if found:
            cut, stop_string = min(found, key=lambda hit: (hit[0], -len(hit[1])))
            text, stop_reason = text[:cut], "stop"
        parsed = parse_tool_calls(text)
        if stop_reason == "length":
            finish_reason: FinishReason = "length"
        else:
            finish_reason = "tool_calls" if parsed.tool_calls else "stop"
        return AssistantMessage(
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            finish_reason=finish_reason,
            text=text,
            tool_call_errors=parsed.errors,
            stop_string=stop_string,
        )

    def incremental_decoder(self, *, skip_special_tokens: bool = False) -> IncrementalDecoder:
        """A fresh streaming decoder for this codec's tokenizer."""
        return IncrementalDecoder(self.tokenizer, skip_special_tokens=skip_special_tokens)

    def _strip_end_marker(self, token_ids: Sequence[int], text: str) -> str:
        """`text` without the trailing end-of-turn marker when the ids end with a stop token."""
        if token_ids:
            marker = self._marker_by_id.get(token_ids[-1])
            if marker and text.endswith(marker):
                return text[: -len(marker)]
        return text


class IncrementalDecoder:
    """Streams text deltas for token ids fed one at a time.

    A delta is only released once the text no longer ends in an incomplete UTF-8 sequence (shown
    by decoders as U+FFFD), so no delta ever carries half a character, and the joined deltas
    (including `finish()`'s) equal `tokenizer.decode(all_ids)`. Only a short window of recent ids
    is re-decoded per token (the prefix/read-offset scheme of vLLM and TGI), which also keeps
    SentencePiece-style decoders' leading-space handling right.
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._emitted: list[str] = []

    def push(self, token_id: int) -> str:
        """Add one sampled id; the text it completes ("" while a character is still incomplete)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd") and new_text.startswith(prefix_text):
            delta = new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self._emitted.append(delta)
            return delta
        return ""

    def extend(self, token_ids: Sequence[int]) -> str:
        """Add several ids; the text they complete."""
        return "".join(self.push(t) for t in token_ids)

    def finish(self) -> str:
        """The rest of the text (e.g. a trailing U+FFFD of a truncated character) once no ids follow."""
        full = self._decode(self._ids)
        emitted = "".join(self._emitted)
        if not full.startswith(emitted):
            # Cannot happen for byte-level or SentencePiece decoders; say so loudly rather than stream wrong text.
            raise RuntimeError(
                "incremental decoding diverged from a full decode for this tokenizer; stream whole responses instead"
            )
        rest = full[len(emitted) :]
        if rest:
            self._emitted.append(rest)
        self._prefix_offset = self._read_offset = len(self._ids)
        return rest

    @property
    def text(self) -> str:
        """All text released so far."""
        return "".join(self._emitted)

    @property
    def token_ids(self) -> list[int]:
        """All ids fed so far."""
        return list(self._ids)

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )


def _find_stop_token_ids(tokenizer: Any, extra: Sequence[int]) -> tuple[int, ...]:
    """eos_token, known end-of-turn tokens in the added vocabulary, then `extra`; no duplicates."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    added = tokenizer.get_added_vocab()
    for token in _KNOWN_END_OF_TURN_TOKENS:
        token_id = added.get(token)
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
    vocab_size = len(tokenizer)
    for token_id in extra:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise ValueError(f"extra stop token id {token_id!r} is not in the vocabulary (0..{vocab_size - 1})")
        if token_id not in ids:
            ids.append(token_id)
    if not ids:
        raise ValueError(
            "the tokenizer declares no eos_token and no known end-of-turn token; pass extra_stop_token_ids"
        )
    return tuple(ids)


def _template_kwargs(chat_template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validated extra template variables (e.g. enable_thinking)."""
    if chat_template_kwargs is None:
        return {}
    if not isinstance(chat_template_kwargs, Mapping):
        raise ChatFormatError(
            f"chat_template_kwargs must be an object, got {type(chat_template_kwargs).__name__}", "chat_template_kwargs"
        )
    for key in chat_template_kwargs:
        if not isinstance(key, str):
            raise ChatFormatError(f"chat_template_kwargs keys must be strings, got {key!r}", "chat_template_kwargs")
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise ChatFormatError(
                f"chat_template_kwargs.{key} is not allowed: it is set by the server, not a template variable",
                f"chat_template_kwargs.{key}",
            )
    return dict(chat_template_kwargs)


def _rendered_differently(sampled: str, rendered: str) -> tuple[PrefixBreakKind, str]:
    """The break record for a sampled response the template renders as other text."""
    return (
        "rendered_differently",
        "the chat template renders this message differently from what was sampled "
        f"({_first_difference(sampled, rendered, 'sampled', 'rendered')}); it was re-encoded from the "
        "template's text (typical causes: the template drops <think> blocks of earlier turns, strips "
        "whitespace, or re-formats tool-call JSON)",
    )


def _message_signature(content: str | None, tool_calls: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    """Content (whitespace-trimmed) and (name, canonical arguments) of each call: equal for the same reply."""
    calls = tuple(
        (call["function"]["name"], _canonical_arguments(call["function"]["arguments"])) for call in tool_calls
    )
    return ((content or "").strip(), calls)


@functools.lru_cache(maxsize=4096)
def _text_signature(text: str) -> tuple[Any, ...]:
    """_message_signature of the message `decode_response` makes from `text` (memoized: diagnostics only)."""
    parsed = parse_tool_calls(text, id_factory=lambda: "")
    return _message_signature(parsed.content, [call.to_openai() for call in parsed.tool_calls])


def _canonical_arguments(arguments: object) -> str:
    """Arguments as sorted-key JSON when they parse, so re-serialised JSON still compares equal."""
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(text)
        except ValueError:
            return text
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _first_difference(a: str, b: str, a_name: str = "expected prefix", b_name: str = "prompt") -> str:
    """Where `a` and `b` first differ, with a little context of each: for actionable break reasons."""
    # Binary search on slice equality: C-speed compares, as prompts can be long.
    lo_k, hi_k = 0, min(len(a), len(b))
    while lo_k < hi_k:
        mid = (lo_k + hi_k + 1) // 2
        if a[:mid] == b[:mid]:
            lo_k = mid
        else:
            hi_k = mid - 1
    k = lo_k
    lo = max(0, k - _SNIPPET_CONTEXT)
    return (
        f"they differ at character {k}: {a_name} has {a[lo : k + _SNIPPET_CONTEXT]!r}, "
        f"{b_name} has {b[lo : k + _SNIPPET_CONTEXT]!r}"
    )


def _content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""
