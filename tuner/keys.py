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

    @classmethod
    def parse(cls, text: str) -> ConfigKey:
        """The key `str(key)` wrote (a study's workload_key attribute)."""
        device, kernel_hash, dtype, h, q, b, *batch = text.split("|")
        return cls(device, kernel_hash, dtype, int(h[1:]), int(q[1:]), int(b[1:]), int(batch[0][1:]) if batch else 0)

    @property
    def study_name(self) -> str:
        return self.study_name_for(0)

    def study_label(self, neighbour_mb: int = 0) -> str:
        """The study's identity in the config database: the key, and how its trials are timed when
        not back to back (verify_tuner.measure.backend.Workload.neighbour_mb), so a study timed cold
        never resumes one timed back to back: their times do not compare."""
        return str(self) if not neighbour_mb else f"{self}|N{neighbour_mb}"

    def study_name_for(self, neighbour_mb: int = 0) -> str:
        # a study keeps one search space: new space, new study
        return f"verify-s{SPACE_VERSION}:" + self.study_label(neighbour_mb)
