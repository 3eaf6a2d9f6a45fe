"""On-policy distillation: a frozen teacher scores the tokens the student sampled; the gap is the advantage.

The student (the policy) samples through the proxy as in any run; the teacher — a Hugging Face
model loaded once in the trainer process, never trained — computes its raw logprob of every
sampled token; the advantage of token t is ``teacher_lp_t − student_lp_t`` with the student's
logprob the sampler recorded. Minimising −Σ A·lp then descends the per-token reverse KL,
KL(student ‖ teacher) (tinker-cookbook's on-policy distillation). No reward is needed. The teacher
must share the policy's tokenizer (the ids are the same tokens for both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from agl_bridge.convert import Trajectory, TrajectorySegment
from agl_bridge.errors import ConfigError
from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from agl_bridge.train.advantages import Advantage


class Teacher:
    """A frozen causal LM that scores token sequences (raw logprobs, as the sampler and trainer compute them).

    name: the `teacher` setting (named in errors); policy_tokenizer / policy_name: the student's
    tokenizer and its `model` setting, which the teacher's tokenizer must equal. max_batch_tokens:
    most padded tokens per forward pass.
    """

    def __init__(
        self,
        name: str,
        *,
        policy_tokenizer: Any,
        policy_name: str,
        device: str | torch.device | None = None,
        max_batch_tokens: int = 16384,
    ) -> None:
        self.name = name
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._max_batch_tokens = max_batch_tokens
        try:
            path = resolve_model_path(name)
            tokenizer = load_tokenizer(path)
        except Exception as error:
            raise ConfigError(f"teacher {name!r} cannot be loaded: {error}") from None
        if not same_tokenizer(tokenizer, policy_tokenizer):
            raise ConfigError(
                f"teacher {name!r} has another tokenizer than model {policy_name!r} (vocabularies of "
                f"{len(tokenizer.get_vocab())} and {len(policy_tokenizer.get_vocab())} tokens differ); on-policy "
                "distillation scores the student's token ids with the teacher, so teacher and model must share "
                "a tokenizer"
            )
        try:
            self._model = load_causal_lm(path, device=str(self._device))
        except Exception as error:
            raise ConfigError(f"teacher {name!r} cannot be loaded: {error}") from None
        self._model.eval()
        self._model.requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Per sequence, the teacher's logprob of each token given the ones before it (entry 0 is 0.0)."""
        out: list[list[float]] = [[] for _ in sequences]
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        batch: list[int] = []
        for index in order:
            if batch and len(sequences[index]) * (len(batch) + 1) > self._max_batch_tokens:
                self._score(sequences, batch, out)
                batch = []
            batch.append(index)
        if batch:
            self._score(sequences, batch, out)
        return out

    def close(self) -> None:
        """Drop the model (its memory goes with the last reference)."""
        del self._model

    def _score(self, sequences: Sequence[Sequence[int]], batch: list[int], out: list[list[float]]) -> None:
        # Right-padded with no attention mask, as the trainer scores: causal attention never sees the padding.
        rows = [torch.tensor(list(sequences[i]), dtype=torch.long) for i in batch]
        ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).to(self._device)
        logits = self._model(input_ids=ids, use_cache=False).logits
        lp = torch.log_softmax(logits.float(), dim=-1)[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        for row, index in enumerate(batch):
            out[index] = [0.0, *lp[row, : len(sequences[index]) - 1].cpu().tolist()]


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers map the same strings to the same ids (equal vocabularies and special tokens)."""
    return bool(a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids)


def distill_advantages(segment: TrajectorySegment, teacher_logprobs: Sequence[float]) -> list[float]:
    """Per token of `segment`: teacher logprob − the sampler's (student's) logprob where sampled, else 0."""
    return [
        (teacher - student) if mask else 0.0
        for teacher, student, mask in zip(teacher_logprobs, segment.sampler_logprobs, segment.loss_mask, strict=True)
    ]


def distill_items(
    trajectories: Sequence[Trajectory], teacher: Teacher
) -> tuple[list[tuple[Trajectory, Advantage]], float]:
    """Each trajectory with its per-token advantages, and the mean reverse KL (student − teacher) per sampled token."""
    segments = [segment for trajectory in trajectories for segment in trajectory.segments]
    scored = iter(teacher.logprobs([segment.input_ids for segment in segments]))
    items: list[tuple[Trajectory, Advantage]] = []
    gaps: list[float] = []
    for trajectory in trajectories:
        per_segment = []
        for segment in trajectory.segments:
            advantages = distill_advantages(segment, next(scored))
            gaps.extend(-a for a, m in zip(advantages, segment.loss_mask, strict=True) if m)
            per_segment.append(advantages)
        items.append((trajectory, per_segment))
    return items, (math.fsum(gaps) / len(gaps) if gaps else math.nan)
