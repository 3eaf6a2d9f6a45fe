"""`agl-bridge plot RUN_DIR`: the reward and evaluation curves of a run as PNG files."""

from __future__ import annotations

from pathlib import Path

from agl_bridge.train.run_log import read_metrics


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write reward_curve.png (training reward per step, evaluation reward, loss) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r.get("phase") == "train" and r.get("reward_mean") is not None]
    evals = [
        r
        for r in records
        if r.get("phase") == "eval" and r.get("eval_reward") is not None and r.get("stage", "rl") == "rl"
    ]
    validation = [r for r in records if r.get("phase") == "validation" and r.get("validation_reward") is not None]
    before_warm = [r for r in records if r.get("stage") == "before_warm_start" and r.get("eval_reward") is not None]
    if not train and not evals:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no reward or evaluation records to plot yet")
    figure, (rewards, losses) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    if train:
        rewards.plot(
            [r["step"] for r in train],
            [r["reward_mean"] for r in train],
            label="train reward (mean of step)",
            alpha=0.7,
        )
    if evals:
        rewards.plot(
            [r["step"] for r in evals], [r["eval_reward"] for r in evals], "o-", label="held-out reward", linewidth=2
        )
    if validation:
        rewards.plot(
            [r["step"] for r in validation],
            [r["validation_reward"] for r in validation],
            "s--",
            label="validation reward",
            alpha=0.8,
        )
    if before_warm:
        rewards.scatter(
            [0],
            [before_warm[-1]["eval_reward"]],
            marker="x",
            color="gray",
            label="held-out, before warm start",
            zorder=3,
        )
    rewards.set_ylabel("reward")
    rewards.grid(alpha=0.3)
    rewards.legend()
    with_loss = [r for r in train if r.get("loss") is not None]
    if with_loss:
        losses.plot([r["step"] for r in with_loss], [r["loss"] for r in with_loss], color="tab:red", label="loss")
        losses.legend()
    losses.set_xlabel("RL step")
    losses.set_ylabel("loss")
    losses.grid(alpha=0.3)
    figure.suptitle(run_dir.name)
    figure.tight_layout()
    path = Path(out) if out is not None else run_dir / "reward_curve.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
