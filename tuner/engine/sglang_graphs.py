"""Graphs per (batch size, prefix range) for the SGLang backend (verify_tuner.engine.sglang_backend).

A graph plan set gives each batch size up to K configs, each for the batches whose longest prefix
falls in its range (the tuner's `graph_plans`). SGLang 0.5.23's decode graph runner captures one
graph per batch size and *attention variant*: an object with `capture_labels` (one graph a label,
for every batch size) and `select(forward_batch) -> label` (which graph a step replays, asked on the
host before the replay). `RangeVariants` is that object: one label a range; a batch is replayed
in the range holding its longest prefix, read from the host copy of its lengths (`seq_lens_cpu`,
which the backend asks SGLang for while it has ranges) or, without one, from the device (one
scalar copy, counted). Every graph computes the same attention: the label chooses only a config,
so a step that lands in another range than the best (an unknown length, a batch padded into a
larger batch size's graph) is slower, never wrong.

A batch size whose set has fewer ranges than the most any batch size has still gets a graph for
every label (SGLang captures them all): the extra ones repeat its last range and are never
replayed.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verify_tuner.engine.sglang_metadata import counted_tokens
from verify_tuner.kernels.config import KernelConfig

#: SGLang's label of the graph of range i (its graph keys and profile tags carry it)
LABEL = "prefix_range_{}"

#: (first prefix of the range, config), in prefix order, the first range from 0
Ranges = Sequence[tuple[int, KernelConfig]]


def label(i: int) -> str:
    return LABEL.format(i)


def label_index(text: str) -> int:
    """The range a capture label names; ValueError for a label that is not one of ours."""
    head, _, tail = text.rpartition("_")
    if head != LABEL.rpartition("_")[0] or not tail.isdigit():
        raise ValueError(f"attention variant {text!r} is not a prefix range of this backend ({LABEL.format('N')})")
    return int(tail)


@dataclass
class GraphRanges:
    """Each (q_len, batch size)'s ranges, picked once and fixed; which range a graph is captured
    with (SGLang's capture label) and which one a batch replays."""

    pick: Callable[[int, int], Ranges]
    q_lens: tuple[int, ...]
    #: the attention variant SGLang is capturing (None: none, one graph per batch size)
    capture_label: Callable[[], str | None] = lambda: None
    #: what the backend handed SGLang (None: one graph per batch size, the last range's)
    variants: RangeVariants | None = None
    _starts: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    _configs: dict[tuple[int, int], tuple[KernelConfig, ...]] = field(default_factory=dict)
    _captured: dict[int, list[int]] = field(default_factory=dict)
    #: batches whose longest prefix was read from the device (no host copy of the lengths)
    length_syncs: int = 0
    #: SGLang's host copy of a verify step's lengths counts its draft tokens (DFlash, DSpark), the
    #: device lengths do not
    host_counts_draft: bool = False

    def configs(self, q_len: int, bs: int) -> tuple[KernelConfig, ...]:
        """The configs of the batch size's ranges, in prefix order (picked at the first call)."""
        got = self._configs.get((q_len, bs))
        if got is None:
            ranges = list(self.pick(q_len, bs))
            starts = tuple(s for s, _ in ranges)
            if not starts or starts[0] != 0 or any(a >= b for a, b in itertools.pairwise(starts)):
                raise ValueError(f"ranges of q_len {q_len} batch {bs} must start at 0 and increase, got {starts}")
            self._starts[(q_len, bs)] = starts
            got = self._configs[(q_len, bs)] = tuple(c for _, c in ranges)
        return got

    def count(self, up_to_bs: int) -> int:
        """The most ranges any batch size up to `up_to_bs` has, at any q_len."""
        return max((len(self.configs(q, bs)) for q in self.q_lens for bs in range(1, up_to_bs + 1)), default=1)

    def make_variants(
        self, max_bs: int, labelled_bs: Callable[[], int], batch_of: Callable[[Any], tuple[int, Any]]
    ) -> RangeVariants | None:
        """SGLang's variants (None while every batch size up to max_bs has one range): a label for
        each range of the batch size with the most of those SGLang captures (`labelled_bs()`, known
        when it captures), chosen for a batch (`batch_of`: its size and step buffers) by its longest
        prefix."""
        if self.count(max_bs) == 1:
            return None
        if self.variants is None:

            def select(forward_batch: Any) -> str:
                if forward_batch.forward_mode.is_idle():
                    return label(0)
                bs, step = batch_of(forward_batch)
                return label(self.range_of(forward_batch, step.q_len, self._graph_bs(step.q_len, bs)))

            self.variants = RangeVariants(lambda: tuple(label(i) for i in range(self.count(labelled_bs()))), select)
        return self.variants

    def range_of(self, forward_batch: Any, q_len: int, bs: int) -> int:
        """The range of a batch of bs: the one holding its longest prefix."""
        if len(self.configs(q_len, bs)) == 1:
            return 0  # no lengths read: one range serves every prefix
        return bisect.bisect_right(self._starts[(q_len, bs)], self._longest(forward_batch, q_len, bs)) - 1

    def captured_range(self, q_len: int, bs: int) -> int:
        """The range of the graph SGLang is capturing: its attention variant's, or without variants
        (one graph per batch size) the last range, whose prefixes cost a step the most."""
        sizes = self._captured.setdefault(q_len, [])
        if bs not in sizes:
            bisect.insort(sizes, bs)
        text = self.capture_label()
        if text is not None:
            return label_index(text)
        if self.variants is not None:
            raise RuntimeError("SGLang captured without an attention variant after taking this backend's variants")
        return len(self.configs(q_len, bs)) - 1

    def replayed_range(self, forward_batch: Any, q_len: int, bs: int) -> int:
        """The range of the graph SGLang replays: the one its variant chose, or the one graph's."""
        if self.variants is None:
            return len(self.configs(q_len, bs)) - 1
        return self.range_of(forward_batch, q_len, bs)

    def _graph_bs(self, q_len: int, bs: int) -> int:
        """The captured batch size a batch of `bs` is padded to (itself, past every captured one)."""
        sizes = self._captured.get(q_len, [])
        i = bisect.bisect_left(sizes, bs)
        return sizes[i] if i < len(sizes) else bs

    def _longest(self, forward_batch: Any, q_len: int, bs: int) -> int:
        """The batch's longest prefix: from the host copy of its lengths (less the draft tokens where
        that copy counts them), else from the device (less the step's own token in decode, which
        SGLang's lengths count)."""
        lengths = getattr(forward_batch, "seq_lens_cpu", None)
        ahead = 0
        if lengths is None or lengths.device.type != "cpu" or lengths.numel() == 0:
            self.length_syncs += 1
            lengths = forward_batch.seq_lens
        elif self.host_counts_draft and forward_batch.forward_mode.is_target_verify():
            ahead = q_len
        # never below 0: a warm-up's lengths (1 each) need not carry the draft block
        return max(0, int(lengths[:bs].max()) - counted_tokens(forward_batch) - ahead)


@dataclass
class RangeVariants:
    """SGLang's AttentionGraphVariants for graphs per prefix range: one label a range, and the label
    of the graph a batch replays (chosen by the backend, from the batch's longest prefix)."""

    labels: Callable[[], tuple[str, ...]]
    choose: Callable[[Any], str]

    @property
    def capture_labels(self) -> tuple[str, ...]:
        # read when SGLang captures, after init_cuda_graph_state fixed the captured batch sizes
        return self.labels()

    def select(self, forward_batch: Any) -> str:
        return self.choose(forward_batch)
