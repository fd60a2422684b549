"""Which fused-output-projection (FUSION=q_out) configs of cross_attention_layer match the reference
on the GPU, and which do not: relative error per config, pipelining depth and warps varied, twice
per config (a race shows as errors that change between launches).

    python benchmarks/q_out_diagnosis.py --out q_out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from omnitune.kernels.cross_attention_layer import SPEC, CrossAttentionLayerProblem, fused_config

SHAPES = {"b1_lq1_lk4k": (1, 1, 4096), "b1_lq16_lk4k": (1, 16, 4096), "b2_lq64_lk1k": (2, 64, 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for name, (b, lq, lk) in SHAPES.items():
        problem = CrossAttentionLayerProblem(b=b, lq=lq, lk=lk, hidden=3584, h=28, hkv=4, d=128)
        inputs = SPEC.make_inputs(problem, torch.bfloat16, "cuda", 0)
        ref = SPEC.reference(inputs)
        base = fused_config(problem, torch.bfloat16, "q_out")
        for stages, warps in ((1, 4), (2, 4), (3, 4), (1, 8)):
            cfg = base.replace(num_stages=stages, num_warps=warps)
            if SPEC.violations(problem, cfg, torch.bfloat16):
                continue
            errors = []
            for _ in range(2):
                out = SPEC.new_output(inputs)
                SPEC.launch(inputs, out, cfg)
                torch.cuda.synchronize()
                errors.append(SPEC.compare(out, ref))
            bad_rows = None
            if errors[-1] > SPEC.tolerance[torch.bfloat16]:
                per_row = ((out.float() - ref.float()).norm(dim=-1) / ref.float().norm(dim=-1)).flatten()
                bad_rows = (per_row > 0.03).nonzero().flatten().tolist()[:32]
            rows.append({"shape": name, "config": cfg.as_dict(), "rel_errors": errors, "bad_rows": bad_rows,
                         "ws_zero_after": int(torch.count_nonzero(inputs.workspace.sums)) == 0})
            print(name, cfg.label(), " ".join(f"{e:.3g}" for e in errors), bad_rows, flush=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
