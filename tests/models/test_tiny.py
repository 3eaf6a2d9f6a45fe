"""The offline tiny model: deterministic build, loadable with Auto classes, Qwen-style tokens and chat template."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from agl_bridge.models.tiny import (
    ADDED_TOKENS,
    MARKER_FILENAME,
    SPECIAL_TOKENS,
    TINY_FORMAT_VERSION,
    InvalidTinySpecError,
    TinyModelSpec,
    build_tiny,
    build_tiny_model,
)

SMALL = {"hidden": 32, "layers": 1, "vocab": 600}


def test_same_arguments_build_byte_identical_directories(tiny_model_dir: Path, tmp_path: Path) -> None:
    rebuilt = build_tiny_model(tmp_path / "again")
    names = sorted(p.name for p in tiny_model_dir.iterdir())
    assert names == sorted(p.name for p in rebuilt.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER_FILENAME} <= set(names)
    for name in names:
        assert (tiny_model_dir / name).read_bytes() == (rebuilt / name).read_bytes(), name


def test_seed_changes_weights_but_not_tokenizer(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", seed=1, **SMALL)
    b = build_tiny_model(tmp_path / "b", seed=2, **SMALL)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    weights_a, weights_b = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    matrices = [k for k in weights_a if weights_a[k].ndim == 2]
    assert matrices and all(not torch.equal(weights_a[k], weights_b[k]) for k in matrices)


def test_build_does_not_touch_the_global_torch_rng(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", **SMALL)
    assert torch.equal(torch.rand(3), expected)


def test_loads_with_plain_auto_classes_and_has_the_qwen3_shape(tiny_model_dir: Path, tiny_tokenizer) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (128, 2, 384)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 32)
    assert config.max_position_embeddings == 65536 and config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert config.vocab_size == len(tiny_tokenizer) == 2048
    im_end, eot = tiny_tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (config.eos_token_id, config.pad_token_id) == (im_end, eot)
    assert GenerationConfig.from_pretrained(tiny_model_dir).eos_token_id == [im_end, eot]
    logits = model(torch.tensor([tiny_tokenizer.encode("I am 42.")])).logits
    assert logits.shape[-1] == 2048 and torch.isfinite(logits).all()


def test_marker_records_the_build(tiny_model_dir: Path) -> None:
    marker = json.loads((tiny_model_dir / MARKER_FILENAME).read_text())
    assert marker["format_version"] == TINY_FORMAT_VERSION
    assert marker["args"] == {
        "hidden": 128,
        "layers": 2,
        "vocab": 2048,
        "seed": 0,
        "initializer_range": 0.2,
        "context": 65536,
    }
    assert marker["fingerprint"] == TinyModelSpec().fingerprint()


def test_random_model_is_far_from_uniform(tiny_model_dir: Path, tiny_tokenizer) -> None:
    # Deterministic weights, so this is a fixed fact of the build, not a chance event.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tiny_tokenizer.encode("User: Let's play a game. Say you are 42.\nAssistant: I'm 42!")
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    assert entropy.mean().item() < 0.8 * math.log(2048)
    top2 = logprobs.topk(2, dim=-1).values
    # Greedy choice must not hinge on float noise.
    assert (top2[:, 0] - top2[:, 1]).min().item() > 1e-4


def test_special_and_added_tokens_are_single_ids(tiny_tokenizer) -> None:
    ids = [tiny_tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + ADDED_TOKENS]
    assert ids[:3] == [0, 1, 2]
    assert ids[3:] == list(range(2048 - len(ADDED_TOKENS), 2048))
    for token, token_id in zip(SPECIAL_TOKENS + ADDED_TOKENS, ids, strict=False):
        assert tiny_tokenizer.encode(token, add_special_tokens=False) == [token_id]
        assert tiny_tokenizer.encode(f"x{token}y", add_special_tokens=False).count(token_id) == 1
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.bos_token is None


def test_control_tokens_are_special_but_markup_tokens_are_text(tiny_tokenizer) -> None:
    text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><think>hm</think><|im_end|>"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text
    visible = "assistant\n<tool_call>\n{}\n</tool_call><think>hm</think>"
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == visible


def test_no_bos_or_eos_is_added_on_encode(tiny_tokenizer) -> None:
    assert tiny_tokenizer.encode("Hello world") == tiny_tokenizer.encode("Hello world", add_special_tokens=False)


def test_byte_level_round_trips_any_text(tiny_tokenizer) -> None:
    text = 'Ünïcödé ☃ 日本語 \t\n  {"a": [1, 2.5, null]} 999 emoji 🙂'
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text
    # Qwen-style pre-tokenization: every digit is its own token.
    assert len(tiny_tokenizer.encode("123")) == 3


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_chat_template_renders_system_tools_tool_calls_and_tool_results(tiny_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 20}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"temp": 25}'},
        {"role": "assistant", "content": "Paris 20, Rome 25."},
        {"role": "user", "content": "Thanks"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    tool_json = json.dumps(TOOLS[0])
    expected_system = (
        "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist with the "
        "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{tool_json}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    )
    expected_rest = (
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response>\n'
        '<tool_response>\n{"temp": 25}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\nParis 20, Rome 25.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected_system + expected_rest


def test_chat_template_without_tools_and_token_ids(tiny_tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say you are 42."}]
    text = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay you are 42.<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tiny_tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    assert no_prompt == "<|im_start|>user\nSay you are 42.<|im_end|>\n"
    ids = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_vocab_is_honoured_exactly(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path / "m", **SMALL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) == 600
    assert AutoConfig.from_pretrained(path).vocab_size == 600


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hidden": 30}, "hidden"),
        ({"layers": 0}, "layers"),
        ({"vocab": 100}, "vocab"),
        ({"seed": -1}, "seed"),
        ({"initializer_range": 0.0}, "initializer_range"),
    ],
)
def test_bad_arguments_name_the_argument(overrides: dict, field: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidTinySpecError, match=field) as info:
        build_tiny_model(tmp_path / "m", **overrides)
    assert info.value.field == field
    assert not (tmp_path / "m").exists()


def test_vocab_larger_than_the_corpus_supports_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidTinySpecError, match="only supports .* tokens") as info:
        build_tiny(tmp_path / "m", TinyModelSpec(vocab=100_000))
    assert info.value.field == "vocab"
    assert not (tmp_path / "m").exists()


def test_refuses_to_overwrite_a_foreign_directory_but_rebuilds_its_own(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        build_tiny_model(foreign, **SMALL)
    assert (foreign / "notes.txt").read_text() == "mine"
    own = build_tiny_model(tmp_path / "own", **SMALL)
    assert build_tiny_model(own, **SMALL) == own


def test_families_build_their_architecture_with_the_shared_tokenizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    gemma = build_tiny_model(tmp_path / "gemma2", family="gemma2", **SMALL)
    gpt2 = build_tiny_model(tmp_path / "gpt2", family="gpt2", **SMALL)
    assert type(AutoModelForCausalLM.from_pretrained(gemma)).__name__ == "Gemma2ForCausalLM"
    assert type(AutoModelForCausalLM.from_pretrained(gpt2)).__name__ == "GPT2LMHeadModel"
    config = AutoConfig.from_pretrained(gemma)
    assert config.layer_types == ["sliding_attention"] and config.sliding_window == 8
    assert (gemma / "tokenizer.json").read_bytes() == (gpt2 / "tokenizer.json").read_bytes()
    marker = json.loads((gemma / MARKER_FILENAME).read_text())
    assert marker["args"]["family"] == "gemma2"
    assert TinyModelSpec(family="gemma2").fingerprint() != TinyModelSpec().fingerprint()
    assert "family" not in json.loads((tiny_model_dir / MARKER_FILENAME).read_text())["args"]
