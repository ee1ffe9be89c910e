"""The engine side of bench/engine_loop.py, device-agnostic so its logic is tested on the CPU:
a request schedule (prefixes growing by what each step accepts, requests finishing and new ones
joining in another pool row at P=0 or at a prompt's length), SGLang's step tensors built from it
(req_to_token rows, out_cache_loc, seq_lens' host copy, EAGLE trees in the backend's mask layout
written where SGLang's draft stage writes them), the backend's own hooks in the order SGLang calls
them -- with graphs per prefix range, the attention variant set at each capture and the label the
backend's variants select before each replay -- and every step's output checked against fp32
attention computed from those SGLang tensors.

The SGLang-shaped objects (ForwardBatch, the MLA pool, the tree kernel's masks) are the test
stand-ins in tests/engine: the same facts the backend's CPU tests use.
"""

from __future__ import annotations

import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from verify_tuner.buckets import bucket_of
from verify_tuner.engine.sglang_backend import VerifyMLABackend
from verify_tuner.engine.tree_masks import TreeMaskMode
from verify_tuner.kernels.reference import quantized_q, rel_error

from tests.engine.sglang_doubles import ForwardBatch, ForwardMode, Layer, MLAPool, SpecInfo, sglang_attention
from tests.engine.sglang_trees import eagle_tree, sglang_mask

H, Q, TOPK, SCALE = 8, 9, 4, 0.1447  # Kimi K2 at TP8: 8 heads a GPU, its YaRN-scaled softmax scale


@dataclass
class Schedule:
    """Requests in pool rows: each step every prefix grows by what it accepted (1..accept_max); a
    request that reaches its stop finishes and a new one joins in the longest-free row, at the
    next of `joins` (a prompt's length after its prefill; 0: a request's first step), and runs
    64..`run` tokens (default: the longest stop)."""

    starts: list[int]
    stops: list[int]
    spare: int = 4
    accept_max: int = 5
    seed: int = 0
    joins: tuple[int, ...] = (0,)
    run: int = 0
    lens: list[int] = field(init=False)
    rows: list[int] = field(init=False)
    joined: int = field(init=False, default=0)
    buckets: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.lens, self.rows = list(self.starts), list(range(len(self.starts)))
        self.free = deque(range(len(self.starts), len(self.starts) + self.spare))
        self.stop = list(self.stops)
        self.buckets |= {bucket_of(n).index for n in self.lens}

    def advance(self) -> None:
        for b in range(len(self.lens)):
            self.lens[b] += self.rng.randint(1, self.accept_max)
            if self.lens[b] >= self.stop[b]:  # finished: its row goes back, a new request takes another
                self.free.append(self.rows[b])
                start = self.joins[self.joined % len(self.joins)]
                self.rows[b], self.lens[b] = self.free.popleft(), start
                self.stop[b] = start + self.rng.randint(64, self.run or max(self.stops))
                self.joined += 1
            self.buckets.add(bucket_of(self.lens[b]).index)

    @property
    def width(self) -> int:
        """Slots a req_to_token row needs: the longest request plus its draft tokens."""
        return max(max(self.stops), max(self.joins) + (self.run or max(self.stops))) + self.accept_max + Q + 1


