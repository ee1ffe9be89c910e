"""Decide, before compiling, whether a configuration can run for (device, H, q_len).

The resource formulas mirror the layout in csrc/verify_attention.cu; build.py checks the
shared-memory figure against the compiled module, so the two cannot drift apart silently.
"""

from __future__ import annotations

from kernels.config import BLOCK_CHOICES, STAGES_CHOICES, TK_CHOICES, KernelConfig
from kernels.errors import InvalidConfig
from kernels.limits import DeviceLimits

D_QK, D_V = 576, 512
KSTRIDE = D_QK + 8
MAX_Q_LEN = 64
MAX_NSPLIT = 1024
#: Registers a thread needs besides the O accumulator and its B fragments (addresses, softmax,
#: loop state); calibrated on ptxas -v reports for sm_90 (see kernels/NOTES.md).
REG_OVERHEAD = 24


def rows_padded(ht: int, q_len: int) -> int:
    return (ht * q_len + 7) // 8 * 8


def smem_bytes(cfg: KernelConfig, q_len: int) -> int:
    """Dynamic shared memory of the partial kernel, in bytes."""
    rp = rows_padded(cfg.ht, q_len)
    q = rp * KSTRIDE * 2
    kv = cfg.stages * cfg.tk * KSTRIDE * 2
    scores = rp * (cfg.tk + 4) * 4
    stats = 3 * rp * 4
    mask = q_len * 8
    slots = cfg.tk * 4
    return q + kv + scores + stats + mask + slots


def accumulator_registers(cfg: KernelConfig, q_len: int) -> int:
    """fp32 registers per thread holding the O^T accumulator plus the P^T fragments."""
    nr = rows_padded(cfg.ht, q_len) // 8
    warps = cfg.block // 32
    return (D_V // 16 // warps) * nr * 4 + 2 * nr


def max_registers_per_thread(cfg: KernelConfig, limits: DeviceLimits) -> int:
    per_thread = limits.regs_per_block // cfg.block
    return min(255, per_thread // 8 * 8)


def check(cfg: KernelConfig, limits: DeviceLimits, *, H: int, q_len: int) -> str | None:
    """The reason `cfg` cannot run, or None when it can."""
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
    if cfg.block > limits.max_threads_per_block:
        return f"BLOCK={cfg.block} over the device's {limits.max_threads_per_block} threads per block"
    smem = smem_bytes(cfg, q_len)
    if smem > limits.max_smem_optin:
        return (
            f"needs {smem} B shared memory per block, device allows {limits.max_smem_optin} B "
            f"(HT*q_len={cfg.ht * q_len} rows, TK={cfg.tk}, STAGES={cfg.stages})"
        )
    need = accumulator_registers(cfg, q_len) + REG_OVERHEAD
    cap = max_registers_per_thread(cfg, limits)
    if need > cap:
        return (
            f"accumulator needs >= {need} registers per thread, BLOCK={cfg.block} allows {cap} "
            f"(HT*q_len={cfg.ht * q_len} rows): it would spill"
        )
    return None


def validate(cfg: KernelConfig, limits: DeviceLimits, *, H: int, q_len: int) -> None:
    """Raise InvalidConfig with the reason when `cfg` cannot run."""
    reason = check(cfg, limits, H=H, q_len=q_len)
    if reason is not None:
        raise InvalidConfig(reason)
