"""`tuner configs`: the best configs stored in the database, listed, shown, exported, dumped as
engine files and imported (`configs verify` is in verify_tuner.cli.plans)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from verify_tuner.batches import MAX_BATCH
from verify_tuner.buckets import MAX_PREFIX
from verify_tuner.cli.database import checked_sessions
from verify_tuner.cli.exits import clean_exit
from verify_tuner.cli.options import H_RANGE, JSON_OPT, KV_DTYPE_OPT, Q_LEN_RANGE, Integer, integer
from verify_tuner.kernels.validate import MAX_Q_LEN
from verify_tuner.keys import MAX_H
from verify_tuner.settings import Settings


@click.group()
def configs() -> None:
    """Best configs stored in the database."""


@configs.command("list")
@click.option("--device", default=None)
@click.option("--H", "H", type=H_RANGE, default=None)
@click.option("--q-len", type=Q_LEN_RANGE, default=None)
@JSON_OPT
@click.pass_obj
@clean_exit
def configs_list(settings: Settings, device: str | None, H: int | None, q_len: int | None, as_json: bool) -> None:
    """One line per stored best config (with STAGES and the kernel hash)."""
    from verify_tuner.kernels import kernel_hash
    from verify_tuner.kernels.config import PARAM_NAMES
    from verify_tuner.store import configs_io
    from verify_tuner.store.session import session_scope

    with session_scope(checked_sessions(settings)) as s:
        rows = configs_io.export_rows(session=s, device=device, H=H, q_len=q_len)
    current = kernel_hash()
    if as_json:
        click.echo(json.dumps([{**r, "served": _served(r, current)} for r in rows], indent=1, allow_nan=False))
        return
    if not rows:
        click.echo("no tuned configs")
    for r in rows:
        consts = " ".join(f"{k}={r[k]}" for k in PARAM_NAMES)
        if r["kernel_hash"] != current:
            served = "  (another kernel: not served)"
        elif r["verdict"] == "stale":
            served = f"  (verified stale {r['verified_at']}: not served, the heuristic answers)"
        else:
            served = ""
        click.echo(
            f"{r['device']}  {r['kv_dtype']} H={r['H']} q_len={r['q_len']} prefix[{r['bucket_lo']},{r['bucket_hi']}) "
            f"B[{r['batch_lo']},{r['batch_hi']}]  "
            f"{consts}  {_us(r['median_us'])} (default {_us(r['default_us'])}{_timed(r['neighbour_mb'])})  "
            f"kernel {r['kernel_hash']}{served}"
        )


def _served(row: dict[str, Any], current: str) -> bool:
    """What the sidecar does with the row: this kernel's, and not verified stale (verify_tuner.store.lookup)."""
    return row["kernel_hash"] == current and row["verdict"] != "stale"


def _timed(neighbour_mb: int) -> str:
    """How the row's times were measured, where not back to back (docs/operations.md)."""
    return f", cold: {neighbour_mb} MB neighbour" if neighbour_mb else ""


def _us(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f} us"


@configs.command("show")
@click.option("--H", "H", type=H_RANGE, required=True)
@click.option("--q-len", type=Q_LEN_RANGE, required=True)
@click.option(
    "--prefix",
    type=Integer(0, MAX_PREFIX),
    required=True,
    help="A batch's longest prefix (verify_tuner.batches.prefix_of).",
)
@click.option(
    "--batch", type=Integer(1, MAX_BATCH), default=1, show_default=True, help="Requests verified in one launch."
)
@click.option("--device", default=None, help="Default: TUNER_DEVICE, else the only recorded device.")
@KV_DTYPE_OPT
@JSON_OPT
@click.pass_obj
@clean_exit
def configs_show(
    settings: Settings, H: int, q_len: int, prefix: int, batch: int, device: str | None, kv_dtype: str, as_json: bool
) -> None:
    """The config the service would answer for this key (tuned, nearest or heuristic), as the JSON
    GET /config answers (--json is accepted for symmetry with the other commands)."""
    from verify_tuner.api.schemas import ConfigEntryOut, ConfigOut, GraphPlanOut
    from verify_tuner.store import lookup, plan_docs, plans
    from verify_tuner.store.session import session_scope

    with session_scope(checked_sessions(settings)) as s:
        limits = lookup.resolve_device(session=s, name=device, default=settings.device)
        key = lookup.local_key(limits, H=H, q_len=q_len, kv_dtype=kv_dtype)
        a = lookup.answer(session=s, limits=limits, key=key, prefix=prefix, batch=batch)
        chosen = plans.served_sets(session=s, table=key).get(a.batch_bucket.index)
    # the range of the batch bucket's plan set that holds this prefix, as GET /config answers
    graph_plan = (
        None if chosen is None else GraphPlanOut.model_validate(plan_docs.range_docs(chosen)[chosen.index_of(prefix)])
    )
    out = ConfigOut(**dict(ConfigEntryOut.of(a)), graph_plan=graph_plan)
    click.echo(json.dumps(out.model_dump(mode="json"), indent=2))


