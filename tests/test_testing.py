"""omnitune.testing catches what it is there to catch: each rule fails, naming the rule, on a spec
that breaks it (a built-in spec with one thing changed)."""

from __future__ import annotations

import dataclasses

import pytest

from omnitune import testing
from omnitune.kernels import kv_cache_write
from omnitune.errors import ConfigError
from omnitune.spec import Constraint, MatchPolicy

from conftest import DEVICE

GOOD = kv_cache_write.SPEC
DTYPE = testing.runnable_dtypes(GOOD, DEVICE)[0]


def broken(**changes):
    return dataclasses.replace(GOOD, **changes)


def test_the_unchanged_spec_passes():
    testing.check_spec(GOOD, DEVICE, spread=1)


@pytest.mark.parametrize(
    "rule, changes, message",
    [
        (testing.check_identity, {"module": ""}, "set module=__name__"),
        (testing.check_identity, {"name": "my.kernel"}, "would read as a module or a file"),
        (testing.check_match_policy, {"match": MatchPolicy(exact=("heads",))}, "MatchPolicy.exact names 'heads'"),
        (testing.check_match_policy, {"aliases": {"tokens": ("tokens",)}}, "alias 'tokens' names 'tokens'"),
        (testing.check_constraints_fire,
         {"constraints": GOOD.constraints + (Constraint("never", lambda *a: None),)},
         r"constraints \['never'\] reject no config"),
        (testing.check_default_configs,
         {"default_config": lambda problem, dtype: kv_cache_write.Config(BLOCK_T=64, BLOCK_H=16, num_warps=1)},
         "is rejected"),
        (testing.check_partial_configs, {"known_good": ({"BLOCK_T": 3},)}, "BLOCK_T=3 is not a valid choice"),
    ],
    ids=["no-module", "dotted-name", "match-field", "alias-field", "dead-constraint", "bad-default", "bad-known-good"],
)
def test_a_static_rule_names_what_is_broken(rule, changes, message):
    rule(GOOD)
    with pytest.raises((AssertionError, ConfigError), match=message):
        rule(broken(**changes))


def test_inputs_that_ignore_the_seed_fail():
    def seed_ignored(problem, dtype, device, seed):
        return kv_cache_write.make_inputs(problem, dtype, device, 0)

    same = broken(make_inputs=seed_ignored)
    with pytest.raises(AssertionError, match="ignores the seed"):
        testing.check_inputs(same, DEVICE, DTYPE)


def test_an_output_that_passes_unwritten_fails():
    answered = broken(new_output=kv_cache_write.reference)
    with pytest.raises(AssertionError, match="never written passes the check"):
        testing.check_unwritten_output_fails(answered, DEVICE, DTYPE)


def test_a_kernel_that_disagrees_with_its_reference_fails():
    def half_written(inputs, out, config):
        kv_cache_write.launch(inputs, out, config)
        out[1] = 0.0  # the value cache lost

    with pytest.raises(AssertionError, match=r"BLOCK_T=\d+ num_warps=\d+: error [0-9.]+ > tolerance 0.0"):
        testing.check_default_matches_reference(broken(launch=half_written), DEVICE, [DTYPE])


def test_spread_configs_are_valid_distinct_and_not_the_default():
    problem = GOOD.example_problem
    default = GOOD.default_config(problem, DTYPE)
    picked = testing.spread_configs(GOOD, problem, DTYPE, most=3)
    valid = GOOD.valid_configs(problem, DTYPE)
    assert len(picked) == 3 == len(set(picked)) and default not in picked
    assert set(picked) <= set(valid) and picked[0] == next(c for c in valid if c != default)
