"""The contract every registered kernel's spec must honour: omnitune.testing's suite (the one a
user runs on their own kernel) over every built-in kernel; a new kernel is picked up here by
being in the registry."""

from __future__ import annotations

import pytest

from omnitune.registry import get_spec, kernel_names
from omnitune.testing import SpecContract


class TestBuiltinKernels(SpecContract):
    @pytest.fixture(params=kernel_names())
    def spec(self, request):
        return get_spec(request.param)
