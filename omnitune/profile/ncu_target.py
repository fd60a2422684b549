"""The process Nsight Compute wraps: builds one problem's inputs and launches a kernel with one
config a few times, nothing else.

    python -m omnitune.profile.ncu_target KERNEL SHAPE DTYPE CONFIG_JSON [--launches N]

KERNEL is a registry name, module path or .py file (as `omnitune profile` takes it); SHAPE a
--shape spec; CONFIG_JSON a (partial) config laid over the kernel's default. Input building and
the first launch's compilation run other kernels or none; `omnitune profile` filters by the
kernel's own names and skips the first launch, so only warm launches are counted.
"""

from __future__ import annotations

import argparse
import json
import sys

from omnitune.errors import OmnituneError

DEFAULT_LAUNCHES = 3


def run(kernel: str, shape: str, dtype_text: str, config_json: str, launches: int = DEFAULT_LAUNCHES) -> None:
    """Launch the kernel `launches` times on fresh random inputs; raises OmnituneError on bad
    arguments or without a GPU."""
    import torch

    from omnitune.errors import ConfigError, DeviceError
    from omnitune.registry import get_spec
    from omnitune.spec import parse_dtype

    if not torch.cuda.is_available():
        raise DeviceError("no CUDA GPU here; ncu_target launches a kernel on one")
    spec = get_spec(kernel)
    problem = spec.parse_shape(shape)
    dtype = parse_dtype(dtype_text)
    try:
        values = json.loads(config_json)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"CONFIG_JSON is not valid JSON ({exc.msg} at position {exc.pos})") from None
    config = spec.complete_config(values, problem, dtype)
    spec.require_valid(problem, config, dtype)
    inputs = spec.make_inputs(problem, dtype, "cuda", 0)
    out = spec.new_output(inputs)
    for _ in range(launches):
        if spec.restore_inputs is not None:
            spec.restore_inputs(inputs)
        spec.launch(inputs, out, config)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omnitune.profile.ncu_target", description=__doc__.splitlines()[0])
    parser.add_argument("kernel")
    parser.add_argument("shape")
    parser.add_argument("dtype")
    parser.add_argument("config_json")
    parser.add_argument("--launches", type=int, default=DEFAULT_LAUNCHES)
    args = parser.parse_args(argv)
    try:
        run(args.kernel, args.shape, args.dtype, args.config_json, args.launches)
    except OmnituneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
