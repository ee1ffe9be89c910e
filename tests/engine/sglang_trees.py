"""SGLang's EAGLE draft trees and the verify masks its tree kernel writes, rebuilt on the CPU for
the tests (facts read from SGLang 0.5.23's released source: eagle_utils.build_tree_kernel_efficient
and the CUDA kernels build_tree_efficient / build_tree_efficient_partial_packed).

A tree is drawn as EAGLE drafts it: topk candidates under the root; at each later step every one
of the topk beams (candidates picked at the step before) gets topk children, candidate ids running
in that order, parent_list holding each beam's id; selected_index the sorted ids of the q_len - 1
candidates kept, a set closed under ancestors. The expected rows come from the drawn parents
directly, not through SGLang's encoding, so the two are independent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


@dataclass
class Tree:
    parent_list: list[int]  # [topk * (depth - 1) + 1]: -1, then the beams' candidate ids
    selected_index: list[int]  # [q_len - 1] sorted candidate ids
    rows: list[int]  # the expected mask rows: bit j of row i, node i sees node j


def eagle_tree(*, topk: int, depth: int, q_len: int, rng: random.Random) -> Tree:
    """A random draft tree of q_len nodes (root + q_len - 1 candidates) as EAGLE encodes it."""
    parent: dict[int, int | None] = {c: None for c in range(topk)}  # candidate -> parent candidate
    parent_list, step = [-1], list(range(topk))
    for s in range(1, depth):
        beams = rng.sample(step, min(topk, len(step)))
        step = []
        for m, beam in enumerate(beams):
            parent_list.append(beam)
            first = topk + (s - 1) * topk * topk + m * topk
            for t in range(topk):
                parent[first + t] = beam
                step.append(first + t)
    chosen: set[int] = set()
    while len(chosen) < q_len - 1:  # grow a set closed under ancestors
        frontier = [c for c in parent if c not in chosen and (parent[c] is None or parent[c] in chosen)]
        chosen.add(rng.choice(frontier))
    selected = sorted(chosen)
    node = {c: k + 1 for k, c in enumerate(selected)}
    rows = [1]
    for c in selected:
        p = parent[c]
        rows.append((1 << node[c]) | (rows[node[p]] if p is not None else 1))
    return Tree(parent_list, selected, rows)


def chain(q_len: int) -> Tree:
    """A chain (topk 1): node i's parent is node i - 1."""
    return eagle_tree(topk=1, depth=max(q_len - 1, 1), q_len=q_len, rng=random.Random(0))


def sglang_mask(trees: list[Tree], seq_lens: list[int], *, topk: int, q_len: int, mode: int) -> torch.Tensor:
    """The mask SGLang's tree kernel writes for these requests, in `mode` (flat, on the CPU): cells
    prefilled True (FULL_MASK / QLEN_ONLY) or 0 (packed) as build_tree_kernel_efficient does."""
    bs = len(trees)
    if mode == QLEN_ONLY_BITPACKING:
        width = 1 if q_len <= 8 else 2 if q_len <= 16 else 4
        raw = torch.zeros(bs * q_len * width, dtype=torch.uint8)
        for b, tree in enumerate(trees):
            for i in range(q_len):
                row = _kernel_row(tree, i, topk, q_len)
                for byte in range(width):
                    raw[(b * q_len + i) * width + byte] = (row >> (8 * byte)) & 0xFF
        return raw.view({1: torch.uint8, 2: torch.uint16, 4: torch.uint32}[width])
    cells = q_len * sum(seq_lens) + bs * q_len * q_len if mode == FULL_MASK else bs * q_len * q_len
    mask = torch.ones(cells, dtype=torch.bool)
    start = 0
    for b, (tree, n) in enumerate(zip(trees, seq_lens)):
        width = n + q_len if mode == FULL_MASK else q_len
        base = start if mode == FULL_MASK else b * q_len * q_len
        for i in range(q_len):
            row = _kernel_row(tree, i, topk, q_len)
            first = base + width * i + (n if mode == FULL_MASK else 0)
            for j in range(q_len):
                mask[first + j] = bool((row >> j) & 1)
        start += q_len * (n + q_len)
    return mask


def _kernel_row(tree: Tree, i: int, topk: int, q_len: int) -> int:
    """Row i as SGLang's kernel derives it: column 0 set, then node i and each ancestor found by
    parent_list[selected_index[pos] // topk] looked up among the selected ids."""
    row = 1
    pos = i - 1
    while i > 0:
        row |= 1 << (pos + 1)
        parent_tb = tree.selected_index[pos] // topk
        if parent_tb == 0:
            break
        token = tree.parent_list[parent_tb]
        pos = next(p for p in range(q_len - 1) if tree.selected_index[p] == token)
    return row
