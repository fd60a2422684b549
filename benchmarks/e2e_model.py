"""The decoder stack that benchmarks/e2e_decoder.py runs: a thinker-style LM with random weights,
and the two implementations of its attention and KV-cache parts that the benchmark compares.

Everything but attention and the cache is plain PyTorch and shared by both implementations:
RMSNorm (fp32 statistics, as Qwen2's), Q/K/V projections with bias, RoPE, the output projection,
a SwiGLU MLP (gate and up in one GEMM), residuals, a final norm. RoPE is plain 1-D RoPE on token
positions, not Qwen2.5-Omni's TMRoPE (3-D time/height/width positions): the same elementwise
cost, and the attention kernels never see positions. There is no embedding table or LM head: the
inputs are random embeddings (what the vision and audio encoders and the token embedding would
produce is not what is measured), and decode is teacher-forced (each step's input is drawn
beforehand), so both implementations see identical inputs at every step and their outputs can
be compared step by step.

The two implementations (same interface, chosen per run):
  Omnitune     — attention(..., causal=True, mm_spans=spans) at prefill, write_kv_cache for every
                 cache write, PagedDecodePlan.run for decode attention;
  TorchNative  — SDPA with a dense boolean mask (causal + bidirectional image blocks) at prefill,
                 index_copy_ into the flattened caches, and at decode SDPA over the K/V pages
                 gathered through the block table (see TorchNative for why it is done this way).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from omnitune.presets import PRESETS

# Qwen2.5-Omni-7B's thinker is Qwen2.5-7B's LM: its MLP width (not in omnitune.presets, which
# holds only what the attention kernels see), RMSNorm epsilon and RoPE base, from its config.
QWEN_OMNI_7B_INTERMEDIATE = 18944
QWEN_OMNI_7B_RMS_EPS = 1e-6
QWEN_OMNI_7B_ROPE_THETA = 1e6


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    rope_theta: float = QWEN_OMNI_7B_ROPE_THETA
    eps: float = QWEN_OMNI_7B_RMS_EPS

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def qwen_omni_7b_dims(layers: int) -> Dims:
    p = PRESETS["qwen2.5-omni-7b"]
    return Dims(hidden=p.hidden, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                intermediate=QWEN_OMNI_7B_INTERMEDIATE, layers=layers)


# --------------------------------------------------------------------------------------------
# The prompt
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """A multimodal prompt as a sequence of (kind, tokens) segments: "text", "image", "audio"."""

    segments: tuple[tuple[str, int], ...]

    @property
    def length(self) -> int:
        return sum(n for _, n in self.segments)

    def spans(self, kind: str = "image") -> list[tuple[int, int]]:
        """[start, end) token ranges of the segments of one kind."""
        out, start = [], 0
        for k, n in self.segments:
            if k == kind:
                out.append((start, start + n))
            start += n
        return out

    def tokens(self, kind: str) -> int:
        return sum(n for k, n in self.segments if k == kind)


def multimodal_prompt(text_tokens: int = 128, images: int = 2, image_side_px: int = 448,
                      audio_s: float = 10.0, model: str = "qwen2.5-omni-7b") -> Prompt:
    """Text, `images` square images, audio, then text again, laid out as Qwen2.5-Omni's chat
    template does: each image's tokens between <|vision_bos|> and <|vision_eos|>, the audio's
    between <|audio_bos|> and <|audio_eos|> (those marker tokens count as text). Token counts
    from the model's preset: 448 px → (448 / 28)² = 256 tokens (14-px patches merged 2×2), 25
    audio tokens per second → 250 for 10 s."""
    p = PRESETS[model]
    before, after = text_tokens // 2, text_tokens - text_tokens // 2
    segments = [("text", before + 1)]                              # … <|vision_bos|>
    for _ in range(images):
        segments += [("image", p.image_tokens(image_side_px)), ("text", 2)]  # <|vision_eos|><|…_bos|>
    segments += [("audio", p.audio_tokens(audio_s)), ("text", 1 + after)]  # <|audio_eos|> …
    return Prompt(tuple((k, n) for k, n in segments if n > 0))


# --------------------------------------------------------------------------------------------
# The model (shared by both implementations)
# --------------------------------------------------------------------------------------------


@dataclass
class LayerWeights:
    in_norm: torch.Tensor
    qkv: torch.Tensor          # [(H + 2·Hkv)·D, hidden]
    qkv_bias: torch.Tensor
    o: torch.Tensor            # [hidden, H·D]
    post_norm: torch.Tensor
    gate_up: torch.Tensor      # [2·intermediate, hidden]
    down: torch.Tensor         # [hidden, intermediate]


class Decoder:
    """Random weights, drawn on the device. Each projection is scaled by 1/√fan_in so activations
    keep their size through the stack; Q/K by √2 more, so that attention scores have a spread of
    about 2 and softmax is not flat (a flat softmax would hide attention errors)."""

    def __init__(self, dims: Dims, dtype: torch.dtype, device, seed: int = 0, max_positions: int = 1 << 15):
        self.dims, self.dtype, self.device = dims, dtype, torch.device(device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        d = dims

        def w(rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
            return torch.randn((rows, cols), generator=gen, device=self.device, dtype=dtype).mul_(gain / math.sqrt(cols))

        def qkv_weight() -> torch.Tensor:
            qk = w((d.heads + d.kv_heads) * d.head_dim, d.hidden, math.sqrt(2.0))
            return torch.cat([qk, w(d.kv_heads * d.head_dim, d.hidden)])

        ones = torch.ones(d.hidden, device=self.device, dtype=dtype)
        self.layers = [
            LayerWeights(
                in_norm=ones, qkv=qkv_weight(),
                qkv_bias=torch.randn((d.heads + 2 * d.kv_heads) * d.head_dim, generator=gen,
                                     device=self.device, dtype=dtype).mul_(0.1),
                o=w(d.hidden, d.heads * d.head_dim), post_norm=ones,
                gate_up=w(2 * d.intermediate, d.hidden), down=w(d.hidden, d.intermediate),
            )
            for _ in range(d.layers)
        ]
        self.final_norm = ones
        inv_freq = d.rope_theta ** (-torch.arange(0, d.head_dim, 2, device=self.device, dtype=torch.float32) / d.head_dim)
        angles = torch.arange(max_positions, device=self.device, dtype=torch.float32)[:, None] * inv_freq
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)  # [max_positions, D/2]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, heads, D]; cos, sin [B, L, D/2]: rotate the two halves of each head (GPT-NeoX
    layout, as Qwen2)."""
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


