"""Run inside a compile worker by tests/test_precompile.py. It imports nothing but sys, so that
the modules it finds imported were there before it came."""

import sys


def imported(names: list[str]) -> list[str]:
    return [name for name in names if name in sys.modules]
