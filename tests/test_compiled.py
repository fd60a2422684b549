"""Compiled-kernel facts, from a recorded sample.

tests/data/compiled_metadata.json is the <name>.json that triton 3.6 wrote into its cache when it
compiled omnitune's attention kernel for sm_90 (BLOCK_M=128, BLOCK_N=64, D=128, bf16, causal,
num_warps=4, num_stages=3), with the two facts only a loaded binary reports added beside it,
taken from the cubin's resource usage: n_regs 255 and n_spills 304 (ptxas: 255 registers and a
1216-byte stack frame per thread; triton's n_spills is local bytes / 4).
"""

from __future__ import annotations

import json
import types
from collections import namedtuple
from pathlib import Path

import pytest

from omnitune.profile.compiled import CompileWatch, CompiledFacts, cached_kernels, compiled_facts, kernel_names

SAMPLE = Path(__file__).parent / "data" / "compiled_metadata.json"


@pytest.fixture
def recorded() -> dict:
    return json.loads(SAMPLE.read_text())


def _compiled_kernel_like(recorded: dict, loaded: bool = True):
    """An object shaped as triton's CompiledKernel: metadata is a namedtuple of the JSON's keys
    (sorted, as CompiledKernel builds it), n_regs / n_spills exist once the binary is loaded."""
    metadata = {k: v for k, v in recorded.items() if k not in ("n_regs", "n_spills")}
    KernelMetadata = namedtuple("KernelMetadata", sorted(metadata))
    kernel = types.SimpleNamespace(metadata=KernelMetadata(**metadata), name=metadata["name"])
    if loaded:
        kernel.n_regs, kernel.n_spills = recorded["n_regs"], recorded["n_spills"]
    return kernel


def test_facts_from_the_recorded_mapping(recorded):
    facts = compiled_facts(recorded)
    assert facts == CompiledFacts(
        kernel_name=recorded["name"],
        registers_per_thread=recorded["n_regs"],
        spill_words_per_thread=recorded["n_spills"],
        shared_memory_bytes=recorded["shared"],
        num_warps=recorded["num_warps"],
        num_stages=recorded["num_stages"],
    )
    assert facts.spills is True
    assert (facts.num_warps, facts.num_stages) == (4, 3)  # the config the sample was compiled with


def test_facts_from_a_compiled_kernel_object(recorded):
    assert compiled_facts(_compiled_kernel_like(recorded)) == compiled_facts(recorded)


def test_registers_are_unknown_until_the_binary_is_loaded(recorded):
    facts = compiled_facts(_compiled_kernel_like(recorded, loaded=False))
    assert facts.registers_per_thread is None and facts.spill_words_per_thread is None
    assert facts.spills is None
    assert facts.shared_memory_bytes == recorded["shared"]


def test_metadata_nested_under_its_own_key(recorded):
    nested = {"metadata": {k: v for k, v in recorded.items() if k not in ("n_regs", "n_spills")},
              "n_regs": 96, "n_spills": 0}
    facts = compiled_facts(nested)
    assert (facts.registers_per_thread, facts.spill_words_per_thread) == (96, 0)
    assert facts.spills is False
    assert facts.num_stages == recorded["num_stages"]


def test_missing_fields_are_none():
    facts = compiled_facts({"num_warps": 8, "shared": "not a number"})
    assert facts.num_warps == 8
    assert facts.shared_memory_bytes is None
    assert facts.kernel_name is None and facts.num_stages is None and facts.registers_per_thread is None
    assert compiled_facts(object()) == CompiledFacts(None, None, None, None, None, None)


def test_extra_keys_are_flat_and_named(recorded):
    extra = compiled_facts(recorded).as_extra()
    assert extra["compiled_registers_per_thread"] == recorded["n_regs"]
    assert extra["compiled_shared_memory_bytes"] == recorded["shared"]
    assert json.loads(json.dumps(extra)) == extra


def _fake_jit_module(name: str):
    """A module holding one fake JITFunction with triton 3.6's device_caches layout:
    device → (kernel_cache, kernel_key_cache, target, backend, binder)."""
    module = types.ModuleType(name)

    def _my_kernel():  # the Python function a @triton.jit wraps
        pass

    _my_kernel.__module__ = name
    jit_fn = types.SimpleNamespace(fn=_my_kernel, device_caches={0: ({}, {}, None, None, None)})
    module._my_kernel = jit_fn
    module.imported_helper = types.SimpleNamespace(fn=len, device_caches={})  # defined elsewhere
    return module, jit_fn


def test_compile_watch_finds_what_a_launch_compiled(recorded):
    module, jit_fn = _fake_jit_module("user_kernels")
    cache = jit_fn.device_caches[0][0]
    earlier = _compiled_kernel_like(recorded)
    cache["key-a"] = earlier
    with CompileWatch(module) as watch:
        fresh = _compiled_kernel_like(recorded)
        cache["key-b"] = fresh  # what a launch of a new config does
    assert watch.new_kernels() == [fresh]
    assert cached_kernels(jit_fn) == [earlier, fresh]
    assert kernel_names(module) == ["_my_kernel"]


def test_kernel_names_of_a_real_kernel_module():
    from omnitune.kernels import attention

    assert kernel_names(attention) == ["_attention_fwd"]


@pytest.mark.gpu
def test_facts_of_a_real_launch():
    import torch

    from omnitune.kernels import attention

    spec = attention.SPEC
    problem = spec.parse_shape("b=1,h=2,hkv=2,lq=64,lk=64,d=64")
    inputs = spec.make_inputs(problem, torch.float16, "cuda", 0)
    out = spec.new_output(inputs)
    config = spec.default_config(problem, torch.float16)
    spec.launch(inputs, out, config)
    torch.cuda.synchronize()
    facts = [compiled_facts(k) for k in cached_kernels(attention._attention_fwd)]
    launched = [f for f in facts if f.num_warps == config["num_warps"] and f.num_stages == config["num_stages"]]
    assert launched, "the launched specialization is not in the JIT cache"
    assert all(f.registers_per_thread and f.registers_per_thread > 0 for f in launched)
    assert all(f.kernel_name == "_attention_fwd" for f in launched)
