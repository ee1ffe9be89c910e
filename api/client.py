"""Worker-side client: import it in an inference worker (no CUDA, no FastAPI needed).

    client = ConfigClient("http://127.0.0.1:8177", H=8, q_len=9, device="NVIDIA H200")
    client.fetch()                       # once, at startup: every bucket table (never raises)
    cfg = client.lookup(prefix, batch)   # every decode step: a bisect, no I/O

`prefix` for a batch of requests is its longest one (tuner.batches.prefix_of, measured in
docs/batching.md); `batch` is the number of requests verified in the launch (default 1).

`fetch` falls back to the last snapshot saved on disk (the per-user cache dir unless given)
when the sidecar is unreachable, then to the heuristic default, and says which in `source` /
`reason`; a worker never blocks on, or crashes because of, the sidecar. A snapshot that cannot be
saved is noted in `reason` (the sidecar's table is still used); a device the client does not know
and no table for it leaves `source == "none"` for the worker to check, without raising.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from kernels.config import PARAM_NAMES, KernelConfig
from kernels.limits import DeviceLimits, known_device
from tuner import batches, buckets
from tuner.heuristic import heuristic_config


@dataclass(frozen=True)
class Entry:
    lo: int
    hi: int
    config: KernelConfig
    source: str  # tuned | nearest | heuristic (as the sidecar answered)


class ConfigClient:
    def __init__(self, base_url: str, *, H: int, q_len: int, device: str, dtype: str = "bf16",
                 snapshot_dir: str | os.PathLike[str] | None = None, timeout_s: float = 2.0,
                 limits: DeviceLimits | None = None) -> None:
        self.base_url, self.H, self.q_len, self.device, self.dtype = base_url.rstrip("/"), H, q_len, device, dtype
        self.timeout_s = timeout_s
        self.limits = limits or known_device(device)
        name = f"configs-{_slug(device)}-H{H}-q{q_len}-{dtype}.json"
        self.snapshot = Path(snapshot_dir or Path(user_cache_dir("verify-tuner")) / "snapshots") / name
        # per batch bucket index: bucket starts and entries, sorted by prefix
        self._starts: dict[int, list[int]] = {}
        self._entries: dict[int, list[Entry]] = {}
        self.source = "none"  # sidecar | snapshot | heuristic | none (nothing usable: see reason)
        self.reason = "fetch() not called yet"

    # --- startup ---------------------------------------------------------------------------
    def fetch(self) -> str:
        """Load the table: sidecar, else saved snapshot, else heuristic. Returns the source; never
        raises (an unknown device with nothing fetched: "none", with the reason)."""
        try:
            table = self._get_table()
            self._load(table)
        except (OSError, ValueError, KeyError) as exc:  # unreachable, HTTP error, bad body
            err = f"sidecar unavailable ({type(exc).__name__}: {exc})"
        else:
            n = sum(len(e) for e in self._entries.values())
            self.source, self.reason = "sidecar", f"{self.base_url}: {n} buckets in {len(self._entries)} batch buckets"
            try:
                self._save(table)
            except OSError as exc:  # keep the good table; a later fetch without the sidecar has no snapshot
                self.reason += f"; snapshot not saved ({type(exc).__name__}: {exc})"
            return self.source
        try:
            self._load(json.loads(self.snapshot.read_text()))
            self.source, self.reason = "snapshot", f"{err}; using snapshot {self.snapshot}"
            return self.source
        except (OSError, ValueError, KeyError) as exc:
            err += f"; no usable snapshot ({type(exc).__name__})"
        if self.limits is None:
            self._entries, self._starts = {}, {}
            self.source, self.reason = "none", f"{err}; device {self.device!r} is unknown, so no heuristic either"
            return self.source
        self._entries = {bb.index: [Entry(b.lo, b.hi, heuristic_config(self.limits, H=self.H, q_len=self.q_len,
                                                                        prefix=b.mid, batch=bb.hi), "heuristic")
                                    for b in buckets.ALL] for bb in batches.ALL}
        self._starts = {i: [e.lo for e in es] for i, es in self._entries.items()}
        self.source, self.reason = "heuristic", f"{err}; using the built-in heuristic for {self.limits.name}"
        return self.source

    def _get_table(self) -> dict:
        q = urllib.parse.urlencode({"H": self.H, "q_len": self.q_len, "device": self.device, "dtype": self.dtype,
                                    "all_batches": "true"})
        with urllib.request.urlopen(f"{self.base_url}/configs?{q}", timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def _load(self, table: dict) -> None:
        if (table["H"], table["q_len"]) != (self.H, self.q_len):
            raise ValueError(f"table is for H={table['H']} q_len={table['q_len']}")
        by_batch: dict[int, list[Entry]] = {}
        for c in table["configs"]:
            by_batch.setdefault(int(c["batch_bucket"]["index"]), []).append(Entry(
                c["bucket"]["lo"], c["bucket"]["hi"],
                KernelConfig.from_params({k: c[k] for k in PARAM_NAMES if k in c}), c["source"]))
        if set(by_batch) != {bb.index for bb in batches.ALL}:
            raise ValueError(f"table holds batch buckets {sorted(by_batch)}, not all {len(batches.ALL)}")
        for entries in by_batch.values():
            entries.sort(key=lambda e: e.lo)
            if entries[0].lo != 0 or any(a.hi != b.lo for a, b in zip(entries, entries[1:])):
                raise ValueError("table does not cover every prefix")
        self._entries, self._starts = by_batch, {i: [e.lo for e in es] for i, es in by_batch.items()}

    def _save(self, table: dict) -> None:
        self.snapshot.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.snapshot.parent, prefix=self.snapshot.name)
        with os.fdopen(fd, "w") as f:
            json.dump(table, f)
        os.replace(tmp, self.snapshot)

    # --- every decode step -----------------------------------------------------------------
    def lookup(self, prefix: int, batch: int = 1) -> KernelConfig:
        """The config for this step: `prefix` is the batch's lookup prefix (its longest request,
        tuner.batches.prefix_of), `batch` the requests in the launch. A bisect, no I/O."""
        if not self._entries:
            raise RuntimeError(f"no config table ({self.reason})")
        if not 1 <= batch <= batches.MAX_BATCH:
            raise ValueError(f"batch {batch} outside 1..{batches.MAX_BATCH}")
        bb = (batch - 1).bit_length()  # tuner.batches.bucket_of without its checks: the hot path
        entries = self._entries[bb]
        i = bisect.bisect_right(self._starts[bb], prefix) - 1
        e = entries[max(i, 0)]
        if not e.lo <= prefix < e.hi:
            raise ValueError(f"prefix {prefix} outside 0..{entries[-1].hi - 1}")
        return e.config

    def distinct_configs(self) -> list[KernelConfig]:
        """Every config the table can answer: what a worker pre-compiles / graph-captures."""
        return sorted({e.config for es in self._entries.values() for e in es})


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in s).strip("-")
