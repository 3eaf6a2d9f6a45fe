"""Building the sampler a command or a run asks for: `hf` (in-process transformers), `remote`
(vLLM-protocol servers over HTTP) or `vllm` (an in-process vLLM engine: CUDA GPU or vLLM's CPU build).

The CLI (`agl-bridge serve --sampler ...`) and the trainer config (`sampler = ...`) both describe a
sampler with a `SamplerSpec`; `SamplerSpecError.field` names the option that is wrong so each caller
can report it in its own words (a flag, or a config key).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from agl_bridge import semconv

SamplerKind = Literal["hf", "remote", "vllm"]
SAMPLER_KINDS: tuple[str, ...] = ("hf", "remote", "vllm")
VLLM_DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")


class SamplerSpecError(ValueError):
    """A sampler option is wrong; `field` names it (sampler, sampler_urls, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class SamplerSpec:
    """Which sampler to build and its options.

    kind: hf | remote | vllm. urls: the remote servers. api_key: their key (default the
    AGL_SAMPLER_API_KEY environment variable). remote_model: the name they serve the base model
    under (default: the served model name). timeout_s: longest wait for one remote answer.
    adapter_dir: where adapters are written for remote servers to load. max_batch_size: most
    sequences sampled together (hf) / most samples per request.

    The in-process vLLM engine's settings (sampler `vllm` only; a remote vLLM server takes the same
    ones as its own flags), None meaning the default: dtype (float32 on CPU, so logprobs match the
    trainer's; "auto" on a GPU), max_model_len (the model's context window), max_lora_rank (64; at
    least the trainer's lora_rank), max_loras (2: the old and the new adapter overlap during a
    sync), enforce_eager (false; true skips CUDA graphs / compilation: faster start, slower steps).
    """

    kind: str = "hf"
    urls: list[str] = field(default_factory=list)
    api_key: str | None = None
    remote_model: str | None = None
    timeout_s: float = 600.0
    adapter_dir: str | None = None
    max_batch_size: int = 64
    seed: int | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    max_lora_rank: int | None = None
    max_loras: int | None = None
    enforce_eager: bool | None = None

    def validate(self) -> None:
        """Raise SamplerSpecError naming the first option that is wrong."""
        from agl_bridge.sampler.remote_pool import normalize_url

        if self.kind not in SAMPLER_KINDS:
            raise SamplerSpecError("sampler", f"sampler must be one of {', '.join(SAMPLER_KINDS)}, got {self.kind!r}")
        if self.kind == "remote":
            if not self.urls:
                raise SamplerSpecError(
                    "sampler_urls",
                    "sampler 'remote' needs at least one server URL (e.g. http://gpu-1:8000), comma-separated for "
                    "several",
                )
            for url in self.urls:
                try:
                    normalize_url(url)
                except ValueError as error:
                    raise SamplerSpecError("sampler_urls", str(error)) from None
        elif self.urls:
            raise SamplerSpecError(
                "sampler_urls", f"sampler URLs are only used with sampler 'remote' (sampler is {self.kind!r})"
            )
        if not isinstance(self.timeout_s, (int, float)) or isinstance(self.timeout_s, bool) or self.timeout_s <= 0:
            raise SamplerSpecError(
                "sampler_timeout_s", f"sampler_timeout_s must be a number of seconds > 0, got {self.timeout_s!r}"
            )
        self._validate_engine_settings()

    def _validate_engine_settings(self) -> None:
        if self.dtype is not None and self.dtype not in VLLM_DTYPES:
            raise SamplerSpecError(
                "sampler_dtype", f"sampler_dtype must be one of {', '.join(VLLM_DTYPES)}, got {self.dtype!r}"
            )
        for name, value, least in (
            ("sampler_max_model_len", self.max_model_len, 2),
            ("sampler_max_lora_rank", self.max_lora_rank, 1),
            ("sampler_max_loras", self.max_loras, 1),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise SamplerSpecError(name, f"{name} must be an integer >= {least}, got {value!r}")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise SamplerSpecError(
                "sampler_enforce_eager", f"sampler_enforce_eager must be true or false, got {self.enforce_eager!r}"
            )
        settings = {
            "sampler_dtype": self.dtype,
            "sampler_max_model_len": self.max_model_len,
            "sampler_max_lora_rank": self.max_lora_rank,
            "sampler_max_loras": self.max_loras,
            "sampler_enforce_eager": self.enforce_eager,
        }
        changed = [name for name, value in settings.items() if value is not None]
        if changed and self.kind != "vllm":
            where = "set them on the vLLM servers (vllm serve flags)" if self.kind == "remote" else "they do not apply"
            raise SamplerSpecError(
                changed[0],
                f"{changed[0]} is a setting of the in-process vLLM engine (sampler 'vllm'); with sampler "
                f"{self.kind!r} {where}",
            )


def split_urls(values: list[str] | str | None) -> list[str]:
    """URLs from repeated and/or comma-separated values."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def build_sampler(spec: SamplerSpec, model_path: str, tokenizer: Any, *, served_name: str) -> Any:
    """The sampler `spec` describes over the model at `model_path` (weights are loaded only for hf)."""
    spec.validate()
    if spec.kind == "hf":
        from agl_bridge.models.loading import load_causal_lm
        from agl_bridge.sampler.hf import HFSampler

        return HFSampler(load_causal_lm(model_path), tokenizer, max_batch_size=spec.max_batch_size, seed=spec.seed)
    if spec.kind == "vllm":
        from agl_bridge.sampler.vllm import VLLMSampler

        return VLLMSampler(
            model_path,
            tokenizer=tokenizer,
            max_batch_size=spec.max_batch_size,
            adapter_dir=spec.adapter_dir,
            seed=spec.seed,
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            max_lora_rank=spec.max_lora_rank or 64,
            max_loras=spec.max_loras or 2,
            enforce_eager=bool(spec.enforce_eager),
        )
    from agl_bridge.sampler.remote import RemoteSampler

    return RemoteSampler(
        spec.urls,
        model=spec.remote_model or served_name,
        api_key=spec.api_key or os.environ.get(semconv.ENV_SAMPLER_API_KEY) or None,
        vocab_size=len(tokenizer),
        max_context=model_context(model_path),
        max_batch_size=spec.max_batch_size,
        timeout_s=spec.timeout_s,
        adapter_dir=spec.adapter_dir,
    )


def model_context(model_path: str, default: int = 32768) -> int:
    """The model's context window from its config (no weights loaded); `default` if it says none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return default
    return int(getattr(config, "max_position_embeddings", None) or default)
