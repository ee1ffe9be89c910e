"""`tuner` command line: a thin layer that parses, calls the library and prints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from verify_tuner.batches import MAX_BATCH
from verify_tuner.buckets import MAX_PREFIX
from verify_tuner.cli import plans as cli_plans
from verify_tuner.cli import study as cli_study
from verify_tuner.cli.exits import clean_exit
from verify_tuner.errors import TunerError
from verify_tuner.kernels.validate import MAX_Q_LEN
from verify_tuner.keys import MAX_H
from verify_tuner.settings import Settings

JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")
H_RANGE = click.IntRange(1, MAX_H)
Q_LEN_RANGE = click.IntRange(1, MAX_Q_LEN)


def _checked_sessions(settings: Settings):  # type: ignore[no-untyped-def]
    from verify_tuner.store.migrate import checked_sessions

    _require_existing(settings.database_url)
    return checked_sessions(settings.database_url)


def _require_existing(url: str) -> None:
    """Only `tuner db upgrade` creates a database: elsewhere a missing SQLite file is a mistaken path."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:") or "uri" in parsed.query:
        return  # a server, memory, or an SQLite URI (file:...) that SQLite resolves itself
    if not Path(parsed.database).expanduser().exists():
        raise click.ClickException(
            f"no database at {parsed.database}: check the path, or create it with `tuner db upgrade`"
        )


def _database_url_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--database-url checked where it is parsed, so that a mistake in it is blamed on it."""
    if value is not None and (why := _url_problem(value)):
        raise click.BadParameter(why)
    return value


def _url_problem(url: str) -> str | None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    from verify_tuner.store.session import url_error

    try:
        make_url(url)
    except ArgumentError:
        return f"not a database URL: {url!r} (e.g. sqlite:////var/lib/tuner/configs.db or postgresql+psycopg://user@host/db)"
    return url_error(url)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="verify-tuner", message="%(prog)s %(version)s")
@click.option(
    "--database-url",
    default=None,
    callback=_database_url_option,
    help="SQLAlchemy URL of the config database (default: TUNER_DATABASE_URL, else SQLite in the user data dir).",
)
@click.pass_context
def cli(ctx: click.Context, database_url: str | None) -> None:
    """Auto-tuner and config service for the MLA verify-attention kernel."""
    env = {k: v for k, v in os.environ.items() if not (database_url and k == "TUNER_DATABASE_URL")}  # overridden
    try:
        ctx.obj = Settings.from_env(env).with_overrides(database_url=database_url)
    except TunerError as exc:
        raise click.ClickException(str(exc)) from None
    if database_url is None and (why := _url_problem(ctx.obj.database_url)):
        raise click.ClickException(f"TUNER_DATABASE_URL: {why}")


# --- db --------------------------------------------------------------------------------------
@cli.group()
def db() -> None:
    """Schema migrations of the config database."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.pass_obj
@clean_exit
def db_upgrade(settings: Settings, revision: str) -> None:
    """Create or migrate the schema (run once before `tuner serve` or `tuner study start`).

    Also creates Optuna's tables in a shared study storage, so that tuners starting together on
    several GPUs never race to create them (with a file per key: its directory and the blank
    storage each key's file is copied from when the key is first tuned)."""
    from verify_tuner.search.study_storage import prepare_study_storage
    from verify_tuner.store import migrate

    migrate.upgrade(settings.database_url, revision)
    prepare_study_storage(settings.studies)
    click.echo(f"database at revision {revision}: {_safe_url(settings.database_url)}")


@db.command("snapshot")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_obj
@clean_exit
def db_snapshot(settings: Settings, dest: Path) -> None:
    """Write DEST: an SQLite file with the devices and best configs of the config database, in
    rollback-journal mode, to mount read-only under `tuner serve --read-only-database`."""
    from verify_tuner.store.snapshot import write_snapshot

    n = write_snapshot(settings.database_url, dest)
    click.echo(f"wrote {dest}: {n} best configs")


@db.command("current")
@click.pass_obj
@clean_exit
def db_current(settings: Settings) -> None:
    """Print the schema revision of the database and the one this version needs."""
    from verify_tuner.store import migrate
    from verify_tuner.store.session import make_engine

    _require_existing(settings.database_url)
    engine = make_engine(settings.database_url, immediate=False, read_only=True)  # a look, never a write
    click.echo(f"current: {migrate.current_revision(engine) or 'none'}; head: {migrate.head_revision()}")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- serve -----------------------------------------------------------------------------------
