"""What every agent recipe test asserts: only what the product controls, never the random model's words.

- the agent reached the proxy, every request on its rollout's URL prefix, and no well-formed request
  was answered 4xx/5xx;
- every model request is one record under the rollout (nothing lost, nothing outside it), with
  aligned ids and logprobs; a stream the agent left before its end may have none (it was cancelled);
- the prompt ids are what was sampled on: the tiny model, rescoring `prompt + response`, gives the
  stored logprobs;
- multi-turn: a later turn's prompt extends the earlier turn's prompt + sampled ids token for token,
  or its record says why not (`prefix_breaks`), or the agent sent back other text than it was given.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from http_tap import Exchange

from agl_bridge.store import SQLiteStore
from agl_bridge.types import LLMCall

MODEL_ROUTES = ("/chat/completions", "/completions", "/responses", "/messages")
"""Path endings of the requests that sample (each is one record per choice)."""

RESCORE_TOLERANCE = 2e-3
"""How far a stored logprob may be from a full-sequence forward pass (the sampler decodes with a KV cache)."""


def stored_calls(store_path: Path, rollout_id: str) -> list[LLMCall]:
    """The rollout's records in sequence order, read from the store file the server writes."""

    async def read() -> list[LLMCall]:
        async with SQLiteStore(store_path) as store:
            return [call async for call in store.iter_llm_calls(rollout_id)]

    return asyncio.run(read())


def count_all_calls(store_path: Path) -> int:
    """Every record in the store, inside a rollout or not."""

    async def count() -> int:
        async with SQLiteStore(store_path) as store:
            return sum([1 async for _ in store.iter_all_calls()])

    return asyncio.run(count())


def model_requests(exchanges: Sequence[Exchange]) -> list[Exchange]:
    """The exchanges that asked the model for a sample."""
    return [e for e in exchanges if e.method == "POST" and e.path.endswith(MODEL_ROUTES)]


def check_reached_and_answered(exchanges: Sequence[Exchange], prefix: str) -> None:
    """The agent talked to the proxy, only on its rollout's prefix, and got no 4xx/5xx."""
    assert model_requests(exchanges), "the agent never asked the proxy for a sample"
    stray = [e.describe() for e in exchanges if not e.path.startswith(prefix)]
    assert not stray, f"requests outside the rollout prefix {prefix}: {stray}"
    failed = [e.describe() for e in exchanges if e.failed]
    assert not failed, "well-formed requests were refused:\n" + "\n".join(failed)


def check_recorded(calls: Sequence[LLMCall], exchanges: Sequence[Exchange], rollout_id: str, attempt_id: str) -> None:
    """One record per answered model request, under this rollout attempt, ids and logprobs aligned.

    A stream the agent left before its end is cancelled and recorded only if its sample had already
    finished when the proxy saw the hang-up, so it may or may not have a record.
    """
    answered = [e for e in model_requests(exchanges) if not e.failed]
    finished = [e for e in answered if not e.abandoned]
    recorded = len({call.sequence for call in calls})
    assert len(finished) <= recorded <= len(answered), (
        f"{len(answered)} model requests were answered ({len(answered) - len(finished)} streams left by the agent "
        f"before their end) but {recorded} are recorded under {rollout_id}"
    )
    for call in calls:
        where = f"call {call.sequence} ({call.model})"
        assert (call.rollout_id, call.attempt_id) == (rollout_id, attempt_id), where
        assert call.prompt_token_ids, f"{where} has no prompt ids"
        assert len(call.response_token_ids) == len(call.response_logprobs) == len(call.token_policy_versions), where
        assert all(math.isfinite(lp) and lp <= 0 for lp in call.response_logprobs), f"{where}: logprobs out of range"


def check_sampled_on(calls: Sequence[LLMCall], model: Any) -> None:
    """The shortest call's stored logprobs are the model's on its stored prompt + response ids."""
    import torch

    call = min((c for c in calls if c.response_token_ids), key=lambda c: len(c.prompt_token_ids))
    prompt, response = call.prompt_token_ids, call.response_token_ids
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    scores = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()
    worst = max(abs(a - b) for a, b in zip(scores, call.response_logprobs, strict=True))
    assert worst < RESCORE_TOLERANCE, (
        f"call {call.sequence}: stored logprobs differ from the model's on the stored ids by up to {worst:.4f}"
    )


def continuations(calls: Sequence[LLMCall]) -> list[tuple[LLMCall, LLMCall]]:
    """(earlier, later) pairs where the later prompt starts with the whole earlier prompt.

    The earlier prompt ends with the assistant generation prompt, so a later prompt that starts with
    it continues that conversation with an assistant turn: the earlier call's response. Each later
    call is paired with its latest such predecessor (side calls with other prompts pair with nothing).
    """
    pairs = []
    for k, later in enumerate(calls):
        for earlier in reversed(calls[:k]):
            prompt = earlier.prompt_token_ids
            if len(later.prompt_token_ids) > len(prompt) and later.prompt_token_ids[: len(prompt)] == prompt:
                pairs.append((earlier, later))
                break
    return pairs


