"""How list and JSON fields are stored: compact little-endian arrays and compact JSON text.

Token-id lists (prompt ids, response ids, per-token policy versions) are stored as packed int32
little-endian bytes; logprob lists as packed float64 little-endian bytes. Why this encoding:
  - exact: float64 is Python's float, so every logprob round-trips bit for bit (-0.0, subnormals
    and infinities included);
  - fast: `array.array` packs and unpacks in C. Measured for a 64-long list: float64 pack 0.8 us
    and unpack 0.7 us, against 27 us and 11 us for JSON (float repr is slow); int32 pack 1.3 us
    against 4.3 us. With three lists per record, JSON alone would eat the whole budget of the
    20k records/s ingest target;
  - compact: 4 bytes per id, 8 per logprob (64 logprobs: 512 bytes against ~1,300 as JSON); an
    empty list is an empty blob.
Token ids and policy versions must fit in a signed 32-bit integer (every tokenizer vocabulary does).
Structured fields (messages, prefix breaks, task payloads, metadata) are compact standard JSON.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Sequence
from typing import Any

_BIG_ENDIAN = sys.byteorder == "big"


def encode_int32s(name: str, values: Sequence[int]) -> bytes:
    """Pack integers as little-endian int32 bytes; ValueError naming `name` if one does not fit."""
    if not values:
        return b""
    try:
        packed = array("i", values)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"{name} must be a list of integers in the int32 range: {exc}") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def decode_int32s(blob: bytes) -> list[int]:
    """Unpack bytes written by `encode_int32s`."""
    return int32_array(blob).tolist()


def int32_array(blob: bytes) -> array[int]:
    """Bytes written by `encode_int32s` as an `array("i")`: no Python int per element until read."""
    values = array("i")
    values.frombytes(blob)
    if _BIG_ENDIAN:
        values.byteswap()
    return values


def encode_float64s(name: str, values: Sequence[float]) -> bytes:
    """Pack numbers as little-endian float64 bytes (exact for Python floats)."""
    if not values:
        return b""
    try:
        packed = array("d", values)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"{name} must be a list of real numbers: {exc}") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def decode_float64s(blob: bytes) -> list[float]:
    """Unpack bytes written by `encode_float64s`."""
    return float64_array(blob).tolist()


def float64_array(blob: bytes) -> array[float]:
    """Bytes written by `encode_float64s` as an `array("d")`."""
    values = array("d")
    values.frombytes(blob)
    if _BIG_ENDIAN:
        values.byteswap()
    return values


# One encoder for every call: json.dumps with non-default options builds a new encoder each time,
# which costs more than encoding a short message list.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(name: str, value: Any) -> str:
    """Serialize `value` as compact standard JSON; ValueError naming `name` if it is not JSON-able."""
    if isinstance(value, list) and not value:
        return "[]"
    try:
        return _JSON_ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{name} must be JSON-serializable (dicts, lists, strings, finite numbers, bools, None): {exc}"
        ) from None


def decode_json(text: str) -> Any:
    """Parse text written by `encode_json`."""
    return json.loads(text)
