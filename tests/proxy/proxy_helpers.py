"""Helpers for the proxy tests: store queries on the shared server, unique rollout ids, clients."""

from __future__ import annotations

import queue
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared_helpers import collect

MODEL = "tiny"
USER = [{"role": "user", "content": "Say something."}]


def stored_calls(server: Any, rollout_id: str, attempt_id: str | None = None) -> list[Any]:
    """The LLM calls the proxy's store holds for a rollout (attempt), in sequence order."""
    return server.run_coroutine(collect(server.store.iter_llm_calls(rollout_id, attempt_id)))


def all_calls(server: Any) -> list[Any]:
    """Every LLM call in the store, those outside rollouts included."""
    return server.run_coroutine(collect(server.store.iter_all_calls()))


def stored_rewards(server: Any, rollout_id: str, attempt_id: str | None = None) -> list[Any]:
    """The rewards the store holds for a rollout (attempt), in sequence order."""
    return server.run_coroutine(collect(server.store.iter_rewards(rollout_id, attempt_id)))


def auth(server: Any) -> dict[str, str]:
    """The Authorization header for the server's key."""
    return {"Authorization": f"Bearer {server.api_key}"}


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Text of ids with special tokens kept (what the proxy decodes responses with)."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def strip_end_of_turn(tokenizer: Any, ids: list[int]) -> list[int]:
    """`ids` without a trailing end-of-turn token (<|im_end|> or <|endoftext|>)."""
    ends = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    return ids[:-1] if ids and ids[-1] in ends else ids


START_TIMEOUT_S = 180


@dataclass
class ServeProcess:
    """A running `agl-bridge serve` subprocess and the lines it has written to stderr so far."""

    process: subprocess.Popen[str]
    store: Path
    folder: Path
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def wait_for(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """The first stderr line matching `pattern`, waiting for it to be printed."""
        for line in self.seen:
            if (match := pattern.search(line)) is not None:
                return match
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if (match := pattern.search(line)) is not None:
                return match
        raise AssertionError(
            f"`agl-bridge serve` never printed {pattern.pattern!r}; stderr so far:\n" + "".join(self.seen)
        )