def check_multi_turn(calls: Sequence[LLMCall], decode: Callable[[Sequence[int]], str]) -> list[int]:
    """At least one later turn, and each extends its earlier turn's prompt + sampled ids (or says why not).

    A turn whose text does not start with the earlier prompt + reply, with no prefix break recorded, is
    one where the agent sent back other text than it was given (pydantic-ai re-wraps a `<think>` block
    of the reply): no prompt can carry the sampled ids then. Such turns are returned (their sequence
    numbers), not failed.
    """
    pairs = continuations(calls)
    assert pairs, (
        f"no call's prompt extends an earlier one ({len(calls)} calls, prompt lengths "
        f"{[len(c.prompt_token_ids) for c in calls]}): the conversation was not continued"
    )
    edited_by_agent = []
    for earlier, later in pairs:
        expected = earlier.prompt_token_ids + earlier.response_token_ids
        if later.prompt_token_ids[: len(expected)] == expected:
            continue
        kinds = {b["kind"] if isinstance(b, dict) else str(b) for b in later.prefix_breaks}
        content = expected[:-1]
        assert later.prompt_token_ids[: len(content)] != content, (
            f"call {later.sequence} keeps call {earlier.sequence}'s sampled ids but not its stop token "
            f"{expected[-1]}: the next prompt must extend prompt + response, stop token included"
        )
        if not kinds and not decode(later.prompt_token_ids).startswith(decode(expected)):
            edited_by_agent.append(later.sequence)
            continue
        assert kinds, (
            f"call {later.sequence}'s prompt does not extend call {earlier.sequence}'s prompt + response "
            f"(first difference at token {_first_difference(later.prompt_token_ids, expected)}) and its record "
            "names no prefix break"
        )
    return edited_by_agent


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


TITLE_MARKERS = ("You are a title generator",)
"""Opening words of a title generator's instructions (opencode's title call)."""

SUMMARY_MARKERS = (
    "You are a context summarization agent",  # opencode's compaction agent (its instructions)
    "create a detailed summary of the conversation",  # Claude Code's /compact and auto-compaction (last user message)
    "CONTEXT CHECKPOINT COMPACTION",  # Codex's compaction (last user message)
)
"""Words only a summarisation (compaction) request of the recorded agents carries, where they carry them."""


def message_text(message: dict[str, Any]) -> str:
    """A recorded message's text, whatever shape its content has (a string, or parts with text)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return str(content or "")


def auxiliary_by_content(calls: Sequence[LLMCall]) -> dict[int, str]:
    """The calls that are plainly a title call (`"title"`) or a summarisation (`"summary"`) by what they say.

    Keyed by sequence. Read from the instructions' opening (system/developer messages, first 300
    characters: opencode's main prompt mentions summaries further down) and the last user message,
    so the live recipe tests can check the converter's classes against the calls' content.
    """
    found: dict[int, str] = {}
    for call in calls:
        system = "\n".join(message_text(m) for m in call.messages if m.get("role") in ("system", "developer"))[:300]
        users = [message_text(m) for m in call.messages if m.get("role") == "user"]
        said = f"{system}\n{users[-1] if users else ''}".lower()
        if any(marker.lower() in system.lower() for marker in TITLE_MARKERS):
            found[call.sequence or 0] = "title"
        elif any(marker.lower() in said for marker in SUMMARY_MARKERS):
            found[call.sequence or 0] = "summary"
    return found


def check_call_classes(calls: Sequence[LLMCall]) -> dict[int, str]:
    """The converter's rollout graph over a live session agrees with what the calls plainly are.

    A title call must be `side`, a summarisation `compaction` (or `retry` when it was sent again),
    and the session has a main conversation. Returns each call's class by sequence (for the printout).
    """
    from agl_bridge.convert.graph import build_graph
    from agl_bridge.types import CallClass

    graph = build_graph(calls)
    classes = {sequence: node.call_class for (sequence, _), node in graph.nodes.items()}
    expected = {"title": {CallClass.SIDE}, "summary": {CallClass.COMPACTION, CallClass.RETRY}}
    for sequence, what in auxiliary_by_content(calls).items():
        node = graph.nodes[(sequence, 0)]
        assert node.call_class in expected[what], (
            f"call {sequence} is plainly a {what} call but the rollout graph made it {node.call_class.value}: "
            f"{node.reason}"
        )
    assert CallClass.MAIN in classes.values(), f"no main conversation among the classes {classes}"
    return {sequence: call_class.value for sequence, call_class in classes.items()}
