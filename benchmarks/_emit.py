"""A benchmark's result: printed as JSON, and written to --out when given."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, out: Path | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")
