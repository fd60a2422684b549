"""Warm start: the search measures the winners of the nearest tuned problems (from the exported
tables the runtime reads) right after the default, before the sampler — on the CPU, with a fake
runner and a temporary OMNITUNE_CONFIG_DIR."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import optuna
import pytest
import torch

from omnitune import runtime
from omnitune.profile.device import DeviceFacts
from omnitune.search.driver import run_search, warm_start_configs
from omnitune.trial import TrialResult, TrialStatus
from omnitune.spec import Config, Constraint, KernelSpec, MatchPolicy, Param

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True)
class WarmProblem:
    n: int


def _tile_limit(problem, config, dtype, limits):
    # Large tiles only fit large problems: a config tuned for n=64 can be invalid for n=8.
    return "tile larger than the problem" if config["BLOCK"] > max(32, problem.n) else None


def _unused(*args, **kwargs):
    raise AssertionError("not called")


SPEC = KernelSpec(
    name="warm_toy", description="a fake kernel for warm starts", problem_type=WarmProblem,
    params=(Param("BLOCK", (16, 32, 64, 128)), Param("num_warps", (1, 2, 4, 8))),
    constraints=(Constraint("tile", _tile_limit),),
    default_config=lambda problem, dtype: Config(BLOCK=16, num_warps=1),
    make_inputs=_unused, new_output=_unused, launch=_unused, reference=_unused,
    tolerance={torch.float32: 1e-4, torch.float16: 1e-3}, flops=lambda p: 1e9, bytes_moved=lambda p, d: 1e6,
    match=MatchPolicy(max_ratio=4.0), dtypes=(torch.float32, torch.float16), example_problem=WarmProblem(8),
    module=__name__,
)
DEVICE = DeviceFacts(
    name="Fake GPU 9000", compute_capability="9.0", multiprocessors=132, memory_gib=80.0,
    l2_cache_mib=50.0, shared_memory_per_block_kib=227.0, driver="1.0", cuda="12.8",
    torch="2.x", triton="3.x", omnitune="0.1.0", python="3.12",
)
NEAR = Config(BLOCK=32, num_warps=4)        # tuned for n=16: distance 1 from n=8
NEARER = Config(BLOCK=32, num_warps=2)      # tuned for n=8 itself (fp32)
TOO_BIG = Config(BLOCK=64, num_warps=8)     # tuned for n=24: within policy, invalid for n=8
FAR = Config(BLOCK=16, num_warps=8)         # tuned for n=64: ratio 8, outside the policy
OTHER_DTYPE = Config(BLOCK=16, num_warps=4)  # tuned for n=8 in fp16


def _entry(n: int, dtype: str, config: Config) -> tuple[str, dict]:
    key = f"{dtype}|n={n}"
    return key, {"dtype": dtype, "problem": {"n": n}, "config": config.as_dict(), "time_ms": 1.0}


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    entries = dict([_entry(16, "fp32", NEAR), _entry(8, "fp32", NEARER), _entry(24, "fp32", TOO_BIG),
                    _entry(64, "fp32", FAR), _entry(8, "fp16", OTHER_DTYPE)])
    doc = {"schema_version": runtime.SCHEMA_VERSION, "kernel": SPEC.name,
           "device": {"key": DEVICE.key, "name": DEVICE.name}, "entries": entries}
    path = tmp_path / "tables" / SPEC.name / f"{DEVICE.key}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(runtime.CONFIG_DIR_ENV, str(tmp_path / "tables"))
    runtime.clear_cache()
    yield path
    runtime.clear_cache()


def test_warm_start_configs_are_the_nearest_valid_same_dtype_winners(config_dir):
    assert warm_start_configs(SPEC, WarmProblem(8), torch.float32, DEVICE.key) == [NEARER, NEAR]
    assert warm_start_configs(SPEC, WarmProblem(8), torch.float16, DEVICE.key) == [OTHER_DTYPE]
    assert warm_start_configs(SPEC, WarmProblem(8), torch.float32, "Other_GPU") == []
    # For n=64 the 64-wide tile is valid and n=8 is out of reach; nearest first, at most `most`.
    assert warm_start_configs(SPEC, WarmProblem(64), torch.float32, DEVICE.key, most=2) == [FAR, TOO_BIG]


class Runner:
    def __init__(self):
        self.calls: list[Config] = []

    def measure(self, config: Config) -> TrialResult:
        self.calls.append(config)
        t = 1.0 + abs(math.log2(config["BLOCK"]) - 5) + abs(math.log2(config["num_warps"]) - 1)
        return TrialResult(config, TrialStatus.OK, time_ms=t, p20_ms=t, p80_ms=t, rel_error=0.0)


def test_search_measures_warm_start_configs_after_the_default(config_dir, tmp_path):
    runner = Runner()
    storage = f"sqlite:///{tmp_path / 'studies.optuna.db'}"
    outcome = run_search(SPEC, WarmProblem(8), torch.float32, runner_factory=lambda: runner, device=DEVICE,
                         trials=5, storage_url=storage, finalists=0, sampler="random")
    assert runner.calls[:3] == [Config(BLOCK=16, num_warps=1), NEARER, NEAR]
    study = optuna.load_study(study_name=outcome.study_name, storage=storage)
    chosen = [t.user_attrs["measurement"]["chosen_by"] for t in study.get_trials() if "measurement" in t.user_attrs]
    assert chosen[:3] == ["default", "warm-start", "warm-start"] and "warm-start" not in chosen[3:]
    assert outcome.best.config == NEARER
