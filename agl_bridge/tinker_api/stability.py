"""Stability info: the sequences a sampling client recorded (`record_stability_info=True`), and training
datums' provenance spans resolved against them, for `stable_reinforce`.

The loss trains on what the sampler did as this server saw it: a datum's behaviour logprobs come from
the record, not from the client, and a datum whose sampled targets differ from the recorded tokens is
refused, so a client cannot make a sample look likelier or different than it was. A record is kept a
day after it was made or last trained on (Tinker's rule).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agl_bridge.primitives.datum import ADVANTAGES, LOGPROBS, TARGET_TOKENS, WEIGHTS, Datum
from agl_bridge.tinker_api.wire import ProvenanceSpan

KEEP_S = 24 * 3600.0
"""How long a recorded sequence stays trainable after it was sampled or last trained on."""


class ProvenanceError(ValueError):
    """A datum's provenance does not match the record; the message names the datum and what to do."""


@dataclass
class _Recorded:
    tokens: np.ndarray
    logprobs: np.ndarray
    used_at: float


class StabilityRecord:
    """Sequence id → the sampled tokens and the sampler's logprobs of each."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self._keep_s = keep_s
        self._sequences: dict[str, _Recorded] = {}
        self._next_sweep = time.monotonic() + keep_s

    def add(self, sequence_id: str, tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        """Record one sampled sequence."""
        self._sweep()
        self._sequences[sequence_id] = _Recorded(
            np.asarray(tokens, dtype=np.int64), np.asarray(logprobs, dtype=np.float32), time.monotonic()
        )

    def resolve(self, index: int, datum: Datum, spans: Sequence[ProvenanceSpan]) -> Datum:
        """`datum` with the recorded sampler logprobs as `logprobs` and weight 1 on its sampled targets (0 on
        prompt ones); ProvenanceError when its spans do not tile its targets or do not match the record."""
        where = f"data[{index}]"
        length = datum.num_tokens
        if not spans:
            raise ProvenanceError(
                f"{where}: stable_reinforce trains on recorded samples; name them with provenance spans "
                "(Datum.with_provenance) after sampling with record_stability_info=True"
            )
        if sum(span.length for span in spans) != length:
            raise ProvenanceError(
                f"{where}: the loss_fn_input spans cover {sum(s.length for s in spans)} targets, the datum has "
                f"{length}; the spans must tile the targets"
            )
        for name in (TARGET_TOKENS, ADVANTAGES):
            if np.size(datum.loss_fn_inputs.get(name, ())) != length:
                raise ProvenanceError(f"{where}.loss_fn_inputs[{name!r}]: expected {length} values, one per target")
        targets = np.asarray(datum.loss_fn_inputs[TARGET_TOKENS], dtype=np.int64).reshape(-1)
        advantages = np.asarray(datum.loss_fn_inputs[ADVANTAGES], dtype=np.float32).reshape(-1)
        behaviour = np.zeros(length, dtype=np.float32)
        weights = np.zeros(length, dtype=np.float32)
        now = time.monotonic()
        position = 0
        for span in spans:
            covered = slice(position, position + span.length)
            if not span.sampled:
                if np.any(advantages[covered] != 0):
                    raise ProvenanceError(
                        f"{where}: a nonzero advantage on prompt targets {position}..{covered.stop - 1}; "
                        "stable_reinforce only accepts advantages on sampled tokens"
                    )
            else:
                recorded = self._sequences.get(span.sequence_id)
                if recorded is None or now - recorded.used_at > self._keep_s:
                    raise ProvenanceError(
                        f"{where}: sequence {span.sequence_id!r} was not recorded by this server (or is over a "
                        "day old); sample with record_stability_info=True on this server and train within a day"
                    )
                taken = slice(span.offset, span.offset + span.length)
                if span.offset < 0 or taken.stop > len(recorded.tokens):
                    raise ProvenanceError(
                        f"{where}: span {span.offset}+{span.length} runs past sequence {span.sequence_id!r}'s "
                        f"{len(recorded.tokens)} sampled tokens"
                    )
                if not np.array_equal(targets[covered], recorded.tokens[taken]):
                    raise ProvenanceError(
                        f"{where}: targets {position}..{covered.stop - 1} differ from the tokens sequence "
                        f"{span.sequence_id!r} sampled; train on the tokens as sampled"
                    )
                behaviour[covered] = recorded.logprobs[taken]
                weights[covered] = 1.0
                recorded.used_at = now
            position = covered.stop
        if WEIGHTS in datum.loss_fn_inputs:
            weights *= np.asarray(datum.loss_fn_inputs[WEIGHTS], dtype=np.float32).reshape(-1)
        inputs = {**datum.loss_fn_inputs, LOGPROBS: behaviour, WEIGHTS: weights}
        return Datum(model_input=datum.model_input, loss_fn_inputs=inputs)

    def _sweep(self) -> None:
        # Walks every record: once per keep window, not on every sample.
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._keep_s
        stale = [key for key, recorded in self._sequences.items() if now - recorded.used_at > self._keep_s]
        for key in stale:
            del self._sequences[key]
