"""What the keyed tables (best configs, graph plans, verifications, studies) share, each made from
the key's declaration (verify_tuner.keys) rather than written out per table: the columns a key
fills, the key read back from a row, and the rows selected or deleted by any of the key's fields."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, delete, select
from sqlalchemy.orm import Session
from verify_tuner import keys
from verify_tuner.store.data_version import bump_version
from verify_tuner.store.devices import get_device
from verify_tuner.store.models import REFERENCES, Device, Kernel
from verify_tuner.store.writes import affected

K = TypeVar("K", bound=keys.TableKey)


def key_columns(device_id: int, kernel_id: int, key: keys.TableKey) -> dict[str, Any]:
    """The columns `key` fills in a table keyed by it (its device and kernel by their rows' ids)."""
    refs = {"device": device_id, "kernel_hash": kernel_id}
    return {REFERENCES[n][0] if n in REFERENCES else n: refs.get(n, v) for n, v in key.values().items()}


def row_key(row: Any, device: str, kernel_hash: str, key_type: type[K]) -> K:
    """The key of a table's row, given the names of its device and kernel rows (select_keyed's)."""
    values = {f.name: getattr(row, f.name) for f, _ in keys.specs(key_type) if f.name not in REFERENCES}
    return key_type(device=device, kernel_hash=kernel_hash, **values)


def columns(model: Any, *names: str) -> list[Any]:
    """The model's columns of these key fields (the table's own: not the device's or kernel's name)."""
    return [getattr(model, n) for n in names]


def _where(model: Any, filters: dict[str, Any]) -> list[ColumnElement[bool]]:
    named = {"device": Device.name, "kernel_hash": Kernel.source_hash}
    return [(named[n] if n in named else getattr(model, n)) == v for n, v in filters.items() if v is not None]


def select_keyed(model: Any, **filters: Any) -> Select[Any]:
    """Rows of `model` with their device's name and kernel's hash, where each key field given (by its
    name in verify_tuner.keys; None: any) has that value."""
    q = select(model, Device.name, Kernel.source_hash)
    q = q.join(Device, model.device_id == Device.id).join(Kernel, model.kernel_id == Kernel.id)
    return q.where(*_where(model, filters))


def delete_keyed(
    *, session: Session, model: Any, device: str, filters: dict[str, Any], also: tuple[ColumnElement[bool], ...] = ()
) -> int:
    """Delete the rows of `device` whose key fields have the values in `filters` (None: any) and that
    meet `also`; the number deleted. Bumps data_version first, as every writer does (one lock order)."""
    dev = get_device(session=session, name=device)
    if dev is None:
        return 0
    bump_version(session)
    stmt = delete(model).where(model.device_id == dev.id, *_where(model, filters), *also)
    return affected(session, stmt)