@configs.command("export")
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default="json", show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write (default: stdout).",
)
@click.option("--device", default=None)
@click.pass_obj
@clean_exit
def configs_export(settings: Settings, fmt: str, output: Path | None, device: str | None) -> None:
    """Write every stored best config as JSON or CSV."""
    from verify_tuner.files import UMASK, write_shared
    from verify_tuner.store import configs_io, lookup, plans
    from verify_tuner.store.session import session_scope

    if output is not None and output.is_dir():  # -o "" is Path("."): the write would replace a folder
        raise click.BadParameter(f"{str(output)!r} is a folder; give a file name", param_hint="-o/--output")
    with session_scope(checked_sessions(settings)) as s:
        text = configs_io.dumps(configs_io.export_rows(session=s, device=device), fmt)
        n_plans = len(plans.list_plans(session=s, device=lookup.device_name(session=s, name=device)))
    if output is None or str(output) == "-":  # `-o -`: stdout, as other tools spell it
        sys.stdout.write(text)
    else:
        write_shared(output, text, mode=UMASK)  # the operator's umask, as for any file they make
        click.echo(f"wrote {output}")
    if n_plans:  # rows of best configs only: say what stays behind rather than let an import look whole
        click.echo(f"note: {n_plans} graph plan(s) are not in the export; `tuner db snapshot` carries them", err=True)


def _write_cubins(settings: Settings, out_dir: Path, paths: list[Path]) -> Path:
    """The cubin bundle for every config the dumped files serve, on each file's device arch."""
    from verify_tuner import engine_files
    from verify_tuner.engine.bundle import Item, write_bundle
    from verify_tuner.kernels.limits import known_device

    items = []
    for path in paths:
        doc = json.loads(path.read_text())
        key = engine_files.doc_key_values(doc)
        limits = known_device(key["device"])
        if limits is None:
            raise click.ClickException(f"{key['device']}: no known arch to compile its cubins for")
        items += [Item(cfg, key["q_len"], key["kv_dtype"], limits.arch) for cfg in engine_files.distinct_configs(doc)]
    n, arches = len(set(items)), ", ".join(sorted({it.arch for it in items}))
    # nvcc takes seconds a config, cached ones none: say what the silence is
    click.echo(f"compiling {n} cubin(s) for {arches} with nvcc (cached ones are reused) ...", err=True)
    return write_bundle(out_dir / "cubins", items, cache_dir=settings.cache_dir)


