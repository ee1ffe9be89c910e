"""Device limits the kernel must fit, read from the device or from a table of known GPUs.

Nothing here imports PyCUDA at module level: the API sidecar uses the table on machines
without CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    max_smem_optin: int  # bytes per block, opt-in
    smem_per_sm: int
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_threads_per_block: int = 1024
    l2_bytes: int = 0
    driver_version: str | None = None
    cuda_version: str | None = None
    #: Measured device-to-device copy bandwidth (read + write), for memory-floor estimates.
    copy_bw_gbps: float | None = None

    @property
    def arch(self) -> str:
        """nvcc's -arch value for this device, e.g. sm_90 or sm_120."""
        return f"sm_{self.cc_major}{self.cc_minor}"

    @property
    def compute_capability(self) -> str:
        return f"{self.cc_major}.{self.cc_minor}"


_KB = 1024
#: Published limits of GPUs users run; used when the database holds no measured record.
KNOWN_DEVICES: dict[str, DeviceLimits] = {
    d.name: d
    for d in (
        DeviceLimits("NVIDIA H200", 9, 0, 132, 227 * _KB, 228 * _KB, l2_bytes=60 * 1024 * _KB),
        DeviceLimits("NVIDIA H100 80GB HBM3", 9, 0, 132, 227 * _KB, 228 * _KB, l2_bytes=50 * 1024 * _KB),
        DeviceLimits(
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            12,
            0,
            188,
            99 * _KB,
            100 * _KB,
            max_threads_per_block=1024,
            l2_bytes=128 * 1024 * _KB,
        ),
        DeviceLimits("NVIDIA A100-SXM4-80GB", 8, 0, 108, 163 * _KB, 164 * _KB, l2_bytes=40 * 1024 * _KB),
        DeviceLimits("NVIDIA L40S", 8, 9, 142, 99 * _KB, 100 * _KB, l2_bytes=96 * 1024 * _KB),
    )
}
#: Short names an operator may give for a known device (`--device h200`).
ALIASES = {
    "h200": "NVIDIA H200",
    "h100": "NVIDIA H100 80GB HBM3",
    "rtx-pro-6000": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "a100": "NVIDIA A100-SXM4-80GB",
    "l40s": "NVIDIA L40S",
}


#: Variants that share a known device's limits, by name prefix (normalised as below).
_FAMILIES = {
    "nvidia h200": "NVIDIA H200",  # H200 NVL
    "nvidia rtx pro 6000 blackwell": "NVIDIA RTX PRO 6000 Blackwell Server Edition",  # workstation, max-q
}


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").lower().split())


_BY_NORM = {_norm(n): n for n in KNOWN_DEVICES}


def known_device(name: str) -> DeviceLimits | None:
    """Look a device up by its CUDA name, spelled as torch or the engines spell it (`NVIDIA
    H200`, `NVIDIA_H200`), a short alias (h200, rtx-pro-6000, ...) or a variant of a known
    family (`NVIDIA H200 NVL`); None when unknown."""
    key = ALIASES.get(name.lower()) or _BY_NORM.get(_norm(name))
    if key is None:
        n = _norm(name)
        family = max((f for f in _FAMILIES if n == f or n.startswith(f + " ")), key=len, default=None)
        key = _FAMILIES.get(family) if family else None
    return KNOWN_DEVICES.get(key) if key else None


def same_device(a: str, b: str) -> bool:
    """Whether two names mean one device's limits: the same name however spelt, or two names
    (aliases, family variants) of one known device."""
    if _norm(a) == _norm(b):
        return True
    la, lb = known_device(a), known_device(b)
    return la is not None and lb is not None and la.name == lb.name


def read_device_limits(ordinal: int = 0) -> DeviceLimits:
    """Query the limits of CUDA device `ordinal` through PyCUDA (GPU path only)."""
    import pycuda.driver as cuda

    cuda.init()
    dev = cuda.Device(ordinal)
    a = cuda.device_attribute
    major, minor = dev.compute_capability()
    drv = cuda.get_driver_version()
    return DeviceLimits(
        name=dev.name(),
        cc_major=major,
        cc_minor=minor,
        sm_count=dev.get_attribute(a.MULTIPROCESSOR_COUNT),
        max_smem_optin=dev.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        smem_per_sm=dev.get_attribute(a.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        regs_per_sm=dev.get_attribute(a.MAX_REGISTERS_PER_MULTIPROCESSOR),
        regs_per_block=dev.get_attribute(a.MAX_REGISTERS_PER_BLOCK),
        max_threads_per_block=dev.get_attribute(a.MAX_THREADS_PER_BLOCK),
        l2_bytes=dev.get_attribute(a.L2_CACHE_SIZE),
        driver_version=f"{drv // 1000}.{drv % 1000 // 10}",
        cuda_version=".".join(str(v) for v in cuda.get_version()),
    )
