"""What one key's search loop searches (KeySearch), what it reports as it goes (Progress), and
the vocabulary its modules share: a config's signature (its constants in PARAMS order) and the
user attributes a trial's record carries in the study."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.kernels.validate import check
from verify_tuner.keys import ConfigKey
from verify_tuner.measure.backend import Workload

PARAMS = PARAM_NAMES
MEASURED_ATTR, STATE_ATTR, REASON_ATTR, REUSED_ATTR = "measured", "state", "reason", "reused_trial"

Signature = tuple[int, ...]


def signature(params: dict[str, int]) -> Signature:
    return tuple(params[p] for p in PARAMS)


def config_signature(cfg: KernelConfig) -> Signature:
    return tuple(getattr(cfg, p.lower()) for p in PARAMS)


def config_of(params: Mapping[str, int]) -> KernelConfig:
    """The config of a trial's params."""
    return KernelConfig.from_params(params)


def refusal(params: dict[str, int], limits: DeviceLimits, key: ConfigKey) -> str | None:
    """Why verify_tuner.kernels.validate refuses these params for `key` on this device, or None."""
    return check(config_of(params), limits, H=key.H, q_len=key.q_len, kv_dtype=key.kv_dtype)


@dataclass(frozen=True)
class Progress:
    key: ConfigKey
    measured: int
    budget: int
    best_us: float | None
    default_us: float | None
    last: str


@dataclass(frozen=True)
class KeySearch:
    """What the loop searches: one key's space, the configs that fit it, and its limits."""

    key: ConfigKey
    workload: Workload
    study_id: int  # the config database's row, which the trial log writes to
    choices: dict[str, list[int]]
    valid: Sequence[KernelConfig]
    budget: int  # measurements, by every process sharing the study
    parallel: int  # this process's trials in flight: compiling, waiting for the GPU or measuring
    timeout_s: float | None = None
    default: KernelConfig | None = None

    @property
    def space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {k: optuna.distributions.CategoricalDistribution(v) for k, v in self.choices.items()}

    @property
    def max_trials(self) -> int:
        """Trials of every kind after which the search gives up (a sampler that only repeats)."""
        return 20 * self.budget + len(self.valid)
