"""The supervised warm start's datums: the chat-templated prompt masked, the response trained."""

from __future__ import annotations

import math

from agl_bridge.train.warm_start import sft_datum


def test_sft_datum_trains_only_the_response(tiny_tokenizer) -> None:
    from agl_bridge.chat import ChatCodec

    codec = ChatCodec(tiny_tokenizer)
    datum = sft_datum(codec, "Say you are 7.", "I'm 7.")
    weights = datum.loss_fn_inputs["weights"]
    trained = [t for t, w in zip(datum.loss_fn_inputs["target_tokens"], weights, strict=False) if w]
    assert tiny_tokenizer.decode(trained) == "I'm 7.<|im_end|>"
    assert not math.isnan(sum(weights))
