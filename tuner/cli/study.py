"""`tuner study start` and `tuner study report` (`study graph-plan` is in verify_tuner.cli.plans)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from verify_tuner.buckets import MAX_PREFIX
from verify_tuner.cli.exits import clean_exit
from verify_tuner.settings import Settings


def _parse_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"expected LO:HI, got {text!r}", param_hint="--prefix-range") from None
    if not 0 <= lo <= hi <= MAX_PREFIX:
        raise click.BadParameter(f"need 0 <= LO <= HI <= {MAX_PREFIX}, got {text!r}", param_hint="--prefix-range")
    return lo, hi


def _parse_only(items: tuple[str, ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        name, _, values = item.partition("=")
        try:
            out[name.strip().upper()] = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected NAME=V1,V2 with integers, got {item!r}") from None
        if not out[name.strip().upper()]:
            raise click.BadParameter(f"no values in {item!r}")
    return out


def _parse_devices(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"--devices takes GPU ordinals like 0,1; got {text!r}") from None
    if not out or any(d < 0 for d in out):
        raise click.BadParameter(f"--devices takes GPU ordinals like 0,1; got {text!r}")
    return out


def _parse_batches(text: str) -> list[int]:
    from verify_tuner.batches import MAX_BATCH

    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(f"--batch takes batch sizes like 1,8,32; got {text!r}") from None
    if not out or not all(1 <= b <= MAX_BATCH for b in out):
        raise click.BadParameter(f"--batch takes batch sizes in 1..{MAX_BATCH} like 1,8,32; got {text!r}")
    return out


def prefixes_for(prefix: tuple[int, ...], prefix_range: str | None) -> list[int]:
    """Explicit prefixes, plus one representative prefix per bucket of the range."""
    from verify_tuner import buckets

    out = list(prefix)
    if prefix_range:
        lo, hi = _parse_range(prefix_range)
        out += [min(max(b.mid, lo), hi) for b in buckets.buckets_between(lo, hi)]
    if not out:
        raise click.UsageError("give --prefix (repeatable) or --prefix-range LO:HI")
    return sorted(set(out))


class _Bar:
    """One self-rewriting status line on stderr (a plain line per update when not a TTY)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def __call__(self, p: Any) -> None:
        best = f"{p.best_us:.1f} us" if p.best_us else "-"
        sp = f" ({p.default_us / p.best_us:.2f}x vs default)" if p.best_us and p.default_us else ""
        width = 24
        done = int(width * min(p.measured, p.budget) / max(p.budget, 1))
        line = (
            f"H={p.key.H} q={p.key.q_len} b{p.key.bucket} B{p.key.batch_bucket} [{'#' * done}{'.' * (width - done)}] "
            f"{p.measured}/{p.budget}  best {best}{sp}"
        )
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def _with_options(options: list[Callable[..., Any]], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` decorated with `options`, listed in the order --help shows them."""
    for opt in reversed(options):
        fn = opt(fn)
    return fn


START_OPTS = [
    click.option("--H", "H", type=click.IntRange(1, 1024), required=True, help="Heads per GPU."),
    click.option("--q-len", type=click.IntRange(1, 64), required=True, help="Draft nodes per request."),
    click.option(
        "--prefix", type=click.IntRange(0, MAX_PREFIX), multiple=True, help="Prefix length to tune (repeatable)."
    ),
    click.option("--prefix-range", default=None, help="LO:HI - tune every prefix bucket in the range."),
    click.option(
        "--batch",
        "batch_text",
        default="1",
        show_default=True,
        metavar="B1,B2,...",
        help="Requests per launch to tune for, e.g. 1,8,32: one key per batch bucket; each measures a "
        "ragged batch whose longest prefix is the key's prefix.",
    ),
    click.option(
        "--spread",
        type=click.Choice(["uniform", "one-long", "equal"]),
        default="uniform",
        show_default=True,
        help="How a batch's prefixes are drawn (seeded): uniform in 0.5x..1.5x, "
        "or one long request among short ones; scaled so the longest is the prefix.",
    ),
    click.option(
        "--trials",
        type=click.IntRange(min=1),
        default=60,
        show_default=True,
        help="Measured trials per key (invalid configs are not counted).",
    ),
    click.option(
        "--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds per key for the search."
    ),
    click.option("--sampler", type=click.Choice(["tpe", "grid"]), default="tpe", show_default=True),
    click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=None, help="Sampler seed (NumPy's range)."),
    click.option(
        "--storage",
        default=None,
        help="Optuna storage URL, or an SQLite file per key with {study} in its name (default: "
        "TUNER_STUDY_STORAGE, else a file per key beside an SQLite config DB, else the config DB).",
    ),
    click.option(
        "--device", "ordinal", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device ordinal."
    ),
    click.option(
        "--devices",
        default=None,
        metavar="0,1,...",
        help="Several GPUs: one tuner process per GPU, all sharing the studies.",
    ),
    click.option(
        "--measure-timeout",
        type=click.FloatRange(min=1),
        default=120.0,
        show_default=True,
        help="Seconds before a hanging measurement is killed.",
    ),
    click.option(
        "--compile-jobs",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="Trials in flight per GPU: each compiles its config in its own thread while one at a time "
        "measures. Default: the host's cores / GPUs, at most 8.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (one object per key)."),
    click.option(
        "--only",
        "only",
        multiple=True,
        metavar="NAME=V1,V2",
        help="Restrict a constant's candidates, e.g. --only STAGES=2 --only BLOCK=256,512.",
    ),
]


def _start(
    settings: Settings,
    H: int,
    q_len: int,
    prefix: tuple[int, ...],
    prefix_range: str | None,
    batch_text: str,
    spread: str,
    trials: int,
    timeout: float | None,
    sampler: str,
    seed: int | None,
    storage: str | None,
    ordinal: int,
    devices: str | None,
    compile_jobs: int | None,
    measure_timeout: float,
    as_json: bool,
    only: tuple[str, ...],
) -> None:
    """Tune the kernel on the local GPU(s) for each (H, q_len, prefix bucket, batch bucket);
    resumable, and shared with other processes running the same job (docs/operations.md)."""
    from verify_tuner.jobs.runner import default_compile_jobs

    ordinals = _parse_devices(devices) if devices else [ordinal]
    job = _job(
        H,
        q_len,
        prefix,
        prefix_range,
        batch_text,
        spread,
        only,
        trials=trials,
        sampler=sampler,
        seed=seed,
        timeout=timeout,
        storage=storage,
        measure_timeout=measure_timeout,
        compile_jobs=compile_jobs or default_compile_jobs(len(ordinals)),
    )
    if devices:
        _start_on_devices(settings, job, ordinals, as_json)
    else:
        _start_on_one(settings, job, ordinal, as_json)


REPORT_OPTS = [
    click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("bench/results"),
        show_default=True,
    ),
    click.option("--device", default=None, help="Default: every recorded device."),
]


def _report(settings: Settings, out_dir: Path, device: str | None) -> None:
    """Write a markdown table and a PNG (default vs tuned per bucket, with the memory floor)."""
    from verify_tuner.store.migrate import checked_sessions
    from verify_tuner.store.report import write_report

    written = write_report(sessions=checked_sessions(settings.database_url), out_dir=out_dir, device=device)
    if not written:
        raise click.ClickException(
            "nothing tuned" + (f" on {device}" if device else "") + ": no report written (`tuner configs list`)"
        )
    for path in written:
        click.echo(f"wrote {path}")


@click.group()
def study() -> None:
    """Optuna studies that tune the kernel on the local GPU."""


study.command("start")(_with_options(START_OPTS, click.pass_obj(clean_exit(_start))))
study.command("report")(_with_options(REPORT_OPTS, click.pass_obj(clean_exit(_report))))


def _job(
    H: int,
    q_len: int,
    prefix: tuple[int, ...],
    prefix_range: str | None,
    batch_text: str,
    spread: str,
    only: tuple[str, ...],
    **kw: Any,
) -> Any:
    """The TuneJob the arguments describe; every argument is checked here, before a worker or a
    GPU is touched (and before Optuna is imported: the measuring child starts first)."""
    from verify_tuner import space
    from verify_tuner.jobs.runner import TuneJob
    from verify_tuner.measure.backend import Workload
    from verify_tuner.study_files import study_storage_error

    if kw["storage"] is not None and (why := study_storage_error(kw["storage"])):
        raise click.BadParameter(why, param_hint="--storage")
    restrict = _parse_only(only)
    try:
        space.choices(H, restrict, q_len=q_len)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    workloads = [
        Workload(H, q_len, p, batch=b, spread=spread)
        for b in _parse_batches(batch_text)
        for p in prefixes_for(prefix, prefix_range)
    ]
    return TuneJob(
        workloads=workloads,
        n_trials=kw["trials"],
        sampler=kw["sampler"],
        seed=kw["seed"],
        timeout_s=kw["timeout"],
        storage_url=kw["storage"],
        measure_timeout_s=kw["measure_timeout"],
        restrict=restrict,
        compile_jobs=kw["compile_jobs"],
    )


def _start_on_devices(settings: Settings, job: Any, devices: list[int], as_json: bool) -> None:
    import json

    from verify_tuner.jobs.runner import tune_on_devices

    results = tune_on_devices(settings, job, devices)
    failed = [r for r in results if not r.ok]
    if as_json:
        click.echo(json.dumps([r.as_json() for r in results], indent=1, allow_nan=False))
    else:
        for r in results:
            if not r.ok:
                click.echo(f"GPU {r.device}: failed: {r.error}", err=True)
                continue
            for k in r.keys:
                click.echo(
                    f"GPU {r.device}: {k['key']} prefix={k['prefix']} batch={k['batch']} best {k['best']} "
                    f"({k['best_us'] or float('nan'):.1f} us) {k['decision']} {k['counts']}"
                )
            click.echo(
                f"GPU {r.device}: owned {len(r.keys)} key(s), helped with {r.helped}, "
                f"left {r.done_before} to the other processes or to an earlier run, "
                + _waited({"waited_s": r.waited_s, "declined": r.declined})
            )
    if failed:
        raise click.ClickException("a GPU's tuner failed (see above); the others' results are stored")


def _waited(idle: dict[str, Any]) -> str:
    """What verify_tuner.jobs.runner.idle reports, as a phrase."""
    declined = ", ".join(
        f"prefix={d['prefix']} batch={d['batch']} with {d['places_left']} places left" for d in idle["declined"]
    )
    return f"waited {idle['waited_s']:.1f} s for keys other processes owned" + (
        f" (not helped: {declined})" if declined else ""
    )


def _start_on_one(settings: Settings, job: Any, ordinal: int, as_json: bool) -> None:
    import json

    from verify_tuner.jobs.runner import idle, summary, tune_on_device

    bar = None if as_json else _Bar()
    res = tune_on_device(settings, job, ordinal, on_progress=bar, on_key_done=bar.end if bar else None)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "keys": [summary(o) for o in res.outcomes],
                    "helped": len(res.helped),
                    "done_before": [vars(w) for w in res.done_before],
                    **idle(res),
                },
                indent=1,
                allow_nan=False,
            )
        )
    else:
        click.echo(summary_table(res.outcomes))
        for wl in res.done_before:
            click.echo(
                f"H={wl.H} q={wl.q_len} prefix={wl.prefix} batch={wl.batch}: already tuned with the full "
                "budget (raise --trials to search further)"
            )
        if res.helped:
            click.echo(f"helped {len(res.helped)} key(s) owned by other tuner processes")
        if res.waited_s or res.declined:  # another host (or tuner) runs the same job
            click.echo(_waited(idle(res)))
    empty = [o for o in res.outcomes if not o.stored]
    if empty:
        raise click.ClickException(
            f"{len(empty)} key(s) ended with nothing stored: "
            + "; ".join(f"H={o.key.H} q={o.key.q_len} prefix={o.workload.prefix}: {o.decision}" for o in empty)
        )


def summary_table(outcomes: list[Any]) -> str:
    lines = [
        (
            "| key | prefix | batch | trials (ok/invalid/failed) | default | best | best µs | default µs | speedup | "
            "decision | wall s |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        c = o.counts
        best_us = f"{o.best_m.median_us:.1f}" if o.best_m else "-"
        def_us = f"{o.default_m.median_us:.1f}" if o.default_m else "-"
        sp = f"{o.speedup:.2f}x" if o.speedup else "-"
        lines.append(
            f"| H={o.key.H} q={o.key.q_len} b{o.key.bucket} B{o.key.batch_bucket} | {o.workload.prefix} | "
            f"{o.workload.batch} | "
            f"{c.get('trials', 0)} ({c.get('ok', 0)}/{c.get('invalid', 0)}/{c.get('failed', 0)}) | "
            f"{o.default} | {o.best} | {best_us} | {def_us} | {sp} | {o.decision} | {o.wall_s:.0f} |"
        )
    return "\n".join(lines)
