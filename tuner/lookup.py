"""Answer "which config for (device, H, q_len, prefix)": tuned, nearest tuned bucket, or the
heuristic default. The API, the CLI and the worker client's fallback all go through here."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.orm import Session

from kernels import kernel_hash as current_kernel_hash
from kernels.config import KernelConfig
from kernels.errors import InvalidConfig
from kernels.limits import DeviceLimits, known_device
from tuner import buckets
from tuner.db import repo
from tuner.errors import BadParameter
from tuner.heuristic import heuristic_config

#: A tuned neighbour bucket is served only this close (log2 of the prefix ratio): beyond it the
#: heuristic, which adapts to the prefix, is the better guess (a config tuned for 4k prefixes
#: is not one for an empty prefix).
NEAREST_MAX_OCTAVES = 1.0


@dataclass(frozen=True)
class Answer:
    config: KernelConfig
    source: str  # tuned | nearest | heuristic
    bucket: buckets.Bucket
    device: str
    kernel_hash: str
    expected_us: float | None = None
    speedup_vs_default: float | None = None
    tuned_at: dt.datetime | None = None
    from_bucket: int | None = None  # for "nearest": the bucket the config was tuned on


def resolve_device(*, session: Session, name: str | None, default: str | None) -> DeviceLimits:
    """Limits of the named device (else the sidecar's, else the only one recorded)."""
    name = name or default
    if name is None:
        devices = repo.list_devices(session=session)
        if len(devices) != 1:
            known = ", ".join(d.name for d in devices) or "none recorded"
            raise BadParameter("device", f"required: this service has no default device (recorded: {known})")
        return repo.device_limits(devices[0])
    dev = repo.get_device(session=session, name=name)
    if dev is not None:
        return repo.device_limits(dev)
    limits = known_device(name)
    if limits is not None:
        dev = repo.get_device(session=session, name=limits.name)
        return repo.device_limits(dev) if dev is not None else limits
    raise BadParameter("device", f"unknown device {name!r}: not recorded by the tuner and not a known GPU")


def _pick(rows: list[repo.BestRow], *, limits: DeviceLimits, H: int, q_len: int, bucket: buckets.Bucket,
          khash: str) -> Answer:
    """Exact bucket, else the nearest tuned bucket within NEAREST_MAX_OCTAVES, else the heuristic
    at the bucket's representative prefix (so /config and the /configs table always agree)."""
    exact = [r for r in rows if r.key.bucket == bucket.index]
    if exact:
        r = exact[0]
        return Answer(r.config, "tuned", bucket, limits.name, khash, r.median_us, r.speedup, r.tuned_at, bucket.index)
    r = repo.nearest_row(rows, bucket)
    if r is not None and buckets.log_distance(buckets.by_index(r.key.bucket), bucket) <= NEAREST_MAX_OCTAVES:
        return Answer(r.config, "nearest", bucket, limits.name, khash, None, r.speedup, r.tuned_at, r.key.bucket)
    try:
        cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=bucket.mid)
    except InvalidConfig as exc:
        raise BadParameter("q_len", f"no kernel config can run on {limits.name}: {exc}") from exc
    return Answer(cfg, "heuristic", bucket, limits.name, khash)


def answer(*, session: Session, limits: DeviceLimits, H: int, q_len: int, prefix: int, dtype: str = "bf16",
           kernel_hash: str | None = None) -> Answer:
    khash = kernel_hash or current_kernel_hash()
    rows = repo.list_best_for(session=session, device=limits.name, kernel_hash=khash, dtype=dtype, H=H, q_len=q_len)
    return _pick(rows, limits=limits, H=H, q_len=q_len, bucket=buckets.bucket_of(prefix), khash=khash)


def table(*, session: Session, limits: DeviceLimits, H: int, q_len: int, dtype: str = "bf16",
          kernel_hash: str | None = None) -> list[Answer]:
    """The answer for every bucket: what a worker caches at startup and looks up each step."""
    khash = kernel_hash or current_kernel_hash()
    rows = repo.list_best_for(session=session, device=limits.name, kernel_hash=khash, dtype=dtype, H=H, q_len=q_len)
    return [_pick(rows, limits=limits, H=H, q_len=q_len, bucket=b, khash=khash) for b in buckets.ALL]
