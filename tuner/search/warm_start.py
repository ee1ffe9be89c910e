"""What a key's study starts from: the heuristic default and the stored bests of neighbouring
keys that are valid here (warm_start_configs), less those the study has already tried (unseen)."""

from __future__ import annotations

import optuna
from sqlalchemy.orm import Session
from verify_tuner import buckets
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import Workload
from verify_tuner.store import best_configs


def _params(cfg: KernelConfig) -> dict[str, int]:
    return cfg.as_params()


def warm_start_configs(
    *, session: Session, key: ConfigKey, limits: DeviceLimits, workload: Workload
) -> list[KernelConfig]:
    """The heuristic default, then stored bests of this key's other prefix buckets (nearest
    first, same batch bucket), then of the neighbouring batch buckets (nearest batch first, then
    nearest prefix), then of other H with the same q_len and KV format -- each only if valid here."""
    cands = [
        heuristic_config(
            limits, H=key.H, q_len=key.q_len, prefix=workload.prefix, batch=workload.batch, kv_dtype=key.kv_dtype
        )
    ]
    here = buckets.by_index(key.bucket)
    same = best_configs.list_best_for(session=session, table=key)
    same.sort(
        key=lambda r: (
            abs(r.key.batch_bucket - key.batch_bucket),
            buckets.log_distance(buckets.by_index(r.key.bucket), here),
        )
    )
    near = best_configs.list_best(session=session, device=key.device, q_len=key.q_len, kv_dtype=key.kv_dtype)
    others = [r for r in near if r.key.H != key.H]
    for r in same + others:  # as stored: NSPLIT is the grid's parts, which every batch shares
        cfg = r.config
        if cfg not in cands and check(cfg, limits, H=key.H, q_len=key.q_len, kv_dtype=key.kv_dtype) is None:
            cands.append(cfg)
    return cands


def unseen(study: optuna.Study, warm: list[KernelConfig], choices: dict[str, list[int]]) -> list[dict[str, int]]:
    """The warm-start configs inside the choices that the study has no trial of."""
    seen = {tuple(sorted(t.params.items())) for t in study.get_trials(deepcopy=False)}
    queue = [_params(c) for c in warm if all(v in choices[k] for k, v in _params(c).items())]
    return [q for q in queue if tuple(sorted(q.items())) not in seen]