@cli.command()
@click.option("--host", default=None, help="Bind address (TUNER_HOST, default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (TUNER_PORT, default 8177).")
@click.option("--device", default=None, help="Device answered for when a request names none (TUNER_DEVICE).")
@click.option(
    "--read-only-database",
    is_flag=True,
    default=None,
    help="The database is a read-only snapshot: open it read-only and stay ready (TUNER_DATABASE_READ_ONLY).",
)
@click.pass_obj
@clean_exit
def serve(
    settings: Settings, host: str | None, port: int | None, device: str | None, read_only_database: bool | None
) -> None:
    """Run the read-only config service (FastAPI under uvicorn)."""
    from verify_tuner.api import server
    from verify_tuner.api.app import create_app
    from verify_tuner.store.migrate import ensure_current
    from verify_tuner.store.session import make_engine

    settings = settings.with_overrides(host=host, port=port, device=device, database_read_only=read_only_database)
    # fail fast, before binding
    ensure_current(make_engine(settings.database_url, immediate=False, read_only=settings.database_read_only))
    server.run(create_app(settings), settings)  # uvicorn, with the request limits of api/server.py


# --- device ----------------------------------------------------------------------------------
@cli.group()
def device() -> None:
    """GPUs known to the database."""


@device.command("record")
@click.option(
    "--device", "ordinal", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device ordinal."
)
@click.pass_obj
@clean_exit
def device_record(settings: Settings, ordinal: int) -> None:
    """Read the local GPU's limits (needs CUDA) and store them."""
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.store import devices
    from verify_tuner.store.session import session_scope

    limits = read_device_limits(ordinal)
    with session_scope(_checked_sessions(settings)) as s:
        devices.upsert_device(session=s, limits=limits)
    click.echo(f"recorded {limits.name} ({limits.arch}, {limits.sm_count} SMs, {limits.max_smem_optin} B smem)")


@device.command("list")
@JSON_OPT
@click.pass_obj
@clean_exit
def device_list(settings: Settings, as_json: bool) -> None:
    """List recorded devices."""
    from dataclasses import asdict

    from verify_tuner.store import devices
    from verify_tuner.store.session import session_scope

    with session_scope(_checked_sessions(settings)) as s:
        recorded = devices.list_devices(session=s)
        limits = [asdict(devices.device_limits(d)) for d in recorded]
    if as_json:
        click.echo(json.dumps(limits, indent=1, allow_nan=False))
        return
    if not limits:
        click.echo("no devices recorded (`tuner device record` on a GPU host, or `tuner configs import`)")
    for d in limits:
        click.echo(
            f"{d['name']}\tcc {d['cc_major']}.{d['cc_minor']}\t{d['sm_count']} SMs\t{d['max_smem_optin']} B smem"
        )


# --- configs ---------------------------------------------------------------------------------
@cli.group()
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

    with session_scope(_checked_sessions(settings)) as s:
        rows = configs_io.export_rows(session=s, device=device, H=H, q_len=q_len)
    current = kernel_hash()
    if as_json:
        click.echo(json.dumps([{**r, "served": r["kernel_hash"] == current} for r in rows], indent=1, allow_nan=False))
        return
    if not rows:
        click.echo("no tuned configs")
    for r in rows:
        consts = " ".join(f"{k}={r[k]}" for k in PARAM_NAMES)
        served = "" if r["kernel_hash"] == current else "  (another kernel: not served)"
        click.echo(
            f"{r['device']}  H={r['H']} q_len={r['q_len']} prefix[{r['bucket_lo']},{r['bucket_hi']}) "
            f"B[{r['batch_lo']},{r['batch_hi']}]  "
            f"{consts}  {_us(r['median_us'])} (default {_us(r['default_us'])})  "
            f"kernel {r['kernel_hash']}{served}"
        )


def _us(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f} us"


