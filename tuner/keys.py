"""The key every stored config hangs off (device, kernel, dtype, H, q_len, prefix bucket, batch
bucket): the study, the DB row and the API lookup share it. Not to be confused with
verify_tuner.measure.backend.Workload, what one study measures (its prefix lengths and batch)."""

from __future__ import annotations

from dataclasses import dataclass

from verify_tuner.space import SPACE_VERSION

DTYPES = ("bf16",)
#: Heads per GPU a key may have: the bound every input (CLI, import, API) checks.
MAX_H = 1024


@dataclass(frozen=True, order=True)
class ConfigKey:
    device: str
    kernel_hash: str
    dtype: str
    H: int
    q_len: int
    bucket: int
    batch_bucket: int = 0  # verify_tuner.batches index; 0 is B=1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    def __str__(self) -> str:
        # B=1 keys keep the form they had before batch buckets, so their studies resume
        batch = f"|B{self.batch_bucket}" if self.batch_bucket else ""
        return f"{self.device}|{self.kernel_hash}|{self.dtype}|H{self.H}|Q{self.q_len}|b{self.bucket}{batch}"

    @property
    def study_name(self) -> str:
        return f"verify-s{SPACE_VERSION}:" + str(self)  # a study keeps one search space: new space, new study
