"""`keep_best`: the adapter with the best validation reward so far, kept on disk and restored at the end of a run.

Late in GRPO most groups have equal returns and are dropped, so a step's update rests on the few
groups left; the policy keeps moving, and its reward on tasks it never trained on wobbles from one
evaluation to the next. With `keep_best`, each evaluation also runs the validation tasks (never
trained on, apart from the held-out `eval_tasks`); the adapter of the best validation reward is
saved, and the run ends with it. The held-out reward reported for it is the one measured at its
step: the choice never looked at the held-out tasks, so that figure stays an unbiased measure.

The kept adapter and what is known of it live together in `run_dir/best_adapter/` (a
`TrainingClient.save_state` directory plus `best.json`, written last), so a resumed run keeps it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from agl_bridge.primitives.client import TrainingClient

BEST_ADAPTER = "best_adapter"
"""The folder of the kept adapter, under run_dir."""

_FACTS = "best.json"


@dataclass
class KeptAdapter:
    """Where the best adapter stands: its step, its validation reward, the held-out reward measured at its step."""

    step: int
    validation_reward: float
    held_out_reward: float | None


class BestAdapter:
    """Keeps the adapter of the best validation reward of a run in `run_dir/best_adapter/`."""

    def __init__(self, run_dir: Path, *, resume: bool) -> None:
        self.path = run_dir / BEST_ADAPTER
        self.kept: KeptAdapter | None = None
        facts = self.path / _FACTS
        if resume and facts.is_file():
            self.kept = KeptAdapter(**json.loads(facts.read_text()))
        elif not resume and self.path.exists():
            shutil.rmtree(self.path)  # a fresh run in an old run_dir: that run's adapter is not a candidate

    def offer(
        self, client: TrainingClient, *, step: int, validation_reward: float | None, held_out_reward: float | None
    ) -> bool:
        """Keep the client's adapter if its validation reward is at least the kept one's.

        A tie keeps the later adapter: it trained longer, at a smaller learning rate late in a decaying
        schedule. Validation rewards are means of few values (160 rollouts of -1, 0, +1 in the demo),
        so late adapters tie often; one demo run kept step 140 over step 200 at 0.787 each, with
        held-out rewards 0.775 and 0.850.
        """
        if validation_reward is None or (self.kept is not None and validation_reward < self.kept.validation_reward):
            return False
        facts = self.path / _FACTS
        facts.unlink(missing_ok=True)  # no facts while the state is rewritten: a kill here leaves no stale pairing
        client.save_state(self.path)
        self.kept = KeptAdapter(step, validation_reward, held_out_reward)
        partial = self.path / f"{_FACTS}.partial"
        partial.write_text(json.dumps(asdict(self.kept)))
        os.replace(partial, facts)
        return True

    def restore(self, client: TrainingClient) -> KeptAdapter | None:
        """Load the kept adapter's weights into `client` (not its optimizer state); what is known of it."""
        if self.kept is not None:
            client.load_state(self.path, optimizer=False)
        return self.kept
