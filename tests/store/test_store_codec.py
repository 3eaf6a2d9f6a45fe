"""The list encodings: exact round-trips for every int32 and every float64."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agl_bridge.store.codec import decode_float64s, decode_int32s, encode_float64s, encode_int32s


@given(st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1)))
def test_int32_lists_round_trip(values: list[int]) -> None:
    blob = encode_int32s("ids", values)
    assert len(blob) == 4 * len(values)
    assert decode_int32s(blob) == values


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True)))
def test_float64_lists_round_trip_bit_for_bit(values: list[float]) -> None:
    decoded = decode_float64s(encode_float64s("logprobs", values))
    assert [struct.pack("<d", v) for v in decoded] == [struct.pack("<d", v) for v in values]


def test_encoding_is_little_endian() -> None:
    assert encode_int32s("ids", [1, -2]) == struct.pack("<2i", 1, -2)
    assert encode_float64s("logprobs", [-0.5, math.inf]) == struct.pack("<2d", -0.5, math.inf)


@pytest.mark.parametrize("bad", [[2**31], [-(2**31) - 1], [1.5], ["3"]])
def test_ids_that_do_not_fit_are_rejected_with_the_field_name(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="^ids must be a list of integers in the int32 range"):
        encode_int32s("ids", bad)  # type: ignore[arg-type]
