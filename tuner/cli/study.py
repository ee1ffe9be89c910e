"""`tuner study start` and `tuner study report` (`study graph-plan` is in verify_tuner.cli.plans);
their options and parsing are in verify_tuner.cli.study_options, what start prints in
verify_tuner.cli.study_output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from verify_tuner.cli.exits import clean_exit
from verify_tuner.cli.options import with_options
from verify_tuner.cli.study_options import REPORT_OPTS, START_OPTS, parse_devices, tune_job
from verify_tuner.cli.study_output import Bar, summary_table, waited
from verify_tuner.settings import Settings


def _start(settings: Settings, ordinal: int, devices: str | None, as_json: bool, **options: Any) -> None:
    """Tune the kernel on the local GPU(s) for each (H, q_len, prefix bucket, batch bucket) of a KV
    format; resumable, and shared with other processes running the same job (docs/operations.md)."""
    from verify_tuner.jobs.runner import stop_on_signals

    stop_on_signals()  # SIGTERM as Ctrl-C: by default it killed the run mid-write, claims held
    ordinals = parse_devices(devices) if devices else [ordinal]
    job = tune_job(options, n_devices=len(ordinals))
    if devices:
        _start_on_devices(settings, job, ordinals, as_json)
    else:
        _start_on_one(settings, job, ordinal, as_json)


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


study.command("start")(with_options(START_OPTS, click.pass_obj(clean_exit(_start))))
study.command("report")(with_options(REPORT_OPTS, click.pass_obj(clean_exit(_report))))


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
                + waited({"waited_s": r.waited_s, "declined": r.declined})
            )
    if failed and len(failed) == len(results):
        raise click.ClickException(f"every GPU's tuner failed ({len(failed)}, see above); nothing was tuned")
    if failed:
        raise click.ClickException(
            f"{len(failed)} of {len(results)} GPUs' tuners failed (see above); the others' results are stored"
        )


def _start_on_one(settings: Settings, job: Any, ordinal: int, as_json: bool) -> None:
    import json

    from verify_tuner.jobs.runner import idle, summary, tune_on_device

    bar = None if as_json else Bar()
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
            click.echo(waited(idle(res)))
    empty = [o for o in res.outcomes if not o.stored]
    if empty:
        raise click.ClickException(
            f"{len(empty)} key(s) ended with nothing stored: "
            + "; ".join(f"H={o.key.H} q={o.key.q_len} prefix={o.workload.prefix}: {o.decision}" for o in empty)
        )
