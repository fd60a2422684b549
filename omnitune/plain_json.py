"""JSON that any parser reads: what omnitune writes for scripts (verify's and bench's reports)."""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from typing import Any


def encodes_as_utf8(text: str) -> bool:
    """Whether UTF-8 can carry `text`: not if it holds a lone surrogate (JSON's "\\ud800", which a
    table's key can hold), which a UTF-8 file or log handler fails to write."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def utf8_text(text: str) -> str:
    """`text` as UTF-8 can carry it: a lone surrogate written as its escape, where writing it
    raised UnicodeEncodeError mid-report."""
    return text if encodes_as_utf8(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> Any:
    """Plain JSON: NaN and infinities as None (allow_nan=False holds), tuples as lists, enums by
    their value, numpy and torch scalars unwrapped, text UTF-8 can write (utf8_text), anything
    else by its str()."""
    if isinstance(value, Mapping):
        return {utf8_text(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):
        return json_safe(value.item())
    return utf8_text(str(value))


def plain_json_text(value: Any) -> str:
    """`value` as indented JSON text (json_safe first: a NaN is null, which every parser reads)."""
    return json.dumps(json_safe(value), indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"
