"""Data-parallel training on 2 CPU ranks (gloo) gives one process's numbers, and fails by name.

Each test but the first starts a real group: this process is rank 0 and a worker process is rank 1
(`spawn_local_group`), on the tiny model — slow (a worker imports torch and loads the model).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.primitives.data_parallel import (
    DataParallelError,
    DataParallelTrainingClient,
    RankGroup,
    WorkerHandle,
    _LocalProcess,
    shard_by_tokens,
    spawn_local_group,
    start_group,
)
from tests.datum_helpers import random_sequences, rl_batch

ADAM = AdamParams(learning_rate=1e-2)


def _driver(model: Path, ranks: int = 2, timeout_s: float = 120.0) -> DataParallelTrainingClient:
    return DataParallelTrainingClient(
        spawn_local_group(ranks, timeout_s=timeout_s), base_model=str(model), lora_rank=8, device="cpu", seed=3
    )


def _gradients(client: TrainingClient) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in client.trainable_parameters()]  # type: ignore[union-attr]


def _weights(client: TrainingClient) -> list[torch.Tensor]:
    return [p.detach().clone() for p in client.trainable_parameters()]


def assert_same_up_to_float_order(
    got: list[torch.Tensor], expected: list[torch.Tensor], tolerance: float = 1e-6
) -> None:
    """Equal within `tolerance` times the largest magnitude: fp32 sums in another order (another
    padding, another rank's share) differ by that much — one process re-batched differs as much."""
    scale = max(float(t.abs().max()) for t in expected)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True))
    assert worst <= tolerance * scale, f"differs by {worst:.3g}, more than {tolerance:g} x {scale:.3g}"


def _sft_batch(count: int = 5) -> list[Datum]:
    return [Datum.from_sequence(s, [0] * 3 + [1] * (len(s) - 3)) for s in random_sequences(count, seed=4)]


def test_shards_balance_tokens_and_keep_every_datum_once() -> None:
    lengths = [100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10]
    shards = shard_by_tokens(lengths, 2)
    assert sorted(i for shard in shards for i in shard) == list(range(len(lengths)))
    assert [sum(lengths[i] for i in shard) for shard in shards] == [100, 100]  # by tokens, not by count
    assert shards == shard_by_tokens(lengths, 2)  # deterministic
    assert shard_by_tokens([5], 3) == [[0], [], []]  # fewer datums than ranks: empty shares
    with pytest.raises(ValueError, match="world_size"):
        shard_by_tokens([1], 0)


@pytest.mark.slow
def test_two_ranks_give_one_process_loss_gradients_and_next_weights(tiny_model_dir: Path) -> None:
    single = TrainingClient(str(tiny_model_dir), lora_rank=8, device="cpu", seed=3)
    mirrored = TrainingClient(str(tiny_model_dir), lora_rank=8, device="cpu", seed=3)
    driver = _driver(tiny_model_dir)
    try:
        data = rl_batch(single, count=6, seed=1)
        expected = single.forward_backward(data, "importance_sampling")
        got = driver.forward_backward(data, "importance_sampling")
        assert got.metrics["loss"] == pytest.approx(expected.metrics["loss"], abs=1e-6)
        assert got.metrics["tokens"] == expected.metrics["tokens"]
        assert got.metrics["num_datums"] == 6
        assert got.metrics["ratio_mean"] == pytest.approx(expected.metrics["ratio_mean"], abs=1e-6)
        for mine, theirs in zip(got.loss_fn_outputs, expected.loss_fn_outputs, strict=True):
            torch.testing.assert_close(mine["logprobs"], theirs["logprobs"], atol=1e-6, rtol=0)
        assert_same_up_to_float_order(_gradients(driver), _gradients(single))

        # One process scoring the ranks' shares as two calls does the very same float work: the
        # gradients, and the weights after the step (what the sampler gets next), are bit for bit equal.
        for shard in shard_by_tokens([d.num_tokens for d in data], 2):
            mirrored.forward_backward([data[i] for i in shard], "importance_sampling")
        assert all(torch.equal(a, b) for a, b in zip(_gradients(driver), _gradients(mirrored), strict=True))
        driver.optim_step(ADAM)
        mirrored.optim_step(ADAM)
        assert all(torch.equal(a, b) for a, b in zip(_weights(driver), _weights(mirrored), strict=True))
        single.optim_step(ADAM)

        # The worker stepped the same way (its weights' digest is checked at every step), and a
        # second call before a step adds to the first, as on one process.
        more = _sft_batch()
        for client in (single, driver):
            client.forward_backward(data, "importance_sampling")
            client.forward_backward(more, "cross_entropy")
        # After an Adam step `single` is no longer bit-equal to the driver: where a gradient was float noise,
        # Adam moves the weight by about ±lr whichever the noise's sign, so the next gradients agree a little
        # less closely: 1.6e-6 of the largest on an AMD EPYC, where 1e-6 failed on the commit that last passed CI.
        assert_same_up_to_float_order(_gradients(driver), _gradients(single), tolerance=1e-5)
    finally:
        driver.close()
        single.close()
        mirrored.close()
    assert [worker.exit_status() for worker in driver.group.workers.values()] == ["exit code 0"]


