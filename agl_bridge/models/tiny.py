"""Build the offline tiny test model: a byte-level BPE tokenizer and a random causal LM (Qwen3 by default).

Everything is built from text shipped in this package, so tests, demos and CI never need the
Hugging Face hub. The result is a normal Hugging Face model directory (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``chat_template.jinja``, ...) that plain
``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained`` load, plus a marker file
(``agl_bridge_tiny.json``) recording how it was built. ``family`` picks the architecture (Llama,
Qwen2, Qwen3, Qwen3-MoE, Mistral, Gemma 2/3, Phi-3, GPT-2: see ``families.py``); every family gets
the same tokenizer and ChatML template.

The same arguments always give a byte-identical directory: the tokenizer trainer is
deterministic for a fixed corpus, and the weights are drawn from a private ``torch.Generator``
seeded with ``seed`` (the global torch RNG is neither used nor disturbed).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from agl_bridge.models.families import DEFAULT_FAMILY, FAMILIES, NUM_ATTENTION_HEADS, family_config

TINY_FORMAT_VERSION = 1
"""Bump whenever a change here changes what a build with the same arguments produces."""

MARKER_FILENAME = "agl_bridge_tiny.json"
"""Name of the file, written last, that marks a directory as a complete tiny-model build."""

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
"""Control tokens (``special=True``: dropped by ``decode(skip_special_tokens=True)``); ids 0, 1, 2."""

ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Markup tokens that are single ids but ordinary text (``special=False``), as in Qwen; the last ids."""

DEFAULT_CONTEXT = 65536
"""Context window of the built-in `tiny` model: long enough for coding agents' 14k–38k-token system prompts."""

