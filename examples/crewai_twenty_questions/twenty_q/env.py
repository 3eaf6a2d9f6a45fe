"""The environment switches that keep CrewAI, agentops and LiteLLM from reaching outside services.

They are read when those libraries are imported (or on first use), so they are set with
`setdefault` before anything imports CrewAI: a user who wants CrewAI's own tracing can still set
a variable explicitly. `OTEL_SDK_DISABLED` is never set: it would switch off our own tracing too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

OFFLINE_SWITCHES: dict[str, str] = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_TESTING": "true",  # no first-run prompt asking to enable CrewAI's cloud traces
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "AGENTOPS_LOG_LEVEL": "WARNING",
    "AGENTOPS_LOGGING_TO_FILE": "False",  # else agentops writes ./agentops.log wherever it runs
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply_offline_environment(storage_dir: str | os.PathLike[str] | None = None) -> None:
    """Set the offline switches (unless already set) and where CrewAI keeps its files.

    storage_dir: CrewAI's storage (`CREWAI_STORAGE_DIR`); by default (and unless the variable is set)
    a private temporary folder of this process, removed when it exits.

    Why private: every `Crew.kickoff` in CrewAI 1.6.1 rewrites `latest_kickoff_task_outputs.db` in that
    folder (its `crewai replay` log: a DELETE and INSERTs, each committed), through sqlite3's default
    5-second lock timeout, and a lock error fails the kickoff. The answerer is a one-task Crew per
    question, so a folder shared between processes (one fixed temp path used to be the default) let
    any other process on the machine that holds that file's lock for 5 s (a commit's fsync on a busy
    disk, a writer starved of CPU) fail a question: "answerer failed on turn N: Database
    initialization error: database is locked", a wasted turn, in tests and in training alike.
    """
    for name, value in OFFLINE_SWITCHES.items():
        os.environ.setdefault(name, value)
    if storage_dir is not None:
        os.environ["CREWAI_STORAGE_DIR"] = str(storage_dir)
    elif not os.environ.get("CREWAI_STORAGE_DIR"):
        private = tempfile.mkdtemp(prefix="agl-crewai-")
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        os.environ["CREWAI_STORAGE_DIR"] = private


def limit_torch_threads(threads: int | None) -> None:
    """Use `threads` CPU threads for torch (None: leave torch's default).

    On a small machine shared with other jobs, torch's default (one thread per core) spins its
    threads against everything else: on 2 loaded cores one sampling thread ran 10x faster than two.
    """
    if threads is None or threads < 1:
        return
    import torch

    torch.set_num_threads(threads)
