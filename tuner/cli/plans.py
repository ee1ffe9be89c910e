"""`tuner study graph-plan` and `tuner configs verify`: both measure through the backend on the
local GPU (open_backend, the one place that starts it; tests replace it with a fake), call the
library (verify_tuner.search.plan_job, verify_tuner.search.verify) and print.

graph-plan is a command of its own rather than a flag of `study start`: it runs no search, it
reads the winners `study start` stored, and an operator re-runs it alone (new prefix weights, a
new driver) without touching the studies."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from verify_tuner.cli.database import checked_sessions
from verify_tuner.cli.exits import clean_exit
from verify_tuner.cli.options import (
    H_OPT,
    KV_DTYPE_OPT,
    MEASURE_TIMEOUT_OPT,
    NEIGHBOUR_OPT,
    ORDINAL_OPT,
    Q_LEN_OPT,
    Integer,
    Share,
    spread_option,
    with_options,
)
from verify_tuner.search.graph_ranges import MIN_SAVING
from verify_tuner.settings import Settings


def open_backend(settings: Settings, ordinal: int, measure_timeout_s: float) -> Any:
    """The product backend on GPU `ordinal` (a measuring child owning the CUDA context)."""
    from verify_tuner.measure.gpu_backend import DEFAULT_MEASURER, IsolatedBackend

    return IsolatedBackend(
        measurer=DEFAULT_MEASURER,
        measurer_kwargs={"cache_dir": str(settings.cache_dir)},
        device_ordinal=ordinal,
        timeout_s=measure_timeout_s,
    )


class _Stderr(logging.Handler):
    """Log lines on the command's stderr (looked up at each line, not when the handler was made)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


def _log_to_stderr() -> None:
    """Every decision is logged with its measurements: shown on stderr, the summary on stdout."""
    for name in ("verify_tuner.search.plan_job", "verify_tuner.search.verify"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _Stderr) for h in logger.handlers):
            logger.addHandler(_Stderr())
        logger.setLevel(logging.INFO)


def _shown(*decls: str, **kwargs: Any) -> Callable[..., Any]:
    """An option whose default the help shows."""
    return click.option(*decls, show_default=True, **kwargs)


