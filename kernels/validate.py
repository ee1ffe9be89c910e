"""Decide, before compiling, whether a configuration can run for (device, H, q_len).

The resource formulas mirror the layout in csrc/verify_attention.cu; launch.py checks the
shared-memory figure against the compiled module (`kSmemBytes`), so the two cannot drift apart
silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from verify_tuner.kernels.config import (
    BLOCK_CHOICES,
    PIPE_CHOICES,
    SF_CHOICES,
    STAGES_CHOICES,
    TK_CHOICES,
    KernelConfig,
)
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import kv_format
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.shapes import D_QK, D_V

KSTRIDE = D_QK  # shared-memory row of Q, KV and the O staging (swizzled, no padding)
KSTEPS = D_QK // 16
MAX_Q_LEN = 64
MAX_NSPLIT = 1024
#: Registers a thread needs besides the accumulators and fragments the formula counts
#: (addresses, loop state, softmax); calibrated on ptxas -v reports for sm_80/90/120 (within
#: ~10 of ptxas near the 255 cap; tests/kernels/test_compile.py compiles the heuristic defaults of
#: a sample and checks they do not spill).
REG_OVERHEAD = 40


@dataclass(frozen=True)
class Shape:
    """The kernel's derived sizes for one config at one q_len (csrc names in comments)."""

    rows: int  # ROWS = HT * QT
    nr: int  # n8 row tiles
    warps: int
    mw: int  # PV: latent-dim m16 tiles per warp
    wt: int  # QK token groups
    mq: int  # QK m16 token tiles per warp
    nq: int  # QK n8 row tiles per warp

    @property
    def rows_padded(self) -> int:
        return self.nr * 8


