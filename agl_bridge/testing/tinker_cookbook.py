"""Running tinker-cookbook's recipes offline against our Tinker API server (its contract tests and
`bench/tinker_cookbook.py`): their environment, and stand-ins for what they fetch from the Hugging Face
hub, written into an HF_HOME the recipes then read with the hub offline — nothing in a recipe is edited.

- `Qwen/Qwen3-8B`'s tokenizer: the tiny model's (same ChatML special tokens), as a hub-cache snapshot.
- `HuggingFaceH4/no_robots` (sl_loop's data): conversations that answer a sum with `\\boxed{0}` or
  `\\boxed{1}`, a warm start after which rl_loop's groups get unequal rewards.
- `openai/gsm8k` config `main` (rl_loop's data): those sums, every answer `#### 0`.

The datasets are written as the datasets library's own cache of a prepared dataset (what it reads
offline once a dataset was loaded). Written by a process with the cookbook's folder on PYTHONPATH
(it needs `datasets`):

    python -m agl_bridge.testing.tinker_cookbook HF_HOME
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agl_bridge.models.loading import resolve_model_path
from agl_bridge.testing.proxy_process import child_env

QUESTIONS = 256
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
TOKENIZER_REPO = "Qwen/Qwen3-8B"


def write_tokenizer_repo(hf_home: Path, source: Path, repo: str = TOKENIZER_REPO) -> None:
    """`repo` in the hub cache, holding the tokenizer and config files of the model directory `source`."""
    cached = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    revision = "0" * 40
    snapshot = cached / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (cached / "refs").mkdir(exist_ok=True)
    (cached / "refs" / "main").write_text(revision)
    for path in source.iterdir():
        if path.suffix in (".json", ".jinja"):
            shutil.copy(path, snapshot / path.name)


def write_dataset(hf_home: Path, repo: str, splits: dict[str, list[dict]], config: str = "default") -> None:
    """`repo` (config `config`) in the datasets cache, as `load_dataset(repo, config)` reads it offline."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as scratch:
        files = {}
        for split, rows in splits.items():
            files[split] = f"{scratch}/{split}.parquet"
            pq.write_table(pa.Table.from_pylist(rows), files[split])
        builder = datasets.load_dataset_builder("parquet", data_files=files, cache_dir=f"{scratch}/cache")
        builder.download_and_prepare()
        built = Path(builder.cache_dir)
        namespace, name = repo.split("/")
        target = hf_home / "datasets" / f"{namespace}___{name}" / config / "0.0.0" / built.name
        shutil.rmtree(target.parents[1], ignore_errors=True)
        shutil.copytree(built, target)
    for arrow in target.glob("parquet-*.arrow"):
        arrow.rename(target / arrow.name.replace("parquet-", f"{name}-", 1))
    info = json.loads((target / "dataset_info.json").read_text())
    info.update(config_name=config, builder_name=name, dataset_name=name)
    (target / "dataset_info.json").write_text(json.dumps(info))


def cookbook_env(site: str | Path, base_url: str, api_key: str, hf_home: Path) -> dict[str, str]:
    """The environment a recipe runs in: the cookbook's folder importable, the hub offline at `hf_home` (with
    the stand-ins written there), the SDK pointed at our server, telemetry off."""
    repo = Path(__file__).resolve().parents[2]
    env = {
        **child_env(),
        "PYTHONPATH": os.pathsep.join([str(site), str(repo)]),
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TINKER_BASE_URL": base_url,
        "TINKER_API_KEY": api_key,
        "TINKER_TELEMETRY": "0",
        "WANDB_MODE": "disabled",
    }
    subprocess.run([sys.executable, "-m", __name__, str(hf_home)], env=env, check=True, capture_output=True)
    return env


def main() -> None:
    """Write every stand-in into the HF_HOME given as the first argument."""
    hf_home = Path(sys.argv[1])
    write_tokenizer_repo(hf_home, Path(resolve_model_path("tiny")))
    questions = [f"What is {i} minus {i}?" for i in range(QUESTIONS)]
    conversations = [
        {
            "prompt": question,
            "prompt_id": str(i),
            "messages": [
                {"role": "user", "content": question + SUFFIX},
                {"role": "assistant", "content": f"\\boxed{{{i % 2}}}"},
            ],
            "category": "Chat",
        }
        for i, question in enumerate(questions)
    ]
    write_dataset(hf_home, "HuggingFaceH4/no_robots", {"train": conversations, "test": conversations[:8]})
    sums = [{"question": question, "answer": f"{i} - {i} = 0\n#### 0"} for i, question in enumerate(questions)]
    write_dataset(hf_home, "openai/gsm8k", {"train": sums, "test": sums[:8]}, config="main")


if __name__ == "__main__":
    main()
