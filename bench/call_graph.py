"""Rollout-graph benchmark: prints ONE JSON line.

Classifies every call of the recorded real-agent sessions in tests/convert/fixtures/ (opencode with
its title call and a forced compaction, Claude Code with `/compact`, Codex with auto-compaction, a
client retry, an OpenAI Agents SDK sub-agent; see that folder's README) with
`agl_bridge.convert.graph.build_graph` and compares each class with the hand-checked label:
precision and recall per class, per fixture the calls right, and every miss with the classifier's
reason. Then times the classifier alone over those sessions (calls classified per second; the
converter's throughput with classification is bench/convert.py's).

    .venv/bin/python bench/call_graph.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "convert")]

from recorded import FIXTURE_NAMES, call_key, load_fixture, load_labels  # noqa: E402

from agl_bridge import semconv  # noqa: E402
from agl_bridge.convert.graph import build_graph  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200, help="passes over every fixture for the timing")
    args = parser.parse_args()
    right: Counter[str] = Counter()  # class -> calls labelled it and classified it
    labelled: Counter[str] = Counter()  # class -> calls labelled it
    predicted: Counter[str] = Counter()  # class -> calls classified as it
    per_fixture: dict[str, dict[str, int]] = {}
    misses: list[dict[str, object]] = []
    attempts = []
    for name in FIXTURE_NAMES:
        labels = load_labels(name)
        correct = total = 0
        for attempt in load_fixture(name):
            attempts.append(attempt.calls)
            graph = build_graph(attempt.calls)
            for call in attempt.calls:
                if call.kind != semconv.CALL_KIND_TOKEN:
                    continue
                node = graph.nodes[(call.sequence, call.choice_index)]  # type: ignore[index]
                want, got = labels[call_key(call)].call_class, node.call_class.value
                labelled[want] += 1
                predicted[got] += 1
                total += 1
                if want == got:
                    right[want] += 1
                    correct += 1
                else:
                    misses.append(
                        {"fixture": name, "sequence": call.sequence, "label": want, "got": got, "why": node.reason}
                    )
        per_fixture[name] = {"calls": total, "right": correct}
    calls = sum(len(a) for a in attempts)
    started = time.process_time()
    for _ in range(args.repeat):
        for attempt_calls in attempts:
            build_graph(attempt_calls)
    cpu = time.process_time() - started
    print(
        json.dumps(
            {
                "bench": "call_graph",
                "fixtures": per_fixture,
                "calls": sum(labelled.values()),
                "right": sum(right.values()),
                "per_class": {
                    name: {
                        "labelled": labelled[name],
                        "precision": round(right[name] / predicted[name], 4) if predicted[name] else None,
                        "recall": round(right[name] / labelled[name], 4) if labelled[name] else None,
                    }
                    for name in semconv.CALL_CLASSES
                },
                "misses": misses,
                "classified_calls_per_cpu_s": round(calls * args.repeat / cpu) if cpu else None,
            }
        )
    )


if __name__ == "__main__":
    main()