# attend(layer, q [B, L, H, D], k, v [B, L, Hkv, D]) -> [B, L, H·D]: the attention and KV-cache
# part of one layer, the only part the two implementations do differently.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def forward(model: Decoder, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
    """x [B, L, hidden], positions [B, L] int64 → the final-norm hidden states [B, L, hidden]."""
    d = model.dims
    b, length, _ = x.shape
    cos, sin = model.cos[positions], model.sin[positions]
    for i, layer in enumerate(model.layers):
        h = rms_norm(x, layer.in_norm, d.eps)
        q, k, v = F.linear(h, layer.qkv, layer.qkv_bias).split(
            [d.heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.head_dim], dim=-1)
        q = apply_rope(q.view(b, length, d.heads, d.head_dim), cos, sin)
        k = apply_rope(k.view(b, length, d.kv_heads, d.head_dim), cos, sin)
        v = v.view(b, length, d.kv_heads, d.head_dim)
        x = x + F.linear(attend(i, q, k, v), layer.o)
        h = rms_norm(x, layer.post_norm, d.eps)
        gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, layer.down)
    return rms_norm(x, model.final_norm, d.eps)


# --------------------------------------------------------------------------------------------
# The paged KV cache (one per implementation, identical layout and block tables)
# --------------------------------------------------------------------------------------------


