"""Model presets: the dimensions of the multimodal models omnitune tunes for, and the problems each
kernel sees when such a model serves realistic traffic.

Dimensions come from the models' public configs (docs/design: "Model dimensions"). The problem
lists are small on purpose (a search per problem costs minutes on a GPU) and chosen so that the
runtime's nearest-match rule (each kernel's MatchPolicy: every soft dimension within a ratio of 4)
finds a tuned problem for the traffic in between:

- decode (lq=1): batch 1–256 and contexts 1k–32k are covered by batch {4, 64} × context
  {4096, 16384}: every batch is within 4× of 4 or of 64, every context within 4× of 4096 or 16384;
- mixed prefill (text + one image of 448² or 512² + up to 30 s of audio, causal, the image a
  bidirectional span): prompts of ~230 to ~32k tokens are covered by a short (~640–770 tokens)
  and a long (~8.3–8.5k tokens) prompt, under 16× apart, with batch 1–4 and one to four images;
- text → image cross-attention: 32–4096 text queries over one image's tokens;
- DiT joint attention (not causal): image + text tokens at 512² and 1024², batch 2 (CFG);
- KV-cache writes: decode steps of 1–256 tokens and prefill writes of ~230 to 64k tokens, covered
  by t ∈ {4, 64, 1024, 16384};
- the fused cross-attention layer (text queries over an image's or a video's hidden states, with
  the model's projections): decode-like steps (batch 1–8, 1–16 queries, 1k–4k attended tokens),
  text → image prefill (batch 2–8, 256–512 queries over ~4k tokens) and long video (batch 1–2,
  128–512 queries over 8k–16k tokens), one problem each; and the decode-like steps again with the
  attended K/V projected once and cached (kv_cached, matched exactly), one problem.

tests/test_presets.py checks that coverage on a grid of problems between these points.

The kernel modules are imported only when problems are built: `omnitune search --interpret` must
switch the interpreter on before any kernel is imported.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from omnitune.errors import OmnituneError


class UnknownModelError(OmnituneError):
    """A --model name that is not a preset."""


class UnknownPresetKernelError(OmnituneError):
    """A --kernels name that presets have no traffic for."""


class ModelKind(str, enum.Enum):
    LANGUAGE = "language"  # an autoregressive thinker / LM: prefill, decode, a paged KV cache
    DIT = "dit"            # a diffusion transformer: joint attention over image + text, no KV cache


# Decode batch sizes and contexts that stand for batch 1–256 and contexts 1k–32k (see module doc).
DECODE_BATCHES = (4, 64)
DECODE_CONTEXTS = (4096, 16384)
# Tokens per KV-cache write: decode steps (4, 64) and prefill writes (1024, 16384).
KV_WRITE_TOKENS = (4, 64, 1024, 16384)
# Text tokens of the prompts that stand for short and long multimodal prompts.
SHORT_PROMPT_TEXT_TOKENS = 384
LONG_PROMPT_TEXT_TOKENS = 7936
SHORT_PROMPT_AUDIO_S = 5.0
LONG_PROMPT_AUDIO_S = 10.0
# Text queries of text → image cross-attention.
CROSS_ATTENTION_TEXT_TOKENS = (128, 1024)
# A DiT prompt's text tokens (Qwen-Image allows up to 1024) and its batch: 2 with classifier-free guidance.
DIT_TEXT_TOKENS = 256
DIT_BATCH = 2
DIT_SIDES_PX = (512, 1024)
# Paged KV caches use pages of this many tokens (vLLM's default).
KV_BLOCK_SIZE = 16
# The caches an engine keeps: in the activations' dtype, or fp8 (vLLM's kv_cache_dtype="fp8"):
# the KV write and paged decode are tuned for both.
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
_CACHE_ROLES = {"auto": "", "fp8_e4m3": ", fp8 cache"}

# Fused cross-attention layer (b, lq, lk, role, kv_cached): decode-like, text → image prefill, long
# video; and the decode steps again with the image's K/V projected once and reused (kv_cached), as
# a decode loop runs it: a different mix of work, tuned apart. Decode-like and prefill at two
# batches each: the layer's tuned entries are lent across at most 2x of batch (its MatchPolicy),
# because batch is what flips the winner (fused won at b2 and lost 3x at b8 on the H200).
# One query token is a regime of its own for the unfused path (SDPA's single-query kernels: at b8
# lk4k with cached K/V, 0.050 ms for one token against 0.135 ms for four), so the one-token decode
# step is tuned too rather than lent from four tokens.
CROSS_LAYER_PROBLEMS = ((2, 4, 2048, "decode-like", False), (8, 4, 4096, "decode-like, batch 8", False),
                        (2, 1, 2048, "decode step", False), (8, 1, 4096, "decode step, batch 8", False),
                        (8, 512, 4096, "text → image prefill", False),
                        (2, 512, 2048, "text → image prefill, batch 2", False),
                        (1, 256, 16384, "long video", False),
                        (2, 4, 2048, "decode-like, K/V cached", True),
                        (8, 4, 4096, "decode-like, batch 8, K/V cached", True),
                        (2, 1, 2048, "decode step, K/V cached", True),
                        (8, 1, 4096, "decode step, batch 8, K/V cached", True))

KERNELS = ("attention", "kv_cache_write", "paged_decode_attention", "cross_attention_layer")


@dataclass(frozen=True)
class ModelPreset:
    """The dimensions of one model's transformer (the LM / thinker part, or the DiT)."""

    name: str
    description: str
    kind: ModelKind
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    image_patch_px: int
    """Pixels per image token along one side: 28 for Qwen2.x (14-px patches merged 2×2), 32 for
    Qwen3-Omni, 16 for the DiT (an 8× VAE, then 2×2 patches)."""
    audio_tokens_per_s: float = 0.0
    """0 for a model without audio input."""

    def image_tokens(self, side_px: int) -> int:
        """Tokens of one square image of side_px pixels: each side rounded to a multiple of the
        patch, then (side / patch)²."""
        per_side = max(1, round(side_px / self.image_patch_px))
        return per_side * per_side

    @property
    def image_tokens_448(self) -> int:
        return self.image_tokens(448)

    @property
    def image_tokens_512(self) -> int:
        return self.image_tokens(512)

    def audio_tokens(self, seconds: float) -> int:
        return round(self.audio_tokens_per_s * seconds)

    def prompt_tokens(self, text_tokens: int, image_side_px: int, audio_s: float) -> int:
        """Tokens of a prompt of text, one square image and audio."""
        return text_tokens + self.image_tokens(image_side_px) + self.audio_tokens(audio_s)


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("qwen2.5-omni-7b", "Qwen2.5-Omni-7B thinker", ModelKind.LANGUAGE,
                    hidden=3584, heads=28, kv_heads=4, head_dim=128, layers=28, image_patch_px=28,
                    audio_tokens_per_s=25),
        # The 3B shares the 7B's audio encoder (one token per 40 ms).
        ModelPreset("qwen2.5-omni-3b", "Qwen2.5-Omni-3B thinker", ModelKind.LANGUAGE,
                    hidden=2048, heads=16, kv_heads=2, head_dim=128, layers=36, image_patch_px=28,
                    audio_tokens_per_s=25),
        ModelPreset("qwen3-omni-30b-a3b", "Qwen3-Omni-30B-A3B thinker (MoE, 3B active)", ModelKind.LANGUAGE,
                    hidden=2048, heads=32, kv_heads=4, head_dim=128, layers=48, image_patch_px=32,
                    audio_tokens_per_s=13),
        ModelPreset("qwen2.5-vl-7b", "Qwen2.5-VL-7B", ModelKind.LANGUAGE,
                    hidden=3584, heads=28, kv_heads=4, head_dim=128, layers=28, image_patch_px=28),
        ModelPreset("qwen-image-dit", "Qwen-Image-style MMDiT (joint image + text attention)", ModelKind.DIT,
                    hidden=3072, heads=24, kv_heads=24, head_dim=128, layers=60, image_patch_px=16),
    )
}


