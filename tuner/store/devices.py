"""Queries of devices and kernels, keyword-only, each taking the session: the rows a workload
key's device and kernel hash name. The API and CLI call these, never raw SQL."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session
from verify_tuner.errors import StorageError
from verify_tuner.kernels.build import KERNEL_NAME, KERNEL_VERSION
from verify_tuner.kernels.limits import DeviceLimits
from verify_tuner.store.data_version import bump_version
from verify_tuner.store.models import Device, Kernel, utcnow
from verify_tuner.store.writes import insert_ignore, upsert


def upsert_device(*, session: Session, limits: DeviceLimits) -> Device:
    values = {
        "compute_capability": limits.compute_capability,
        "sm_count": limits.sm_count,
        "max_smem_optin": limits.max_smem_optin,
        "smem_per_sm": limits.smem_per_sm,
        "regs_per_sm": limits.regs_per_sm,
        "regs_per_block": limits.regs_per_block,
        "max_threads_per_block": limits.max_threads_per_block,
        "l2_bytes": limits.l2_bytes,
        "driver_version": limits.driver_version,
        "cuda_version": limits.cuda_version,
        "recorded_at": utcnow(),
    }
    if limits.copy_bw_gbps is not None:  # a known-table record must not erase a measured figure
        values["copy_bw_gbps"] = limits.copy_bw_gbps
    # Every study key and claim records its device: a row that already says the same is left alone,
    # so the sidecar's cache stamp (and every worker's table) does not turn over for nothing.
    current = get_device(session=session, name=limits.name)
    if current is not None and all(getattr(current, k) == v for k, v in values.items() if k != "recorded_at"):
        return current
    bump_version(session)
    upsert(session, Device, key_cols={"name": limits.name}, values=values)
    return session.scalars(select(Device).where(Device.name == limits.name)).one()


def get_device(*, session: Session, name: str) -> Device | None:
    return session.scalars(select(Device).where(Device.name == name)).one_or_none()


def list_devices(*, session: Session) -> list[Device]:
    return list(session.scalars(select(Device).order_by(Device.name)))


def device_limits(device: Device) -> DeviceLimits:
    major, minor = (int(x) for x in device.compute_capability.split("."))
    return DeviceLimits(
        name=device.name,
        cc_major=major,
        cc_minor=minor,
        sm_count=device.sm_count,
        max_smem_optin=device.max_smem_optin,
        smem_per_sm=device.smem_per_sm,
        regs_per_sm=device.regs_per_sm,
        regs_per_block=device.regs_per_block,
        max_threads_per_block=device.max_threads_per_block,
        l2_bytes=device.l2_bytes,
        driver_version=device.driver_version,
        cuda_version=device.cuda_version,
        copy_bw_gbps=device.copy_bw_gbps,
    )


def key_ids(
    *,
    session: Session,
    device: str,
    kernel_hash: str,
    kernel_name: str = KERNEL_NAME,
    kernel_version: str = KERNEL_VERSION,
) -> tuple[int, int]:
    """The ids of a key's device row, which must be recorded, and kernel row (inserted on first use)."""
    dev = get_device(session=session, name=device)
    if dev is None:
        raise StorageError(f"device {device!r} is not recorded; record it first (tuner device record)")
    return dev.id, upsert_kernel(session=session, source_hash=kernel_hash, name=kernel_name, version=kernel_version).id


def upsert_kernel(*, session: Session, source_hash: str, name: str, version: str) -> Kernel:
    """The kernel row of `source_hash`, inserted on first use. An existing row is not rewritten
    (its name and version come from the same source): a rewrite would lock the row, and two
    tuners storing winners then deadlock against each other's data_version bump."""
    insert_ignore(session, Kernel, key_cols={"source_hash": source_hash}, values={"name": name, "version": version})
    return session.scalars(select(Kernel).where(Kernel.source_hash == source_hash)).one()