@pytest.mark.slow
def test_a_checkpoint_loads_on_any_rank_count(tiny_model_dir: Path, tmp_path: Path) -> None:
    single = TrainingClient(str(tiny_model_dir), lora_rank=8, device="cpu", seed=3)
    try:
        single.forward_backward(_sft_batch(), "cross_entropy")
        single.optim_step(ADAM)
        single.save_state(tmp_path / "state")
        single.forward_backward(_sft_batch(3), "cross_entropy")
        single.optim_step(ADAM)
        expected = _weights(single)
    finally:
        single.close()
    driver = _driver(tiny_model_dir)
    try:
        assert driver.load_state(tmp_path / "state") == 1
        driver.forward_backward(_sft_batch(3), "cross_entropy")  # the worker's share needs the loaded weights
        driver.optim_step(ADAM)  # and its optimizer moments: the step checks the replicas agree
        assert_same_up_to_float_order(_weights(driver), expected, tolerance=1e-3)  # AdamW magnifies float order
    finally:
        driver.close()


@pytest.mark.slow
def test_a_bad_call_is_refused_before_any_rank_starts_and_the_group_goes_on(tiny_model_dir: Path) -> None:
    driver = _driver(tiny_model_dir)
    try:
        bad = Datum(model_input=[1, 2, 3], loss_fn_inputs={"target_tokens": [1, 2], "weights": [1.0, 1.0, 1.0]})
        with pytest.raises(Exception, match="target_tokens"):
            driver.forward_backward([bad], "cross_entropy")
        with pytest.raises(ValueError, match="learning_rate"):
            driver.optim_step(AdamParams(learning_rate=-1.0))
        assert driver.forward_backward(_sft_batch(), "cross_entropy").metrics["num_datums"] == 5
    finally:
        driver.close()


@pytest.mark.slow
def test_a_rank_that_dies_mid_run_is_named_not_waited_for(tiny_model_dir: Path) -> None:
    driver = _driver(tiny_model_dir)
    try:
        worker = driver.group.workers[1].process  # type: ignore[attr-defined]  # a local process
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        with pytest.raises(DataParallelError, match=r"rank 1 \(exit code -9\) exited"):
            driver.forward_backward(_sft_batch(), "cross_entropy")
    finally:
        driver.close()


@pytest.mark.slow
def test_a_hung_rank_is_named_after_the_timeout(tiny_model_dir: Path) -> None:
    driver = _driver(tiny_model_dir, timeout_s=60.0)
    worker = driver.group.workers[1].process  # type: ignore[attr-defined]  # a local process
    try:
        driver.group.timeout_s = 3.0  # the replica is built; now a short wait shows the naming
        os.kill(worker.pid, signal.SIGSTOP)
        with pytest.raises(DataParallelError, match=r"rank 1 did not report .* within 3 s \(trainer_timeout_s\)"):
            driver.forward_backward(_sft_batch(), "cross_entropy")
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        driver.close()


WORKER_WITH_ANOTHER_CONFIG = """
from agl_bridge.primitives.data_parallel import join_group_from_env, serve_worker
group = join_group_from_env()
try:
    serve_worker(group, config_digest="another-config")
finally:
    group.close()
"""


@pytest.mark.slow
def test_a_rank_with_another_run_config_is_refused_by_name(tiny_model_dir: Path) -> None:
    def start(rank: int, environment: dict[str, str]) -> WorkerHandle:
        command = [sys.executable, "-c", WORKER_WITH_ANOTHER_CONFIG]
        return _LocalProcess(subprocess.Popen(command, env={**os.environ, **environment}))

    group = start_group(2, start, timeout_s=120.0)
    with pytest.raises(DataParallelError, match="rank 1's run config differs from rank 0's"):
        DataParallelTrainingClient(group, config_digest="this-config", base_model=str(tiny_model_dir), device="cpu")
    assert group.workers[1].exit_status() == "exit code 0", "the refused rank was stopped, not left behind"


def test_a_message_not_signed_with_the_groups_key_is_refused() -> None:
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    ours = RankGroup(0, 2, store, timeout_s=5.0, secret=b"our key")
    outsider = RankGroup(0, 2, store, timeout_s=5.0, secret=b"guessed")
    ours.post("call/1/1", ("forward_backward", ([{"model_input": [1, 2]}], "ppo", {"clip": 0.2})))
    assert ours.take("call/1/1") == ("forward_backward", ([{"model_input": [1, 2]}], "ppo", {"clip": 0.2}))
    outsider.post("call/2/1", ("optim_step", ({"learning_rate": 1.0},)))
    with pytest.raises(DataParallelError, match="not signed with this group's key"):
        ours.take("call/2/1")


def _whole_adapter(client: TrainingClient) -> list[torch.Tensor]:
    """The adapter as the sampler and checkpoints get it (a sharded client gathers it)."""
    return [t.detach().clone() for t in client._run(client._trained_state).values()]