@dataclass
class PagedCache:
    """Per layer a key and a value cache [num_blocks, block_size, Hkv, D] (vLLM's layout), and
    one block table [B, max_blocks] int32 for the batch. Every sequence's pages for the whole run
    are allocated up front (max_context tokens), scattered at random through the cache as an
    engine's allocator leaves them after a while; zeros where nothing was written."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    block_tables: torch.Tensor
    block_size: int
    max_context: int

    @classmethod
    def allocate(cls, dims: Dims, batch: int, max_context: int, block_size: int, dtype, device,
                 seed: int = 0) -> PagedCache:
        max_blocks = -(-max_context // block_size)
        num_blocks = batch * max_blocks + 1  # one block no sequence owns
        gen = torch.Generator().manual_seed(seed)
        tables = torch.randperm(num_blocks, generator=gen)[: batch * max_blocks].view(batch, max_blocks)
        shape = (num_blocks, block_size, dims.kv_heads, dims.head_dim)
        return cls(keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.layers)],
                   values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(dims.layers)],
                   block_tables=tables.to(device=device, dtype=torch.int32),
                   block_size=block_size, max_context=max_context)

    @property
    def max_blocks(self) -> int:
        return self.block_tables.shape[1]

    def slots(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [B, n] int64 → their cache slots [B, n], block · block_size + offset."""
        pages = self.block_tables.long().gather(1, positions // self.block_size)
        return pages * self.block_size + positions % self.block_size

    def clone(self) -> PagedCache:
        return PagedCache([k.clone() for k in self.keys], [v.clone() for v in self.values],
                          self.block_tables.clone(), self.block_size, self.max_context)


def prefill_attend(impl, cache: PagedCache, slots: torch.Tensor, meta) -> Attend:
    """A layer's attention at prefill: write the prompt's K/V into the cache, attend over them.
    slots [B·L] int64; meta: what impl.prefill_meta built once for the whole forward."""

    def attend(i, q, k, v):
        b, length, heads, dim = q.shape
        impl.write(k.reshape(b * length, -1, dim), v.reshape(b * length, -1, dim), cache.keys[i], cache.values[i], slots)
        out = impl.prefill_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), meta)
        return out.transpose(1, 2).reshape(b, length, heads * dim)

    return attend


def decode_attend(impl, cache: PagedCache, slots: torch.Tensor, context_lens: torch.Tensor, meta) -> Attend:
    """A layer's attention at a decode step: write the new token's K/V, attend over the cache.
    slots [B] int64, context_lens [B] int32 (the new token included)."""

    def attend(i, q, k, v):
        b, _, heads, dim = q.shape
        impl.write(k.reshape(b, -1, dim), v.reshape(b, -1, dim), cache.keys[i], cache.values[i], slots)
        out = impl.decode_attention(q.transpose(1, 2), cache.keys[i], cache.values[i], cache, context_lens, meta)
        return out.transpose(1, 2).reshape(b, 1, heads * dim)

    return attend


# --------------------------------------------------------------------------------------------
# The two implementations of the attention and KV-cache parts
# --------------------------------------------------------------------------------------------


def span_mask(spans: torch.Tensor, length: int) -> torch.Tensor:
    """spans [B, S, 2] → the dense boolean mask [B, 1, L, L] (True = attend): causal, and
    bidirectional inside each span."""
    pos = torch.arange(length, device=spans.device)
    inside = (pos >= spans[..., :1]) & (pos < spans[..., 1:])            # [B, S, L]
    both = (inside[..., :, None] & inside[..., None, :]).any(dim=1)     # [B, L, L]
    return ((pos[:, None] >= pos[None, :]) | both)[:, None]


