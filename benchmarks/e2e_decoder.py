"""End to end: a decoder stack with Qwen2.5-Omni-7B's thinker dimensions — a multimodal prefill into
a paged KV cache, then decode steps as CUDA-graph replays — with omnitune's ops against
PyTorch-native ones, everything else identical.

The model (benchmarks/e2e_model.py): hidden 3584, 28 query heads over 4 kv heads of 128, SwiGLU
MLP of 18944, RMSNorm, plain 1-D RoPE, `--layers` layers (default 4) of random bf16 weights. The
prompt: text, two 448×448 images (256 tokens each after the 2×2 merge), 10 s of audio (25 tokens
per second: 250), text again — 896 tokens, each image a bidirectional span, the rest causal —
replicated `--batch` times. Pages of `--block-size` tokens (16), scattered through the cache.
Then `--steps` (64) teacher-forced decode steps (each step's input embedding drawn beforehand).

Implementations (the attention and KV-cache parts only; see e2e_model.py):
  omnitune: attention(..., causal=True, mm_spans=spans) at prefill, write_kv_cache for every
            cache write, PagedDecodePlan.run at decode;
  pytorch:  SDPA with a dense boolean mask at prefill (SDPA picks its backend; the dense mask
            rules out flash; the one it picked is recorded), index_copy_ for the writes, SDPA
            over the pages gathered through the block table into a static maximum-length
            buffer with a padding mask at decode.

What is measured, in one process, the implementations interleaved round-robin (so that clock
drift cannot pass for a difference), the L2 flushed before every timed call and a GPU spin
keeping the host's launch time out of the events (omnitune.profile.timing; the runs and
their loops: benchmarks/e2e_runs.py):
  - prefill ms: the whole prefill forward, eager (as engines run prefill), CUDA events, median
    of `--prefill-reps` after warm-up; tokens/s = batch · prompt / time. The events time the
    device's work; "host included" is the wall-clock time of a call from a synchronised start,
    launch overhead and all (an eager forward whose host is slower than its GPU shows it there);
  - decode ms per token: one CUDA graph per implementation holding a whole decode step (every
    layer), captured once and replayed for each of the steps with new positions, slots and
    context lengths (static device tensors refreshed with copy_ before each replay, outside the
    timed window); median over steps × `--decode-reps`; tokens/s = batch / time;
  - the share of attention and the KV cache: the same settings (eager prefill; a graph of a
    whole step at decode) run with only the attention and cache parts of every layer — the
    per-forward metadata they need (the dense mask, the page gather list), the cache writes and
    attention — on the q, k, v the real run produced (recorded layer by layer), against caches
    of their own; share = that time / the full time. The rest (projections, norms, RoPE, MLP) is
    the same code in both.
  - correctness: the two implementations' prefill outputs and decode hidden states (final norm,
    every step) compared with each other, and both against a reference — PyTorch SDPA over the
    prompt and the teacher-forced decode inputs as one sequence (dense mask, no cache), which
    checks the cache, the positions and the replays too; the worst token's relative error
    ‖a_t − b_t‖ / ‖b_t‖ must stay within TOLERANCE (bf16 5e-2, fp32 1e-4; see there why). Layer 0's caches must be bitwise equal (same inputs, so the writes must agree).

    PYTHONPATH=$PWD python benchmarks/e2e_decoder.py --batch 1 8
    PYTHONPATH=$PWD python benchmarks/e2e_decoder.py --tiny          # CPU, Triton's interpreter

Writes benchmarks/results/e2e_decoder_<device>.json (--out to override). Budget (estimated): 2 GB
of random weights drawn on the GPU, three kernels to compile, and a few seconds of timed work
per batch size — about a minute on one H200 for batches 1 and 8.
--tiny: a 2-layer model with 64-wide hidden states, a 27-token prompt with one 12-token image
span, 3 decode steps, fp32, no CUDA graphs, nothing timed: both implementations run and must
agree (tests/test_e2e_decoder.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # e2e_model and e2e_runs, when imported from elsewhere
from e2e_model import (  # noqa: E402
    IMPLEMENTATIONS, Decoder, Dims, PagedCache, Prompt, Tap, TorchNative, multimodal_prompt, qwen_omni_7b_dims,
)
from e2e_runs import (  # noqa: E402
    Case, DecodeRunner, make_case, max_rel, prefill, prefill_attention_only, time_decode, wall_ms,
)

# The largest relative error of any token's hidden state, ‖a_t − b_t‖ / ‖b_t‖, allowed between the
# implementations. bf16: two attentions that both accumulate accurately still round some outputs
# an ulp apart, and the stack amplifies that. On this model's prefill (CPU, PyTorch only), an
# fp32 softmax against an fp64 one, or the keys summed in another order, differ on the worst
# token by 2.6e-3 at 1 layer, 9.5e-3 at 4 and 1.6e-2 at 8 (about √depth from there on: 5e-2
# leaves room at 28). Gross
# mistakes (a span lost, stale positions, a cache write misplaced) give 1e-1 and more; subtle
# ones (one key of ~900 missed) hide under bf16 noise, which is what the fp32 --tiny check is
# for: there the sums differ only in order.
TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 2e-2, torch.float32: 1e-4}

# Issue 13's goal for this benchmark: ≥ 1.2x on the multimodal prefill (the design behind the
# project promises 20–40 % end to end). Reported against, never assumed.
PREFILL_SPEEDUP_GOAL = 1.2

# How each figure was obtained, written into the JSON beside the figures.
METHOD = {
    "model": "random weights (1/sqrt(fan_in), Q/K x sqrt(2)); RMSNorm, qkv bias, plain 1-D RoPE on token positions "
             "(not TMRoPE), SwiGLU MLP, final norm; no embedding table or LM head: random input embeddings, "
             "teacher-forced decode (each step's input drawn beforehand)",
    "omnitune": "attention(causal=True, mm_spans=int32 [B,S,2] device tensor) at prefill; write_kv_cache for every "
                "cache write; one PagedDecodePlan per batch (shared by the layers), .run at decode",
    "pytorch": "prefill: K/V repeated to the query heads, SDPA with a dense bool mask [B,1,L,L] built once per forward "
               "(enable_gqa with a mask would fall back to math; a dense mask rules out flash); writes: index_copy_ "
               "into the caches flattened to [slots,Hkv,D]; decode: whole pages gathered through the block table "
               "(index_select) into a [B, max_blocks*block_size, Hkv, D] buffer each step (static length, so "
               "capturable), padding masked, SDPA with the GQA group folded into the query rows",
    "prefill_ms": "eager forward, CUDA events (device work only: a GPU spin before the start event keeps host "
                  "launch time out), L2 flushed before each, interleaved round-robin, median",
    "prefill_wall_ms": "host wall clock of one eager forward from a synchronised start to its end, launch time included",
    "decode_ms_per_token": "one CUDA graph per implementation holding a whole step (all layers), replayed for each "
                           "step with positions/slots/context lengths copied into static device tensors first "
                           "(outside the timed window); L2 flushed before each replay; median over steps x reps",
    "attention_kv": "the same setting run with only the attention and KV-cache parts (per-forward metadata, cache "
                    "writes, attention) of every layer, on the q/k/v the real run recorded, against caches of their "
                    "own; share = that time / the full time",
    "request_ms": "prefill_ms + the sum over steps of each step's median",
    "max_rel_err": "worst token's ||a_t - b_t|| / ||b_t|| of the final-norm hidden states; reference = PyTorch SDPA over "
                   "prompt + decode inputs as one sequence, no cache",
}

# --tiny: small enough for the interpreter; head dim 64 is the attention kernel's smallest, and
# GQA (2 query heads per kv head), paging (pages of 8, several per sequence), a span and audio stay.
TINY_DIMS = Dims(hidden=64, heads=4, kv_heads=2, head_dim=64, intermediate=128, layers=2)
TINY_PROMPT = Prompt((("text", 5), ("image", 12), ("text", 3), ("audio", 4), ("text", 3)))


def run_case(model: Decoder, impls: dict, case: Case, *, graphs: bool, timed: bool,
             prefill_reps: int = 20, decode_reps: int = 5) -> dict:
    """Both implementations on one case: outputs compared; timed when `timed` (needs CUDA)."""
    names = list(impls)  # omnitune first, then pytorch
    dims, dev, dtype = model.dims, model.device, model.dtype
    caches, attn_caches, prefill_taps, prefill_out = {}, {}, {}, {}
    for name in names:
        caches[name] = PagedCache.allocate(dims, case.batch, case.max_context, case.block_size, dtype, dev)
        prefill_taps[name] = Tap()
        prefill_out[name] = prefill(model, impls[name], case, caches[name], prefill_taps[name])
        attn_caches[name] = caches[name].clone()

    # The reference: one forward over the prompt and the decode inputs together, no cache reads.
    ref_case = Case(batch=case.batch, prompt=Prompt(case.prompt.segments + (("text", case.steps),)),
                    steps=0, block_size=case.block_size,
                    x=torch.cat([case.x, case.decode_inputs[:, :, 0].transpose(0, 1)], dim=1),
                    decode_inputs=case.decode_inputs[:0], spans=case.spans,
                    positions=torch.arange(case.max_context, device=dev).expand(case.batch, -1))
    ref_cache = PagedCache.allocate(dims, case.batch, case.max_context, case.block_size, dtype, dev)
    reference = prefill(model, TorchNative(dims), ref_case, ref_cache)

    # Decode runners: the whole step, and the attention/cache parts alone on a step's q, k, v.
    full, attn_only = {}, {}
    for name in names:
        # Planned once per batch composition (both caches share the layout and block tables).
        impls[name].plan_decode(caches[name], case.batch, dtype, dev)
        full[name] = DecodeRunner(model, impls[name], caches[name], case)
        attn_only[name] = DecodeRunner(model, impls[name], attn_caches[name], case)
        attn_only[name].record_tap()
        if graphs:
            full[name].capture()
            attn_only[name].capture()

    decode_out = {name: [] for name in names}
    result: dict = {"batch": case.batch, "prompt_tokens": case.prompt.length, "steps": case.steps}
    if timed:
        fns = [lambda n=n: prefill(model, impls[n], case, caches[n]) for n in names]
        fns += [lambda n=n: prefill_attention_only(impls[n], case, attn_caches[n], prefill_taps[n]) for n in names]
        from omnitune.profile.timing import summarize, time_interleaved

        pre = [summarize(s) for s in time_interleaved(fns, rounds=prefill_reps, warmup=2, max_seconds=10.0)]
        wall = [summarize(s) for s in wall_ms(fns[:len(names)], prefill_reps)]
        runners = [full[n] for n in names] + [attn_only[n] for n in names]
        samples = time_decode(runners, case.steps, decode_reps, [decode_out[n] for n in names] + [None] * len(names))
        dec = [summarize(s) for s in samples]
        k = len(names)
        for j, name in enumerate(names):
            per_step = [summarize(samples[j][i::case.steps]).median_ms for i in range(case.steps)]
            result[name] = {
                "prefill_ms": pre[j].median_ms, "prefill_p20_ms": pre[j].p20_ms, "prefill_p80_ms": pre[j].p80_ms,
                "prefill_tokens_per_s": 1e3 * case.batch * case.prompt.length / pre[j].median_ms,
                "prefill_wall_ms": wall[j].median_ms,
                "prefill_attention_kv_ms": pre[k + j].median_ms,
                "prefill_attention_kv_share": pre[k + j].median_ms / pre[j].median_ms,
                "prefill_rest_ms": pre[j].median_ms - pre[k + j].median_ms,
                "decode_ms_per_token": dec[j].median_ms, "decode_p20_ms": dec[j].p20_ms, "decode_p80_ms": dec[j].p80_ms,
                "decode_tokens_per_s": 1e3 * case.batch / dec[j].median_ms,
                "decode_attention_kv_ms": dec[k + j].median_ms,
                "decode_attention_kv_share": dec[k + j].median_ms / dec[j].median_ms,
                "decode_rest_ms": dec[j].median_ms - dec[k + j].median_ms,
                "decode_step_ms_by_step": per_step,
                "request_ms": pre[j].median_ms + sum(per_step),
                "repetitions": {"prefill": pre[j].repetitions, "decode": dec[j].repetitions},
            }
        ours, theirs = result[names[0]], result[names[1]]
        result["speedup"] = {  # pytorch's time over omnitune's: > 1 means omnitune is faster
            key: theirs[f"{key}_ms" if key != "decode" else "decode_ms_per_token"]
            / ours[f"{key}_ms" if key != "decode" else "decode_ms_per_token"]
            for key in ("prefill", "prefill_wall", "prefill_attention_kv", "decode", "decode_attention_kv", "request")
        }
        result["prefill_goal_met"] = result["speedup"]["prefill"] >= PREFILL_SPEEDUP_GOAL
    else:
        for name in names:
            for i in range(case.steps):
                decode_out[name].append(full[name].run(i).clone())
            attn_only[name].run(0)  # the attention-only paths run too, untimed
            prefill_attention_only(impls[name], case, attn_caches[name], prefill_taps[name])

    # Correctness.
    length = case.prompt.length
    dec_out = {n: torch.stack(decode_out[n])[:, :, 0].transpose(0, 1) for n in names}  # [B, steps, hidden]
    ref_prefill, ref_decode = reference[:, :length], reference[:, length:]
    a, b = names
    errors = {
        f"prefill_{a}_vs_{b}": max_rel(prefill_out[a], prefill_out[b]),
        f"decode_{a}_vs_{b}": max_rel(dec_out[a], dec_out[b]),
        **{f"prefill_{n}_vs_reference": max_rel(prefill_out[n], ref_prefill) for n in names},
        **{f"decode_{n}_vs_reference": max_rel(dec_out[n], ref_decode) for n in names},
    }
    tol = TOLERANCE[dtype]
    layer0_equal = all(torch.equal(getattr(caches[a], part)[0], getattr(caches[b], part)[0]) for part in ("keys", "values"))
    result["correctness"] = {
        "max_rel_err": errors, "tolerance": tol, "layer0_caches_bitwise_equal": layer0_equal,
        "agree": layer0_equal and all(e <= tol for e in errors.values()),
    }
    result["sdpa_backends"] = next(impl.backends for impl in impls.values() if isinstance(impl, TorchNative))
    plan = getattr(impls[names[0]], "plan", None)
    result["omnitune_paged_decode_config"] = plan.config.as_dict() if plan is not None else None
    return result


def _device_slug() -> str:
    from omnitune.profile.device import device_key

    name = device_key(torch.cuda.get_device_name()).lower()
    return name.removeprefix("nvidia_") or "gpu"


def _print_case(r: dict) -> None:
    c = r["correctness"]
    print(f"\n== batch {r['batch']}: {r['prompt_tokens']}-token prompt, {r['steps']} decode steps")
    if "speedup" in r:
        o, p, s = r["omnitune"], r["pytorch"], r["speedup"]
        rows = [
            ("prefill ms (eager)", "prefill_ms", "prefill", "{:.3f}"),
            ("  attention + KV ms", "prefill_attention_kv_ms", "prefill_attention_kv", "{:.3f}"),
            ("  attention + KV share", "prefill_attention_kv_share", None, "{:.1%}"),
            ("prefill tokens/s", "prefill_tokens_per_s", None, "{:,.0f}"),
            ("prefill ms, host included", "prefill_wall_ms", "prefill_wall", "{:.3f}"),
            ("decode ms/token (graph)", "decode_ms_per_token", "decode", "{:.4f}"),
            ("  attention + KV ms", "decode_attention_kv_ms", "decode_attention_kv", "{:.4f}"),
            ("  attention + KV share", "decode_attention_kv_share", None, "{:.1%}"),
            ("decode tokens/s", "decode_tokens_per_s", None, "{:,.0f}"),
            (f"prompt + {r['steps']} tokens ms", "request_ms", "request", "{:.2f}"),
        ]
        print(f"   {'':28s} {'omnitune':>12s} {'pytorch':>12s} {'speedup':>8s}")
        for label, key, sp, fmt in rows:
            print(f"   {label:28s} {fmt.format(o[key]):>12s} {fmt.format(p[key]):>12s} "
                  + (f"{s[sp]:7.2f}x" if sp else ""))
        print(f"   SDPA backends: {r['sdpa_backends']}; prefill goal ≥ {PREFILL_SPEEDUP_GOAL}x: "
              + ("met" if r["prefill_goal_met"] else "NOT met"))
    errs = ", ".join(f"{k} {v:.1e}" for k, v in c["max_rel_err"].items())
    print(f"   max rel err: {errs}; tolerance {c['tolerance']:.0e}; layer-0 caches bitwise equal: "
          f"{c['layer0_caches_bitwise_equal']} → {'agree' if c['agree'] else 'DISAGREE'}")


def run_tiny(batch: int = 2, steps: int = 3, block_size: int = 8, seed: int = 0) -> dict:
    """The CPU mode: both implementations on a tiny model, fp32, eager, nothing timed. On a
    machine without CUDA, TRITON_INTERPRET=1 must be set before the kernels are first imported
    (main() sets it)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Decoder(TINY_DIMS, torch.float32, device, seed=seed, max_positions=256)
    impls = {"omnitune": IMPLEMENTATIONS["omnitune"](TINY_DIMS, check=True), "pytorch": TorchNative(TINY_DIMS)}
    case = make_case(model, TINY_PROMPT, batch, steps, block_size, seed + 1)
    return run_case(model, impls, case, graphs=False, timed=False)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes, each a case (the prompt replicated)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--text-tokens", type=int, default=128, help="text tokens besides the media's marker tokens")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--image-px", type=int, default=448)
    parser.add_argument("--audio-s", type=float, default=10.0)
    parser.add_argument("--prefill-reps", type=int, default=20)
    parser.add_argument("--decode-reps", type=int, default=5, help="times the whole decode schedule is replayed")
    parser.add_argument("--no-graphs", action="store_true", help="decode steps eager instead of CUDA-graph replays")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON file (default benchmarks/results/e2e_decoder_<device>.json)")
    parser.add_argument("--tiny", action="store_true", help="CPU check: a tiny model, both implementations, not timed")
    args = parser.parse_args(argv)
    command = "python benchmarks/e2e_decoder.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    from omnitune.profile.device import current_device_facts, software_versions

    if args.tiny:
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        result = run_tiny(seed=args.seed)
        _print_case(result)
        payload = {"mode": "tiny", "command": command, "dims": asdict(TINY_DIMS), "dtype": "fp32", "method": METHOD,
                   "software": software_versions(), "cases": [result], "wall_s": time.perf_counter() - started}
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
        if not result["correctness"]["agree"]:
            raise SystemExit("the implementations disagree")
        return payload

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --tiny for the CPU check)")
    dims, dtype = qwen_omni_7b_dims(args.layers), torch.bfloat16
    prompt = multimodal_prompt(args.text_tokens, args.images, args.image_px, args.audio_s)
    model = Decoder(dims, dtype, "cuda", seed=args.seed)
    impls = {"omnitune": IMPLEMENTATIONS["omnitune"](dims, check=False), "pytorch": TorchNative(dims)}
    out = args.out or Path(__file__).resolve().parent / "results" / f"e2e_decoder_{_device_slug()}.json"
    facts = current_device_facts()
    print(f"{facts.name}, torch {torch.__version__}, {dims.layers} layers of hidden {dims.hidden}, "
          f"{dims.heads}/{dims.kv_heads} heads × {dims.head_dim}, MLP {dims.intermediate}, bf16")
    print(f"prompt {prompt.length} tokens: {prompt.tokens('text')} text, {prompt.tokens('image')} image in "
          f"{args.images} bidirectional spans {prompt.spans()}, {prompt.tokens('audio')} audio; "
          f"block size {args.block_size}; {args.steps} decode steps")
    payload = {
        "mode": "gpu", "command": command, "device": facts.as_dict(), "software": software_versions(),
        "dims": asdict(dims), "dtype": "bf16", "block_size": args.block_size, "steps": args.steps,
        "prompt": {"segments": [list(s) for s in prompt.segments], "tokens": prompt.length,
                   "text_tokens": prompt.tokens("text"), "image_tokens": prompt.tokens("image"),
                   "audio_tokens": prompt.tokens("audio"), "image_spans": prompt.spans(),
                   "images": args.images, "image_px": args.image_px, "audio_s": args.audio_s},
        "cuda_graphs": not args.no_graphs, "prefill_reps": args.prefill_reps, "decode_reps": args.decode_reps,
        "speedup_is": "pytorch time / omnitune time (> 1: omnitune faster)",
        "prefill_speedup_goal": PREFILL_SPEEDUP_GOAL, "method": METHOD,
        "cases": [],
    }
    for batch in args.batch:
        t0 = time.perf_counter()
        case = make_case(model, prompt, batch, args.steps, args.block_size, args.seed + 1)
        result = run_case(model, impls, case, graphs=not args.no_graphs, timed=True,
                          prefill_reps=args.prefill_reps, decode_reps=args.decode_reps)
        result["wall_s"] = time.perf_counter() - t0
        payload["cases"].append(result)
        _print_case(result)
        payload["wall_s"] = time.perf_counter() - started
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
        del case
        torch.cuda.empty_cache()
    print(f"\nwrote {out} in {time.perf_counter() - started:.0f} s")
    if not all(c["correctness"]["agree"] for c in payload["cases"]):
        raise SystemExit("the implementations disagree (see correctness in the JSON)")
    return payload


if __name__ == "__main__":
    main()
