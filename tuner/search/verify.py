"""`tuner configs verify`: keep the table true after a driver, CUDA or clock change. Each stored
best of this kernel on the local device is re-timed side by side with the heuristic default
(verify_tuner.measure.matrix, one call per row) and given a verdict:

- **stale**: it no longer wins -- the heuristic is faster by more than the noise, or the stored
  config now fails the correctness gate. The sidecar stops serving it (the heuristic answers that
  bucket, `source: heuristic`, the response naming the stale row) until a re-tune stores the key again.
- **moved**: it still wins, but its time moved from the stored one by more than the noise. It stays
  served (it is still faster than what would replace it); the row is due for a re-tune.
- **ok**: neither. **failed**: nothing could be measured (both configs failed): no verdict on the row.

The noise rule: a relative change counts only beyond max(MIN_NOISE, NOISE_SPREADS x the measured
relative p10-p90 spread of the two re-timings). Every verification is stored (nothing is
deleted) and logged with its measurements.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner import batches, buckets
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import format_label
from verify_tuner.measure.backend import Backend, Workload
from verify_tuner.measure.matrix import Cell, measure_matrix
from verify_tuner.search.plan_job import measured_by
from verify_tuner.store import best_configs, plans
from verify_tuner.store.models import Study
from verify_tuner.store.session import session_scope

log = logging.getLogger(__name__)

#: A change smaller than this is never a verdict, however quiet the measurement.
MIN_NOISE = 0.05
#: How many measured p10-p90 spreads a change must exceed.
NOISE_SPREADS = 3.0


def noise(*cells: Cell) -> float:
    return max(MIN_NOISE, NOISE_SPREADS * max((c.spread for c in cells if c.ok), default=0.0))


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    noise: float | None


def judge(*, stored_us: float | None, row: Cell, heuristic: Cell | None) -> Verdict:
    """The verdict on a row from its re-timing `row`, the heuristic's beside it (None: the row's
    config is the heuristic) and the time stored with it."""
    if not row.ok:
        if heuristic is not None and not heuristic.ok:
            return Verdict("failed", f"neither config could be measured: {row.reason}; {heuristic.reason}", None)
        return Verdict("stale", f"the stored config failed: {row.state} ({row.reason})", None)
    cells = [row] + ([heuristic] if heuristic is not None and heuristic.ok else [])
    tol = noise(*cells)
    now = row.median_us
    if heuristic is not None and heuristic.ok and now > heuristic.median_us * (1 + tol):  # type: ignore[operator]
        return Verdict(
            "stale",
            f"no longer wins: {now:.2f} us vs the heuristic's {heuristic.median_us:.2f} us "
            f"({now / heuristic.median_us:.3f}x, beyond the noise {tol:.1%})",  # type: ignore[operator]
            tol,
        )
    if stored_us and abs(now / stored_us - 1) > tol:  # type: ignore[operator]
        return Verdict("moved", f"time moved {stored_us:.2f} -> {now:.2f} us (beyond the noise {tol:.1%})", tol)
    return Verdict("ok", f"{now:.2f} us (stored {stored_us or float('nan'):.2f}), within the noise {tol:.1%}", tol)


def pick_rows(rows: list[best_configs.BestRow], sample: int | None) -> list[best_configs.BestRow]:
    """The rows to verify: all, or the `sample` least recently verified (never verified first, then
    oldest), so repeated runs walk the whole table. Deterministic: the key breaks ties."""
    never = dt.datetime.min.replace(tzinfo=dt.UTC)
    ordered = sorted(rows, key=lambda r: (r.verified_at or never, r.key))
    return ordered if sample is None else ordered[:sample]


def verify(
    *,
    backend: Backend,
    sessions: sessionmaker[Session],
    sample: int | None = None,
    rounds: int = 3,
    passes: int = 2,
) -> list[plans.VerificationRow]:
    """Verify stored bests of this kernel on the backend's device (module docstring); returns the
    verifications stored, in the order measured."""
    limits, khash = backend.limits, current_kernel_hash()
    with session_scope(sessions) as s:
        rows = [r for r in best_configs.list_best(session=s, device=limits.name) if r.key.kernel_hash == khash]
        rows = pick_rows(rows, sample)
        prefix_of = {r.key: _prefix(s, r) for r in rows}
    return [_verify_row(backend, sessions, r, prefix_of[r.key], rounds=rounds, passes=passes) for r in rows]


def _verify_row(
    backend: Backend, sessions: sessionmaker[Session], r: best_configs.BestRow, prefix: int, *, rounds: int, passes: int
) -> plans.VerificationRow:
    """Re-time one stored best beside the heuristic, judge it, store the verification and log it."""
    wl = _as_tuned(r, prefix)
    default = heuristic_config(
        backend.limits, H=wl.H, q_len=wl.q_len, prefix=wl.prefix, batch=wl.batch, kv_dtype=wl.kv_dtype
    )
    mx = measure_matrix(backend, list(dict.fromkeys([r.config, default])), [wl], rounds=rounds, passes=passes)
    heuristic = None if default == r.config else mx.cell(default, wl)
    rec = _verification(r, mx.cell(r.config, wl), default, heuristic, measured_by(backend.limits))
    with session_scope(sessions) as s:
        marked = plans.record_verification(session=s, v=rec)
    log.info(
        "verify %s prefix=%d batch=%d: %s %s (stored %s us, now %s us; heuristic %s %s us)%s",
        r.key,
        wl.prefix,
        wl.batch,
        rec.verdict,
        rec.reason,
        r.median_us,
        rec.measured_us,
        default,
        rec.heuristic_us,
        "" if marked or rec.verdict == "failed" else " -- the row changed meanwhile: not marked",
    )
    return rec


def _as_tuned(r: best_configs.BestRow, prefix: int) -> Workload:
    """The workload `r` was tuned under, timed as it was (back to back or cold): its stored time is
    the reference of "moved"."""
    batch = batches.by_index(r.key.batch_bucket).hi
    return Workload(r.key.H, r.key.q_len, prefix, kv_dtype=r.key.kv_dtype, batch=batch, neighbour_mb=r.neighbour_mb)


def _verification(
    r: best_configs.BestRow, row: Cell, default: KernelConfig, heuristic: Cell | None, by: str
) -> plans.VerificationRow:
    """What is kept of one verification: the row's and the heuristic's re-timings (the row's alone
    where the row's config is the heuristic) and the verdict on them."""
    v = judge(stored_us=r.median_us, row=row, heuristic=heuristic)
    h = heuristic or row
    return plans.VerificationRow(
        key=r.key,
        config=r.config,
        stored_us=r.median_us,
        measured_us=row.median_us,
        measured_p10_us=row.p10_us,
        measured_p90_us=row.p90_us,
        heuristic=default,
        heuristic_us=h.median_us,
        heuristic_p10_us=h.p10_us,
        heuristic_p90_us=h.p90_us,
        noise=v.noise,
        verdict=v.verdict,
        reason=v.reason,
        measured_by=by,
        neighbour_mb=r.neighbour_mb,
    )


def _prefix(session: Session, r: best_configs.BestRow) -> int:
    """The prefix the row was tuned at (its study's), else its bucket's middle."""
    if r.study_id is not None:
        st = session.get(Study, r.study_id)
        if st is not None:
            return st.prefix
    return buckets.by_index(r.key.bucket).mid


def describe(v: plans.VerificationRow) -> str:
    b, bb = buckets.by_index(v.key.bucket), batches.by_index(v.key.batch_bucket)
    return f"H={v.key.H} q_len={v.key.q_len}{format_label(v.key)} prefix[{b.lo},{b.hi}) B[{bb}] {v.config}: {v.verdict}: {v.reason}"