def sdpa_backend(*args, **kwargs) -> str:
    """The SDPA backend PyTorch picks for these arguments (recorded, not forced)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name
    except Exception as exc:  # a private API: the figure stands without the name
        return f"unknown ({type(exc).__name__})"


class TorchNative:
    """PyTorch-native attention and cache writes, written the way that lets SDPA pick a fast
    backend:
    - prefill: K/V repeated to the query heads (as transformers' repeat_kv), then SDPA with the
      dense mask. SDPA's enable_gqa with a mask falls back to the math backend, and a dense
      mask excludes the flash backend; SDPA chooses among the rest (recorded in `backends`).
    - cache writes: index_copy_ into the caches flattened to [slots, Hkv, D].
    - decode: each step, every sequence's pages gathered through the block table (index_select
      of whole pages) into a contiguous [B, max_blocks·block_size, Hkv, D] buffer — the static
      maximum length, so that the step is capturable; a mask hides the positions past each
      context — then SDPA with the GQA group folded into the query rows (q [B, Hkv, G, D]:
      exact, one query token per head, and no G-fold copy of the gathered K/V). The page
      gather and the mask are built once per step and shared by the layers, as an engine
      builds its attention metadata once per step."""

    name = "pytorch"

    def __init__(self, dims: Dims):
        self.dims = dims
        self.scale = 1.0 / math.sqrt(dims.head_dim)
        self.backends: dict[str, str] = {}

    def prefill_meta(self, spans: torch.Tensor, length: int) -> torch.Tensor:
        return span_mask(spans, length)

    def prefill_attention(self, q, k, v, mask):
        g = self.dims.group
        b, hkv, length, d = k.shape
        k = k[:, :, None].expand(b, hkv, g, length, d).reshape(b, hkv * g, length, d)
        v = v[:, :, None].expand(b, hkv, g, length, d).reshape(b, hkv * g, length, d)
        if "prefill" not in self.backends:  # asked once: the question costs host time
            self.backends["prefill"] = sdpa_backend(q, k, v, mask, 0.0, False, scale=self.scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

    def write(self, key, value, key_cache, value_cache, slots):
        _, _, hkv, d = key_cache.shape
        key_cache.view(-1, hkv, d).index_copy_(0, slots, key)
        value_cache.view(-1, hkv, d).index_copy_(0, slots, value)

    def plan_decode(self, cache: PagedCache, batch: int, dtype, device) -> None:
        self.key_positions = torch.arange(cache.max_blocks * cache.block_size, device=device)

    def decode_meta(self, cache: PagedCache, context_lens: torch.Tensor):
        pages = cache.block_tables.view(-1).long()
        mask = self.key_positions[None, :] < context_lens[:, None].long()   # [B, keys]
        return pages, mask[:, None, None, :]

    def decode_attention(self, q, key_cache, value_cache, cache: PagedCache, context_lens, meta):
        pages, mask = meta
        b, h, _, d = q.shape
        hkv, g = self.dims.kv_heads, self.dims.group
        keys = key_cache.index_select(0, pages).view(b, -1, hkv, d).transpose(1, 2)     # [B, Hkv, keys, D]
        values = value_cache.index_select(0, pages).view(b, -1, hkv, d).transpose(1, 2)
        qg = q.reshape(b, hkv, g, d)
        if "decode" not in self.backends:
            self.backends["decode"] = sdpa_backend(qg, keys, values, mask, 0.0, False, scale=self.scale)
        return F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=self.scale).reshape(b, h, 1, d)


class Omnitune:
    """omnitune's public ops, as a serving engine calls them. check: the ops' validation mode
    (None: their default)."""

    name = "omnitune"

    def __init__(self, dims: Dims, check: bool | None = None):
        # Imported here, not at the top: the interpreter (TRITON_INTERPRET=1) must be switched on
        # before a kernel module is imported, and the CPU mode switches it on itself.
        from omnitune.kernels.attention import attention
        from omnitune.kernels.kv_cache_write import write_kv_cache
        from omnitune.kernels.paged_decode_attention import PagedDecodePlan

        self._attention, self._write, self._plan_type = attention, write_kv_cache, PagedDecodePlan
        self.dims, self.check = dims, check
        self.scale = 1.0 / math.sqrt(dims.head_dim)
        self.plan = None

    def prefill_meta(self, spans: torch.Tensor, length: int) -> torch.Tensor:
        return spans

    def prefill_attention(self, q, k, v, spans):
        return self._attention(q, k, v, causal=True, sm_scale=self.scale, mm_spans=spans, check=self.check)

    def write(self, key, value, key_cache, value_cache, slots):
        self._write(key, value, key_cache, value_cache, slots, check=self.check)

    def plan_decode(self, cache: PagedCache, batch: int, dtype, device) -> None:
        # One plan for every layer: the layers' shapes are the same and they run one after
        # another on one stream, so the plan's split buffers are free again for the next layer.
        d = self.dims
        self.plan = self._plan_type(
            batch=batch, num_heads=d.heads, num_kv_heads=d.kv_heads, head_dim=d.head_dim,
            block_size=cache.block_size, max_blocks=cache.max_blocks, max_context_len=cache.max_context,
            dtype=dtype, device=device, query_tokens=1, sm_scale=self.scale)

    def decode_meta(self, cache: PagedCache, context_lens: torch.Tensor):
        return None

    def decode_attention(self, q, key_cache, value_cache, cache: PagedCache, context_lens, meta):
        # Into the plan's own output buffer, shared by the layers: each layer's output projection
        # reads it (stream order) before the next layer's run overwrites it.
        return self.plan.run(q, key_cache, value_cache, cache.block_tables, context_lens, check=self.check)


IMPLEMENTATIONS = {"omnitune": Omnitune, "pytorch": TorchNative}


@dataclass
class Tap:
    """Records each layer's (q, k, v) as attend sees them, for the attention-only variants."""

    qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def wrap(self, attend: Attend) -> Attend:
        def tapped(i, q, k, v):
            self.qkv.append((q.clone(), k.clone(), v.clone()))
            return attend(i, q, k, v)

        return tapped