def shape(cfg: KernelConfig, q_len: int) -> Shape:
    rows = cfg.ht * cfg.row_tile(q_len)
    nr = (rows + 7) // 8
    warps = cfg.block // 32
    wt = max(1, warps // groups(cfg) // (cfg.wr * cfg.wk))
    return Shape(
        rows=rows, nr=nr, warps=warps, mw=max(1, 32 // warps), wt=wt, mq=max(1, cfg.tk // 16 // wt), nq=-(-nr // cfg.wr)
    )


def groups(cfg: KernelConfig) -> int:
    """Warp groups that take turns at QK + softmax (NGROUPS): 2 in the seesaw (PIPE 3)."""
    return 2 if cfg.pipe == 3 else 1


def smem_bytes(cfg: KernelConfig, q_len: int, kv_dtype: str = "bf16") -> int:
    """Dynamic shared memory of the partial kernel, in bytes (SMEM_* in the .cu)."""
    rp = shape(cfg, q_len).rows_padded
    fmt = kv_format(kv_dtype)
    elem = fmt.staged_bytes
    q = rp * KSTRIDE * elem
    kv = cfg.stages * cfg.tk * fmt.ring_row_bytes
    g = groups(cfg)  # the seesaw: score buffers per group, P and alpha for two tiles
    scores = g * (cfg.wk // 2 if cfg.sf else cfg.wk) * rp * (cfg.tk + 4) * 4
    p = g * rp * (cfg.tk + 8) * elem
    # m, l, alpha per row (and q's row scale); two rescale flags, padding, the segment at hand and the next
    stats = (2 + g + fmt.q_row_scale) * rp * 4 + 48
    mask = cfg.row_tile(q_len) * 8
    slots = cfg.stages * cfg.tk * 4  # slot-index ring
    return q + kv + scores + p + stats + mask + slots


def registers_needed(cfg: KernelConfig, q_len: int) -> int:
    """Estimated registers per thread: the O^T accumulator, the larger of the QK and PV working
    sets and a calibrated overhead. QK's Q fragments count 2 registers a row tile, calibrated on
    ptxas near the cap: 72 rows in one row group (9 row tiles a warp, whose code loads two k-steps'
    fragments at once) build in 254-255 registers without spills on sm_80 and sm_90, both formats
    (tests/kernels/test_compile.py), where 4 a row tile had estimated 260."""
    s = shape(cfg, q_len)
    o_acc = s.mw * s.nr * 4
    qk = s.mq * s.nq * 4 + s.nq * 2 + s.mq * 4
    pv = s.nr * 2 + 4
    return o_acc + max(qk, pv) + REG_OVERHEAD


def max_registers_per_thread(cfg: KernelConfig, limits: DeviceLimits) -> int:
    per_thread = limits.regs_per_block // cfg.block
    return min(255, per_thread // 8 * 8)


def check(
    cfg: KernelConfig,
    limits: DeviceLimits,
    *,
    H: int,
    q_len: int,
    kv_dtype: str = "bf16",
) -> str | None:
    """The reason `cfg` cannot run on a `kv_dtype` cache, or None when it can."""
    try:
        fmt = kv_format(kv_dtype)
    except InvalidConfig as exc:
        return str(exc)
    reason = fmt.unsupported_reason(limits.cc_major * 10 + limits.cc_minor)
    if reason:
        return reason
    if H < 1:
        return f"H must be >= 1, got {H}"
    if not 1 <= q_len <= MAX_Q_LEN:
        return f"q_len must be in 1..{MAX_Q_LEN} (uint64 tree mask), got {q_len}"
    if H % cfg.ht:
        return f"HT={cfg.ht} does not divide H={H}"
    if cfg.tk not in TK_CHOICES:
        return f"TK={cfg.tk} not in {TK_CHOICES}"
    if cfg.block not in BLOCK_CHOICES:
        return f"BLOCK={cfg.block} not in {BLOCK_CHOICES}"
    if cfg.stages not in STAGES_CHOICES:
        return f"STAGES={cfg.stages} not in {STAGES_CHOICES}"
    if cfg.nsplit > MAX_NSPLIT:
        return f"NSPLIT={cfg.nsplit} over {MAX_NSPLIT}"
    if cfg.sf not in SF_CHOICES:
        return f"SF={cfg.sf} not in {SF_CHOICES}"
    if cfg.sf and cfg.wk % 2:
        return f"SF=1 folds pairs of k-slices: WK={cfg.wk} must be even"
    if cfg.pipe not in PIPE_CHOICES:
        return f"PIPE={cfg.pipe} not in {PIPE_CHOICES}"
    if cfg.qt >= q_len and cfg.qt != 0:
        return f"QT={cfg.qt} must be below q_len={q_len} (QT=0 holds all nodes in one block)"
    if cfg.block > limits.max_threads_per_block:
        return f"BLOCK={cfg.block} over the device's {limits.max_threads_per_block} threads per block"
    rope_steps = (D_QK - D_V) // 16
    if fmt.rope_apart and rope_steps % cfg.wk:
        return (
            f"WK={cfg.wk} does not divide the {rope_steps} rope k-steps, which {kv_dtype} stores apart "
            f"(bf16 after the scaled latent) and every k-slice must end on: WK 1, 2 or 4"
        )
    reason = _warp_grid_reason(cfg, q_len)
    if reason:
        return reason
    smem = smem_bytes(cfg, q_len, kv_dtype)
    if smem > limits.max_smem_optin:
        return (
            f"needs {smem} B shared memory per block, device allows {limits.max_smem_optin} B "
            f"(HT*QT={shape(cfg, q_len).rows} rows, TK={cfg.tk}, STAGES={cfg.stages}, WK={cfg.wk}, {kv_dtype})"
        )
    need = registers_needed(cfg, q_len)
    cap = max_registers_per_thread(cfg, limits)
    if need > cap:
        return (
            f"needs ~{need} registers per thread, BLOCK={cfg.block} allows {cap} "
            f"(HT*QT={shape(cfg, q_len).rows} rows): it would spill"
        )
    return None


def _warp_grid_reason(cfg: KernelConfig, q_len: int) -> str | None:
    """The static_asserts of the .cu on the QK warp grid, as messages."""
    s = shape(cfg, q_len)
    if cfg.pipe == 3 and (cfg.block != 256 or cfg.stages != 3):
        return "PIPE=3 (seesaw) runs two groups of 4 warps on 3 slots: needs BLOCK=256 and STAGES=3"
    qk_warps = s.warps // groups(cfg)
    if qk_warps % (cfg.wr * cfg.wk):
        group = " of a group" if cfg.pipe == 3 else ""
        return f"WR*WK={cfg.wr * cfg.wk} does not divide the {qk_warps} warps{group} of BLOCK={cfg.block}"
    if (cfg.tk // 16) % s.wt:
        return f"{s.wt} QK token groups (warps/(WR*WK)) do not tile TK={cfg.tk}"
    if KSTEPS % cfg.wk:
        return f"WK={cfg.wk} does not divide the {KSTEPS} k-steps"
    if cfg.wr > s.nr:
        return f"WR={cfg.wr} over the {s.nr} n8 row tiles of {s.rows} rows"
    return None


def validate(
    cfg: KernelConfig,
    limits: DeviceLimits,
    *,
    H: int,
    q_len: int,
    kv_dtype: str = "bf16",
) -> None:
    """Raise InvalidConfig with the reason when `cfg` cannot run on a `kv_dtype` cache."""
    reason = check(cfg, limits, H=H, q_len=q_len, kv_dtype=kv_dtype)
    if reason is not None:
        raise InvalidConfig(reason)