@dataclass(frozen=True)
class PresetProblem:
    """One problem a kernel sees under a model's traffic, and what traffic it stands for."""

    kernel: str
    problem: object
    role: str


def get_preset(name: str) -> ModelPreset:
    """The preset called `name` (case-insensitive); UnknownModelError listing the presets."""
    preset = PRESETS.get(name.strip().lower())
    if preset is None:
        raise UnknownModelError(f"unknown model {name!r}; choose one of {', '.join(PRESETS)}")
    return preset


def get_presets(text: str) -> tuple[ModelPreset, ...]:
    """--model 'a,b' → the presets named, each once, in the order given; UnknownModelError for a
    name that is none (or for no name at all)."""
    names = list(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if not names:
        raise UnknownModelError(f"no model named in {text!r}; choose one or more of {', '.join(PRESETS)}")
    return tuple(get_preset(name) for name in names)


def models_problems(presets: tuple[ModelPreset, ...], kernel: str, key) -> list[PresetProblem]:
    """The problems `kernel` sees under any of `presets`, each once (the first preset's, where two
    presets send it the same problem: `key` maps a problem to its identity, the spec's problem key)."""
    found: dict[str, PresetProblem] = {}
    for preset in presets:
        for one in preset_problems(preset, kernel):
            found.setdefault(key(one.problem), one)
    return list(found.values())


def parse_kernels(text: str | None) -> tuple[str, ...]:
    """--kernels 'k1,k2' → ('k1', 'k2'); None or empty → every kernel presets know."""
    if not text or not text.strip():
        return KERNELS
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        if name not in KERNELS:
            raise UnknownPresetKernelError(
                f"model presets have no traffic for kernel {name!r}; choose from {', '.join(KERNELS)}"
            )
    return names


def preset_problems(preset: ModelPreset, kernel: str) -> list[PresetProblem]:
    """The problems `kernel` sees when `preset` serves realistic traffic ([] if it never runs)."""
    if kernel not in KERNELS:
        raise UnknownPresetKernelError(
            f"model presets have no traffic for kernel {kernel!r}; choose from {', '.join(KERNELS)}"
        )
    if preset.kind is ModelKind.DIT:
        return _dit_attention(preset) if kernel == "attention" else []
    builders = {
        "attention": _language_attention,
        "kv_cache_write": _kv_cache_writes,
        "paged_decode_attention": _paged_decode,
        "cross_attention_layer": _cross_attention_layers,
    }
    return builders[kernel](preset)


def _language_attention(p: ModelPreset) -> list[PresetProblem]:
    from omnitune.kernels.attention import AttentionProblem

    heads = dict(h=p.heads, hkv=p.kv_heads, d=p.head_dim)
    found: list[PresetProblem] = []
    audio = p.audio_tokens_per_s > 0
    for text, side, audio_s, what in (
        (SHORT_PROMPT_TEXT_TOKENS, 448, SHORT_PROMPT_AUDIO_S, "short"),
        (LONG_PROMPT_TEXT_TOKENS, 512, LONG_PROMPT_AUDIO_S, "long"),
    ):
        tokens = p.prompt_tokens(text, side, audio_s)
        # One image span; its length is within 4× of both image sizes (and of up to 4 images).
        found.append(PresetProblem("attention", AttentionProblem(
            b=1, lq=tokens, lk=tokens, causal=True, spans=1, span_len=p.image_tokens_448, **heads,
        ), f"{what} prefill: {text} text + {side}² image" + (f" + {audio_s:g} s audio" if audio else "")))
    for text in CROSS_ATTENTION_TEXT_TOKENS:
        found.append(PresetProblem("attention", AttentionProblem(
            b=1, lq=text, lk=p.image_tokens_448, **heads,
        ), f"cross-attention: {text} text queries → a 448² image"))
    for b in DECODE_BATCHES:
        for ctx in DECODE_CONTEXTS:
            found.append(PresetProblem("attention", AttentionProblem(b=b, lq=1, lk=ctx, **heads),
                                       f"decode: batch {b}, {ctx} context"))
    return found


def _dit_attention(p: ModelPreset) -> list[PresetProblem]:
    from omnitune.kernels.attention import AttentionProblem

    found = []
    for side in DIT_SIDES_PX:
        tokens = p.image_tokens(side) + DIT_TEXT_TOKENS
        found.append(PresetProblem("attention", AttentionProblem(
            b=DIT_BATCH, h=p.heads, hkv=p.kv_heads, lq=tokens, lk=tokens, d=p.head_dim,
        ), f"joint attention at {side}²: {p.image_tokens(side)} image + {DIT_TEXT_TOKENS} text, CFG batch"))
    return found


def _kv_cache_writes(p: ModelPreset) -> list[PresetProblem]:
    from omnitune.kernels.kv_cache_write import KVCacheWriteProblem

    return [
        PresetProblem("kv_cache_write", KVCacheWriteProblem(t=t, hkv=p.kv_heads, d=p.head_dim, block_size=KV_BLOCK_SIZE,
                                                            cache_dtype=cache),
                      f"{'decode step' if t < 256 else 'prefill'}: {t} tokens{_CACHE_ROLES[cache]}")
        for cache in KV_CACHE_DTYPES
        for t in KV_WRITE_TOKENS
    ]


def _paged_decode(p: ModelPreset) -> list[PresetProblem]:
    from omnitune.kernels.paged_decode_attention import PagedDecodeProblem

    return [
        PresetProblem("paged_decode_attention", PagedDecodeProblem(
            b=b, h=p.heads, hkv=p.kv_heads, lq=1, ctx=ctx, d=p.head_dim, block_size=KV_BLOCK_SIZE, cache_dtype=cache,
        ), f"decode: batch {b}, {ctx} context{_CACHE_ROLES[cache]}")
        for cache in KV_CACHE_DTYPES
        for b in DECODE_BATCHES
        for ctx in DECODE_CONTEXTS
    ]


def _cross_attention_layers(p: ModelPreset) -> list[PresetProblem]:
    from omnitune.kernels.cross_attention_layer import CrossAttentionLayerProblem

    return [
        PresetProblem("cross_attention_layer", CrossAttentionLayerProblem(
            b=b, lq=lq, lk=lk, hidden=p.hidden, h=p.heads, hkv=p.kv_heads, d=p.head_dim, kv_cached=cached,
        ), f"{what}: batch {b}, {lq} text queries over {lk} image/video tokens, "
           + ("K/V projected once, Q/O projections per call" if cached else "with the projections"))
        for b, lq, lk, what, cached in CROSS_LAYER_PROBLEMS
    ]
