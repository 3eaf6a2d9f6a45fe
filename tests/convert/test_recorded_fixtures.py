"""The recorded real-agent fixtures load, and every call has a ground-truth label and its tokens.

The classifier's scores against these labels are the rollout graph's tests; here only that the
fixtures and labels are whole: a fixture re-recorded without relabelling fails here.
"""

from __future__ import annotations

import pytest
from recorded import FIXTURE_NAMES, FIXTURES, call_key, load_fixture, load_labels

from agl_bridge import semconv

CLASSES = set(semconv.CALL_CLASSES)
MAX_FIXTURE_BYTES = 3 * 1024 * 1024


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_is_labelled_and_has_tokens(name: str) -> None:
    assert (FIXTURES / f"{name}.jsonl.gz").stat().st_size <= MAX_FIXTURE_BYTES
    attempts = load_fixture(name)
    labels = load_labels(name)
    keys = [call_key(call) for attempt in attempts for call in attempt.calls]
    assert len(attempts) == 1 and keys, f"{name}: one recorded attempt with calls"
    assert sorted(keys) == sorted(labels), f"{name}: calls without a label, or labels without a call"
    for attempt in attempts:
        assert [reward.value for reward in attempt.rewards] == [1.0]
        for call in attempt.calls:
            assert call.kind == semconv.CALL_KIND_TOKEN
            assert call.prompt_token_ids and call.response_token_ids, call_key(call)
            assert len(call.response_logprobs) == len(call.response_token_ids), call_key(call)
            assert call.messages, call_key(call)
    assert {label.call_class for label in labels.values()} <= CLASSES
    assert all(label.reason for label in labels.values())


def test_fixtures_fit_the_size_budget() -> None:
    total = sum((FIXTURES / f"{name}.jsonl.gz").stat().st_size for name in FIXTURE_NAMES)
    assert total <= 12 * 1024 * 1024
