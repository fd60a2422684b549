"""What attention's Gluon ping-pong kernel (omnitune/kernels/attention_gluon.py) is written for,
and whether a tensor's device can run it: read by the attention spec (its constraints and
dispatch) and by the kernel's module (its per-call checks). A module of its own, importing
neither, because the spec must never import the kernel's module (it imports Gluon) and the
kernel's module must not import the spec (a cycle)."""

from __future__ import annotations

import torch

GLUON_PINGPONG = "gluon_pingpong"  # attention's BACKEND value
# The ping-pong kernel tunes its key tile and its K/V ring's depth; the rest is what it is written
# as: 128 query rows (two consumer warpgroups of 64), launched with its producer's 4 warps, one
# head per program, and TMA always (USE_TMA names the Triton kernel's K/V path: unused, so fixed).
GLUON_FIXED = dict(BLOCK_M=128, num_warps=4, PACK_GQA=False, USE_TMA=False)
GLUON_TUNED = dict(BLOCK_N=(64, 128), num_stages=(2, 3))
GLUON_HEAD_DIM = 128

# Per CUDA device index: whether the Gluon kernel can run there (sm_90: wgmma is sm_90a's).
_sm90_devices: dict[int, bool] = {}


def gluon_device_refusal(q: torch.Tensor) -> str | None:
    """Why the Gluon kernel cannot run on q's device (one line), or None; no sync, no Gluon import.
    The op asks before importing the kernel's module, and that module's `refusal` asks the same."""
    index = q.get_device()
    if index < 0:
        return f"needs an sm_90 (Hopper) GPU; q is on {q.device}"
    runs = _sm90_devices.get(index)
    if runs is None:
        runs = _sm90_devices[index] = torch.cuda.get_device_capability(index)[0] == 9
    if not runs:
        major, minor = torch.cuda.get_device_capability(index)
        return f"needs an sm_90 (Hopper) GPU; q is on {q.device}, sm_{major}{minor}"
    return None
