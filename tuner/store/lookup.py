"""Answer "which config for (device, H, q_len, prefix, batch)": tuned, nearest tuned prefix
bucket of the same batch bucket, or the heuristic default for that batch. The API, the CLI and
the worker client's fallback all go through here."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import partial
from typing import Literal

from sqlalchemy.orm import Session
from verify_tuner import batches, buckets
from verify_tuner.errors import BadParameter
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.formats import kv_format
from verify_tuner.kernels.limits import DeviceLimits, known_device
from verify_tuner.keys import TableKey
from verify_tuner.store import best_configs, devices

#: A tuned neighbour bucket is served only this close (log2 of the prefix ratio): beyond it the
#: heuristic, which adapts to the prefix, is the better guess (a config tuned for 4k prefixes
#: is not one for an empty prefix).
NEAREST_MAX_OCTAVES = 1.0


#: Where an answer comes from: the bucket's own tuned row, the nearest tuned bucket's, or the heuristic.
Source = Literal["tuned", "nearest", "heuristic"]


@dataclass(frozen=True)
class Answer:
    config: KernelConfig
    source: Source
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
    kv_dtype: str = DEFAULT_KV_DTYPE  # the KV cache's format the answer is for (the key's)


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
                "sets one): name the GPU, e.g. device=h200 in a query, --device h200 on the command line",
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
    key: TableKey,
    bucket: buckets.Bucket,
    batch: batches.BatchBucket,
) -> Answer:
    """Exact bucket, else the nearest tuned prefix bucket (of the same batch bucket) within
    NEAREST_MAX_OCTAVES, else the heuristic at the bucket's representative prefix and batch (so
    /config and the /configs table always agree). A row verified stale is never served: its own
    bucket gets the heuristic (the verification measured it faster there), and no neighbour
    borrows it."""
    rows = [r for r in rows if r.key.batch_bucket == batch.index]
    exact = [r for r in rows if r.key.bucket == bucket.index]
    if exact and exact[0].stale:
        return _heuristic(limits, key, bucket, batch, stale=exact[0])
    rows = [r for r in rows if not r.stale]
    answer = partial(
        Answer, bucket=bucket, device=key.device, kernel_hash=key.kernel_hash, batch_bucket=batch, kv_dtype=key.kv_dtype
    )
    if exact:
        r = exact[0]
        return answer(
            r.config,
            "tuned",
            expected_us=r.median_us,
            speedup_vs_default=r.speedup,
            tuned_at=r.tuned_at,
            from_bucket=bucket.index,
            neighbour_mb=r.neighbour_mb,
        )
    near = best_configs.nearest_row(rows, bucket)
    if near is not None and buckets.log_distance(buckets.by_index(near.key.bucket), bucket) <= NEAREST_MAX_OCTAVES:
        return answer(
            near.config, "nearest", speedup_vs_default=near.speedup, tuned_at=near.tuned_at, from_bucket=near.key.bucket
        )
    return _heuristic(limits, key, bucket, batch)


def _heuristic(
    limits: DeviceLimits,
    key: TableKey,
    bucket: buckets.Bucket,
    batch: batches.BatchBucket,
    stale: best_configs.BestRow | None = None,
) -> Answer:
    try:
        cfg = heuristic_config(
            limits, H=key.H, q_len=key.q_len, prefix=bucket.mid, batch=batch.hi, kv_dtype=key.kv_dtype
        )
    except InvalidConfig as exc:
        raise BadParameter("q_len", f"no kernel config can run on {limits.name}: {exc}") from exc
    at = (stale.verified_at or stale.tuned_at) if stale is not None else None
    return Answer(
        cfg,
        "heuristic",
        bucket,
        key.device,
        key.kernel_hash,
        batch_bucket=batch,
        stale_verified_at=at,
        kv_dtype=key.kv_dtype,
    )


def _check_format(limits: DeviceLimits, key: TableKey) -> None:
    """A format the device cannot compute (fp8_e4m3_qk on an A100) is the request's kv_dtype that
    is wrong, not its q_len: say so by name before looking for a config."""
    reason = kv_format(key.kv_dtype).unsupported_reason(limits.cc_major * 10 + limits.cc_minor)
    if reason:
        raise BadParameter("kv_dtype", f"{reason} ({limits.name})")


def answer(*, session: Session, limits: DeviceLimits, key: TableKey, prefix: int, batch: int = 1) -> Answer:
    """The answer of `key`'s table (its device: `limits`') for a batch of `batch` requests whose
    lookup prefix (verify_tuner.batches.prefix_of) is `prefix`."""
    _check_format(limits, key)
    bb = batches.bucket_of(batch)
    rows = best_configs.list_best_for(session=session, table=key, batch_bucket=bb.index)
    return _pick(rows, limits=limits, key=key, bucket=buckets.bucket_of(prefix), batch=bb)


def table(
    *, session: Session, limits: DeviceLimits, key: TableKey, batch_buckets: list[int] | None = None
) -> list[Answer]:
    """The answer for every prefix bucket of each batch bucket (default: B=1 only), batch bucket
    major: what a worker caches at startup and looks up each step."""
    _check_format(limits, key)
    wanted = [batches.by_index(i) for i in (batch_buckets if batch_buckets is not None else [0])]
    rows = best_configs.list_best_for(session=session, table=key)
    return [_pick(rows, limits=limits, key=key, bucket=b, batch=bb) for bb in wanted for b in buckets.ALL]


def local_key(limits: DeviceLimits, *, H: int, q_len: int, kv_dtype: str) -> TableKey:
    """The table this host's kernel (this package's source) reads on `limits`' device."""
    return TableKey(limits.name, current_kernel_hash(), kv_dtype, H, q_len)
