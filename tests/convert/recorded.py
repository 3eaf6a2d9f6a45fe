"""The recorded real-agent sessions of tests/convert/fixtures/ (issue 30), as the converter's inputs.

`load_fixture(name)` reads `fixtures/<name>.jsonl.gz` (a store's `export --what calls`, gzipped)
back into `LLMCall` / `Reward` records, one entry per (rollout, attempt); `load_labels(name)` gives
the hand-checked class of each of its calls, keyed "rollout_id/attempt_id/sequence/choice_index"
(`call_key`). How they were recorded and labelled: fixtures/README.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_bridge.store.export import LLM_CALL_KIND, REWARD_KIND
from agl_bridge.types import LLMCall, Reward, Usage

FIXTURES = Path(__file__).resolve().parent / "fixtures"

FIXTURE_NAMES = (
    "opencode",
    "opencode-compaction",
    "claude-code-compact",
    "codex-compaction",
    "client-retry",
    "subagent",
)
"""Every recorded scenario (fixtures/record.py); a name is the file `<name>.jsonl.gz`."""

_CALL_FIELDS = {field.name for field in dataclasses.fields(LLMCall)}


@dataclass(frozen=True)
class RecordedAttempt:
    """One rollout attempt of a fixture: its calls and rewards in store order."""

    rollout_id: str
    attempt_id: str
    calls: list[LLMCall]
    rewards: list[Reward]

    def __iter__(self) -> Any:  # unpacks as (rollout_id, attempt_id, calls, rewards)
        return iter((self.rollout_id, self.attempt_id, self.calls, self.rewards))


def call_key(call: LLMCall) -> str:
    """The key of a call in labels.json: "rollout_id/attempt_id/sequence/choice_index"."""
    return f"{call.rollout_id}/{call.attempt_id}/{call.sequence}/{call.choice_index}"


def _call(record: dict[str, Any]) -> LLMCall:
    # Exports made before `declared_class`/`declared_parent` existed lack them (LLMCall's defaults
    # then apply); a field this LLMCall does not know, from a newer export, is left out.
    fields = {key: value for key, value in record.items() if key in _CALL_FIELDS and key not in ("kind", "usage")}
    counts = record.get("usage")
    usage = (
        None if counts is None else Usage(input_tokens=counts["input_tokens"], output_tokens=counts["output_tokens"])
    )
    return LLMCall(**fields, kind=record["call_kind"], usage=usage)


def read_records(name: str) -> list[dict[str, Any]]:
    """The export lines of fixture `name`, as dicts."""
    with gzip.open(FIXTURES / f"{name}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def load_fixture(name: str) -> list[RecordedAttempt]:
    """Fixture `name`'s attempts, each (rollout_id, attempt_id, calls, rewards), in export order."""
    attempts: dict[tuple[str, str], RecordedAttempt] = {}
    for record in read_records(name):
        key = (record["rollout_id"], record["attempt_id"])
        attempt = attempts.setdefault(key, RecordedAttempt(*key, calls=[], rewards=[]))
        if record["kind"] == LLM_CALL_KIND:
            attempt.calls.append(_call(record))
        elif record["kind"] == REWARD_KIND:
            attempt.rewards.append(Reward(**{k: v for k, v in record.items() if k != "kind"}))
        else:
            raise ValueError(f"{name}: unknown export record kind {record['kind']!r}")
    return list(attempts.values())


@dataclass(frozen=True)
class Label:
    """The true class of one recorded call and why (decided by reading the call)."""

    call_class: str
    reason: str


def load_labels(name: str) -> dict[str, Label]:
    """Fixture `name`'s ground truth: call key (`call_key`) → its Label."""
    every = json.loads((FIXTURES / "labels.json").read_text())
    return {key: Label(entry["class"], entry["reason"]) for key, entry in every[name].items()}
