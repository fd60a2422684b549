"""The kernel spec: the one description of a kernel that search, profile, report, export and
runtime all read.

A kernel module (omnitune/kernels/<name>.py, or a user's own module) defines its Triton code, a
launcher, a PyTorch reference, a frozen dataclass for its problems, and one `SPEC = KernelSpec(...)`.
Nothing downstream knows any kernel by name: everything it needs is here.

This module imports only the standard library and torch, so that `omnitune.runtime` can read
specs on a production hot path.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from omnitune.coerce import as_bool, as_float, as_int, as_str, describe
from omnitune.errors import ConfigError, ShapeError
from omnitune.source_hash import UNKNOWN, kernel_source_hash, module_source_hash
# The tensor helpers kernel modules use, kept importable from here where they have always been.
from omnitune.tensors import element_bytes, poisoned, relative_error, require_runnable_device  # noqa: F401

ParamValue = int | bool | str
# How far resolve_config checks a whole Config a caller gives: not at all (the search, the tests),
# its counts only (the public ops), or against the space and the constraints (the layer).
CheckGiven = Literal["no", "sizes", "all"]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


def parse_dtype(name: str) -> torch.dtype:
    aliases = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16", "float": "fp32"}
    key = aliases.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ShapeError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]


class Config(Mapping[str, ParamValue]):
    """An immutable, hashable launch config. Keys are the literal launch kwargs
    (`BLOCK_M`, `num_warps`, `num_stages`, ...)."""

    __slots__ = ("_items", "_hash")

    def __init__(self, values: Mapping[str, ParamValue] | None = None, /, **kwargs: ParamValue):
        merged = dict(values or {}, **kwargs)
        self._items: tuple[tuple[str, ParamValue], ...] = tuple(sorted(merged.items()))
        # Hashed once: a config keys the ops' launch plans and memos on every call.
        self._hash = hash(self._items)

    def __reduce__(self):
        # Rebuilt from its values in the receiving process, whose string hashes differ.
        return (Config, (dict(self._items),))

    def __getitem__(self, key: str) -> ParamValue:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"

    def as_dict(self) -> dict[str, ParamValue]:
        return dict(self._items)

    def replace(self, **changes: ParamValue) -> Config:
        return Config(self.as_dict(), **changes)

    def label(self) -> str:
        """Short human label, e.g. 'BLOCK_M=128 BLOCK_N=64 num_stages=3 num_warps=8'."""
        return " ".join(f"{k}={_fmt(v)}" for k, v in self._items)


def _fmt(v: ParamValue) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


@dataclass(frozen=True)
class Param:
    """One tunable launch parameter and its discrete choices."""

    name: str
    choices: tuple[ParamValue, ...]
    help: str = ""
    missing: ParamValue | None = None
    """The value a config that lacks this parameter means (a parameter added after tables were
    exported: their entries keep meaning what they meant); None: a config must name it."""

    def coerce(self, value: Any, *, strict: bool = False) -> ParamValue:
        """One of the choices, from a value read from JSON or given by a user.

        strict (what a tuned table must hold, as export writes it): a flag only true/false, an
        integer only an integer, so that a corrupt table is skipped instead of reinterpreted (a
        table's 1.0 for a flag was once False and its 1 True). Otherwise (a user's --config or
        dict) a flag also takes 0/1 and '0'/'1'/'true'/'false', an integer ASCII digits. A float
        is never an integer or a flag, and nothing non-finite or out of range is ever accepted."""
        parsed: dict[type, Any] = {}
        for choice in self.choices:
            kind = type(choice)
            if kind not in parsed:
                parsed[kind] = _parse_choice(kind, value, strict)
            if parsed[kind] is not _UNPARSABLE and parsed[kind] == choice:
                return choice
        raise ConfigError(
            f"{self.name}={describe(value)} is not a valid choice; choose one of "
            + ", ".join(_fmt(c) for c in self.choices)
        )


_UNPARSABLE = object()


def _parse_choice(kind: type, value: Any, strict: bool) -> Any:
    """`value` read as a choice of type `kind` (bool, int or str), or _UNPARSABLE."""
    try:
        if kind is bool:
            return as_bool(value, lenient=not strict)
        if kind is int:
            return as_int(value, strings=not strict)
        return as_str(value)
    except ValueError:
        return _UNPARSABLE


@dataclass(frozen=True)
class DeviceLimits:
    """What constraints need to know about the target GPU, without touching it.

    The defaults are an H100/H200's (227 KiB of shared memory per block, compute capability 9.0),
    used when no GPU is present (interpret mode, `omnitune plan`)."""

    shared_memory_per_block_bytes: int = 232_448
    compute_capability: tuple[int, int] = (9, 0)
    multiprocessors: int = 132

    @classmethod
    def of_current_device(cls) -> DeviceLimits:
        if not torch.cuda.is_available():
            return cls()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        smem = getattr(props, "shared_memory_per_block_optin", 0) or cls.shared_memory_per_block_bytes
        return cls(int(smem), (props.major, props.minor), props.multi_processor_count)


@dataclass(frozen=True)
class Constraint:
    """A named rule that rejects a config for a problem before anything is compiled.

    `check` returns None when the config is acceptable, or a short reason ("needs 240 KiB of
    shared memory, the device has 227 KiB")."""

    name: str
    check: Callable[[Any, Config, torch.dtype, DeviceLimits], str | None]
    help: str = ""


@dataclass(frozen=True)
class MatchPolicy:
    """How the runtime finds the nearest tuned problem when a problem was not tuned itself.

    `exact` fields must be equal (e.g. head dim, causality, GQA ratio). Every other numeric field
    may differ by at most `max_ratio` (per dimension, larger over smaller); among candidates the one
    with the smallest summed |log2 ratio| wins. So a decode call (lq=1) never snaps to a prefill
    config (lq=512) with the default ratio of 4.

    The same split decides how the runtime caches its answers (omnitune/runtime/_buckets.py):
    exact fields are cached as they are, while each integer ratio field is rounded up to the next
    bucket bound, 2**(k / buckets_per_octave) rounded up to an integer, so that consecutive decode
    steps (a context growing by one token) share one cache entry. With 4 buckets per octave a bucket
    is at most ~19% wide, small next to max_ratio; small values (1..8) are their own buckets."""

    exact: tuple[str, ...] = ()
    max_ratio: float = 4.0
    ratio_overrides: Mapping[str, float] = field(default_factory=dict)
    buckets_per_octave: int = 4
    bucket_overrides: Mapping[str, int] = field(default_factory=dict)
    """Per field, another number of buckets per octave; 0 caches that field exactly (a field whose
    constraints are not monotone within a bucket must be cached exactly: see _buckets.py)."""

    def distance(self, a: Any, b: Any) -> float | None:
        """Summed |log2 ratio| over the soft fields, or None if a and b may not be matched.

        Never raises for odd values (a table is untrusted input): a ratio too large for a float,
        a non-finite or non-positive value, or a value of another type means "no match"."""
        total = 0.0
        for f in dataclasses.fields(a):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            if f.name in self.exact or isinstance(va, bool) or not isinstance(va, (int, float)):
                if va != vb:
                    return None
                continue
            if va == vb:
                continue
            if isinstance(vb, bool) or not isinstance(vb, (int, float)) or not (va > 0 and vb > 0):
                return None
            try:
                ratio = max(va, vb) / min(va, vb)
            except (OverflowError, ZeroDivisionError):  # e.g. 10**400 / 3: far beyond any max_ratio
                return None
            if not ratio <= self.ratio_overrides.get(f.name, self.max_ratio):  # also catches NaN
                return None
            total += math.log2(ratio)
        return total

    def buckets_of(self, f: dataclasses.Field) -> int:
        """Buckets per octave of one problem field in the runtime's cache; 0: cached exactly."""
        if f.name in self.exact or field_kind(f) != "int":
            return 0
        return max(0, int(self.bucket_overrides.get(f.name, self.buckets_per_octave)))


@dataclass(frozen=True)
class KernelSpec:
    """Everything the tool knows about one kernel.

    Callables take the kernel's own problem dataclass and inputs object; nothing outside the
    kernel's module looks inside either.
    """

    name: str
    description: str
    problem_type: type
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]
    default_config: Callable[[Any, torch.dtype], Config]
    make_inputs: Callable[[Any, torch.dtype, torch.device | str, int], Any]
    new_output: Callable[[Any], torch.Tensor]
    launch: Callable[[Any, torch.Tensor, Config], torch.Tensor | None]
    """Runs one config: writes the result into the output buffer, or returns the tensor that holds
    it (an implementation that makes its own output, such as attention's SDPA backends)."""
    reference: Callable[[Any], torch.Tensor]
    tolerance: Mapping[torch.dtype, float]
    flops: Callable[[Any], float]
    bytes_moved: Callable[[Any, torch.dtype], float]
    match: MatchPolicy = MatchPolicy()
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    known_good: tuple[Mapping[str, ParamValue], ...] = ()
    """Partial configs, laid over the default, that were fast somewhere before: the search measures
    them right after the default (those valid for the problem), so the sampler starts from a
    good region instead of finding it by luck."""
    backends: tuple[Mapping[str, ParamValue], ...] = ()
    """Partial configs that run another implementation of the same op (PyTorch's SDPA for
    attention): the finalists re-time them beside the best configs whenever they ran, so that a
    table records whichever is fastest and the op never ships slower than them."""
    example_problem: Any = None
    sample_problems: tuple = ()
    """More small problems for the contract tests: together with example_problem they should
    make every constraint fire and every code path (masks, GQA, odd sizes) run."""
    baselines: Callable[[Any], Mapping[str, Callable[[Any], torch.Tensor]]] | None = None
    prepared_baselines: frozenset[str] = frozenset()
    """Baselines that do part of their work before the timed calls (SDPA over a paged cache
    gathered into a contiguous one once, ahead): what another data layout would cost, not a path
    a caller holding this op's inputs could take. Reported beside the others, never counted as
    the PyTorch path the op must not be slower than."""
    compare: Callable[[torch.Tensor, torch.Tensor], float] = relative_error
    restore_inputs: Callable[[Any], None] | None = None
    """For in-place kernels: put the inputs back as make_inputs left them."""
    park_ignored: Callable[[Config], Config] | None = None
    """For kernels with several paths: the config with the parameters its path ignores set to
    fixed parked values (a constraint then rejects any other value, so each path is measured
    once per setting that matters). complete_config applies it to the keys a user left out."""
    adapt: Callable[[Any, Any, Config], Config] | None = None
    """For the runtime's nearest rung: the config tuned for one problem (the first argument)
    carried over to another (the second) by a rule the kernel knows — paged decode scales its
    split count so that the grid keeps as many programs as the tuned one's, attention does not carry
    its long-prefill tile below the length its default takes it at. The runtime checks the
    result like any config, and uses the tuned config as it is where the rule raises, leaves the
    space, or breaks a constraint."""
    rollback_config: Mapping[str, ParamValue] | None = None
    """A partial config naming the fallback path (e.g. {"FUSION": "none"}) for kernels that choose
    between paths: export then records, per problem, the fallback's measured time and the
    winner's speedup over it, so a table shows which path won and by how much."""
    untuned_config: Callable[[Any, torch.dtype], Config] | None = None
    """What the runtime's default rung answers where no tuned shape or predictor does, where the
    kernel knows by measurement a better answer than its own default config (attention hands
    long span-free prefill to SDPA). None: the default config. The search still starts from
    default_config and reports speedups over it: this is the runtime's answer, not the kernel's
    baseline."""
    syncs_host: bool = False
    """The op reads a value back to the host inside its launched, timed call (kv_compress reads its
    kept lengths to size its output), so its timings include host work, and a host busy compiling
    stretches them. The search re-times such an op's finalists on a quiet host: its own compile
    workers finished, the next problem's compiles not begun (omnitune.search.driver)."""
    interpret_refusal: Callable[[Config], str | None] | None = None
    """Why a config cannot run under Triton's CPU interpreter (one line), or None: a config whose
    kernel is not @triton.jit code (attention's Gluon kernel). `omnitune verify --interpret` reports
    such an entry as not checkable there instead of failing it. None: every config runs there."""
    extra_source_modules: tuple[str, ...] = ()
    """Dotted names of other modules whose code the kernel runs and its module must not import
    (attention's Gluon kernel, whose module imports Gluon, and the facts it is written for): the
    source hash covers their code too, read from their files (omnitune.source_hash), so that an
    edit to them marks the kernel's tables as tuned on other code."""
    runs_extra_sources: Callable[[Config], bool] | None = None
    """Which configs run the extra_source_modules' code (attention: BACKEND=gluon_pingpong); None:
    every config. A table (or entry) none of whose configs runs it is good for the kernel's own
    code alone, and source_matches accepts the hash without the extra modules for it: an edit to
    the Gluon kernel stales the tables that hold Gluon configs, not the Triton-only ones, nor
    those exported before the spec named the modules."""
    module: str = ""

    # --- config space -----------------------------------------------------------------------

    def untuned_answer(self, problem: Any, dtype: torch.dtype) -> Config:
        """The config the runtime answers for a problem nothing tuned answers: untuned_config's,
        else the default config."""
        return (self.untuned_config or self.default_config)(problem, dtype)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ConfigError(
            f"{self.name} has no parameter {name!r}; its parameters are "
            + ", ".join(p.name for p in self.params)
        )

    def space_size(self) -> int:
        return math.prod(len(p.choices) for p in self.params)

    def all_configs(self) -> Iterator[Config]:
        names = [p.name for p in self.params]
        for values in itertools.product(*(p.choices for p in self.params)):
            yield Config(dict(zip(names, values)))

    def violations(
        self, problem: Any, config: Config, dtype: torch.dtype, limits: DeviceLimits | None = None
    ) -> list[tuple[str, str]]:
        """(constraint name, reason) for every constraint the config breaks; [] if it is valid."""
        limits = limits or DeviceLimits()
        found = []
        for c in self.constraints:
            reason = c.check(problem, config, dtype, limits)
            if reason:
                found.append((c.name, reason))
        return found

    def require_valid(
        self, problem: Any, config: Config, dtype: torch.dtype, limits: DeviceLimits | None = None
    ) -> None:
        """ConfigError naming the first constraint a user-given config breaks for this problem."""
        broken = self.violations(problem, config, dtype, limits)
        if broken:
            name, reason = broken[0]
            raise ConfigError(f"config {config.label()} breaks constraint {name}: {reason}")

    def valid_configs(
        self, problem: Any, dtype: torch.dtype, limits: DeviceLimits | None = None
    ) -> list[Config]:
        return [c for c in self.all_configs() if not self.violations(problem, c, dtype, limits)]

    def coerce_config(self, values: Mapping[str, Any], *, partial_ok: bool = False, strict: bool = False) -> Config:
        """Validate a config read from JSON or a user: every key a known parameter, every value
        one of its choices; missing keys an error unless partial_ok. strict: values exactly as
        export writes them (see Param.coerce), for configs read from tuned tables."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"a {self.name} config must be a JSON object, got {type(values).__name__}")
        names = {p.name for p in self.params}
        unknown = sorted(set(values) - names, key=str)
        if unknown:
            raise ConfigError(
                f"{self.name} has no parameter {describe(unknown[0])}; its parameters are {', '.join(sorted(names))}"
            )
        filled = {p.name: p.missing for p in self.params if p.name not in values and p.missing is not None}
        missing = sorted(names - set(values) - set(filled))
        if missing and not partial_ok:
            raise ConfigError(f"{self.name} config lacks {', '.join(missing)}")
        coerced = {k: self.param(k).coerce(v, strict=strict) for k, v in values.items()}
        return Config(coerced if partial_ok else {**filled, **coerced})

    def known_good_configs(
        self, problem: Any, dtype: torch.dtype, limits: DeviceLimits | None = None
    ) -> list[Config]:
        """The known-good configs valid for this problem, in order, without duplicates."""
        found: list[Config] = []
        for values in self.known_good:
            cfg = self.complete_config(values, problem, dtype)
            if cfg not in found and not self.violations(problem, cfg, dtype, limits):
                found.append(cfg)
        return found

    def complete_config(self, values: Mapping[str, Any], problem: Any, dtype: torch.dtype) -> Config:
        """A user's partial config laid over the default for this problem; with park_ignored,
        the parameters the chosen path ignores (and the user did not give) take their parked
        values, so that {"FUSION": "none"} names the one unfused config."""
        partial = self.coerce_config(values, partial_ok=True)
        cfg = Config(self.default_config(problem, dtype).as_dict(), **partial.as_dict())
        if self.park_ignored is not None:
            cfg = Config(self.park_ignored(cfg).as_dict(), **partial.as_dict())
        return cfg

    def resolve_config(self, config: Config | Mapping[str, Any], problem: Any, dtype: torch.dtype, *,
                       check_given: CheckGiven = "no") -> Config:
        """A caller's config for one problem, the one rule every public function follows.

        A Config is taken as given: it is what the search and the tests launch, values outside
        the space included. check_given="all" (the layer, which picks a path from the config) coerces
        it against the space and checks it against the constraints as well; check_given="sizes"
        (the public ops) only that each parameter whose choices are counts (tile sizes, splits,
        warps, stages) is a positive integer — NUM_SPLITS=0 launched nothing and returned
        uninitialised memory, BLOCK_M=0 divided by zero — while other values outside the space
        and configs past a constraint still run as given. A mapping (a user's
        JSON) is laid over the default (complete_config), each value checked against the space
        and the result against the constraints. ConfigError names what is wrong."""
        if isinstance(config, Config):
            if check_given == "no":
                return config
            if check_given == "sizes":
                return self._require_positive_sizes(config)
            if check_given != "all":
                raise ValueError(f"check_given must be 'no', 'sizes' or 'all', got {check_given!r}")
            cfg = self.coerce_config(config.as_dict())
        elif isinstance(config, Mapping):
            cfg = self.complete_config(config, problem, dtype)
        else:
            raise ConfigError(f"config must be a Config or a mapping, got {type(config).__name__}")
        self.require_valid(problem, cfg, dtype)
        return cfg

    def _require_positive_sizes(self, config: Config) -> Config:
        for param in self.params:
            counts = all(type(c) is int for c in param.choices)
            value = config.get(param.name)
            if counts and value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"{param.name}={value!r}: {self.name}'s {param.name} is a count, a positive "
                                  f"integer ({', '.join(map(str, param.choices))} are tuned)")
        return config

    # --- problems ---------------------------------------------------------------------------

    def problem_fields(self) -> list[dataclasses.Field]:
        return list(dataclasses.fields(self.problem_type))

    def problem_from_mapping(self, values: Mapping[str, Any]) -> Any:
        """Build a problem from field values (strings allowed), expanding aliases."""
        fields = {f.name: f for f in self.problem_fields()}
        kwargs: dict[str, Any] = {}
        given_by: dict[str, str] = {}  # field -> the key that set it
        for key, raw in values.items():
            targets = self.aliases.get(key, (key,))
            for name in targets:
                if name not in fields:
                    valid = sorted(set(fields) | set(self.aliases))
                    raise ShapeError(
                        f"{self.name} problems have no dimension {describe(key)}; use {', '.join(valid)}"
                    )
                # An alias and its field (heads=4,h=8; l=33,lq=20) would otherwise let the
                # later one win silently: which one the user meant is theirs to say.
                if name in given_by:
                    raise ShapeError(f"{given_by[name]} and {key} both give {name}")
                given_by[name] = key
                kwargs[name] = _coerce_field(fields[name], raw, key)
        missing = [
            n for n, f in fields.items()
            if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ShapeError(f"{self.name} shape lacks {', '.join(missing)}")
        try:
            return self.problem_type(**kwargs)
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise ShapeError(f"impossible {self.name} shape: {exc}") from None

    def canonical_problem(self, problem: Any) -> Any:
        """An instance of problem_type rebuilt from its own fields through problem_from_mapping's
        strict parsing: numpy integers become ints, 0/1 flags bools, and a value no table or
        tensor could hold (inf, 2**40, a string where a dimension belongs) is a ShapeError."""
        return self.problem_from_mapping({f.name: getattr(problem, f.name) for f in self.problem_fields()})

    def parse_shape(self, text: str) -> Any:
        """Parse a shape spec such as 'b=8,h=28,hkv=4,lq=128,lk=1152,d=128'."""
        values: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise ShapeError(f"bad shape {describe(text)}: expected name=value pairs separated by commas")
            k, v = (s.strip() for s in part.split("=", 1))
            # A dict would keep the last of t=1024,...,t=4 silently and answer for a problem
            # the user did not mean. (A repeated unknown name is left to problem_from_mapping,
            # whose message lists the valid ones.)
            if k in values and self._is_dimension_name(k):
                raise ShapeError(f"{k} given twice in the shape")
            values[k] = v
        if not values:
            raise ShapeError("empty shape; give name=value pairs, e.g. " + self.problem_key(self.example_problem))
        return self.problem_from_mapping(values)

    def _is_dimension_name(self, key: str) -> bool:
        """Whether `key` names a field of the problem or an alias of some."""
        return key in self.aliases or any(f.name == key for f in self.problem_fields())

    def problem_key(self, problem: Any) -> str:
        """The canonical key of a problem; also a valid --shape spec. A field declared with
        `optional_field(default)` is left out while it holds its default, so that a field added
        to a problem type later leaves the keys of the tables exported before it unchanged."""
        return ",".join(
            f"{f.name}={_fmt(getattr(problem, f.name))}" for f in dataclasses.fields(problem)
            if not (f.metadata.get(OPTIONAL_IN_KEY) and getattr(problem, f.name) == f.default)
        )

    def problem_dict(self, problem: Any) -> dict[str, Any]:
        return dataclasses.asdict(problem)

    # --- provenance -------------------------------------------------------------------------

    def source_hash(self) -> str:
        """sha256 (first 16 hex digits) of the kernel's device code — its module's @triton.jit
        functions and the jit functions they call, and the code of its extra_source_modules
        (omnitune.source_hash): a tuned config is only as good as the code it was measured on,
        and only that code decides it."""
        mod = sys.modules.get(self.module)
        if mod is None:
            return "unknown"
        return kernel_source_hash(mod, self.extra_source_modules)

    def source_matches(self, recorded: str | None, configs: Iterable[Config] | None = None) -> str | None:
        """Which hash of the kernel's current source a table's `recorded` one is (SourceCheck.matches)."""
        return self.source_check().matches(recorded, configs)

    def source_check(self) -> SourceCheck:
        """Today's source hashes, each computed once (reading and parsing the kernel's source
        takes tens of ms): for a caller that asks of many entries."""
        return SourceCheck(self, self.source_hash())


@dataclass
class SourceCheck:
    """Whether recorded source hashes are today's, for one kernel: `today` is its source_hash;
    the hash of the kernel's own code alone, which a table (or entry) none of whose configs runs
    the extra modules' code may hold (KernelSpec.runs_extra_sources), is computed on first need."""

    spec: KernelSpec
    today: str
    _own_code: str | None = None
    _whole_module: str | None = None

    def matches(self, recorded: str | None, configs: Iterable[Config] | None = None) -> str | None:
        """Which hash of the kernel's current source `recorded` is: "jit" (today's: is_current),
        "module" (the whole-module hash of an older export, computed on first need), or None."""
        if self.is_current(recorded, configs):
            return "jit"
        if recorded in (None, "", UNKNOWN):
            return None
        if self._whole_module is None:
            module = sys.modules.get(self.spec.module)
            self._whole_module = UNKNOWN if module is None else module_source_hash(module)
        return "module" if recorded == self._whole_module else None

    def is_current(self, recorded: str | None, configs: Iterable[Config] | None = None) -> bool:
        """Whether `recorded` is today's hash of the code that `configs` — the configs it speaks
        for, a table's or one entry's — run: today's whole hash, or, where none of them runs the
        extra modules' code, the kernel's own code's. configs None: not known, the whole one only."""
        if recorded in (None, "", UNKNOWN):
            return False
        if recorded == self.today:
            return True
        spec = self.spec
        if (configs is None or not spec.extra_source_modules or spec.runs_extra_sources is None
                or any(spec.runs_extra_sources(c) for c in configs)):
            return False
        if self._own_code is None:
            module = sys.modules.get(spec.module)
            self._own_code = UNKNOWN if module is None else kernel_source_hash(module)
        return recorded == self._own_code


OPTIONAL_IN_KEY = "omnitune.optional_in_key"


def optional_field(default: Any) -> Any:
    """A problem field that problem keys name only when it differs from `default` (see
    KernelSpec.problem_key): for a dimension added after tables were exported, such as a KV
    cache's storage dtype."""
    return field(default=default, metadata={OPTIONAL_IN_KEY: True})


def field_kind(f: dataclasses.Field) -> str:
    """'bool', 'int', 'float', 'str' or 'other', from a problem dataclass field's annotation."""
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    for kind in ("bool", "int", "float", "str"):
        if kind in typ:
            return kind
    return "other"


def _coerce_field(f: dataclasses.Field, raw: Any, key: str) -> Any:
    # Strict (omnitune/coerce.py): "1e400", "Infinity", 10**400, b"16", "１６" and "1_0" are
    # a caller's mistakes to report, not numbers to guess at.
    kind = field_kind(f)
    parse = {"bool": as_bool, "int": as_int, "float": as_float, "str": as_str}.get(kind)
    if parse is None:
        return raw
    try:
        return parse(raw)
    except ValueError as exc:
        raise ShapeError(f"{key}={describe(raw)} is not a valid {kind}: {exc}") from None
