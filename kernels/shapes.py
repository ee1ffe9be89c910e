"""The kernel's dimensions and its cost model: the one home of the MLA sizes, the bytes that must
move once and the FLOPs, which the tuner's report, the benchmarks and the docs' limits use."""

from __future__ import annotations

from verify_tuner.kernels.formats import ITEMSIZE, kv_format

#: Latent dims of q/k (576 = 512 + 64 rope) and of v / o.
D_QK, D_V = 576, 512
#: q and o are bf16 whatever the cache holds (the engine's activations), as are the partials.
Q_DTYPE = "bfloat16"
Q_BYTES = ITEMSIZE[Q_DTYPE]


def floor_bytes(prefix_lens: list[int], *, q_len: int, H: int, kv_dtype: str = "bf16") -> int:
    """Bytes that must move once: the KV rows of every prefix and draft token (in the cache's
    format), q in, o out."""
    tokens = sum(prefix_lens) + len(prefix_lens) * q_len
    return tokens * kv_format(kv_dtype).row_bytes + len(prefix_lens) * q_len * H * (D_QK + D_V) * Q_BYTES


def flops(prefix_lens: list[int], *, q_len: int, H: int) -> int:
    """QK and PV FLOPs of every (node, head) over every visible-or-not token (the kernel computes
    masked scores too): 2 * q_len * H * tokens * (576 + 512)."""
    tokens = sum(prefix_lens) + len(prefix_lens) * q_len
    return 2 * q_len * H * tokens * (D_QK + D_V)
