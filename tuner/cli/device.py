"""`tuner device`: the GPUs known to the database."""

from __future__ import annotations

import json

import click
from verify_tuner.cli.database import checked_sessions
from verify_tuner.cli.exits import clean_exit
from verify_tuner.cli.options import JSON_OPT, ORDINAL_OPT
from verify_tuner.settings import Settings


@click.group()
def device() -> None:
    """GPUs known to the database."""


@device.command("record")
@ORDINAL_OPT
@click.pass_obj
@clean_exit
def device_record(settings: Settings, ordinal: int) -> None:
    """Read the local GPU's limits (needs CUDA) and store them."""
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.store import devices
    from verify_tuner.store.session import session_scope

    limits = read_device_limits(ordinal)
    with session_scope(checked_sessions(settings)) as s:
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

    with session_scope(checked_sessions(settings)) as s:
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
