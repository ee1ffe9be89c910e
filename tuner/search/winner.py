"""The winner of a key: the top candidates of its study, the default and the stored best re-timed
interleaved on the same inputs (verify_tuner.measure.backend.Backend.remeasure), and the config database updated
unless the stored best is within the measured noise of the new winner."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.validate import check
from verify_tuner.measure.backend import Backend, Measurement, Workload
from verify_tuner.search.outcome import Outcome
from verify_tuner.store import repo
from verify_tuner.store.session import session_scope


def _noise(m: Measurement) -> float:
    return max((m.p90_us or 0) - (m.p10_us or 0), 0.0) / 2


def pick_winner(
    out: Outcome,
    *,
    ranked: list[KernelConfig],
    backend: Backend,
    sessions: sessionmaker[Session],
    workload: Workload,
    top_k: int,
    rounds: int,
    owns: Callable[[], bool] | None = None,
) -> None:
    """Re-measure the `top_k` fastest of `ranked` (the study's gated configs, fastest first), the
    default and the stored best interleaved; the fastest of the top configs and the default wins
    and is stored unless the stored best is within the measured noise of it. Fills `out` (best,
    default timing, decision, stored)."""
    top = ranked[:top_k]
    if not top:
        out.decision = "no config passed the correctness gate: nothing stored"
        return
    with session_scope(sessions) as s:
        stored = repo.get_best(session=s, key=out.key)
    pool = list(top)
    default = out.default
    # a default the search never measured must pass the correctness gate before it is timed
    if default is not None and default not in pool and (default in ranked or backend.measure(default, workload).ok):
        pool.append(default)
    incumbent = stored.config if stored else None
    if incumbent is not None and check(incumbent, backend.limits, H=out.key.H, q_len=out.key.q_len) is not None:
        incumbent = None  # e.g. imported for another device's limits: never compiled here, simply replaced
    if incumbent is not None and incumbent not in pool:
        if backend.measure(incumbent, workload).ok:
            pool.append(incumbent)
        else:
            incumbent = None
    ms = backend.remeasure(pool, workload, rounds)
    by_cfg = dict(zip(pool, ms))
    if not all(m.ok for m in ms):
        out.decision = f"re-measurement failed: {[m.reason for m in ms if not m.ok]}; nothing stored"
        return
    # the default competes too: a search restricted away from it (`--only`), or one whose top
    # configs lose in the re-timing, must not store a config slower than what workers already run
    contenders = top + [default] if default is not None and default in by_cfg and default not in top else top
    winner = min(contenders, key=lambda c: by_cfg[c].median_us)  # type: ignore[arg-type, return-value]
    out.best, out.best_m = winner, by_cfg[winner]
    out.default_m = by_cfg.get(default) if default is not None else None
    if incumbent is not None and incumbent != winner:
        inc_m = by_cfg[incumbent]
        gain = inc_m.median_us - out.best_m.median_us  # type: ignore[operator]
        if gain <= max(_noise(inc_m), _noise(out.best_m)):
            out.best, out.best_m = incumbent, inc_m
            out.decision = f"kept stored best: new winner only {gain:.2f} us faster, within noise"
    if not out.decision:
        out.decision = "stored new best" if incumbent != out.best else "stored best re-timed"
    if owns is not None and not owns():
        out.decision = "claim lost while re-timing (this process stalled): the new owner stores this key"
        return
    m = out.best_m
    with session_scope(sessions) as s:
        repo.upsert_best(
            session=s,
            key=out.key,
            config=out.best,
            median_us=m.median_us,
            p10_us=m.p10_us,
            p90_us=m.p90_us,
            default_us=out.default_m.median_us if out.default_m else None,
            study_id=out.study_id,
        )
    out.stored = True