GPU_OPTS = [
    ORDINAL_OPT,
    MEASURE_TIMEOUT_OPT,
    _shown("--rounds", type=Integer(min=1), default=3, help="Interleaved re-timing rounds per pass."),
    _shown(
        "--passes",
        type=Integer(min=1),
        default=2,
        help="Walks over the workloads (forward, then backward, ...), the configs' order rotated each time.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
]


def _gpu_opts(fn: Callable[..., Any]) -> Callable[..., Any]:
    return with_options(GPU_OPTS, fn)


def register_study(study: click.Group) -> None:
    @study.command("graph-plan")
    @H_OPT
    @Q_LEN_OPT
    @click.option(
        "--prefix-range",
        required=True,
        metavar="[LO:]HI",
        help="The prefixes the captured graphs will replay; HI alone: 0..HI (requests join at short prefixes).",
    )
    @click.option(
        "--batch", "batch_text", default="1", show_default=True, metavar="B1,B2,...", help="Captured batch sizes."
    )
    @_shown(
        "--max-graphs",
        type=Integer(1, 8),
        default=2,
        help="Prefix ranges per batch size, each its own captured graph with its own config (1: one graph).",
    )
    @_shown(
        "--min-saving",
        type=Share(),
        default=MIN_SAVING,
        help="The share of the expected step time a further range must save (a graph costs capture time and memory).",
    )
    @click.option(
        "--prefix-weights",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="A production histogram, prefix -> weight (JSON object or list of pairs, or CSV prefix,weight); "
        "default: the range's buckets weighted equally.",
    )
    @spread_option("How each batch's prefixes are drawn (as `study start`).")
    @KV_DTYPE_OPT
    @NEIGHBOUR_OPT
    @_gpu_opts
    @click.pass_obj
    @clean_exit
    def graph_plan(settings: Settings, H: int, q_len: int, prefix_range: str, batch_text: str, **kw: Any) -> None:
        """Choose, per batch size, up to --max-graphs configs to capture in CUDA graphs, one per prefix
        range, and the breakpoints between the ranges: the stored per-prefix-bucket winners and the
        heuristic re-measured side by side at every prefix bucket of the range, the least expected step
        time under the prefix weights wins, a further range only where it saves --min-saving; stores
        each batch size's set of ranges with their regret per bucket (docs/integration.md)."""
        _graph_plan(settings, H, q_len, prefix_range, batch_text, **kw)


def _graph_plan(
    settings: Settings,
    H: int,
    q_len: int,
    prefix_range: str,
    batch_text: str,
    **kw: Any,
) -> None:
    """`tuner study graph-plan`: one plan set per batch size, measured and stored, then printed."""
    from verify_tuner import buckets
    from verify_tuner.cli.study_options import parse_batches, parse_range
    from verify_tuner.search import plan_job, prefix_weights

    lo, hi = parse_range(prefix_range if ":" in prefix_range else f"0:{prefix_range}")
    batch_sizes = parse_batches(batch_text)
    in_range = buckets.buckets_between(lo, hi)
    path = kw["prefix_weights"]
    weights = prefix_weights.load(path, in_range) if path else prefix_weights.equal(in_range)
    sessions = checked_sessions(settings)
    _require_winners(sessions, H, q_len, kw["kv_dtype"], f"{lo}:{hi}", {b.index for b in in_range}, batch_sizes)
    _log_to_stderr()
    if lo > 0:  # the graphs replay them all the same, with the first range's config
        click.echo(f"note: prefixes below {lo} are not measured; the first range's config serves them", err=True)
    backend = open_backend(settings, kw["ordinal"], kw["measure_timeout"])
    try:
        job = plan_job.PlanJob(
            H,
            q_len,
            lo,
            hi,
            weights,
            kv_dtype=kw["kv_dtype"],
            spread=kw["spread"],
            rounds=kw["rounds"],
            passes=kw["passes"],
            neighbour_mb=kw["neighbour_mb"],
            max_graphs=kw["max_graphs"],
            min_saving=kw["min_saving"],
        )
        results = [plan_job.plan_batch(backend=backend, sessions=sessions, job=job, batch=b) for b in batch_sizes]
    finally:
        backend.close()
    _print_plans(results, weights, kw["as_json"])


def _require_winners(
    sessions: Any, H: int, q_len: int, kv_dtype: str, prefix_range: str, in_range: set[int], batch_sizes: list[int]
) -> None:
    """Say that nothing is tuned to plan from before opening the GPU: a machine without PyCUDA was told
    to install it first, to learn then that there was nothing to measure. Any device's winners count
    here (the GPU names the device); plan_job checks this GPU's per batch size."""
    from verify_tuner import batches
    from verify_tuner.kernels import kernel_hash
    from verify_tuner.store import best_configs
    from verify_tuner.store.session import session_scope

    wanted = {batches.bucket_of(b).index for b in batch_sizes}
    with session_scope(sessions) as s:
        rows = best_configs.list_best(session=s, H=H, q_len=q_len, kv_dtype=kv_dtype)
    if not any(
        r.key.kernel_hash == kernel_hash() and r.key.bucket in in_range and r.key.batch_bucket in wanted for r in rows
    ):
        sizes = ", ".join(map(str, batch_sizes))
        raise click.ClickException(
            f"no tuned configs for H={H} q_len={q_len} {kv_dtype} batch {sizes} in prefixes {prefix_range} on any "
            f"device: tune them first (tuner study start --H {H} --q-len {q_len} --kv-dtype {kv_dtype} "
            f"--prefix-range {prefix_range} --batch ...)"
        )


def _set_doc(r: Any) -> dict[str, Any]:
    """One batch size's plan set as `--json` prints it: the set's figures, then its ranges as served."""
    from verify_tuner.store.plan_docs import range_docs
    from verify_tuner.store.plans import PlanSet

    rp = r.ranged
    docs = range_docs(PlanSet(tuple(r.rows)))
    return {
        "batch": r.batch,
        "batch_bucket": docs[0]["batch_bucket"],
        "range_count": len(docs),
        "breakpoints": docs[0]["breakpoints"],
        "expected_us": rp.expected_us,
        "expected_us_by_graphs": docs[0]["expected_us_by_graphs"],
        "regret_geomean": rp.geomean_regret,
        "regret_worst": rp.worst_regret,
        "heuristic": r.heuristic.as_params(),
        "heuristic_expected_us": r.heuristic_us,
        "untuned": r.untuned,
        "ranges": docs,
    }


def _print_plans(results: list[Any], weights: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([_set_doc(r) for r in results], indent=1, allow_nan=False))
        return
    if weights.outside:
        click.echo(f"note: {weights.outside:.1%} of the weights lay outside the range, counted at its end buckets")
    for r in results:
        rp, doc = r.ranged, _set_doc(r)
        vs = f", heuristic {r.heuristic_us:.2f} us ({r.heuristic_us / rp.expected_us:.2f}x)" if r.heuristic_us else ""
        one = rp.by_count[0]
        fewer = f" (1 graph: {one:.2f} us)" if len(rp.ranges) > 1 and one != float("inf") else ""
        click.echo(
            f"batch {r.batch}: {len(rp.ranges)} graph(s), breakpoints {doc['breakpoints']}: expected "
            f"{rp.expected_us:.2f} us{fewer}{vs}; regret geomean {rp.geomean_regret:.3f}x, worst "
            f"{rp.worst_regret:.3f}x over {sum(len(p.buckets) for p in rp.ranges)} buckets"
            + (f" ({len(r.untuned)} without a tuned winner)" if r.untuned else "")
        )
        for d, row in zip(doc["ranges"], r.rows):
            click.echo(
                f"  range [{d['prefix_lo']}, {d['prefix_hi']}): {row.config}: regret geomean "
                f"{d['regret_geomean']:.3f}x, worst {d['regret_worst']:.3f}x"
            )
            for b in row.per_bucket:
                click.echo(
                    f"    prefix [{b['prefix_lo']}, {b['prefix_hi']}): {b['us']:.2f} us, best {b['best_us']:.2f} us, "
                    f"regret {b['regret']:.3f}x"
                )


def register_configs(configs: click.Group) -> None:
    @configs.command("verify")
    @click.option(
        "--sample",
        type=Integer(min=1),
        default=None,
        metavar="N",
        help="Verify only the N least recently verified rows (default: every row of this GPU's device).",
    )
    @_gpu_opts
    @click.pass_obj
    @clean_exit
    def verify(settings: Settings, sample: int | None, **kw: Any) -> None:
        """Re-time stored bests against the heuristic on this GPU and mark those that no longer win
        (stale: not served until re-tuned) or whose time moved beyond the noise; every verification is
        stored, nothing is deleted."""
        from verify_tuner.search import verify as verify_mod

        sessions = checked_sessions(settings)
        _log_to_stderr()
        backend = open_backend(settings, kw["ordinal"], kw["measure_timeout"])
        try:
            done = verify_mod.verify(
                backend=backend, sessions=sessions, sample=sample, rounds=kw["rounds"], passes=kw["passes"]
            )
        finally:
            backend.close()
        if kw["as_json"]:
            click.echo(json.dumps([_verification_doc(v) for v in done], indent=1, allow_nan=False))
            return
        if not done:
            click.echo("nothing to verify: no stored bests of this kernel on this device")
        for v in done:
            click.echo(verify_mod.describe(v))
        counts = {k: sum(v.verdict == k for v in done) for k in ("ok", "moved", "stale", "failed")}
        click.echo(", ".join(f"{n} {k}" for k, n in counts.items()))


def _verification_doc(v: Any) -> dict[str, Any]:
    return {
        "device": v.key.device,
        "kv_dtype": v.key.kv_dtype,
        "H": v.key.H,
        "q_len": v.key.q_len,
        "bucket": v.key.bucket,
        "batch_bucket": v.key.batch_bucket,
        **v.config.as_params(),
        "stored_us": v.stored_us,
        "measured_us": v.measured_us,
        "heuristic_us": v.heuristic_us,
        "noise": v.noise,
        "neighbour_mb": v.neighbour_mb,
        "verdict": v.verdict,
        "reason": v.reason,
    }
