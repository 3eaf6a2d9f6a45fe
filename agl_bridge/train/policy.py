"""The policy a sampling run trains: its tokenizer, its served name, the sampler and the training client on it.

The online and follow modes both sample through a proxy over the sampler and hand the trained
adapter to it live: `hf` merges it in place in this process, `remote` / `vllm` load it by name
from files written to `adapter_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_bridge.models.loading import load_tokenizer, resolve_model_path, served_model_name
from agl_bridge.primitives.client import TrainingClient
from agl_bridge.proxy.server import ProxyServer
from agl_bridge.sampler.factory import build_sampler
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.step import run_client


@dataclass
class Policy:
    """A run's sampler and the training client that updates it; `close` releases both."""

    model_path: str  # a local directory or a hub id
    tokenizer: Any
    name: str
    sampler: Any  # the TokenSampler build_sampler made (hf, remote or vllm)
    client: TrainingClient

    def close(self) -> None:
        """Stop the training client, then the sampler."""
        self.client.close()
        self.sampler.close()

    def proxy(self, config: GRPOConfig, run_dir: Path, **serving: Any) -> ProxyServer:
        """The proxy (not started) that serves this policy to a run's agents and records into the run's
        store; `serving` sets where and how it listens (host, port, api_key, rollout_idle_timeout_s),
        by default on a free loopback port."""
        return ProxyServer(
            sampler=self.sampler,
            tokenizer=self.tokenizer,
            store_path=config.store_location(run_dir),
            model_name=self.name,
            default_max_tokens=config.default_max_tokens,
            litellm_config_path=config.litellm_config,
            **serving,
        )


def open_policy(config: GRPOConfig) -> Policy:
    """Load the config's model as a sampler (its `sampler*` keys) and a LoRA training client over it."""
    model_path = resolve_model_path(config.model)
    tokenizer = load_tokenizer(model_path)
    name = served_model_name(config.model)
    sampler = build_sampler(config.sampler_spec(), model_path, tokenizer, served_name=name)
    client = run_client(config, model_path, sampler)
    return Policy(model_path, tokenizer, name, sampler, client)
