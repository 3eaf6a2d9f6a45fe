"""CrewAI's storage folder is private to each process: no other process can lock a game's files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from twenty_questions_helpers import EXAMPLE

SHOW_STORAGE = "import os, twenty_q; print(os.environ['CREWAI_STORAGE_DIR'])"


def storage_of_a_fresh_process(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "CREWAI_STORAGE_DIR"}
    result = subprocess.run(
        [sys.executable, "-c", SHOW_STORAGE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=EXAMPLE,
        env={**clean, **env},
        check=True,
    )
    return result.stdout.strip()


def test_each_process_gets_its_own_storage_folder_removed_when_it_exits() -> None:
    first, second = storage_of_a_fresh_process(), storage_of_a_fresh_process()
    assert first != second
    assert not Path(first).exists() and not Path(second).exists()


def test_an_explicit_storage_folder_is_kept(tmp_path: Path) -> None:
    assert storage_of_a_fresh_process(CREWAI_STORAGE_DIR=str(tmp_path)) == str(tmp_path)
    assert tmp_path.is_dir()
