"""Worker-side client: import it in an inference worker. It needs only the bare package (no
CUDA, FastAPI, SQLAlchemy, Optuna or torch: `pip install verify-tuner`).

    client = ConfigClient(H=8, q_len=9, device="NVIDIA H200")  # URL / folder from the environment
    client.fetch()                       # once, at startup: every bucket table (never raises)
    cfg = client.lookup(prefix, batch)   # every decode step: a bisect, no I/O

Where the table comes from, first that works: the sidecar (`base_url`, else VERIFY_TUNER_URL),
then a folder of `tuner configs dump` files (`config_dir`, else VERIFY_TUNER_CONFIG_DIR), then
the last snapshot saved on disk (the per-user cache dir unless given), then the built-in
heuristic; `source` / `reason` say which and why the others were passed over, and `tuned` /
`counts` how many entries were measured rather than guessed (a sidecar can serve a table of
heuristics). The sidecar is asked for the table of the kernel this package launches (its kernel
hash): one that holds none answers 404, and a table made for another kernel, from any source, is
refused and the next source tried. `refresh()` re-fetches the sidecar's table only if it changed
(If-None-Match with its ETag). `prefix` for a batch of requests is its longest one
(verify_tuner.batches.prefix_of, measured in docs/batching.md); `batch` is the number of requests
verified in the launch. The table's entries and the checks it passes are in
verify_tuner.engine.config_table, the request to the sidecar in verify_tuner.engine.sidecar.

A worker never blocks on, or crashes because of, the sidecar. A snapshot that cannot be saved is
noted in `reason` (the sidecar's table is still used); a device the client does not know and no
table for it leaves `source == "none"` for the worker to check, without raising.
"""

from __future__ import annotations

import bisect
import http.client
import json
import operator
import os
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir
from verify_tuner import batches, engine_files
from verify_tuner.engine import sidecar
from verify_tuner.engine.bundle import Bundle, BundleError
from verify_tuner.engine.config_table import (
    Entry,
    GraphPlanChoice,
    engine_file_configs,
    engine_file_plans,
    heuristic_table,
    parse_table,
)
from verify_tuner.kernels import kernel_hash as current_kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import DEFAULT as DEFAULT_KV_DTYPE
from verify_tuner.kernels.limits import DeviceLimits, known_device, same_device
from verify_tuner.kernels.validate import MAX_Q_LEN
from verify_tuner.keys import TableKey, specs

# Entry and GraphPlanChoice live in config_table; a worker imports them from here.
__all__ = ["DIR_ENV", "URL_ENV", "ConfigClient", "Entry", "GraphPlanChoice"]

URL_ENV, DIR_ENV, CUBINS_ENV = "VERIFY_TUNER_URL", "VERIFY_TUNER_CONFIG_DIR", "VERIFY_TUNER_CUBINS"


