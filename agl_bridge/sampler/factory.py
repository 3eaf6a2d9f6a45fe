"""Building the sampler a command or a run asks for: `hf` (transformers, in a child process or this one), `remote`
(vLLM-protocol servers over HTTP) or `vllm` (an in-process vLLM engine: CUDA GPU or vLLM's CPU build).

`SamplerSpec` is the one description of the sampler settings: each field carries its default, its
help text, its `agl-bridge serve` flag and its run-config key (`SamplerSetting`), and `validate` is
the one check. The CLI builds its options from it and the trainer config its `sampler*` keys;
`SamplerSpecError` names the wrong setting so each caller reports it in its own words (a flag, or a
config key). Adding a setting: a field with its `SamplerSetting`, its check in `validate`, its use in
`build_sampler`, and (if it has a config key) the `GRPOConfig` field defaulting to the spec's.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from agl_bridge import semconv

SamplerKind = Literal["hf", "remote", "vllm"]
SAMPLER_KINDS: tuple[str, ...] = ("hf", "remote", "vllm")
VLLM_DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class SamplerSetting:
    """How users spell one `SamplerSpec` field: its help text, its `agl-bridge serve` flag and its run-config
    key (None where that side does not set it: the config derives it, or the CLI has no use for it)."""

    help: str
    flag: str | None = None
    key: str | None = None
    metavar: str | None = None


_SETTING = "agl_bridge.sampler_setting"


def _described(default: Any, **setting: Any) -> Any:
    """A dataclass field whose metadata holds its `SamplerSetting` (a list default is copied per instance)."""
    metadata = {_SETTING: SamplerSetting(**setting)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


class SamplerSpecError(ValueError):
    """A sampler setting is wrong; `field` names the `SamplerSpec` field, `flag` and `key` how the CLI and a
    run config spell it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    @property
    def flag(self) -> str:
        """The `agl-bridge serve` flag of the wrong setting (the field name if it has none)."""
        return SamplerSpec.setting(self.field).flag or self.field

    @property
    def key(self) -> str:
        """The run-config key of the wrong setting (the field name if it has none)."""
        return SamplerSpec.setting(self.field).key or self.field


