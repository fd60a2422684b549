"""What measuring in an isolated worker costs over measuring in-process, on the CPU under
Triton's interpreter: the same attention configs through Runner and through IsolatedRunner.

Not a GPU figure. Under the interpreter a trial takes tens of milliseconds of Python either way,
so this shows the fixed costs of isolation — starting the worker (a fresh interpreter importing
torch and Triton, then the inputs and reference) and one pipe round trip per trial — not how
they compare with a GPU trial.

    python benchmarks/isolation_overhead.py [--configs 8]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

import torch  # noqa: E402

from omnitune.kernels.attention import AttentionProblem  # noqa: E402
from omnitune.registry import get_spec  # noqa: E402
from omnitune.measure.runner import Runner  # noqa: E402
from omnitune.measure.worker import IsolatedRunner  # noqa: E402

PROBLEM = AttentionProblem(b=1, h=2, hkv=1, lq=9, lk=21, d=64, causal=True)
DTYPE = torch.float32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=8, help="how many valid configs to measure")
    args = parser.parse_args()
    spec = get_spec("attention")
    configs = spec.valid_configs(PROBLEM, DTYPE)[: args.configs]

    started = time.perf_counter()
    runner = Runner(spec, PROBLEM, DTYPE, interpret=True)
    in_process = [runner.measure(configs[0])]
    first_in_process_s = time.perf_counter() - started  # inputs, reference and the first trial
    started = time.perf_counter()
    in_process += [runner.measure(c) for c in configs[1:]]
    rest_in_process_s = time.perf_counter() - started

    with IsolatedRunner("attention", PROBLEM, DTYPE, interpret=True) as isolated:
        started = time.perf_counter()
        isolated_results = [isolated.measure(configs[0])]  # starts the worker
        first_isolated_s = time.perf_counter() - started
        started = time.perf_counter()
        isolated_results += [isolated.measure(c) for c in configs[1:]]
        rest_isolated_s = time.perf_counter() - started
    agree = all(a.status is b.status and a.rel_error == b.rel_error for a, b in zip(in_process, isolated_results))

    rest = max(1, len(configs) - 1)
    print("CPU, Triton interpreter: not a GPU figure")
    print(f"attention {spec.problem_key(PROBLEM)} fp32, {len(configs)} configs; same statuses and errors: {agree}")
    print(f"{'':12}{'first trial (setup included)':>30}{f'other {rest} trials':>18}{'per trial':>12}")
    for name, first_s, rest_s in (("in-process", first_in_process_s, rest_in_process_s),
                                  ("isolated", first_isolated_s, rest_isolated_s)):
        print(f"{name:12}{first_s:>28.2f} s{rest_s:>16.2f} s{rest_s / rest * 1e3:>9.1f} ms")
    print(f"isolation costs {first_isolated_s - first_in_process_s:.2f} s once (and again after each crash or "
          f"timeout) and {(rest_isolated_s - rest_in_process_s) / rest * 1e3:+.1f} ms per trial")

if __name__ == "__main__":
    main()