class LoopEngine:
    """One batch size's engine: a pool per layer (scattered slots), req_to_token, the runner's
    static step buffers, the backend, and each layer's static q / k (what a captured graph reads).
    `pick_ranges` instead of `pick_config`: a graph per prefix range (`labels`, `select`)."""

    def __init__(self, sched: Schedule, *, layers: int, device: str, mode: TreeMaskMode, pick_config: Any = None,
                 pick_ranges: Any = None, pool_dtype: torch.dtype = torch.bfloat16,
                 kv_dtype: str | None = None) -> None:  # fmt: skip
        self.sched, self.device, self.mode = sched, torch.device(device), mode
        bs, rows, width = len(sched.starts), len(sched.starts) + sched.spare, sched.width
        gen = torch.Generator().manual_seed(sched.seed)
        self.pool = MLAPool(size=rows * width, layers=layers, dtype=pool_dtype, device=device)
        self.req_to_token = torch.randperm(rows * width, generator=gen).view(rows, width).to(torch.int32).to(device)
        self.backend = VerifyMLABackend(
            pool=self.pool, req_to_token=self.req_to_token, heads=H, q_lens=(Q,), max_bs=rows,
            max_context_len=width, pick_config=pick_config, pick_ranges=pick_ranges, tree_mask_mode=mode,
            capture_label=lambda: self.label, kv_dtype=kv_dtype,
        )  # fmt: skip
        self.label: str | None = None  # the attention variant being captured (SGLang's runner sets it)
        self.variants = self.backend.graph_variants()  # taken before init_cuda_graph_state, as SGLang does
        self.backend.init_cuda_graph_state(bs, bs * Q)
        self.gen = torch.Generator(device=device).manual_seed(sched.seed)
        self.tree_rng = random.Random(sched.seed)
        z = {"dtype": torch.int64, "device": device}
        info = SpecInfo(self.backend.verify_mask.buffer, Q, TOPK)
        self.fb = ForwardBatch(ForwardMode.TARGET_VERIFY, bs, torch.ones(bs, **z), torch.zeros(bs, **z),
                               torch.zeros(bs * Q, **z), info)  # fmt: skip
        bf = {"dtype": torch.bfloat16, "device": device}
        self.q_nope = torch.zeros(H, bs * Q, 512, **bf).transpose(0, 1)  # SGLang's head-major absorbed q
        self.q_rope = torch.zeros(bs * Q, H, 192, **bf)[..., 128:]
        self.k_nope, self.k_rope = torch.zeros(bs * Q, 1, 512, **bf), torch.zeros(bs * Q, 1, 64, **bf)
        self.layers = [Layer(i, H, SCALE) for i in range(layers)]
        self.masks: torch.Tensor | None = None

    def prepare(self) -> None:
        """The step's tensors into the runner's buffers, its mask where the draft stage writes it."""
        s, fb = self.sched, self.fb
        rows = torch.tensor(s.rows, dtype=torch.int64, device=self.device)
        lens = torch.tensor(s.lens, dtype=torch.int64, device=self.device)
        pos = lens.view(-1, 1) + torch.arange(Q, device=self.device)
        fb.seq_lens.copy_(lens)
        fb.seq_lens_cpu = torch.tensor(s.lens, dtype=torch.int64)  # SGLang's host copy (needs_cpu_seq_lens)
        fb.req_pool_indices.copy_(rows)
        fb.out_cache_loc.copy_(self.req_to_token[rows.view(-1, 1), pos].reshape(-1))
        trees = [eagle_tree(topk=TOPK, depth=4, q_len=Q, rng=self.tree_rng) for _ in s.lens]
        mask = sglang_mask(trees, s.lens, topk=TOPK, q_len=Q, mode=int(self.mode)).to(self.device)
        raw = mask.view(torch.uint8)  # byte views: packed uint16/32 rows copy on every device
        self.backend.verify_mask.buffer.view(torch.uint8)[: raw.numel()].copy_(raw)
        self.masks = mask
        for t in (self.q_nope, self.q_rope, self.k_nope, self.k_rope):
            t.copy_(torch.randn(t.shape, generator=self.gen, device=self.device))

    def forward(self) -> list[torch.Tensor]:
        """What the graph holds: the in-graph refill, then every layer's attention (its draft KV first)."""
        be, fb = self.backend, self.fb
        be.init_forward_metadata_in_graph(fb)
        return [be.forward_extend(self.q_nope, self.k_nope, self.k_nope, layer, fb, q_rope=self.q_rope,
                                  k_rope=self.k_rope) for layer in self.layers]  # fmt: skip

    def out_graph(self, *, in_capture: bool = False) -> None:
        self.backend.init_forward_metadata_out_graph(self.fb, in_capture=in_capture)

    @property
    def labels(self) -> tuple[str | None, ...]:
        """The graphs a batch size captures: one per attention variant (None: one graph)."""
        return self.variants.capture_labels if self.variants else (None,)

    def select(self) -> str | None:
        """The graph this step replays, as SGLang's runner asks the variants before the replay."""
        return self.variants.select(self.fb) if self.variants else None

    def error(self, outs: list[torch.Tensor], layer: int) -> tuple[float, float]:
        """(relative, max abs) error of one layer's output against attention on SGLang's tensors, q as
        the backend's format computes with it (quantized per row where QK runs on e4m3 MMAs)."""
        fb = ForwardBatch(ForwardMode.TARGET_VERIFY, self.fb.batch_size, self.fb.seq_lens, self.fb.req_pool_indices,
                          self.fb.out_cache_loc, SpecInfo(self.masks, Q, TOPK))  # fmt: skip
        q = quantized_q(torch.cat([self.q_nope, self.q_rope], dim=-1), self.backend.kv_dtype)
        want = sglang_attention(kv=self.pool.get_key_buffer(layer), req_to_token=self.req_to_token, fb=fb, q=q,
                                mode=int(self.mode), q_len=Q, scale=SCALE)  # fmt: skip
        got = outs[layer].view(-1, H, 512).float()
        return rel_error(got, want), float((got - want).abs().max())
