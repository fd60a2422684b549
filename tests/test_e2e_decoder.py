"""benchmarks/e2e_decoder.py: its --tiny mode (both implementations of the decoder's attention and
KV-cache parts, under Triton's interpreter on the CPU) agrees and writes its JSON; its check is
not vacuous (a broken implementation fails it); the prompt and the dense mask are what the
benchmark says they are. No GPU needed: nothing is timed here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import e2e_decoder  # noqa: E402  (imports no kernel: conftest switches the interpreter on first)
import e2e_model  # noqa: E402


def test_tiny_run_agrees_and_writes_its_json(tmp_path):
    out = tmp_path / "e2e.json"
    payload = e2e_decoder.main(["--tiny", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["mode"] == "tiny" and saved["command"].endswith(f"--tiny --out {out}")
    (case,) = saved["cases"]
    correctness = case["correctness"]
    assert correctness["agree"] and correctness["layer0_caches_bitwise_equal"]
    assert set(correctness["max_rel_err"]) == {
        "prefill_omnitune_vs_pytorch", "decode_omnitune_vs_pytorch",
        "prefill_omnitune_vs_reference", "prefill_pytorch_vs_reference",
        "decode_omnitune_vs_reference", "decode_pytorch_vs_reference",
    }
    assert max(correctness["max_rel_err"].values()) <= correctness["tolerance"] == 1e-4
    assert case["steps"] == 3 and case["prompt_tokens"] == e2e_decoder.TINY_PROMPT.length
    assert payload["cases"][0]["correctness"] == correctness


def test_a_lost_span_or_a_short_context_fails_the_check(monkeypatch):
    """The comparison catches what it is there to catch: omnitune's prefill without the image
    span, and its decode one key short."""
    omnitune = e2e_model.Omnitune
    monkeypatch.setattr(omnitune, "prefill_attention",
                        lambda self, q, k, v, spans: self._attention(q, k, v, causal=True, sm_scale=self.scale))
    errors = e2e_decoder.run_tiny()["correctness"]
    assert not errors["agree"] and errors["max_rel_err"]["prefill_omnitune_vs_reference"] > 1e-2
    monkeypatch.undo()
    monkeypatch.setattr(omnitune, "decode_attention",
                        lambda self, q, kc, vc, cache, lens, meta: self.plan.run(q, kc, vc, cache.block_tables, lens - 1, check=self.check))
    errors = e2e_decoder.run_tiny()["correctness"]
    assert not errors["agree"] and errors["max_rel_err"]["decode_omnitune_vs_pytorch"] > 1e-2
    assert errors["max_rel_err"]["prefill_omnitune_vs_pytorch"] <= 1e-4


def test_the_multimodal_prompt_of_the_gpu_run():
    prompt = e2e_model.multimodal_prompt()  # text + two 448² images + 10 s of audio, Qwen2.5-Omni-7B
    assert prompt.tokens("image") == 2 * 256 and prompt.tokens("audio") == 250
    assert prompt.length == 896 and prompt.length % 16 == 0
    assert prompt.spans("image") == [(65, 321), (323, 579)]
    assert prompt.spans("audio") == [(581, 831)]


def test_span_mask_is_causal_with_bidirectional_spans():
    spans = torch.tensor([[[2, 5]], [[0, 0]]], dtype=torch.int32)  # one span; an empty one
    mask = e2e_model.span_mask(spans, 7)
    assert mask.shape == (2, 1, 7, 7)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    assert torch.equal(mask[1, 0], causal)
    expected = causal.clone()
    expected[2:5, 2:5] = True
    assert torch.equal(mask[0, 0], expected)
