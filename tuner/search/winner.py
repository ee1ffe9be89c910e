"""The winner of a key: the top candidates of its study, the default and the stored best re-timed
interleaved on the same inputs (verify_tuner.measure.backend.Backend.remeasure), and the config database updated
unless the stored best is within the measured noise of the new winner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import Backend, Measurement, Workload
from verify_tuner.store import best_configs
from verify_tuner.store.session import session_scope


@dataclass(frozen=True)
class Winner:
    """What the winner phase decided: the best config and its timing (None when nothing passed),
    the default's timing beside it, whether the best was stored, and why."""

    reason: str
    best: KernelConfig | None = None
    best_m: Measurement | None = None
    default_m: Measurement | None = None
    stored: bool = False


def _noise(m: Measurement) -> float:
    return max((m.p90_us or 0) - (m.p10_us or 0), 0.0) / 2


def _pool(
    top: list[KernelConfig],
    ranked: list[KernelConfig],
    default: KernelConfig | None,
    incumbent: KernelConfig | None,
    backend: Backend,
    workload: Workload,
) -> tuple[list[KernelConfig], KernelConfig | None]:
    """The configs to re-time (the top ones, the default, the stored best) and the stored best
    that stays in the running (None once it fails the gate)."""
    pool = list(top)
    # a default the search never measured must pass the correctness gate before it is timed
    if default is not None and default not in pool and (default in ranked or backend.measure(default, workload).ok):
        pool.append(default)
    if incumbent is not None and incumbent not in pool:
        if backend.measure(incumbent, workload).ok:
            pool.append(incumbent)
        else:
            incumbent = None
    return pool, incumbent


def _incumbent(sessions: sessionmaker[Session], key: ConfigKey, backend: Backend) -> KernelConfig | None:
    """The stored best, if it fits this device (one imported for another device's limits was
    never compiled here: it is simply replaced)."""
    with session_scope(sessions) as s:
        stored = best_configs.get_best(session=s, key=key)
    if stored is None or check(stored.config, backend.limits, H=key.H, q_len=key.q_len, kv_dtype=key.kv_dtype):
        return None
    return stored.config


def _decide(
    top: list[KernelConfig],
    by_cfg: dict[KernelConfig, Measurement],
    default: KernelConfig | None,
    incumbent: KernelConfig | None,
) -> Winner:
    """The fastest of the top configs and the default, unless the stored best is within noise."""
    # the default competes too: a search restricted away from it (`--only`), or one whose top
    # configs lose in the re-timing, must not store a config slower than what workers already run
    contenders = top + [default] if default is not None and default in by_cfg and default not in top else top
    best = min(contenders, key=lambda c: by_cfg[c].median_us)  # type: ignore[arg-type, return-value]
    default_m = by_cfg.get(default) if default is not None else None
    if incumbent is not None and incumbent != best:
        inc_m, best_m = by_cfg[incumbent], by_cfg[best]
        gain = inc_m.median_us - best_m.median_us  # type: ignore[operator]
        if gain <= max(_noise(inc_m), _noise(best_m)):
            reason = f"kept stored best: new winner only {gain:.2f} us faster, within noise"
            return Winner(reason, incumbent, inc_m, default_m)
    reason = "stored new best" if incumbent != best else "stored best re-timed"
    return Winner(reason, best, by_cfg[best], default_m)


def pick_winner(
    *,
    key: ConfigKey,
    study_id: int,
    default: KernelConfig | None,
    ranked: list[KernelConfig],
    backend: Backend,
    sessions: sessionmaker[Session],
    workload: Workload,
    top_k: int,
    rounds: int,
    owns: Callable[[], bool] | None = None,
) -> Winner:
    """Re-measure the `top_k` fastest of `ranked` (the study's gated configs, fastest first), the
    default and the stored best interleaved; the fastest of the top configs and the default wins
    and is stored unless the stored best is within the measured noise of it."""
    top = ranked[:top_k]
    if not top:
        return Winner("no config passed the correctness gate: nothing stored")
    pool, incumbent = _pool(top, ranked, default, _incumbent(sessions, key, backend), backend, workload)
    ms = backend.remeasure(pool, workload, rounds)
    if not all(m.ok for m in ms):
        return Winner(f"re-measurement failed: {[m.reason for m in ms if not m.ok]}; nothing stored")
    won = _decide(top, dict(zip(pool, ms)), default, incumbent)
    if owns is not None and not owns():
        reason = "claim lost while re-timing (this process stalled): the new owner stores this key"
        return Winner(reason, won.best, won.best_m, won.default_m)
    m = won.best_m
    assert won.best is not None and m is not None
    with session_scope(sessions) as s:
        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(
                key,
                won.best,
                m.median_us,
                m.p10_us,
                m.p90_us,
                default_us=won.default_m.median_us if won.default_m else None,
                study_id=study_id,
                neighbour_mb=workload.neighbour_mb,
            ),
        )
    return Winner(won.reason, won.best, m, won.default_m, stored=True)