@pytest.mark.slow
def test_fsdp_shards_give_one_process_numbers_syncs_and_checkpoints(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Small micro-batches, so the ranks run different numbers of passes and the less busy one idles.
    settings = {"base_model": str(tiny_model_dir), "lora_rank": 8, "device": "cpu", "seed": 3, "max_batch_tokens": 48}
    single = TrainingClient(**settings)
    driver = DataParallelTrainingClient(spawn_local_group(2, timeout_s=120.0), sharding="fsdp", **settings)
    try:
        shard = next(p for p in driver.trainable_parameters() if p.ndim == 2)
        assert shard.to_local().shape[0] * 2 == shard.shape[0]  # each rank holds half
        data = rl_batch(single, count=5, seed=1)
        expected = single.forward_backward(data, "importance_sampling")
        got = driver.forward_backward(data, "importance_sampling")
        assert got.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-6)  # fp32 sums, another order
        assert got.metrics["tokens"] == expected.metrics["tokens"]
        for mine, theirs in zip(got.loss_fn_outputs, expected.loss_fn_outputs, strict=True):
            torch.testing.assert_close(mine["logprobs"], theirs["logprobs"], atol=1e-6, rtol=1e-6)
        for client in (single, driver):
            client.optim_step(ADAM)
        # AdamW divides each gradient by its own magnitude, so float-order noise in the smallest ones
        # shows in the step: 1e-4 of the largest weight (1.4e-6 of 0.09 measured).
        assert_same_up_to_float_order(_whole_adapter(driver), _whole_adapter(single), tolerance=1e-4)

        scored = driver.forward(data).loss_fn_outputs  # every pass is a collective, forward too
        for mine, theirs in zip(scored, single.forward(data).loss_fn_outputs, strict=True):
            torch.testing.assert_close(mine["logprobs"], theirs["logprobs"], atol=1e-5, rtol=0)
        for mine, theirs in zip(driver.reference_logprobs(data), single.reference_logprobs(data), strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-6)

        # The sampler gets the whole adapter: it scores like the sharded trainer.
        sampling = driver.save_weights_and_get_sampling_client()
        tokens = list(data[0].model_input) + [int(data[0].loss_fn_inputs["target_tokens"][-1])]
        sampled = sampling.compute_logprobs(tokens)[1:]
        torch.testing.assert_close(torch.tensor(sampled), scored[0]["logprobs"], atol=1e-5, rtol=0)

        # Checkpoints hold the one-process state, both ways.
        driver.save_state(tmp_path / "sharded")
        with TrainingClient(**settings) as loaded:
            loaded.load_state(tmp_path / "sharded")
            assert all(torch.equal(a, b) for a, b in zip(_whole_adapter(loaded), _whole_adapter(driver), strict=True))
        single.save_state(tmp_path / "single")
        assert driver.load_state(tmp_path / "single") == 1
        assert all(torch.equal(a, b) for a, b in zip(_whole_adapter(driver), _whole_adapter(single), strict=True))
        for client in (single, driver):
            client.forward_backward(_sft_batch(3), "cross_entropy")
            client.optim_step(ADAM)  # the loaded AdamW moments, sharded
        assert_same_up_to_float_order(_whole_adapter(driver), _whole_adapter(single), tolerance=1e-4)

        with pytest.raises(ValueError, match="sharding='fsdp'"):
            driver.forward_backward_custom(data, lambda _data, logprobs: (sum(lp.sum() for lp in logprobs), {}))
    finally:
        driver.close()
        single.close()
    assert [worker.exit_status() for worker in driver.group.workers.values()] == ["exit code 0"]


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_full_weights_train_on_two_ranks_as_on_one_process(tiny_model_dir: Path, sharding: str) -> None:
    settings = {"base_model": str(tiny_model_dir), "device": "cpu", "full_weights": True, "max_batch_tokens": 48}
    single = TrainingClient(**settings)
    driver = DataParallelTrainingClient(spawn_local_group(2, timeout_s=120.0), sharding=sharding, **settings)
    try:
        data = rl_batch(single, count=5, seed=1)
        kl = {"kl_coef": 0.1}  # its reference is a frozen whole copy on each rank, even when sharded
        expected = single.forward_backward(data, "importance_sampling", kl)
        got = driver.forward_backward(data, "importance_sampling", kl)
        assert got.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-6)
        for mine, theirs in zip(got.loss_fn_outputs, expected.loss_fn_outputs, strict=True):
            torch.testing.assert_close(mine["logprobs"], theirs["logprobs"], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(mine["ref_logprobs"], theirs["ref_logprobs"], atol=1e-6, rtol=1e-6)
        for client in (single, driver):
            client.optim_step(AdamParams(learning_rate=1e-3))
        assert_same_up_to_float_order(_whole_adapter(driver), _whole_adapter(single), tolerance=1e-4)
        sampling = driver.save_weights_and_get_sampling_client()
        tokens = [*data[0].model_input, int(data[0].loss_fn_inputs["target_tokens"][-1])]
        trained = driver.forward(data[:1]).loss_fn_outputs[0]["logprobs"]
        torch.testing.assert_close(torch.tensor(sampling.compute_logprobs(tokens)[1:]), trained, atol=1e-5, rtol=0)
    finally:
        driver.close()
        single.close()
