"""The part of a table's entries and predictor points that names a problem — its `dtype`, its
`problem` and the key they must give — validated the one way every reader of a table does
(the runtime, export before merging, verify). Standard library, torch and omnitune.spec only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnitune.coerce import describe
from omnitune.runtime._format import entry_key
from omnitune.spec import DTYPES, KernelSpec


def keyed_problem(key: str, raw: Any, spec: KernelSpec) -> tuple[torch.dtype, Any]:
    """(dtype, problem) of one entry or point stored under `key`; raises KeyError (a field it
    lacks), TypeError, ValueError or an OmnituneError (an impossible problem) naming what is wrong."""
    if not isinstance(raw, dict):
        raise TypeError(f"it is a JSON {type(raw).__name__}, not an object")
    dtype_name = raw["dtype"]
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None or dtype not in spec.dtypes:
        raise ValueError(f"dtype {describe(dtype_name)} is not one of {spec.name}'s dtypes")
    if not isinstance(raw["problem"], Mapping):
        raise TypeError("its 'problem' is not an object")
    problem = spec.problem_from_mapping(raw["problem"])
    expected = entry_key(dtype_name, spec.problem_key(problem))
    if key != expected:
        raise ValueError(f"its problem and dtype give the key {expected!r}")
    return dtype, problem