@configs.command("dump")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the files (created if missing); point VERIFY_TUNER_CONFIG_DIR at it.",
)
@click.option("--device", default=None, help="Default: every recorded device.")
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="H:Q",
    help="Also write this (H, q_len) where nothing is tuned (heuristic table); repeatable.",
)
@KV_DTYPE_OPT
@click.option(
    "--cubins",
    is_flag=True,
    help="Also compile every config the files serve for each device's arch into OUT_DIR/cubins "
    "(needs nvcc): the bundle an inference host loads without nvcc (VERIFY_TUNER_CUBINS).",
)
@click.pass_obj
@clean_exit
def configs_dump(
    settings: Settings, out_dir: Path, device: str | None, shapes: tuple[str, ...], kv_dtype: str, cubins: bool
) -> None:
    """Write engine-style files, one per table (device, KV format, H, q_len), named like vLLM's
    tuned configs (H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json, dtype the KV cache's
    format): the whole answer table for the kernel this version launches, for workers that read
    configs from a folder. --kv-dtype is the format of the --shape tables."""
    from verify_tuner.files import private_umask
    from verify_tuner.store import engine_dump, lookup
    from verify_tuner.store.session import session_scope

    parsed = []
    for text in shapes:
        try:
            H, q = (integer(x.strip()) for x in text.split(":"))
        except ValueError:
            raise click.BadParameter(f"expected H:Q like 8:9, got {text!r}", param_hint="--shape") from None
        if not (1 <= H <= MAX_H and 1 <= q <= MAX_Q_LEN):
            raise click.BadParameter(
                f"need 1 <= H <= {MAX_H} and 1 <= Q <= {MAX_Q_LEN}, got {text!r}", param_hint="--shape"
            )
        parsed.append((H, q))
    with session_scope(checked_sessions(settings)) as s:
        paths = engine_dump.dump(session=s, out_dir=out_dir, device=device, shapes=parsed, kv_dtype=kv_dtype)
        name = lookup.device_name(session=s, name=device)
    if not paths and parsed:  # shapes asked for, but no device to write their heuristic tables for
        raise click.ClickException(
            "no device to write the --shape tables for: this database records none; name the GPU with "
            "--device (e.g. --device h200)"
        )
    if not paths:
        click.echo("nothing tuned for this kernel: no files written (heuristic tables: --shape H:Q --device NAME)")
    for p in paths:
        click.echo(f"wrote {p}")
    old = engine_dump.left_over(out_dir=out_dir, written=paths, device=name)
    if old:  # removing an operator's files is theirs to decide; a worker would load them all the same
        click.echo(
            f"warning: {len(old)} config file(s) in {out_dir} are not from this dump, and workers reading the "
            "folder still load them (remove them if their shapes are no longer wanted): "
            + ", ".join(p.name for p in old),
            err=True,
        )
    if paths and private_umask():
        click.echo("note: the umask keeps other users from reading these files (umask 022 shares them)", err=True)
    if cubins and paths:
        manifest = _write_cubins(settings, out_dir, paths)
        click.echo(f"wrote {manifest}")


@configs.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["json", "csv"]), default=None, help="Default: from the file extension."
)
@click.pass_obj
@clean_exit
def configs_import(settings: Settings, path: Path, fmt: str | None) -> None:
    """Import best configs; every row is checked and the file is rejected whole on any error."""
    from verify_tuner.store import configs_io
    from verify_tuner.store.session import session_scope

    guessed, fmt = fmt is None, fmt or ("csv" if path.suffix.lower() == ".csv" else "json")
    if not path.is_file():  # a device or a pipe (/dev/zero) would be read until memory runs out
        raise click.BadParameter(f"{path} is not a regular file", param_hint="PATH")
    try:
        loaded = configs_io.loads(path.read_bytes(), fmt)
    except configs_io.ImportRejected as exc:
        if guessed and fmt == "json" and path.suffix.lower() != ".json" and exc.errors[0].startswith("not valid JSON"):
            why = f"{exc.errors[0]} (read as JSON, as {path.name} does not end in .csv: give --format csv for CSV)"
            raise configs_io.ImportRejected([why], whole_file=True) from None
        raise
    with session_scope(checked_sessions(settings)) as s:
        result = configs_io.import_rows(session=s, rows=loaded.rows, allow_empty=loaded.dump)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if loaded.plans:  # a served plan's file form lacks what a stored one keeps (its weights, finalists)
        click.echo(
            f"warning: the file's {loaded.plans} graph plan(s) are not imported: run `tuner study graph-plan` "
            "here, or move a whole database with `tuner db snapshot`",
            err=True,
        )
    click.echo(f"imported {result.imported} config(s)")
    if loaded.dump and not loaded.rows:  # a dump of an untuned table: its answers are derived, not stored
        click.echo("note: the file holds no tuned rows (its heuristic answers are not stored)", err=True)
