"""The source hash an exported table records, translated from what a search recorded
(omnitune.source_hash holds the hashes; this module looks the kernel up, which the hashes, read
by omnitune.spec, must not)."""

from __future__ import annotations

import sys
from typing import Any

from omnitune.source_hash import UNKNOWN, kernel_source_hash, source_matches


def provenance_hash(kernel: str, recorded: Any) -> Any:
    """The source hash an exported table records for the search's `recorded` one.

    Searches made before this hash existed recorded the whole-module hash. Where that still
    equals the module's current source, the device code measured is today's, so its jit hash is
    written instead; any other value (a jit hash already, or a hash of code that has changed
    since) is written as recorded, which is the truth about what was measured."""
    if not isinstance(recorded, str) or recorded in ("", UNKNOWN):
        return recorded
    from omnitune.errors import OmnituneError
    from omnitune.registry import get_spec

    try:
        module = sys.modules.get(get_spec(kernel).module)
    except (OmnituneError, ImportError):
        return recorded
    if module is not None and source_matches(module, recorded) == "module":
        return kernel_source_hash(module)
    return recorded
