"""--profile-top: after a search, the best configs profiled with Nsight Compute and their counters
stored beside the trials (see `omnitune report`). A failure of ncu is one line and ends the
profiling, never the search."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from omnitune.cli.common import console, err_console

if TYPE_CHECKING:
    import torch

    from omnitune.profile.ncu import NcuProfile
    from omnitune.spec import Config, KernelSpec


def profile_top_possible(count: int, interpret: bool) -> int:
    """--profile-top as it can run here: 0, with one line saying why, without ncu or a GPU."""
    if not count:
        return 0
    from omnitune.profile.ncu import ncu_available

    # --interpret first: with it, installing ncu would change nothing, so that is the reason to give.
    if interpret:
        console.print("--profile-top: skipped under --interpret (ncu profiles kernels on a GPU)", soft_wrap=True)
        return 0
    if not ncu_available():
        console.print("--profile-top: Nsight Compute (ncu) is not installed here, so nothing is profiled; "
                      "put ncu on PATH (it ships with the CUDA toolkit)", soft_wrap=True)
        return 0
    return count


def ncu_profile(kernel_arg: str, spec: KernelSpec, problem, dtype: torch.dtype, config: Config,
                launches: int = 3) -> NcuProfile:
    """One config's ncu counters, taken as `omnitune profile` takes them."""
    from omnitune.profile.ncu import profile_config

    return profile_config(kernel_arg, spec, problem, dtype, config, launches)


def profile_best(
    spec: KernelSpec, kernel_arg: str, problem, dtype: torch.dtype, configs, *, database, device_key: str,
    profiler=ncu_profile,
) -> int:
    """Profile `configs` (best first) with ncu and store each: the first as 'tuned', the kernel's
    default config as 'default', the others as 'custom'. An ncu failure is one line and ends the
    profiling, never the search. Returns how many were stored."""
    from omnitune.profile.ncu import NcuError
    from omnitune.profile.ncu import profile_record
    from omnitune.store import ProfileKind, record_profile

    default = spec.default_config(problem, dtype)
    stored = 0
    for rank, config in enumerate(configs):
        which = ProfileKind.TUNED if rank == 0 else ProfileKind.DEFAULT if config == default else ProfileKind.CUSTOM
        try:
            with console.status(f"profiling {escape(config.label())} under ncu…"):
                profile = profiler(kernel_arg, spec, problem, dtype, config)
        except NcuError as exc:
            err_console.print(f"  --profile-top: {escape(str(exc))}; the search's results stand", soft_wrap=True)
            break
        record_profile(database, profile_record(profile, spec=spec, problem=problem, dtype=dtype,
                                                device_key=device_key, config=config, which=which))
        stored += 1
        console.print(f"  ncu {which.value}: {escape(config.label())}: {_profile_figures(profile)}", soft_wrap=True)
    return stored


def _profile_figures(profile: NcuProfile) -> str:
    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}%"

    duration = "—" if profile.duration_us is None else f"{profile.duration_us:.1f} µs"
    return (f"{duration}, L1 hit {pct(profile.l1_hit_pct)}, L2 hit {pct(profile.l2_hit_pct)}, "
            f"DRAM {pct(profile.dram_pct_of_peak)} of peak, occupancy {pct(profile.achieved_occupancy_pct)}")
