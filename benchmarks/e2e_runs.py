"""One case of benchmarks/e2e_decoder.py: its inputs, a prefill, a decode step as a graph-safe
runner, and the timing loops that interleave the implementations (the model and the two
implementations are benchmarks/e2e_model.py's)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from e2e_model import Decoder, PagedCache, Prompt, Tap, decode_attend, forward, prefill_attend


@dataclass
class Case:
    """One batch's inputs, the same for both implementations."""

    batch: int
    prompt: Prompt
    steps: int
    block_size: int
    x: torch.Tensor               # [B, L, hidden]: the prompt's embeddings
    decode_inputs: torch.Tensor   # [steps, B, 1, hidden]: each step's input embedding
    spans: torch.Tensor           # [B, S, 2] int32: the image spans
    positions: torch.Tensor       # [B, L] int64

    @property
    def max_context(self) -> int:
        return self.prompt.length + self.steps


def make_case(model: Decoder, prompt: Prompt, batch: int, steps: int, block_size: int, seed: int) -> Case:
    gen = torch.Generator(device=model.device).manual_seed(seed)
    hidden, dev = model.dims.hidden, model.device
    x = torch.randn((1, prompt.length, hidden), generator=gen, device=dev, dtype=model.dtype).expand(batch, -1, -1)
    spans = torch.tensor(prompt.spans("image"), dtype=torch.int32, device=dev).view(1, -1, 2)
    return Case(batch=batch, prompt=prompt, steps=steps, block_size=block_size, x=x.contiguous(),
                decode_inputs=torch.randn((steps, batch, 1, hidden), generator=gen, device=dev, dtype=model.dtype),
                spans=spans.expand(batch, -1, -1).contiguous(),
                positions=torch.arange(prompt.length, device=dev).expand(batch, -1).contiguous())


def prefill(model: Decoder, impl, case: Case, cache: PagedCache, tap: Tap | None = None) -> torch.Tensor:
    slots = cache.slots(case.positions).view(-1)
    attend = prefill_attend(impl, cache, slots, impl.prefill_meta(case.spans, case.prompt.length))
    return forward(model, case.x, case.positions, tap.wrap(attend) if tap else attend)


def prefill_attention_only(impl, case: Case, cache: PagedCache, tap: Tap) -> None:
    """The attention and cache parts of a prefill alone, on the recorded q, k, v."""
    slots = cache.slots(case.positions).view(-1)
    attend = prefill_attend(impl, cache, slots, impl.prefill_meta(case.spans, case.prompt.length))
    for i, (q, k, v) in enumerate(tap.qkv):
        attend(i, q, k, v)


class DecodeRunner:
    """One implementation's decode step, graph-safe: what changes between steps (input, positions,
    slots, context lengths) lives in static device tensors that load(i) refreshes with copy_ from
    a schedule computed on the device beforehand. After record_tap(), the step runs only the
    attention and cache parts, on the recorded q, k, v. The implementation must have been planned
    for this batch (impl.plan_decode)."""

    def __init__(self, model: Decoder, impl, cache: PagedCache, case: Case):
        self.model, self.impl, self.cache, self.tap = model, impl, cache, None
        b, length = case.batch, case.prompt.length
        dev = model.device
        pos = length + torch.arange(case.steps, device=dev)[None, :].expand(b, -1)    # [B, steps]
        self.schedule_positions = pos.t().contiguous()[:, :, None]                    # [steps, B, 1]
        self.schedule_slots = cache.slots(pos).t().contiguous()                       # [steps, B]
        self.schedule_lens = (pos + 1).t().to(torch.int32).contiguous()               # [steps, B]
        self.schedule_inputs = case.decode_inputs
        self.x = torch.empty_like(case.decode_inputs[0])
        self.positions = torch.empty_like(self.schedule_positions[0])
        self.slots = torch.empty_like(self.schedule_slots[0])
        self.context_lens = torch.empty_like(self.schedule_lens[0])
        self.graph = None
        self.out = None

    def load(self, i: int) -> None:
        self.x.copy_(self.schedule_inputs[i])
        self.positions.copy_(self.schedule_positions[i])
        self.slots.copy_(self.schedule_slots[i])
        self.context_lens.copy_(self.schedule_lens[i])

    def _attend(self):
        meta = self.impl.decode_meta(self.cache, self.context_lens)  # once per step, for every layer
        return decode_attend(self.impl, self.cache, self.slots, self.context_lens, meta)

    def body(self):
        attend = self._attend()
        if self.tap is None:
            return forward(self.model, self.x, self.positions, attend)
        for i, (q, k, v) in enumerate(self.tap.qkv):
            attend(i, q, k, v)
        return None

    def record_tap(self) -> None:
        """Run step 0 whole, eagerly, recording each layer's q, k, v; from then on the runner
        runs only the attention and cache parts, on those."""
        self.load(0)
        tap = Tap()
        forward(self.model, self.x, self.positions, tap.wrap(self._attend()))
        self.tap = tap

    def capture(self) -> None:
        """Capture one step, warmed up first on the capture stream (compilation, lazily made
        buffers); step 0's inputs are loaded, and rewriting its slots later is harmless."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.load(0)
                self.body()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self.out = self.body()
        torch.cuda.synchronize()

    def launch(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.out = self.body()

    def run(self, i: int):
        self.load(i)
        self.launch()
        return self.out


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The worst token's relative error, max over tokens of ‖a_t − b_t‖ / ‖b_t‖ (last dim = hidden)."""
    a, b = a.float(), b.float()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).max())


def time_decode(runners: list[DecodeRunner], steps: int, reps: int, record: list[list | None]) -> list[list[float]]:
    """Per runner, the CUDA-event time of each replay (steps × reps samples). Each step replays
    every runner once, starting one further along each step (timing.interleaved_order); the L2 is
    flushed and the GPU spun (HostCushion) before each start event. record[j]: a list that gets
    runner j's output of every step of the first repetition, or None."""
    from omnitune.profile.timing import HostCushion, L2Flusher

    flusher = L2Flusher()
    cushion = HostCushion.warm_up([lambda r=r: r.run(0) for r in runners], 3)
    samples: list[list[float]] = [[] for _ in runners]
    n = len(runners)
    for rep in range(reps):
        events = []
        for i in range(steps):
            for j in ((i + k) % n for k in range(n)):
                runners[j].load(i)
                flusher()
                cushion()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                runners[j].launch()
                end.record()
                events.append((j, start, end))
                if rep == 0 and record[j] is not None:
                    record[j].append(runners[j].out.clone())
        torch.cuda.synchronize()
        for j, start, end in events:
            samples[j].append(start.elapsed_time(end))
    return samples


def wall_ms(fns, rounds: int) -> list[list[float]]:
    """Per callable, the host's wall-clock time of one call from a synchronised start to the end of
    its GPU work (round-robin, the L2 flushed before each): what a caller waits for, the host's
    launch time included — which the CUDA-event figures leave out on purpose."""
    from omnitune.profile.timing import L2Flusher

    flusher = L2Flusher()
    samples: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(rounds):
        for j in ((r + k) % n for k in range(n)):
            flusher()
            torch.cuda.synchronize()
            start = time.perf_counter()
            fns[j]()
            torch.cuda.synchronize()
            samples[j].append(1e3 * (time.perf_counter() - start))
    return samples