# Qwen2/Qwen3's pre-tokenizer split: digits are split one by one, so "42" is "4" "2" as in Qwen.
_QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class InvalidTinySpecError(ValueError):
    """A tiny-model build argument is out of range; ``field`` names the offending argument."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class TinyModelSpec:
    """The arguments of one tiny-model build; equal specs build byte-identical directories.

    hidden: model width; a multiple of 8, so the 4 attention heads get an even head_dim = hidden / 4
      (rotary embeddings need an even head_dim).
    layers: number of transformer blocks.
    vocab: total tokenizer size, the 3 special and 6 added tokens included; honoured exactly. The
      shipped corpus supports up to about 3000; a larger value is an error, never silently less.
    seed: seed of the weight initialisation.
    initializer_range: std of the normal init of every matrix. The default is 10x the usual 0.02
      so the random model's next-token distribution is peaked (at hidden 128: logit std ~2.3, mean
      entropy ~5.2 nats against 7.6 for uniform, mean top-1 probability ~0.11). Greedy decoding
      is then stable under float noise, and sampling still varies enough for RL to learn from.
    family: the architecture, a key of ``FAMILIES`` (default qwen3).
    context: the context window in tokens (``max_position_embeddings``); rotary families cost nothing
      more for a longer one, ``gpt2`` learns one position embedding per token.
    """

    hidden: int = 128
    layers: int = 2
    vocab: int = 2048
    seed: int = 0
    initializer_range: float = 0.2
    family: str = DEFAULT_FAMILY
    context: int = DEFAULT_CONTEXT

    def __post_init__(self) -> None:
        # 1 and 1.0 must be the same build: the marker and the cache fingerprint serialise this value.
        if isinstance(self.initializer_range, int) and not isinstance(self.initializer_range, bool):
            object.__setattr__(self, "initializer_range", float(self.initializer_range))

    def validate(self) -> None:
        """Raise InvalidTinySpecError naming the argument, its value and what is allowed."""
        if not isinstance(self.hidden, int) or self.hidden < 8 or self.hidden % (2 * NUM_ATTENTION_HEADS):
            raise InvalidTinySpecError(
                "hidden",
                f"hidden must be a positive multiple of {2 * NUM_ATTENTION_HEADS} (the model has "
                f"{NUM_ATTENTION_HEADS} heads with an even head_dim = hidden/{NUM_ATTENTION_HEADS}), "
                f"got {self.hidden!r}; try 64 or 128",
            )
        if not isinstance(self.layers, int) or self.layers < 1:
            raise InvalidTinySpecError("layers", f"layers must be an integer >= 1, got {self.layers!r}")
        min_vocab = 256 + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
        if not isinstance(self.vocab, int) or self.vocab < min_vocab:
            raise InvalidTinySpecError(
                "vocab",
                f"vocab must be an integer >= {min_vocab} (256 byte tokens + {len(SPECIAL_TOKENS)} special "
                f"+ {len(ADDED_TOKENS)} added tokens), got {self.vocab!r}",
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidTinySpecError("seed", f"seed must be an integer >= 0, got {self.seed!r}")
        if not (isinstance(self.initializer_range, (int, float)) and 0 < self.initializer_range <= 10):
            raise InvalidTinySpecError(
                "initializer_range",
                f"initializer_range must be a number in (0, 10], got {self.initializer_range!r}",
            )
        if not isinstance(self.context, int) or isinstance(self.context, bool) or not 128 <= self.context <= 1 << 20:
            raise InvalidTinySpecError(
                "context",
                f"context must be an integer in 128..{1 << 20} tokens, got {self.context!r}; try 4096 or 65536",
            )
        if self.family not in FAMILIES:
            raise InvalidTinySpecError("family", f"family must be one of {', '.join(FAMILIES)}, got {self.family!r}")

    def build_args(self) -> dict[str, object]:
        """The arguments as the marker and the fingerprint record them.

        The default family is left out, so Qwen3 builds keep the fingerprints they had before families.
        """
        args = asdict(self)
        if self.family == DEFAULT_FAMILY:
            del args["family"]
        return args

    def fingerprint(self) -> str:
        """Short hash of these arguments, the format version and the corpus: names a cached build."""
        payload = json.dumps(
            {"format_version": TINY_FORMAT_VERSION, "args": self.build_args(), "corpus_sha256": corpus_sha256()},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class TinyBuildInfo:
    """What a build produced: where, how big, and the ids a caller usually needs."""

    path: Path
    spec: TinyModelSpec
    vocab_size: int
    num_parameters: int
    bytes_on_disk: int
    eos_token_id: int
    pad_token_id: int


def corpus_texts() -> list[tuple[str, str]]:
    """The tokenizer training corpus shipped in ``agl_bridge/models/corpus``, as (name, text), sorted by name."""
    corpus_dir = resources.files("agl_bridge.models") / "corpus"
    items = [
        (entry.name, entry.read_text(encoding="utf-8")) for entry in corpus_dir.iterdir() if entry.name.endswith(".txt")
    ]
    if not items:
        raise FileNotFoundError(
            f"no *.txt corpus files found in {corpus_dir}; the agl_bridge installation is incomplete "
            "(package data missing), reinstall it"
        )
    return sorted(items)


def corpus_sha256() -> str:
    """Hash of the shipped corpus, so a changed corpus never reuses a stale cached build."""
    digest = hashlib.sha256()
    for name, text in corpus_texts():
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def chat_template_text() -> str:
    """The ChatML/Qwen-style chat template shipped with the package (``chat_template.jinja``)."""
    return (resources.files("agl_bridge.models") / "chat_template.jinja").read_text(encoding="utf-8")


def train_tokenizer(vocab: int):
    """Train the byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab`` tokens on the shipped corpus.

    Ids 0-2 are the special tokens, then the 256 byte symbols and the learned merges, and the 6
    added markup tokens take the last ids.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trained_size = vocab - len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=trained_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = [line for _, text in corpus_texts() for line in text.splitlines(keepends=True)]
    tokenizer.train_from_iterator(lines, trainer=trainer, length=len(lines))
    if tokenizer.get_vocab_size() != trained_size:
        raise InvalidTinySpecError(
            "vocab",
            f"the shipped corpus only supports {tokenizer.get_vocab_size() + len(ADDED_TOKENS)} tokens "
            f"but vocab={vocab} was asked for; pass a smaller vocab",
        )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    if tokenizer.get_vocab_size() != vocab:
        raise RuntimeError(
            f"tokenizer has {tokenizer.get_vocab_size()} tokens, expected {vocab}: an added token clashed"
        )
    return tokenizer