class ConfigClient:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        H: int,
        q_len: int,
        device: str,
        kv_dtype: str = DEFAULT_KV_DTYPE,
        config_dir: str | os.PathLike[str] | None = None,
        snapshot_dir: str | os.PathLike[str] | None = None,
        timeout_s: float = 2.0,
        limits: DeviceLimits | None = None,
        kernel_hash: str | None = None,
        cubins: str | os.PathLike[str] | None = None,
    ) -> None:
        """`kv_dtype` is the format of the engine's KV cache (verify_tuner.kernels.formats): a table
        tuned for another one is refused."""
        self.device, self.limits = device, limits or known_device(device)
        #: the table this worker reads: its device's own name however the worker spelt it ("h200"), and
        #: the kernel it launches (tables made for another are refused); a shape no table can hold is
        #: the caller's mistake, said here (fetch() promises never to raise)
        self.key = TableKey(
            self.limits.name if self.limits else device,
            kernel_hash or current_kernel_hash(),
            kv_dtype,
            _integer(H, "H"),  # numpy and torch integers: as ints from here
            _integer(q_len, "q_len"),
        )
        _check_shape(self.key)
        self.H, self.q_len, self.kv_dtype, self.kernel_hash = self.key.H, self.key.q_len, kv_dtype, self.key.kernel_hash
        self.base_url = _sidecar_url(base_url)
        folder = config_dir if config_dir is not None else os.environ.get(DIR_ENV)
        self.config_dir = Path(folder) if folder else None
        self.timeout_s = timeout_s  # in all, for one request to the sidecar (sidecar.Requests)
        self._requests = sidecar.Requests()
        #: the cubin bundle the op loads (VERIFY_TUNER_CUBINS, as the op reads it): a table serving a
        #: config it lacks is refused, since capturing that config on a host without nvcc would fail
        bundle = cubins if cubins is not None else os.environ.get(CUBINS_ENV)
        self.cubins = Path(bundle) if bundle else None
        #: the snapshot file, or None where no folder for it is known: it is optional, so the worker goes on
        self.snapshot, self.snapshot_error = _snapshot_path(snapshot_dir, self.key)
        #: per batch bucket index: bucket starts and entries, sorted by prefix (replaced whole, see _set)
        self._table: dict[int, tuple[list[int], list[Entry]]] = {}
        #: per batch bucket index: the ranges of the tuner's graph plan set, in prefix order, where one was chosen
        self._plans: dict[int, tuple[GraphPlanChoice, ...]] = {}
        self.etag: str | None = None  # of the sidecar's table held, for refresh()
        self._file_read: bytes | None = None  # the config dir's file as last loaded, for refresh()
        self.refresh_error: str | None = None
        self.source = "none"  # sidecar | config_dir | snapshot | heuristic | none (nothing usable: see reason)
        self.reason = "fetch() not called yet"

    # --- startup ---------------------------------------------------------------------------
    def fetch(self) -> str:
        """Load the table from the first source that works (module docstring). Returns the
        source; never raises (an unknown device with nothing fetched: "none", with the reason)."""
        passed: list[str] = []
        if self.base_url:
            try:
                self._ask_sidecar(etag=None)
                return self._done(passed)
            except sidecar.PassedOver as exc:
                passed.append(str(exc))
        else:
            passed.append(f"no sidecar ({URL_ENV} not set)")
        if self.config_dir:
            try:
                path = self._load_dir()
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                passed.append(f"config dir {self.config_dir}: {type(exc).__name__}: {exc}")
            else:
                self.source, self.reason = "config_dir", f"{path}: {self._count()}"
                return self._done(passed)
        if self.snapshot is None:
            passed.append(self.snapshot_error or "no snapshot folder")
        else:
            try:
                self._load(json.loads(self.snapshot.read_text()))
                self.source, self.reason = "snapshot", f"snapshot {self.snapshot}: {self._count()}"
                return self._done(passed)
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # deep JSON: RecursionError
                passed.append(f"no usable snapshot ({type(exc).__name__}: {exc})"[:300])
        if self.limits is None:
            self._set({})
            self.source, self.reason = "none", f"device {self.device!r} is unknown, so no heuristic either"
            return self._done(passed)
        try:
            table = heuristic_table(self.limits, self.key)
        except InvalidConfig as exc:  # no config of the kernel fits this shape on this device
            self._set({})
            self.source, self.reason = "none", f"no heuristic either: {exc}"
            return self._done(passed)
        self._set(table)
        self.source, self.reason = "heuristic", f"the built-in heuristic for {self.limits.name}, {self.kv_dtype}"
        try:  # served all the same (no source is left), but a capture from this bundle would fail: say so
            self._check_bundle({e.config for es in table.values() for e in es})
        except ValueError as exc:
            self.reason += f"; warning: the heuristic's configs cannot be launched from the cubin bundle: {exc}"
        return self._done(passed)

    def refresh(self) -> str:
        """Fetch the sidecar's table again if it changed since the one held (If-None-Match with its
        ETag): "updated", "unchanged", or "failed" with `refresh_error` saying why; the table held is
        kept unless a usable new one came. Never raises; safe while other threads call lookup()."""
        if not self.base_url:
            return self._refresh_dir()
        try:
            changed = self._ask_sidecar(etag=self.etag if self.source == "sidecar" else None)
        except sidecar.PassedOver as exc:
            self.refresh_error = str(exc)
            return "failed"
        self.refresh_error = None
        return "updated" if changed else "unchanged"

    def _load_dir(self) -> Path:
        """Load this device's file from the config dir (exceptions as engine_files.read raises them)."""
        path = self._config_file()
        raw = path.read_bytes()
        self._load_engine(engine_files.loads(raw, path.name))
        self._file_read = raw
        return path

    def _refresh_dir(self) -> str:
        """refresh() without a sidecar: the config dir's file read again, "updated" when it changed (a
        re-dump) and loads; it was "failed" whatever the folder held."""
        if self.config_dir is None:
            self.refresh_error = f"nothing to refresh from: no sidecar ({URL_ENV}) and no config dir ({DIR_ENV})"
            return "failed"
        before = self._file_read
        try:
            path = self._load_dir() if self._config_file().read_bytes() != before else None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.refresh_error = f"config dir {self.config_dir}: {type(exc).__name__}: {exc}"
            return "failed"
        self.refresh_error = None
        if path is None:
            return "unchanged"
        self.source, self.reason = "config_dir", f"{path}: {self._count()}"
        return "updated"

    def _ask_sidecar(self, *, etag: str | None) -> bool:
        """Load the sidecar's table (False: unchanged since `etag`, a 304); sidecar.PassedOver says
        why not, telling an unreachable or failing sidecar from one that refused this worker's request."""
        try:
            table, new_etag = self._get_table(etag)
            self._load(table)
        except sidecar.ErrorStatus as exc:
            if exc.code == 304 and etag:
                return False
            raise sidecar.PassedOver(sidecar.refused(sidecar.where(self.base_url), exc)) from None
        except OSError as exc:
            at = sidecar.where(self.base_url)
            raise sidecar.PassedOver(f"sidecar unavailable at {at} ({type(exc).__name__}: {exc})") from None
        except http.client.HTTPException as exc:  # a cut-off answer, or something else listening on the port
            raise sidecar.PassedOver(sidecar.broken(sidecar.where(self.base_url), exc)) from None
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise sidecar.PassedOver(
                f"sidecar at {self.base_url} served a table this worker cannot use ({type(exc).__name__}: {exc})"
            ) from None
        self.etag = new_etag
        self.source, self.reason = "sidecar", f"{self.base_url}: {self._count()}"
        try:
            self._save(table)
        except (OSError, ValueError) as exc:  # keep the good table; a later fetch without the sidecar has no snapshot
            self.reason += f"; snapshot not saved ({type(exc).__name__}: {exc})"
        return True

    def _done(self, passed: list[str]) -> str:
        if passed:
            self.reason += "; passed over: " + "; ".join(passed)
        return self.source

    @property
    def counts(self) -> dict[str, int]:
        """Entries of the table held by source (tuned, nearest, heuristic)."""
        out = dict.fromkeys(("tuned", "nearest", "heuristic"), 0)
        for _, entries in self._table.values():
            for e in entries:
                out[e.source] = out.get(e.source, 0) + 1
        return out

    @property
    def tuned(self) -> int:
        """Entries measured on this kernel and device: 0 means a table of guesses, whatever its source."""
        return self.counts["tuned"]

    def _count(self) -> str:
        c = self.counts
        return (
            f"{self.kv_dtype} table: {c['tuned']} of {sum(c.values())} entries tuned ({c['nearest']} nearest, "
            f"{c['heuristic']} heuristic) in {len(self._table)} batch buckets"
        )

    def _set(self, by_batch: dict[int, list[Entry]]) -> None:
        # one assignment: a lookup on another thread sees the old table or the new one, never a mix
        self._table = {i: ([e.lo for e in es], es) for i, es in by_batch.items()}

    def _get_table(self, etag: str | None) -> tuple[dict, str | None]:
        # a key field at its default is left out: the sidecar's default is the same, and a sidecar
        # older than the field (which refuses a parameter it does not know) answers the same table
        defaults = {f.name: spec.default for f, spec in specs(TableKey)}
        query: dict[str, object] = {k: v for k, v in self.key.values().items() if v != defaults[k]}
        query |= {"device": self.device, "all_batches": "true"}
        assert self.base_url is not None  # fetch() and refresh() ask only when there is one
        return self._requests.get_table(self.base_url, query, etag, self.timeout_s)

    def _config_file(self) -> Path:
        """This device's file, else its family's (a `NVIDIA H200 NVL` reads the H200's)."""
        assert self.config_dir is not None  # fetch() reads files only when there is a folder
        names = [self.device] + ([self.key.device] if self.key.device != self.device else [])
        paths = [self.config_dir / engine_files.file_name(replace(self.key, device=name)) for name in names]
        for path in paths:
            if path.exists():
                return path
        raise FileNotFoundError(f"no {paths[-1].name}")

    def _check_key(self, got: dict[str, Any]) -> None:
        """A table made for another kernel, device (a snapshot or file copied between hosts), KV
        format or shape would serve configs measured for something this worker does not run. A
        field added to the key after the table was made (an older sidecar or snapshot) is at its
        default there."""
        for f, spec in specs(type(self.key)):
            name, want = f.name, getattr(self.key, f.name)
            have = got.get(name, spec.default if spec.added else None)
            if name != "device":
                if have != want:
                    raise ValueError(f"table is for {name} {have!r}, this worker's is {want!r}")
            elif not isinstance(have, str):  # a hand-edited or foreign file
                raise TypeError(f"table's device must be a name, got {have!r}")
            elif not same_device(have, self.device):
                raise ValueError(f"table is for device {have!r}, this worker runs on {self.device!r}")

    def _load_engine(self, doc: dict) -> None:
        self._check_key(engine_files.doc_key_values(doc))
        self._install(engine_file_configs(doc), engine_file_plans(doc))

    def _load(self, table: dict) -> None:
        # a sidecar older than kv_dtype says dtype (verify_tuner.api.schemas.ConfigTableOut)
        self._check_key({"kv_dtype": table.get("dtype"), **table})
        self._install(table["configs"], table.get("graph_plans", []))

    def _install(self, configs: list[dict], graph_plans: list[dict] | None = None) -> None:
        by_batch, plans = parse_table(configs, graph_plans, self.limits, self.key)
        self._check_bundle(
            {e.config for es in by_batch.values() for e in es} | {p.config for r in plans.values() for p in r}
        )
        self._plans = plans  # before the table: a graph_plan() racing a refresh sees a plan of either
        self._set(by_batch)

    def _check_bundle(self, configs: set[KernelConfig]) -> None:
        """ValueError (the source is passed over) when the bundle lacks a config the table serves: a
        row tuned after the bundle was built made the engine's graph capture fail."""
        if self.cubins is None or self.limits is None:
            return
        try:
            bundle = Bundle.open(self.cubins)
        except BundleError as exc:
            raise ValueError(str(exc)) from None
        missing = sorted(c for c in configs if not bundle.has(c, self.q_len, self.limits.arch, self.kv_dtype))
        if missing:
            raise ValueError(
                f"{len(missing)} of its {len(configs)} configs are not in the cubin bundle at {self.cubins} for "
                f"q_len={self.q_len} {self.kv_dtype} on {self.limits.arch} (e.g. {missing[0]}): rebuild the bundle "
                "from this table "
                "(`tuner configs dump --cubins`)"
            )

    def _save(self, table: dict) -> None:
        if self.snapshot is None:
            raise OSError(self.snapshot_error)
        engine_files.write_atomic(self.snapshot, table)

    # --- every decode step -----------------------------------------------------------------
    def lookup(self, prefix: int, batch: int = 1) -> KernelConfig:
        """The config for this step: `prefix` is the batch's lookup prefix (its longest request,
        verify_tuner.batches.prefix_of), `batch` the requests in the launch. A bisect, no I/O."""
        table = self._table  # read once: refresh() may replace it meanwhile
        if not table:
            raise RuntimeError(f"no config table ({self.reason})")
        prefix, batch = operator.index(prefix), operator.index(batch)  # numpy / torch integers too
        if not 1 <= batch <= batches.MAX_BATCH:
            raise ValueError(f"batch {batch} outside 1..{batches.MAX_BATCH}")
        bb = (batch - 1).bit_length()  # verify_tuner.batches.bucket_of without its checks: the hot path
        starts, entries = table[bb]
        i = bisect.bisect_right(starts, prefix) - 1
        e = entries[max(i, 0)]
        if not e.lo <= prefix < e.hi:
            raise ValueError(f"prefix {prefix} outside 0..{entries[-1].hi - 1}")
        return e.config

    def graph_plans(self, batch: int, *, max_prefix: int) -> tuple[GraphPlanChoice, ...]:
        """What to capture for batch size `batch`, one graph per prefix range, for an engine whose
        requests reach `max_prefix` tokens: the ranges of the tuner's plan set for the batch bucket,
        in prefix order (a batch whose longest prefix is P replays range bisect_right(starts, P),
        starts: each range's first prefix after the first's; the first also serves shorter prefixes
        than it was measured at, the last longer ones), else one choice, the table's config for
        `max_prefix`; `source` and `reason` say which. Call it at capture time, once per batch size."""
        table = self._table
        if not table:
            raise RuntimeError(f"no config table ({self.reason})")
        batch, max_prefix = operator.index(batch), operator.index(max_prefix)
        if not 1 <= batch <= batches.MAX_BATCH:
            raise ValueError(f"batch {batch} outside 1..{batches.MAX_BATCH}")
        ranges = self._plans.get((batch - 1).bit_length())
        if ranges is None:
            cfg = self.lookup(max_prefix, batch)
            why = f"no graph plan for batch {batch} ({self.source}): the config for the longest prefix {max_prefix}"
            return (GraphPlanChoice(cfg, "longest_prefix", reason=why),)
        last = ranges[-1]
        hi = last.prefix_range[1]  # type: ignore[index]
        if max_prefix >= hi:
            last = replace(last, reason=last.reason + f"; prefixes from {hi} up to {max_prefix} were not measured")
        return (*ranges[:-1], last)

    def graph_plan(self, batch: int, *, max_prefix: int) -> GraphPlanChoice:
        """The one config to capture in the CUDA graph of batch size `batch`, for an engine that
        captures one graph per batch size and whose requests reach `max_prefix` tokens: the range of
        the tuner's plan set holding `max_prefix` (the longest prefixes cost a step the most), else
        the table's config for `max_prefix`. An engine that captures a graph per range takes every
        range from graph_plans()."""
        ranges = self.graph_plans(batch, max_prefix=max_prefix)
        if len(ranges) == 1:
            return ranges[0]
        i = bisect.bisect_right([r.prefix_range[0] for r in ranges[1:]], max_prefix)  # type: ignore[index]
        note = f"; range {i + 1} of {len(ranges)}, holding the longest prefix {max_prefix} (graph_plans(): all)"
        return replace(ranges[i], reason=ranges[i].reason + note)

    def distinct_configs(self) -> list[KernelConfig]:
        """Every config the table or a graph plan can answer: what a worker pre-compiles / graph-captures."""
        plans = {p.config for ranges in self._plans.values() for p in ranges}
        return sorted({e.config for _, es in self._table.values() for e in es} | plans)