@dataclass
class SamplerSpec:
    """Which sampler to build and its options (see the module docs; each field's help is its `SamplerSetting`).

    `urls` may be given as one comma-separated string or a list of such strings; they are split.
    """

    kind: str = _described(
        "hf",
        flag="--sampler",
        key="sampler",
        metavar="hf|remote|vllm",
        help="hf: transformers on this machine (in a child process, see --sampler-process); remote: vLLM-protocol "
        "servers (--sampler-url); vllm: an in-process vLLM engine (CUDA GPU, or vLLM's CPU build).",
    )
    urls: list[str] = _described(
        [],
        flag="--sampler-url",
        key="sampler_urls",
        metavar="URL[,URL...]",
        help="Servers a remote sampler calls (vLLM or agl-bridge serve); repeat or comma-separate for several.",
    )
    api_key: str | None = _described(
        None,
        flag="--sampler-api-key",
        key="sampler_api_key",
        help=f"Key the remote servers require (default: the {semconv.ENV_SAMPLER_API_KEY} environment variable).",
    )
    remote_model: str | None = _described(
        None,
        flag="--sampler-model",
        key="sampler_model",
        metavar="NAME",
        help="Name the remote servers serve the base model under (default: the served model name).",
    )
    timeout_s: float = _described(
        600.0,
        flag="--sampler-timeout",
        key="sampler_timeout_s",
        metavar="SECONDS",
        help="Longest wait for one remote answer before that server counts as failed.",
    )
    adapter_dir: str | None = _described(
        None,
        key="adapter_dir",
        help="Where each policy version's adapter is written for remote servers or vLLM to load (a training run: "
        "run_dir/adapters).",
    )
    max_batch_size: int = _described(
        64,
        flag="--max-batch-size",
        help="Most sequences the sampler decodes together (hf) / most samples per request.",
    )
    seed: int | None = _described(None, help="Sampling seed of requests that set none (a training run: its seed).")
    process: bool | None = _described(
        None,
        flag="--sampler-process",
        key="sampler_process",
        help="hf sampler: run the model in a child process of its own, so that its decode steps and the proxy's "
        "HTTP work do not take turns on one interpreter lock (default: yes for agl-bridge serve, no in a training "
        "run, where it measured no faster and is one more interpreter to start).",
    )
    # The in-process vLLM engine's settings (sampler `vllm` only: a remote vLLM server takes the same ones as
    # its own flags); None means vLLM's default as chosen in sampler/vllm.py.
    dtype: str | None = _described(
        None,
        flag="--dtype",
        key="sampler_dtype",
        metavar="|".join(("auto", "float32", "bfloat16", "float16")),
        help="vllm sampler: weights' dtype (default float32 on CPU, so logprobs match the trainer's; auto on a GPU).",
    )
    max_model_len: int | None = _described(
        None,
        flag="--max-model-len",
        key="sampler_max_model_len",
        metavar="N",
        help="vllm sampler: context window (default: the model's).",
    )
    max_lora_rank: int | None = _described(
        None,
        flag="--max-lora-rank",
        key="sampler_max_lora_rank",
        metavar="R",
        help="vllm sampler: largest adapter rank it loads (default 64, at least the trainer's lora_rank).",
    )
    max_loras: int | None = _described(
        None,
        flag="--max-loras",
        key="sampler_max_loras",
        metavar="N",
        help="vllm sampler: adapters held at once (default 2: the old and the new overlap during a sync).",
    )
    enforce_eager: bool = _described(
        False,
        flag="--enforce-eager",
        key="sampler_enforce_eager",
        help="vllm sampler: no CUDA graphs or compilation (faster start, slower steps).",
    )

    def __post_init__(self) -> None:
        if isinstance(self.urls, (str, list)):  # anything else is refused by validate(), naming the setting
            self.urls = split_urls(self.urls)

    @staticmethod
    def setting(name: str) -> SamplerSetting:
        """The `SamplerSetting` of field `name`."""
        return next(f.metadata[_SETTING] for f in dataclasses.fields(SamplerSpec) if f.name == name)

    @staticmethod
    def settings() -> dict[str, SamplerSetting]:
        """Every field's `SamplerSetting`, by field name, in declaration order."""
        return {f.name: f.metadata[_SETTING] for f in dataclasses.fields(SamplerSpec)}

    def validate(self) -> None:
        """Raise SamplerSpecError naming the first setting that is wrong."""
        from agl_bridge.sampler.remote_pool import normalize_url

        if self.kind not in SAMPLER_KINDS:
            raise SamplerSpecError("kind", f"must be one of {', '.join(SAMPLER_KINDS)}, got {self.kind!r}")
        if not isinstance(self.urls, list):
            raise SamplerSpecError("urls", f"must be a list of URLs (or one comma-separated string), got {self.urls!r}")
        if self.kind == "remote":
            if not self.urls:
                raise SamplerSpecError(
                    "urls",
                    "sampler 'remote' needs at least one server URL (e.g. http://gpu-1:8000), comma-separated for "
                    "several",
                )
            for url in self.urls:
                try:
                    normalize_url(url)
                except ValueError as error:
                    raise SamplerSpecError("urls", str(error)) from None
        elif self.urls:
            raise SamplerSpecError(
                "urls", f"server URLs are only used with sampler 'remote' (sampler is {self.kind!r})"
            )
        if not isinstance(self.timeout_s, (int, float)) or isinstance(self.timeout_s, bool) or self.timeout_s <= 0:
            raise SamplerSpecError("timeout_s", f"must be a number of seconds > 0, got {self.timeout_s!r}")
        if not isinstance(self.max_batch_size, int) or isinstance(self.max_batch_size, bool) or self.max_batch_size < 1:
            raise SamplerSpecError("max_batch_size", f"must be an integer >= 1, got {self.max_batch_size!r}")
        if self.process is not None and not isinstance(self.process, bool):
            raise SamplerSpecError("process", f"must be true or false, got {self.process!r}")
        self._validate_engine_settings()

    def _validate_engine_settings(self) -> None:
        if self.dtype is not None and self.dtype not in VLLM_DTYPES:
            raise SamplerSpecError("dtype", f"must be one of {', '.join(VLLM_DTYPES)}, got {self.dtype!r}")
        for name, value, least in (
            ("max_model_len", self.max_model_len, 2),
            ("max_lora_rank", self.max_lora_rank, 1),
            ("max_loras", self.max_loras, 1),
        ):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise SamplerSpecError(name, f"must be an integer >= {least}, got {value!r}")
        if not isinstance(self.enforce_eager, bool):
            raise SamplerSpecError("enforce_eager", f"must be true or false, got {self.enforce_eager!r}")
        engine = ("dtype", "max_model_len", "max_lora_rank", "max_loras", "enforce_eager")
        changed = [name for name in engine if getattr(self, name) not in (None, False)]
        if changed and self.kind != "vllm":
            where = "set them on the vLLM servers (vllm serve flags)" if self.kind == "remote" else "they do not apply"
            raise SamplerSpecError(
                changed[0],
                f"is a setting of the in-process vLLM engine (sampler 'vllm'); with sampler {self.kind!r} {where}",
            )


def split_urls(values: list[str] | str | None) -> list[str]:
    """URLs from repeated and/or comma-separated values."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def build_sampler(
    spec: SamplerSpec,
    model_path: str,
    tokenizer: Any,
    *,
    served_name: str,
    process_by_default: bool = False,
    follow_adapters: bool = False,
) -> Any:
    """The sampler `spec` describes over the model at `model_path` (weights are loaded only for hf).

    process_by_default: where an hf sampler runs when `spec.process` does not say: in a child process
    (`agl-bridge serve`) or in this one (a training run).
    follow_adapters: a remote sampler names the newest adapter its servers list rather than loading
    its own (a proxy's, whose trainer loads them: `RemoteSampler`'s module docs).
    """
    spec.validate()
    process = process_by_default if spec.process is None else spec.process
    if spec.kind == "hf" and process:
        import torch

        from agl_bridge.sampler.hf_process import HFProcessSampler

        # The child samples with this process's torch threads, as an in-process sampler would.
        return HFProcessSampler(
            model_path, max_batch_size=spec.max_batch_size, seed=spec.seed, torch_threads=torch.get_num_threads()
        )
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
            enforce_eager=spec.enforce_eager,
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
        follow_adapters=follow_adapters,
    )


def model_context(model_path: str, default: int = 32768) -> int:
    """The model's context window from its config (no weights loaded); `default` if it says none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return default
    return int(getattr(config, "max_position_embeddings", None) or default)
