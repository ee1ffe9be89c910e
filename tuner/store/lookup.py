"""Answer "which config for (device, H, q_len, prefix, batch)": tuned, nearest tuned prefix
bucket of the same batch bucket, or the heuristic default for that batch. The API, the CLI and
the worker client's fallback all go through here."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy.orm import Session
from verify_tuner import batches, buckets
from verify_tuner.errors import BadParameter
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import DeviceLimits, known_device
from verify_tuner.store import best_configs, devices, plans

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
    batch_bucket: batches.BatchBucket = batches.ALL[0]  # never crossed: tuned rows of this one only
    #: the bucket's tuned row was verified stale then (`tuner configs verify`): the heuristic answers
    stale_verified_at: dt.datetime | None = None
    #: how expected_us was measured (verify_tuner.measure.backend.Workload.neighbour_mb); None without a time
    neighbour_mb: int | None = None


def resolve_device(*, session: Session, name: str | None, default: str | None) -> DeviceLimits:
    """Limits of the named device (else the sidecar's, else the only one recorded)."""
    name = name or default
    if name is None:
        recorded = devices.list_devices(session=session)
        if len(recorded) != 1:
            known = f"recorded: {', '.join(d.name for d in recorded)}" if recorded else "none recorded"
            raise BadParameter(
                "device",
                f"required: there is no default device ({known}; `tuner serve --device h200` or TUNER_DEVICE "
                "sets one): name the GPU, e.g. device=h200",
            )
        return devices.device_limits(recorded[0])
    dev = devices.get_device(session=session, name=name)
    if dev is not None:
        return devices.device_limits(dev)
    limits = known_device(name)
    if limits is not None:
        dev = devices.get_device(session=session, name=limits.name)
        return devices.device_limits(dev) if dev is not None else limits
    raise BadParameter("device", f"unknown device {name!r}: not recorded by the tuner and not a known GPU")


def device_name(*, session: Session, name: str | None) -> str | None:
    """The recorded name an operator's --device means (an alias such as h200 → NVIDIA H200), or None
    for every device; an unknown one raises BadParameter, so a filter never silently matches nothing."""
    return None if name is None else resolve_device(session=session, name=name, default=None).name


def _pick(
    rows: list[best_configs.BestRow],
    *,
    limits: DeviceLimits,
    H: int,
    q_len: int,
    bucket: buckets.Bucket,
    batch: batches.BatchBucket,
    khash: str,
) -> Answer:
    """Exact bucket, else the nearest tuned prefix bucket (of the same batch bucket) within
    NEAREST_MAX_OCTAVES, else the heuristic at the bucket's representative prefix and batch (so
    /config and the /configs table always agree). A row verified stale is never served: its own
    bucket gets the heuristic (the verification measured it faster there), and no neighbour
    borrows it."""
    rows = [r for r in rows if r.key.batch_bucket == batch.index]
    exact = [r for r in rows if r.key.bucket == bucket.index]
    if exact and exact[0].stale:
        return _heuristic(limits, H=H, q_len=q_len, bucket=bucket, batch=batch, khash=khash, stale=exact[0])
    rows = [r for r in rows if not r.stale]
    if exact:
        r = exact[0]
        return Answer(
            r.config,
            "tuned",
            bucket,
            limits.name,
            khash,
            r.median_us,
            r.speedup,
            r.tuned_at,
            bucket.index,
            batch,
            neighbour_mb=r.neighbour_mb,
        )
    r = best_configs.nearest_row(rows, bucket)
    if r is not None and buckets.log_distance(buckets.by_index(r.key.bucket), bucket) <= NEAREST_MAX_OCTAVES:
        return Answer(r.config, "nearest", bucket, limits.name, khash, None, r.speedup, r.tuned_at, r.key.bucket, batch)
    return _heuristic(limits, H=H, q_len=q_len, bucket=bucket, batch=batch, khash=khash)


def _heuristic(
    limits: DeviceLimits,
    *,
    H: int,
    q_len: int,
    bucket: buckets.Bucket,
    batch: batches.BatchBucket,
    khash: str,
    stale: best_configs.BestRow | None = None,
) -> Answer:
    try:
        cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=bucket.mid, batch=batch.hi)
    except InvalidConfig as exc:
        raise BadParameter("q_len", f"no kernel config can run on {limits.name}: {exc}") from exc
    at = (stale.verified_at or stale.tuned_at) if stale is not None else None
    return Answer(cfg, "heuristic", bucket, limits.name, khash, batch_bucket=batch, stale_verified_at=at)


def answer(
    *,
    session: Session,
    limits: DeviceLimits,
    H: int,
    q_len: int,
    prefix: int,
    batch: int = 1,
    dtype: str = "bf16",
    kernel_hash: str | None = None,
) -> Answer:
    """`prefix` is the batch's lookup prefix (verify_tuner.batches.prefix_of)."""
    khash = kernel_hash or current_kernel_hash()
    bb = batches.bucket_of(batch)
    rows = best_configs.list_best_for(
        session=session, device=limits.name, kernel_hash=khash, dtype=dtype, H=H, q_len=q_len, batch_bucket=bb.index
    )
    return _pick(rows, limits=limits, H=H, q_len=q_len, bucket=buckets.bucket_of(prefix), batch=bb, khash=khash)


def table(
    *,
    session: Session,
    limits: DeviceLimits,
    H: int,
    q_len: int,
    dtype: str = "bf16",
    kernel_hash: str | None = None,
    batch_buckets: list[int] | None = None,
) -> list[Answer]:
    """The answer for every prefix bucket of each batch bucket (default: B=1 only), batch bucket
    major: what a worker caches at startup and looks up each step."""
    khash = kernel_hash or current_kernel_hash()
    wanted = [batches.by_index(i) for i in (batch_buckets if batch_buckets is not None else [0])]
    rows = best_configs.list_best_for(
        session=session, device=limits.name, kernel_hash=khash, dtype=dtype, H=H, q_len=q_len
    )
    return [
        _pick(rows, limits=limits, H=H, q_len=q_len, bucket=b, batch=bb, khash=khash)
        for bb in wanted
        for b in buckets.ALL
    ]


def graph_plans(
    *, session: Session, limits: DeviceLimits, H: int, q_len: int, dtype: str = "bf16", kernel_hash: str | None = None
) -> dict[int, plans.PlanRow]:
    """The graph plan served per batch bucket index (verify_tuner.store.plans.served_plans)."""
    return plans.served_plans(
        session=session,
        device=limits.name,
        kernel_hash=kernel_hash or current_kernel_hash(),
        dtype=dtype,
        H=H,
        q_len=q_len,
    )
