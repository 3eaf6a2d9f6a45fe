"""A small store with every case the viewer shows, a run directory, and parsers for the token markup."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agl_bridge.store import PostgresStore, SQLiteStore, store_at
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus, StoredSpan

KEY = "test-key"
PREFIX_BREAK = {"message_index": 0, "kind": "rerendered", "reason": "the template dropped a <think> block"}


def call(
    rollout_id: str | None, attempt_id: str | None, prompt: list[int], response: list[int], **extra: Any
) -> LLMCall:
    """A token call; the logprobs are distinct per token so a mix-up shows."""
    fields: dict[str, Any] = {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "model": "tiny",
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_logprobs": [-0.125 * (i + 1) for i in range(len(response))],
        "token_policy_versions": [1] * len(response),
        "messages": [{"role": "user", "content": "Say hello."}],
        "response_text": "hello",
        "finish_reason": "stop",
        "started_at": time.time(),
        "ended_at": time.time() + 0.05,
    }
    fields.update(extra)
    return LLMCall(**fields)


async def finish(
    store: SQLiteStore | PostgresStore, rollout_id: str, attempt_id: str, status: AttemptStatus, **kwargs: Any
) -> None:
    """Close an attempt and its rollout with `status`."""
    await store.finish_attempt(attempt_id, status, **kwargs)
    await store.set_rollout_status(rollout_id, RolloutStatus(status.value))


async def build_store(path: Path | str) -> None:
    """The scenario (rollout ids in brackets):

    step 1 (group s0-0, task "alpha"): [ro-a1] one call, reward 1; [ro-a2] two turns in one sequence,
      rewards correct 0.5 and format 0.25, an agent span; [ro-a3] attempt 1 failed with a traceback,
      attempt 2 succeeded with a second call that does not extend the first (a prefix break), reward 0.
    step 1 (group s0-1, task "beta"): [ro-b1], [ro-b2] both reward 1 (equal returns: not trained).
    step 2 (group s1-0, task "gamma"): [ro-c1] still running, one call.
    held-out after step 1 (group eval1-12345678-0): [ro-e1] reward 1.
    no group: [ro-solo] a token call, a text-only call, and a reward recorded outside any attempt.
    `path` is a SQLite file or a PostgreSQL URL.
    """
    async with store_at(path) as store:
        for rollout_id, group, task in (
            ("ro-a1", "s0-0", "alpha"),
            ("ro-a2", "s0-0", "alpha"),
            ("ro-a3", "s0-0", "alpha"),
            ("ro-b1", "s0-1", "beta"),
            ("ro-b2", "s0-1", "beta"),
            ("ro-c1", "s1-0", "gamma"),
            ("ro-e1", "eval1-12345678-0", "delta"),
            ("ro-solo", None, "solo"),
        ):
            await store.create_rollout({"word": task}, group_id=group, rollout_id=rollout_id)

        attempt = (await store.start_attempt("ro-a1")).attempt_id
        await store.add_llm_call(call("ro-a1", attempt, [1, 2, 3], [10, 11]))
        await store.add_reward(Reward(rollout_id="ro-a1", attempt_id=attempt, value=1.0))
        await finish(store, "ro-a1", attempt, AttemptStatus.SUCCEEDED)

        attempt = (await store.start_attempt("ro-a2")).attempt_id
        first = [{"role": "user", "content": "What is 2+2?"}]
        tool_call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
        await store.add_llm_call(call("ro-a2", attempt, [1, 2, 3], [12, 13], messages=first, response_text=tool_call))
        await store.add_span(
            StoredSpan(
                rollout_id="ro-a2",
                attempt_id=attempt,
                name="crewai.tool.add",
                trace_id="1" * 32,
                span_id="2" * 16,
                start_time_ns=1_000_000_000,
                end_time_ns=1_004_000_000,
                attributes={"tool.name": "add", "tool.result": "4"},
            )
        )
        function = {"name": "add", "arguments": '{"a": 2, "b": 2}'}
        second = [
            *first,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        ]
        prompt = [1, 2, 3, 12, 13, 5, 6]
        await store.add_llm_call(call("ro-a2", attempt, prompt, [14], messages=second, response_text="4"))
        await store.add_reward(Reward(rollout_id="ro-a2", attempt_id=attempt, value=0.5, name="correct"))
        await store.add_reward(Reward(rollout_id="ro-a2", attempt_id=attempt, value=0.25, name="format"))
        await finish(store, "ro-a2", attempt, AttemptStatus.SUCCEEDED)

        attempt = (await store.start_attempt("ro-a3")).attempt_id
        await store.add_llm_call(call("ro-a3", attempt, [1, 2, 3], [15]))
        error = "ValueError: the tool broke"
        await store.finish_attempt(
            attempt, AttemptStatus.FAILED, error=error, traceback=f"Traceback (most recent call last):\n  {error}"
        )
        attempt = (await store.start_attempt("ro-a3")).attempt_id
        await store.add_llm_call(call("ro-a3", attempt, [1, 2, 3], [20]))
        await store.add_llm_call(call("ro-a3", attempt, [1, 9, 9, 20, 7], [21], prefix_breaks=[PREFIX_BREAK]))
        await store.add_reward(Reward(rollout_id="ro-a3", attempt_id=attempt, value=0.0))
        await finish(store, "ro-a3", attempt, AttemptStatus.SUCCEEDED)

        for rollout_id in ("ro-b1", "ro-b2"):
            attempt = (await store.start_attempt(rollout_id)).attempt_id
            await store.add_llm_call(call(rollout_id, attempt, [4, 5], [30, 31, 32]))
            await store.add_reward(Reward(rollout_id=rollout_id, attempt_id=attempt, value=1.0))
            await finish(store, rollout_id, attempt, AttemptStatus.SUCCEEDED)

        attempt = (await store.start_attempt("ro-c1")).attempt_id
        await store.add_llm_call(call("ro-c1", attempt, [6, 7], [40]))

        attempt = (await store.start_attempt("ro-e1")).attempt_id
        await store.add_llm_call(call("ro-e1", attempt, [8], [50]))
        await store.add_reward(Reward(rollout_id="ro-e1", attempt_id=attempt, value=1.0))
        await finish(store, "ro-e1", attempt, AttemptStatus.SUCCEEDED)

        attempt = (await store.start_attempt("ro-solo")).attempt_id
        await store.add_llm_call(call("ro-solo", attempt, [1], [60]))
        await store.add_llm_call(
            LLMCall(rollout_id="ro-solo", attempt_id=attempt, model="judge", kind="text", response_text="fine")
        )
        await store.add_reward(Reward(rollout_id="ro-solo", value=0.5, name="judge"))
        await finish(store, "ro-solo", attempt, AttemptStatus.SUCCEEDED)


def write_run_dir(run_dir: Path, *, metrics: bool = True) -> Path:
    """A run directory like the GRPO loop's: config.json, and metrics.jsonl for two steps and an evaluation."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"model": None, "reward_weights": {}, "missing_reward": "drop"}))
    if metrics:
        records = [
            {"phase": "eval", "stage": "rl", "step": 0, "eval_reward": 0.25},
            {"phase": "train", "step": 1, "policy_version": 1, "reward_mean": 0.5, "loss": 0.75, "entropy_mean": 2.0,
             "logprob_diff_abs_mean": 1e-7, "time_step_s": 1.5},
            {"phase": "eval", "stage": "rl", "step": 1, "eval_reward": 0.5},
            {"phase": "train", "step": 2, "policy_version": 1, "reward_mean": 0.625, "loss": None, "time_step_s": 1.25},
        ]  # fmt: skip
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


_SEGMENT = re.compile(r'<div class="tokens" data-adv="([^"]*)">(.*?)</div>', re.S)
_TOKEN = re.compile(r'<span class="tok[^"]*" data-i="(\d+)" data-id="(\d+)" data-m="(\d)"')


def token_segments(html: str) -> list[dict[str, Any]]:
    """The token spans of a token view page, per segment: ids, masks, and the advantage the page carries."""
    segments = []
    for advantage, body in _SEGMENT.findall(html):
        tokens = _TOKEN.findall(body)
        segments.append(
            {
                "advantage": float(advantage),
                "input_ids": [int(t[1]) for t in tokens],
                "loss_mask": [int(t[2]) for t in tokens],
            }
        )
    return segments


def start_viewer(*args: str) -> tuple[subprocess.Popen[str], str]:
    """`agl-bridge view ARGS --port 0` in a subprocess, and the address (with the key) it printed."""
    command = [sys.executable, "-m", "agl_bridge.cli", "view", *args, "--port", "0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"(http://\S+/\?key=\S+)", line)
        if found:
            return process, found[1]
    process.wait(timeout=30)
    raise AssertionError(f"agl-bridge view printed no address (exit {process.returncode})")
