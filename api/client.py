"""Worker-side client: import it in an inference worker. It needs only the bare package (no
CUDA, FastAPI, SQLAlchemy, Optuna or torch: `pip install verify-tuner`).

    client = ConfigClient(H=8, q_len=9, device="NVIDIA H200")  # URL / folder from the environment
    client.fetch()                       # once, at startup: every bucket table (never raises)
    cfg = client.lookup(prefix, batch)   # every decode step: a bisect, no I/O

Where the table comes from, first that works: the sidecar (`base_url`, else VERIFY_TUNER_URL),
then a folder of `tuner configs dump` files (`config_dir`, else VERIFY_TUNER_CONFIG_DIR), then
the last snapshot saved on disk (the per-user cache dir unless given), then the built-in
heuristic; `source` / `reason` say which and why the others were passed over. A table made for
another kernel than the one this package launches (its kernel hash differs) is refused and the
next source tried. `prefix` for a batch of requests is its longest one (verify_tuner.batches.prefix_of,
measured in docs/batching.md); `batch` is the number of requests verified in the launch.

A worker never blocks on, or crashes because of, the sidecar. A snapshot that cannot be saved is
noted in `reason` (the sidecar's table is still used); a device the client does not know and no
table for it leaves `source == "none"` for the worker to check, without raising.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir
from verify_tuner import batches, buckets, engine_files
from verify_tuner.heuristic import heuristic_config
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import PARAM_NAMES, KernelConfig
from verify_tuner.kernels.limits import DeviceLimits, known_device
from verify_tuner.kernels.validate import check

URL_ENV, DIR_ENV = "VERIFY_TUNER_URL", "VERIFY_TUNER_CONFIG_DIR"


@dataclass(frozen=True)
class Entry:
    lo: int
    hi: int
    config: KernelConfig
    source: str  # tuned | nearest | heuristic (as the sidecar answered)


class ConfigClient:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        H: int,
        q_len: int,
        device: str,
        dtype: str = "bf16",
        config_dir: str | os.PathLike[str] | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
        timeout_s: float = 2.0,
        limits: DeviceLimits | None = None,
        kernel_hash: str | None = None,
    ) -> None:
        url = base_url if base_url is not None else os.environ.get(URL_ENV)
        self.base_url = url.rstrip("/") if url else None
        folder = config_dir if config_dir is not None else os.environ.get(DIR_ENV)
        self.config_dir = Path(folder) if folder else None
        self.H, self.q_len, self.device, self.dtype = H, q_len, device, dtype
        self.timeout_s = timeout_s
        self.limits = limits or known_device(device)
        #: the kernel this worker launches: tables made for another are refused
        self.kernel_hash = kernel_hash or current_kernel_hash()
        name = f"configs-{engine_files.slug(device)}-H{H}-q{q_len}-{dtype}.json"
        self.snapshot = Path(snapshot_dir or Path(user_cache_dir("verify-tuner")) / "snapshots") / name
        # per batch bucket index: bucket starts and entries, sorted by prefix
        self._starts: dict[int, list[int]] = {}
        self._entries: dict[int, list[Entry]] = {}
        self.source = "none"  # sidecar | config_dir | snapshot | heuristic | none (nothing usable: see reason)
        self.reason = "fetch() not called yet"

    # --- startup ---------------------------------------------------------------------------
    def fetch(self) -> str:
        """Load the table from the first source that works (module docstring). Returns the
        source; never raises (an unknown device with nothing fetched: "none", with the reason)."""
        passed: list[str] = []
        if self.base_url:
            try:
                table = self._get_table()
                self._load(table)
            except (OSError, ValueError, KeyError, TypeError) as exc:  # unreachable, HTTP error, bad body
                passed.append(f"sidecar unavailable at {self.base_url} ({type(exc).__name__}: {exc})")
            else:
                self.source, self.reason = "sidecar", f"{self.base_url}: {self._count()}"
                try:
                    self._save(table)
                except (
                    OSError,
                    ValueError,
                ) as exc:  # keep the good table; a later fetch without the sidecar has no snapshot
                    self.reason += f"; snapshot not saved ({type(exc).__name__}: {exc})"
                return self._done(passed)
        else:
            passed.append(f"no sidecar ({URL_ENV} not set)")
        if self.config_dir:
            try:
                path = self._config_file()
                self._load_engine(engine_files.read(path))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                passed.append(f"config dir {self.config_dir}: {type(exc).__name__}: {exc}")
            else:
                self.source, self.reason = "config_dir", f"{path}: {self._count()}"
                return self._done(passed)
        try:
            self._load(json.loads(self.snapshot.read_text()))
            self.source, self.reason = "snapshot", f"snapshot {self.snapshot}"
            return self._done(passed)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            passed.append(f"no usable snapshot ({type(exc).__name__}: {exc})"[:300])
        if self.limits is None:
            self._entries, self._starts = {}, {}
            self.source, self.reason = "none", f"device {self.device!r} is unknown, so no heuristic either"
            return self._done(passed)
        self._entries = {
            bb.index: [
                Entry(
                    b.lo,
                    b.hi,
                    heuristic_config(self.limits, H=self.H, q_len=self.q_len, prefix=b.mid, batch=bb.hi),
                    "heuristic",
                )
                for b in buckets.ALL
            ]
            for bb in batches.ALL
        }
        self._starts = {i: [e.lo for e in es] for i, es in self._entries.items()}
        self.source, self.reason = "heuristic", f"the built-in heuristic for {self.limits.name}"
        return self._done(passed)

    def _done(self, passed: list[str]) -> str:
        if passed:
            self.reason += "; passed over: " + "; ".join(passed)
        return self.source

    def _count(self) -> str:
        return f"{sum(len(e) for e in self._entries.values())} buckets in {len(self._entries)} batch buckets"

    def _get_table(self) -> dict:
        q = urllib.parse.urlencode(
            {"H": self.H, "q_len": self.q_len, "device": self.device, "dtype": self.dtype, "all_batches": "true"}
        )
        with urllib.request.urlopen(f"{self.base_url}/configs?{q}", timeout=self.timeout_s) as resp:
            return json.loads(resp.read())

    def _config_file(self) -> Path:
        """This device's file, else its family's (a `NVIDIA H200 NVL` reads the H200's)."""
        names = [self.device] + ([self.limits.name] if self.limits and self.limits.name != self.device else [])
        for name in names:
            path = self.config_dir / engine_files.file_name(
                H=self.H,
                q_len=self.q_len,
                device=name,  # type: ignore[operator]
                dtype=self.dtype,
            )
            if path.exists():
                return path
        raise FileNotFoundError(
            f"no {engine_files.file_name(H=self.H, q_len=self.q_len, device=names[-1], dtype=self.dtype)}"
        )

    def _check_kernel(self, khash: str) -> None:
        if khash != self.kernel_hash:
            raise ValueError(f"table is for kernel {khash}, this worker launches {self.kernel_hash}")

    def _load_engine(self, doc: dict) -> None:
        self._check_kernel(doc["kernel_hash"])
        if (doc["H"], doc["q_len"], doc["dtype"]) != (self.H, self.q_len, self.dtype):
            raise ValueError(f"file is for H={doc['H']} q_len={doc['q_len']} dtype={doc['dtype']}")
        configs = [
            {
                **e,
                "bucket": {"lo": e["prefix_lo"], "hi": e["prefix_hi"]},
                "batch_bucket": {"index": batches.bucket_of(int(hi)).index},
            }
            for hi, entries in doc["configs"].items()
            for e in entries
        ]
        self._install(configs)

    def _load(self, table: dict) -> None:
        self._check_kernel(table["kernel_hash"])
        if (table["H"], table["q_len"]) != (self.H, self.q_len):
            raise ValueError(f"table is for H={table['H']} q_len={table['q_len']}")
        self._install(table["configs"])

    def _install(self, configs: list[dict]) -> None:
        by_batch: dict[int, list[Entry]] = {}
        for c in configs:
            by_batch.setdefault(int(c["batch_bucket"]["index"]), []).append(
                Entry(
                    c["bucket"]["lo"],
                    c["bucket"]["hi"],
                    KernelConfig.from_params({k: c[k] for k in PARAM_NAMES if k in c}),
                    c["source"],
                )
            )
        self._check_device(by_batch)
        if set(by_batch) != {bb.index for bb in batches.ALL}:
            raise ValueError(f"table holds batch buckets {sorted(by_batch)}, not all {len(batches.ALL)}")
        for entries in by_batch.values():
            entries.sort(key=lambda e: e.lo)
            if entries[0].lo != 0 or any(a.hi != b.lo for a, b in itertools.pairwise(entries)):
                raise ValueError("table does not cover every prefix")
        self._entries, self._starts = by_batch, {i: [e.lo for e in es] for i, es in by_batch.items()}

    def _check_device(self, by_batch: dict[int, list[Entry]]) -> None:
        """Every config must run on this device, whatever the table's file name or source said
        (another GPU's table saved under this one's name would launch configs it cannot run)."""
        if self.limits is None:  # nothing to check against: the caller sees source and reason
            return
        entries = [e for es in by_batch.values() for e in es]
        bad = [(e, r) for e in entries if (r := check(e.config, self.limits, H=self.H, q_len=self.q_len))]
        if bad:
            e, why = bad[0]
            raise ValueError(
                f"{len(bad)} of {len(entries)} configs cannot run on {self.limits.name} (e.g. {e.config}: {why})"
            )

    def _save(self, table: dict) -> None:
        engine_files.write_atomic(self.snapshot, table)

    # --- every decode step -----------------------------------------------------------------
    def lookup(self, prefix: int, batch: int = 1) -> KernelConfig:
        """The config for this step: `prefix` is the batch's lookup prefix (its longest request,
        verify_tuner.batches.prefix_of), `batch` the requests in the launch. A bisect, no I/O."""
        if not self._entries:
            raise RuntimeError(f"no config table ({self.reason})")
        if not 1 <= batch <= batches.MAX_BATCH:
            raise ValueError(f"batch {batch} outside 1..{batches.MAX_BATCH}")
        bb = (batch - 1).bit_length()  # verify_tuner.batches.bucket_of without its checks: the hot path
        entries = self._entries[bb]
        i = bisect.bisect_right(self._starts[bb], prefix) - 1
        e = entries[max(i, 0)]
        if not e.lo <= prefix < e.hi:
            raise ValueError(f"prefix {prefix} outside 0..{entries[-1].hi - 1}")
        return e.config

    def distinct_configs(self) -> list[KernelConfig]:
        """Every config the table can answer: what a worker pre-compiles / graph-captures."""
        return sorted({e.config for es in self._entries.values() for e in es})
