"""The KV-cache formats the kernel knows: one row each, the one place element types and sizes live.

A format is what an engine's pool holds (element type, bytes a token's row, how it is scaled)
together with how the kernel computes on it (the type its MMAs read). Rendering (the .cu's KV_FMT),
validation (shared-memory sizes), the ABI checks (the pool's accepted dtypes and row width), the
cost model (bytes a token), the build cache's and the cubin bundle's keys read this table, and the
tuning key's `kv_dtype` takes its values from it (verify_tuner.keys). A format the current kernel
does not read yet is listed, so that a request for it is refused by name rather than as unknown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verify_tuner.kernels.errors import InvalidConfig

#: Bytes of one element of each torch dtype a pool or q may be stored as.
ITEMSIZE = {"bfloat16": 2, "float16": 2, "uint8": 1, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class KVFormat:
    name: str  # the key's kv_dtype value
    code: int  # KV_FMT in csrc/verify_attention.cu
    element: str  # the latent's stored element type
    row_bytes: int  # bytes of one token's row in the pool (576 latent + rope dims, plus any scales)
    scale: str  # "none"; "per_layer": one fp32 scale for the layer's cache (the op's kv_scale); "per_128":
    #   an fp32 scale for each 128 latent dims in every row (no kv_scale)
    mma: str  # the element type the QK MMAs read ("bf16", "f16" after dequantizing, "e4m3")
    pool_dtypes: tuple[str, ...]  # torch dtypes the op accepts for the pool
    staged_bytes: int  # bytes of one element of Q and P in shared memory
    ring_row_bytes: int  # bytes of a token's row in a KV ring slot (1152 bf16 rows; 592 e4m3 rows)
    q_row_scale: bool  # q is rescaled per row in shared memory (a float a row of the block)
    rope_apart: bool  # the 64 rope dims are stored apart (bf16 after the scaled latent): QK's k-slices end on them
    min_cc: int  # lowest compute capability (10 * major + minor) with the instructions it needs
    kernel_reads: bool  # the current kernel reads it; otherwise it is refused by name
    about: str
    #: why a format the kernel reads is held back (its GPU tests fail): refused with this reason
    #: unless named in $VERIFY_TUNER_RUN_WITHHELD, which its GPU tests and diagnostics set to run it
    withheld: str | None = None

    def pool_row_elems(self, pool_dtype: str) -> int:
        """Elements of a token's row in a pool stored as `pool_dtype` (576 bf16, 576 uint8, ...)."""
        return self.row_bytes // ITEMSIZE[pool_dtype]

    def unsupported_reason(self, cc: int | None = None) -> str | None:
        """Why this format cannot be computed (by this kernel, or on compute capability `cc`), or None."""
        if not self.kernel_reads:
            return f"kv_dtype {self.name} ({self.about}) is not read by this kernel version yet"
        if self.withheld and self.name not in os.environ.get(RUN_WITHHELD_ENV, "").split(","):
            return f"kv_dtype {self.name} is withheld: {self.withheld}"
        if cc is not None and cc < self.min_cc:
            return (
                f"kv_dtype {self.name} needs compute capability {self.min_cc / 10:.1f}+, the device has {cc / 10:.1f}"
            )
        return None


#: Names the formats a process runs although they are withheld (comma-separated): for their GPU
#: tests and diagnostics, never for serving.
RUN_WITHHELD_ENV = "VERIFY_TUNER_RUN_WITHHELD"
_E4M3_POOL = ("uint8", "float8_e4m3fn")  # SGLang stores e4m3 as uint8; torch's own fp8 dtype is taken too
#: An e4m3 row in the ring (the kernel converts fragments in registers): 576 bytes in 37 16-byte
#: chunks (odd: ldmatrix's eight rows fall on eight bank quads without a swizzle)
E4M3_RING_ROW = 592
#: FlashMLA's "fp8 with scale" row: 512 e4m3 latent dims, an fp32 scale for each 128 of them, the
#: 64 rope dims in bf16 (656 bytes: 41 16-byte chunks, odd, so the ring keeps it as stored)
DS_MLA_NOPE, DS_MLA_BLOCK, DS_MLA_ROPE = 512, 128, 64
DS_MLA_ROW = DS_MLA_NOPE + 4 * (DS_MLA_NOPE // DS_MLA_BLOCK) + 2 * DS_MLA_ROPE
FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat(
            name="bf16", code=0, element="bf16", row_bytes=1152, scale="none", mma="bf16",
            pool_dtypes=("bfloat16",), staged_bytes=2, ring_row_bytes=1152, q_row_scale=False, rope_apart=False,
            min_cc=80, kernel_reads=True,
            about="bf16 latent rows, read as stored",
        ),
        KVFormat(
            name="fp8_e4m3", code=1, element="e4m3", row_bytes=576, scale="per_layer", mma="f16",
            pool_dtypes=_E4M3_POOL, staged_bytes=2, ring_row_bytes=E4M3_RING_ROW, q_row_scale=True, rope_apart=False,
            min_cc=80, kernel_reads=True,
            about="e4m3 latent rows with one fp32 scale a layer (SGLang --kv-cache-dtype fp8_e4m3, vLLM fp8), "
            "dequantized to f16 in registers",
        ),
        KVFormat(
            name="fp8_e4m3_qk", code=2, element="e4m3", row_bytes=576, scale="per_layer", mma="e4m3",
            pool_dtypes=_E4M3_POOL, staged_bytes=2, ring_row_bytes=E4M3_RING_ROW, q_row_scale=True, rope_apart=False,
            min_cc=89, kernel_reads=True,
            about="the fp8_e4m3 cache with QK on e4m3 MMAs, q quantized to e4m3 per row",
        ),
        KVFormat(
            name="fp8_ds_mla", code=3, element="e4m3", row_bytes=DS_MLA_ROW, scale="per_128", mma="f16",
            pool_dtypes=_E4M3_POOL, staged_bytes=2, ring_row_bytes=DS_MLA_ROW, q_row_scale=True, rope_apart=True,
            min_cc=80, kernel_reads=True,
            about="FlashMLA's fp8 with scale (SGLang's DeepSeek-V3.2 fp8 pool): 512 e4m3, 4 fp32 scales (one per "
            "128 dims), 64 bf16 rope dims a row; the latent dequantized to f16 in registers, the rope read as bf16",
            withheld="its GPU tests fail (relative error 0.18-0.63 against the reference on the dequantized rows; "
            "docs/kernel.md, Cache formats)",
        ),
    )
}  # fmt: skip
DEFAULT = "bf16"
#: The formats the kernel reads (the rest are refused by name; a withheld one with its reason).
KV_DTYPES = tuple(name for name, f in FORMATS.items() if f.kernel_reads)


def kv_format(name: str) -> KVFormat:
    """The format named `name`; InvalidConfig naming the accepted ones otherwise."""
    f = FORMATS.get(name)
    if f is None:
        raise InvalidConfig(f"unknown kv_dtype {name!r}: one of {', '.join(FORMATS)}")
    return f


def readable(name: str, cc: int | None = None) -> KVFormat:
    """The format named `name` if this kernel computes on it (on compute capability `cc`); InvalidConfig otherwise."""
    f = kv_format(name)
    reason = f.unsupported_reason(cc)
    if reason:
        raise InvalidConfig(reason)
    return f