def _wrap_tokenizer(tokenizer, context: int):
    """Wrap a trained ``tokenizers.Tokenizer`` as a transformers fast tokenizer with the chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        model_max_length=context,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template_text(),
    )


def _init_weights(model, spec: TinyModelSpec) -> None:
    """Draw every matrix from N(0, initializer_range) with a private generator.

    Vectors (norm scales, biases) keep the constants the architecture's own init gives them: scale 1
    (Gemma's zero-centred norms 0), bias 0.
    """
    import torch

    generator = torch.Generator(device="cpu").manual_seed(spec.seed)
    with torch.no_grad():
        # Sorted names fix the draw order independently of module registration order.
        for _, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.ndim > 1:
                param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float32) * spec.initializer_range)


def _build_model(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int):
    """Create the random causal LM of ``spec.family`` for ``spec``, with its generation config."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = family_config(
        spec.family,
        vocab_size=vocab_size,
        hidden=spec.hidden,
        layers=spec.layers,
        max_positions=spec.context,
        initializer_range=spec.initializer_range,
        eos_id=eos_id,
        pad_id=pad_id,
    )
    # transformers' own init draws from the global RNG; fork and seed it so building is deterministic
    # and leaves callers' RNG alone (_init_weights then redraws every matrix from a private generator).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config)
    _init_weights(model, spec)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None)
    return model


def _save_quietly(model, out: Path) -> None:
    """``save_pretrained`` as safetensors without transformers' "Writing model shards" progress bar."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _check_out_dir(out_dir: Path) -> None:
    """Refuse to write into a non-empty directory unless it holds a previous tiny build."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory; choose another output directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MARKER_FILENAME).is_file():
        raise FileExistsError(
            f"{out_dir} is not empty and is not a previous tiny-model build (no {MARKER_FILENAME}); "
            "choose an empty or new directory so nothing of yours is overwritten"
        )


def build_tiny(out_dir: str | os.PathLike[str], spec: TinyModelSpec | None = None) -> TinyBuildInfo:
    """Build the tiny tokenizer + model for ``spec`` into ``out_dir`` and describe the result.

    ``out_dir`` is created if missing; it must be empty or a previous tiny build (which is
    overwritten). The marker file is written last, so its presence means the build completed.
    """
    spec = spec or TinyModelSpec()
    spec.validate()
    out = Path(out_dir)
    _check_out_dir(out)
    # Everything that can fail on bad arguments happens before the directory is touched.
    raw_tokenizer = train_tokenizer(spec.vocab)
    hf_tokenizer = _wrap_tokenizer(raw_tokenizer, spec.context)
    eos_id = raw_tokenizer.token_to_id(IM_END)
    pad_id = raw_tokenizer.token_to_id(ENDOFTEXT)
    model = _build_model(spec, len(hf_tokenizer), eos_id, pad_id)

    out.mkdir(parents=True, exist_ok=True)
    marker = out / MARKER_FILENAME
    marker.unlink(missing_ok=True)
    hf_tokenizer.save_pretrained(out)
    _save_quietly(model, out)
    num_parameters = sum(p.numel() for p in model.parameters())
    marker_payload = {
        "format_version": TINY_FORMAT_VERSION,
        "builder": "agl_bridge.models.tiny.build_tiny",
        "args": spec.build_args(),
        "fingerprint": spec.fingerprint(),
        "corpus_sha256": corpus_sha256(),
        "vocab_size": len(hf_tokenizer),
        "num_parameters": num_parameters,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }
    marker.write_text(json.dumps(marker_payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    bytes_on_disk = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return TinyBuildInfo(
        path=out,
        spec=spec,
        vocab_size=len(hf_tokenizer),
        num_parameters=num_parameters,
        bytes_on_disk=bytes_on_disk,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    hidden: int = 128,
    layers: int = 2,
    vocab: int = 2048,
    seed: int = 0,
    initializer_range: float = TinyModelSpec.initializer_range,
    family: str = DEFAULT_FAMILY,
) -> Path:
    """Build the offline tiny tokenizer + random model (Qwen3 unless ``family`` says) into ``out_dir``; return its path.

    See TinyModelSpec for the arguments and build_tiny for the directory rules.
    """
    spec = TinyModelSpec(
        hidden=hidden, layers=layers, vocab=vocab, seed=seed, initializer_range=initializer_range, family=family
    )
    return build_tiny(out_dir, spec).path
