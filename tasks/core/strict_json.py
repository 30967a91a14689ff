"""Strict JSON: `json.loads` that refuses what a plain decode would take silently (a key written
twice, kept as its last value; NaN and Infinity; an integer of thousands of digits; a number that
overflows to infinity; text that is not UTF-8). Used where a person's or an agent's JSON is bound
to what runs (custom tools' schemas and inputs, docs/tools.md)."""

import json
import math
from typing import Any

INT_DIGITS_MAX = 1000


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}: each key may appear once per object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed: numbers must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range: numbers must be finite")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > INT_DIGITS_MAX:
        raise ValueError(f"an integer of more than {INT_DIGITS_MAX} digits is out of range")
    return int(text)


def _utf8_text(raw: bytes | str) -> str:
    if isinstance(raw, str):
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"not valid UTF-8 text (a lone surrogate at character {exc.start})") from None
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 text (at byte {exc.start})") from None


def loads_strict(raw: bytes | str) -> Any:
    """`json.loads` that refuses a key twice in one object, NaN and Infinity (and numbers too
    large for a float), and text that is not UTF-8; every refusal is a `ValueError`."""
    text = _utf8_text(raw)
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
