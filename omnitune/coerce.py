"""Strict parsing of the scalar values a problem or a config is built from.

Values arrive from JSON tables (written by export, but possibly hand-edited or corrupt), from the
command line (strings) and from Python callers. Python's own conversions are too lenient for that:
int("1_0") is 10, int("１６") is 16, float("1e400") is inf (and int(inf) raises OverflowError), and
int() of a megabyte of digits burns CPU before it fails. So every conversion here accepts only
plain ASCII spellings of bounded length, rejects non-finite numbers and bounds integers, and
reports a rejection as ValueError with a reason, which callers turn into their own error type.

Standard library only: the runtime imports this on a production hot path.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any

MAX_DIMENSION = 2**31 - 1
"""The largest integer a problem field may hold. The kernels index tensors with 32-bit offsets,
and no tuned table holds anything near it, so a larger value is a caller's mistake (or a corrupt
table), not a problem to answer with a default config."""

_INT_TEXT = re.compile(r"[+-]?[0-9]{1,20}")  # ASCII digits only: no '_', no fullwidth digits
# ASCII digits of any length: text _INT_TEXT refuses only for its length is a number too large,
# not a spelling mistake. Matching is linear; the digits are counted, never converted.
_LONG_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][+-]?[0-9]{1,3})?")
_TRUE_WORDS = ("1", "true", "yes", "y")
_FALSE_WORDS = ("0", "false", "no", "n")


def describe(value: Any, limit: int = 40) -> str:
    """A repr of at most ~`limit` characters for messages: a megabyte of digits must not end up
    in a log line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}…({len(text)} characters)"


def as_int(value: Any, *, strings: bool = True) -> int:
    """An int from an int (not a bool), an object with __index__ (numpy integers), or, with
    strings=True, ASCII decimal digits; within ±MAX_DIMENSION."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, int):
        number = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not strings or not _INT_TEXT.fullmatch(text):
            if strings and _LONG_INT_TEXT.fullmatch(text):
                raise ValueError(f"out of range: {len(text.lstrip('+-'))} digits, too large "
                                 f"(at most {MAX_DIMENSION:,} = 2**31 - 1)")
            raise ValueError("not an integer written in ASCII digits")
        number = int(text)
    elif isinstance(value, float):
        raise ValueError("a float is not an integer")
    else:
        try:
            number = operator.index(value)
        except TypeError:
            raise ValueError(f"a {type(value).__name__} is not an integer") from None
    if abs(number) > MAX_DIMENSION:
        raise ValueError(f"out of range (at most {MAX_DIMENSION:,} = 2**31 - 1)")
    return number


def as_bool(value: Any, *, lenient: bool = True) -> bool:
    """A bool; with lenient=True also the integers 0 and 1 and the words the command line uses
    ('1', 'true', 'yes', ...). Never a float: 1.0 is no more a flag than 0.5 is."""
    if isinstance(value, bool):
        return value
    if lenient:
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _TRUE_WORDS:
                return True
            if word in _FALSE_WORDS:
                return False
    raise ValueError("not a boolean")


def as_float(value: Any) -> float:
    """A finite float from an int or float (not a bool) or a plain ASCII decimal string."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, str):
        text = value.strip()
        if not _FLOAT_TEXT.fullmatch(text):
            raise ValueError("not a decimal number")
        value = float(text)
    elif not isinstance(value, (int, float)):
        raise ValueError(f"a {type(value).__name__} is not a number")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError("out of range") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a {type(value).__name__} is not a string")
    return value
