"""Answerer crews that keep their task outputs in memory instead of CrewAI's shared SQLite file.

In CrewAI 1.6.1 every `Crew.kickoff()` deletes every row of `latest_kickoff_task_outputs.db` (under the
storage directory) and then writes its own task's output there, for `crewai replay`. The flow runs one
answerer crew per question, dozens of games at once, so those writes queue on the file's lock; SQLite's
5-second wait ran out under load ("database is locked": 29 of about 13,000 answers in a 40-step run
beside two other jobs), and each such answer cost its game a turn for a reason the player had no part in.
Nothing here replays a crew, so each answerer crew keeps its outputs in memory: no file, no lock. (The
handler is made with the crew, and CrewAI's opens the file then: the crew class names its own.)
"""

from __future__ import annotations

from typing import Any

from crewai import Agent, Crew, Task
from crewai.utilities.task_output_storage_handler import TaskOutputStorageHandler
from pydantic import PrivateAttr


class InMemoryTaskOutputs(TaskOutputStorageHandler):
    """CrewAI's task-output handler without its SQLite storage: one crew's outputs, in a list."""

    def __init__(self) -> None:  # no super().__init__(): that opens the shared SQLite file
        self.outputs: list[dict[str, Any]] = []

    def update(self, task_index: int, log: dict[str, Any]) -> None:
        """Keep the output of task `task_index`."""
        self.outputs[task_index:] = [log]

    def add(
        self,
        task: Task,
        output: dict[str, Any],
        task_index: int,
        inputs: dict[str, Any] | None = None,
        was_replayed: bool = False,
    ) -> None:
        """Keep a task's output (CrewAI's signature)."""
        self.update(task_index, {"task": task, "output": output, "inputs": inputs or {}, "was_replayed": was_replayed})

    def reset(self) -> None:
        """Forget the kept outputs."""
        self.outputs = []

    def load(self) -> list[dict[str, Any]] | None:
        """The kept outputs (None when there are none, as CrewAI's handler answers)."""
        return self.outputs or None


class AnswererCrew(Crew):
    """CrewAI's Crew, its task outputs kept in memory (`InMemoryTaskOutputs`)."""

    _task_output_handler: TaskOutputStorageHandler = PrivateAttr(default_factory=InMemoryTaskOutputs)


def answerer_crew(agent: Agent, task: Task) -> Crew:
    """A one-agent, one-task crew whose task outputs stay in memory."""
    return AnswererCrew(agents=[agent], tasks=[task], verbose=False)