def _sidecar_url(base_url: str | None) -> str | None:
    """The sidecar's URL (`base_url`, else VERIFY_TUNER_URL); ValueError for one without http(s)://,
    which urllib refused and the client passed over for a snapshot, unsaid."""
    url = base_url if base_url is not None else os.environ.get(URL_ENV)
    if url and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        named = "base_url" if base_url is not None else URL_ENV
        raise ValueError(f"{named} {url!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8177)")
    return url.rstrip("/") if url else None


def _integer(v: object, name: str) -> int:
    try:
        return operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {v!r}") from None


def _check_shape(key: TableKey) -> None:
    if key.H < 1:
        raise ValueError(f"H must be a positive number of heads, got {key.H!r}")
    if not 1 <= key.q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in 1..{MAX_Q_LEN}, got {key.q_len!r}")


def _snapshot_path(folder: str | os.PathLike[str] | None, key: TableKey) -> tuple[Path | None, str | None]:
    """Where the snapshot of `key`'s table is kept (named by the whole key: two package versions on one
    host, a canary, keep one each), or None and why there is no folder for it."""
    name = f"configs-{engine_files.slug(str(key))}.json"
    try:
        return Path(folder or Path(user_cache_dir("verify-tuner")) / "snapshots") / name, None
    except (RuntimeError, KeyError, OSError) as exc:  # a user with no home (a container's arbitrary uid)
        return None, f"no snapshot folder ({type(exc).__name__}: {exc}; snapshot_dir sets one)"