@configs.command("show")
@click.option("--H", "H", type=H_RANGE, required=True)
@click.option("--q-len", type=Q_LEN_RANGE, required=True)
@click.option(
    "--prefix",
    type=click.IntRange(0, MAX_PREFIX),
    required=True,
    help="A batch's longest prefix (verify_tuner.batches.prefix_of).",
)
@click.option(
    "--batch", type=click.IntRange(1, MAX_BATCH), default=1, show_default=True, help="Requests verified in one launch."
)
@click.option("--device", default=None, help="Default: TUNER_DEVICE, else the only recorded device.")
@JSON_OPT
@click.pass_obj
@clean_exit
def configs_show(
    settings: Settings, H: int, q_len: int, prefix: int, batch: int, device: str | None, as_json: bool
) -> None:
    """The config the service would answer for this key (tuned, nearest or heuristic); JSON
    either way (--json is accepted for symmetry with the other commands)."""
    from verify_tuner.store import lookup
    from verify_tuner.store.session import session_scope

    with session_scope(_checked_sessions(settings)) as s:
        limits = lookup.resolve_device(session=s, name=device, default=settings.device)
        a = lookup.answer(session=s, limits=limits, H=H, q_len=q_len, prefix=prefix, batch=batch)
    click.echo(
        json.dumps(
            {
                **a.config.as_params(),
                "source": a.source,
                "bucket": [a.bucket.lo, a.bucket.hi],
                "batch_bucket": [a.batch_bucket.lo, a.batch_bucket.hi],
                "device": a.device,
                "expected_us": a.expected_us,
            },
            indent=2,
        )
    )


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
    from verify_tuner.files import write_shared
    from verify_tuner.store import configs_io
    from verify_tuner.store.session import session_scope

    with session_scope(_checked_sessions(settings)) as s:
        text = configs_io.dumps(configs_io.export_rows(session=s, device=device), fmt)
    if output is None:
        sys.stdout.write(text)
    else:
        write_shared(output, text)
        click.echo(f"wrote {output}")


def _write_cubins(settings: Settings, out_dir: Path, paths: list[Path]) -> Path:
    """The cubin bundle for every config the dumped files serve, on each file's device arch."""
    from verify_tuner import engine_files
    from verify_tuner.engine.bundle import write_bundle
    from verify_tuner.kernels.limits import known_device

    items = []
    for path in paths:
        doc = json.loads(path.read_text())
        limits = known_device(doc["device_name"])
        if limits is None:
            raise click.ClickException(f"{doc['device_name']}: no known arch to compile its cubins for")
        items += [(cfg, doc["q_len"], limits.arch) for cfg in engine_files.distinct_configs(doc)]
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
@click.option(
    "--cubins",
    is_flag=True,
    help="Also compile every config the files serve for each device's arch into OUT_DIR/cubins "
    "(needs nvcc): the bundle an inference host loads without nvcc (VERIFY_TUNER_CUBINS).",
)
@click.pass_obj
@clean_exit
def configs_dump(settings: Settings, out_dir: Path, device: str | None, shapes: tuple[str, ...], cubins: bool) -> None:
    """Write engine-style files, one per (H, q_len, device, dtype), named like vLLM's tuned
    configs (H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json): the whole answer table for
    the kernel this version launches, for workers that read configs from a folder."""
    from verify_tuner.store import engine_dump
    from verify_tuner.store.session import session_scope

    parsed = []
    for text in shapes:
        try:
            H, q = (int(x) for x in text.split(":"))
        except ValueError:
            raise click.BadParameter(f"expected H:Q like 8:9, got {text!r}", param_hint="--shape") from None
        if not (1 <= H <= MAX_H and 1 <= q <= MAX_Q_LEN):
            raise click.BadParameter(
                f"need 1 <= H <= {MAX_H} and 1 <= Q <= {MAX_Q_LEN}, got {text!r}", param_hint="--shape"
            )
        parsed.append((H, q))
    with session_scope(_checked_sessions(settings)) as s:
        paths = engine_dump.dump(session=s, out_dir=out_dir, device=device, shapes=parsed)
    if not paths:
        click.echo("nothing tuned for this kernel: no files written (give --shape H:Q for heuristic tables)")
    for p in paths:
        click.echo(f"wrote {p}")
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

    fmt = fmt or ("csv" if path.suffix.lower() == ".csv" else "json")
    loaded = configs_io.loads(path.read_bytes(), fmt)
    with session_scope(_checked_sessions(settings)) as s:
        result = configs_io.import_rows(session=s, rows=loaded.rows, allow_empty=loaded.dump)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    click.echo(f"imported {result.imported} config(s)")


# --- study -----------------------------------------------------------------------------------
@cli.group()
def study() -> None:
    """Optuna studies that tune the kernel on the local GPU."""


cli_study.register(study, clean_exit)  # `study start`, `study report`
cli_plans.register_study(study, clean_exit, _checked_sessions)  # `study graph-plan`
cli_plans.register_configs(configs, clean_exit, _checked_sessions)  # `configs verify`


def main() -> None:
    cli(prog_name="tuner")
