"""Where the layers were: they moved to omnitune.kernels.layers, beside the kernels they launch.

The runtime serves configs and imports no kernel (tests/test_imports.py holds it to that), so this
module forwards nothing: it only turns an old import into an error that names the new one.
"""

_NEW_HOME = "omnitune.kernels.layers"


def __getattr__(name: str):
    if name.startswith("__"):
        # Probes such as hasattr(module, "__wrapped__") expect AttributeError, not an import error.
        raise AttributeError(name)
    raise ImportError(f"omnitune.runtime.layers.{name} has moved: use `from {_NEW_HOME} import {name}`",
                      name=__name__)
