"""Render the kernel's constants into its source and compile it, with an on-disk cache.

nvcc is invoked directly (the same call PyCUDA's compiler wrapper makes) so the cache, the
compile-only checks in CI and the GPU path share one code path; launch.py loads the cubin with
PyCUDA. The cache key hashes everything that can change the binary.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import CompileError
from verify_tuner.kernels.formats import kv_format

SOURCE = Path(__file__).parent / "csrc" / "verify_attention.cu"
KERNEL_NAME = "verify_attention"
#: Bump when the kernel's semantics or interface change; part of every cache key and DB key.
KERNEL_VERSION = "7"
NVCC_FLAGS = ("-O3", "-std=c++17", "--use_fast_math", "-lineinfo")


def render(cfg: KernelConfig, q_len: int, kv_dtype: str = "bf16") -> str:
    """The full source with sorted, validated #defines and a #line so errors point at the .cu."""
    consts = {**cfg.as_params(), "QN": q_len, "QT": cfg.row_tile(q_len), "KV_FMT": kv_format(kv_dtype).code}
    lines = []
    for name in sorted(consts):
        if not name.isidentifier():
            raise CompileError(f"bad constant name {name!r}")
        lines.append(f"#define {name} {int(consts[name])}")
    lines.append(f'#line 1 "{SOURCE.name}"')
    return "\n".join(lines) + "\n" + SOURCE.read_text()


@functools.cache
def kernel_hash() -> str:
    """Hash of the kernel source and version: identifies the kernel in the database."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(KERNEL_VERSION.encode())
    return h.hexdigest()[:16]


def nvcc_path() -> str:
    path = shutil.which("nvcc")
    if path is None:
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        candidate = Path(cuda_home) / "bin" / "nvcc"
        if candidate.exists():
            return str(candidate)
        raise CompileError("nvcc not found on PATH or in $CUDA_HOME/bin")
    return path


@functools.cache
def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Built:
    cubin: bytes
    path: Path
    ptxas_log: str
    cached: bool


def cache_key(source: str, arch: str, extra_flags: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    for part in (source, arch, " ".join(NVCC_FLAGS + extra_flags), nvcc_version(), KERNEL_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def compile_cubin(
    cfg: KernelConfig,
    q_len: int,
    arch: str,
    cache_dir: Path,
    extra_flags: tuple[str, ...] = (),
    kv_dtype: str = "bf16",
) -> Built:
    """Compile (or fetch from the cache) the cubin for `cfg` at `q_len` on `arch` (e.g. sm_90)
    reading a `kv_dtype` cache."""
    source = render(cfg, q_len, kv_dtype)
    key = cache_key(source, arch, extra_flags)
    c = cfg
    stem = (
        f"{KERNEL_NAME}_{arch}_{kv_dtype}_q{q_len}_ns{c.nsplit}_ht{c.ht}_tk{c.tk}_b{c.block}_st{c.stages}"
        f"_qt{c.row_tile(q_len)}_wr{c.wr}_wk{c.wk}_sf{c.sf}_p{c.pipe}_{key}"
    )
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"{stem}.cubin"
    log_path = cache_dir / f"{stem}.log"
    if target.exists():
        return Built(target.read_bytes(), target, _read(log_path), cached=True)
    with _build_lock(cache_dir / f"{stem}.lock"):
        if target.exists():  # another process built it while we waited for the lock
            return Built(target.read_bytes(), target, _read(log_path), cached=True)
        log = _run_nvcc(source, arch, target, extra_flags)
        _atomic_write(log_path, log.encode())
    return Built(target.read_bytes(), target, log, cached=False)


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, opened read-only: a lock file another user's tuner created
    (0644 in a shared TUNER_CACHE_DIR) is still one this user can lock, where opening it for
    writing would be refused."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_uid == os.geteuid():  # ours: 0644 whatever the umask, for the next user
            os.fchmod(fd, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run_nvcc(source: str, arch: str, target: Path, extra_flags: tuple[str, ...]) -> str:
    with tempfile.TemporaryDirectory(prefix="va-build-") as tmp:
        src = Path(tmp) / SOURCE.name
        src.write_text(source)
        out = Path(tmp) / "out.cubin"
        cmd = [
            nvcc_path(),
            "-cubin",
            f"-arch={arch}",
            *NVCC_FLAGS,
            *extra_flags,
            "-Xptxas",
            "-v",
            "-o",
            str(out),
            str(src),
        ]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)  # its stderr is the error
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed for {arch}:\n{proc.stderr.strip()[-4000:]}")
        _atomic_write(target, out.read_bytes())
        return proc.stderr


def _atomic_write(path: Path, data: bytes) -> None:
    from verify_tuner.files import write_shared  # 0644: TUNER_CACHE_DIR may be shared by tuners of other users

    write_shared(path, data)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def ptxas_report(log: str, function: str = "verify_attn_partial") -> dict[str, int]:
    """Registers, spill bytes and stack frame of `function` from nvcc's -Xptxas -v output."""
    import re

    block = log.split(f"Compiling entry function '{function}'", 1)
    if len(block) < 2:
        raise CompileError(f"no ptxas report for {function}")
    text = block[1].split("Compiling entry function", 1)[0]
    regs = re.search(r"Used (\d+) registers", text)
    spill_st = re.search(r"(\d+) bytes spill stores", text)
    spill_ld = re.search(r"(\d+) bytes spill loads", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "spill_stores": int(spill_st.group(1)) if spill_st else 0,
        "spill_loads": int(spill_ld.group(1)) if spill_ld else 0,
        "stack_frame": int(stack.group(1)) if stack else 0,
    }


def _compile_one(args: tuple[KernelConfig, int, str, str, tuple[str, ...], str]) -> str | None:
    cfg, q_len, arch, cache_dir, extra_flags, kv_dtype = args
    try:
        compile_cubin(cfg, q_len, arch, Path(cache_dir), extra_flags, kv_dtype)
    except CompileError as exc:
        return f"{cfg}: {exc}"
    return None


def precompile(
    configs: list[KernelConfig],
    q_len: int,
    arch: str,
    cache_dir: Path,
    workers: int | None = None,
    extra_flags: tuple[str, ...] = (),
    kv_dtype: str = "bf16",
) -> list[str]:
    """Fill the cache for many configs in parallel (nvcc is single-threaded); returns failures,
    which the measurement then reports per config."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(c, q_len, arch, str(cache_dir), extra_flags, kv_dtype) for c in configs]
    with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
        return [r for r in pool.map(_compile_one, jobs) if r]
