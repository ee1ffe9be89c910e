"""The options of `tuner study start` and `tuner study report`, their parsing, and the TuneJob
that start's arguments describe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from verify_tuner.buckets import MAX_PREFIX
from verify_tuner.cli.options import (
    H_OPT,
    KV_DTYPE_OPT,
    MEASURE_TIMEOUT_OPT,
    NEIGHBOUR_OPT,
    ORDINAL_OPT,
    Q_LEN_OPT,
    Integer,
    Seconds,
    integer,
    spread_option,
)


def parse_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (integer(x.strip()) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"expected LO:HI, got {text!r}", param_hint="--prefix-range") from None
    if not 0 <= lo <= hi <= MAX_PREFIX:
        raise click.BadParameter(f"need 0 <= LO <= HI <= {MAX_PREFIX}, got {text!r}", param_hint="--prefix-range")
    return lo, hi


def parse_only(items: tuple[str, ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        name, _, values = item.partition("=")
        if name.strip().upper() in out:  # the second would silently replace the first
            raise click.BadParameter(f"{name.strip().upper()} is given twice; list its values once, as NAME=V1,V2")
        try:
            out[name.strip().upper()] = [integer(v.strip()) for v in values.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected NAME=V1,V2 with integers, got {item!r}") from None
        if not out[name.strip().upper()]:
            raise click.BadParameter(f"no values in {item!r}")
    return out


def parse_devices(text: str) -> list[int]:
    try:
        out = [integer(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"--devices takes GPU ordinals like 0,1; got {text!r}") from None
    if not out or any(d < 0 for d in out):
        raise click.BadParameter(f"--devices takes GPU ordinals like 0,1; got {text!r}")
    if len(set(out)) != len(out):  # two measurers on one GPU would time each other's kernels
        raise click.BadParameter(f"--devices names a GPU twice ({text!r}): one tuner a GPU")
    return out


def parse_batches(text: str) -> list[int]:
    from verify_tuner.batches import MAX_BATCH

    try:
        out = sorted({integer(x.strip()) for x in text.split(",") if x.strip()})
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
        lo, hi = parse_range(prefix_range)
        out += [min(max(b.mid, lo), hi) for b in buckets.buckets_between(lo, hi)]
    if not out:
        raise click.UsageError("give --prefix (repeatable) or --prefix-range LO:HI")
    return sorted(set(out))


START_OPTS = [
    H_OPT,
    Q_LEN_OPT,
    KV_DTYPE_OPT,
    click.option("--prefix", type=Integer(0, MAX_PREFIX), multiple=True, help="Prefix length to tune (repeatable)."),
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
    spread_option(
        "How a batch's prefixes are drawn (seeded): uniform in 0.5x..1.5x, "
        "or one long request among short ones; scaled so the longest is the prefix."
    ),
    NEIGHBOUR_OPT,
    click.option(
        "--trials",
        type=Integer(min=1),
        default=60,
        show_default=True,
        help="Measured trials per key (invalid configs are not counted).",
    ),
    click.option("--timeout", type=Seconds(min=0, min_open=True), default=None, help="Seconds per key for the search."),
    click.option("--sampler", type=click.Choice(["tpe", "grid"]), default="tpe", show_default=True),
    click.option("--seed", type=Integer(0, 2**32 - 1), default=None, help="Sampler seed (NumPy's range)."),
    click.option(
        "--storage",
        default=None,
        help="Optuna storage URL, or an SQLite file per key with {study} in its name (default: "
        "TUNER_STUDY_STORAGE, else a file per key beside an SQLite config DB, else the config DB).",
    ),
    ORDINAL_OPT,
    click.option(
        "--devices",
        default=None,
        metavar="0,1,...",
        help="Several GPUs: one tuner process per GPU, all sharing the studies.",
    ),
    MEASURE_TIMEOUT_OPT,
    click.option(
        "--compile-jobs",
        type=Integer(min=1),
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


REPORT_OPTS = [
    click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        # the working directory, never a folder of a checkout: run there, this overwrote committed results
        default=Path("."),
        help="Folder for tuned_<device>.md and .png (default: the current directory).",
    ),
    click.option("--device", default=None, help="Default: every recorded device."),
]


def tune_job(options: dict[str, Any], *, n_devices: int) -> Any:
    """The TuneJob `study start`'s options (START_OPTS but the GPUs and the output) describe for
    `n_devices` GPUs; every option is checked here, before a worker or a GPU is touched (and before
    Optuna is imported: the measuring child starts first)."""
    from verify_tuner import space
    from verify_tuner.cli.database import url_problem
    from verify_tuner.jobs.runner import TuneJob, default_compile_jobs
    from verify_tuner.measure.backend import Workload
    from verify_tuner.study_files import study_storage_error

    storage = options["storage"]
    if storage is not None and (why := study_storage_error(storage) or url_problem(storage)):
        raise click.BadParameter(why, param_hint="--storage")
    restrict = parse_only(options["only"])
    H, q_len = options["H"], options["q_len"]
    try:
        space.choices(H, restrict, q_len=q_len)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    workloads = [
        Workload(
            H,
            q_len,
            p,
            kv_dtype=options["kv_dtype"],
            batch=b,
            spread=options["spread"],
            neighbour_mb=options["neighbour_mb"],
        )
        for b in parse_batches(options["batch_text"])
        for p in prefixes_for(options["prefix"], options["prefix_range"])
    ]
    return TuneJob(
        workloads=workloads,
        n_trials=options["trials"],
        sampler=options["sampler"],
        seed=options["seed"],
        timeout_s=options["timeout"],
        storage_url=storage,
        measure_timeout_s=options["measure_timeout"],
        restrict=restrict,
        compile_jobs=options["compile_jobs"] or default_compile_jobs(n_devices),
    )
