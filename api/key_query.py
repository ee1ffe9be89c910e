"""The query parameters that name an answer table, made from the key's declaration
(verify_tuner.keys.TableKey): one parameter a field, with the key's description, bounds and check
(an unknown kv_dtype is a 422 naming it and the accepted ones). A field the request leaves out
takes its default; a `local` one (device, kernel_hash) the sidecar's own. A field's former name
(`dtype` for kv_dtype) is still read, for workers older than the rename."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request
from pydantic import AfterValidator
from verify_tuner.api.deps import DEVICE_PATTERN, Digits
from verify_tuner.errors import BadParameter
from verify_tuner.keys import Spec, TableKey, field_types, specs


@dataclass(frozen=True)
class KeyQuery:
    """A table key as a request names it: (field, value) in the key's order, None for a local field
    not named (the sidecar's device or kernel, filled in by `with_local`). Hashable: it keys the
    sidecar's table cache before the device name is resolved (an alias, the default)."""

    values: tuple[tuple[str, Any], ...]

    def get(self, name: str) -> Any:
        return dict(self.values)[name]

    def with_local(self, **local: Any) -> KeyQuery:
        """The query with these local fields filled in where the request left them out."""
        return KeyQuery(tuple((n, local.get(n) if v is None else v) for n, v in self.values))

    def key(self, **resolved: Any) -> TableKey:
        """The table key, with these fields (the device's recorded name) in place of what was asked."""
        return TableKey(**(dict(self.values) | resolved))


def _annotation(spec: Spec, python_type: type) -> Any:
    if python_type is int:
        return Annotated[int, Digits, Query(ge=spec.lo, le=spec.hi, description=spec.doc)]
    if spec.check:  # its check names the accepted values (an empty one too) where a pattern would quote a regex
        return Annotated[str, Query(max_length=spec.max_len, description=spec.doc), AfterValidator(spec.check)]
    # min_length first: an empty value is told so, not shown the pattern's regex
    text = Query(min_length=1, max_length=spec.max_len, pattern=DEVICE_PATTERN, description=spec.doc)
    return Annotated[str | None, text] if spec.local else Annotated[str, text]


def parameters(key_type: type[TableKey] = TableKey) -> list[inspect.Parameter]:
    """The query parameters of `key_type`'s fields (and of their former names), as FastAPI reads them."""
    types, out, former = field_types(key_type), [], []
    kw = inspect.Parameter.KEYWORD_ONLY
    for f, spec in specs(key_type):
        default = None if spec.local else inspect.Parameter.empty if spec.default is None else spec.default
        out.append(inspect.Parameter(f.name, kw, default=default, annotation=_annotation(spec, types[f.name])))
        if spec.formerly:
            doc = Query(deprecated=True, pattern=DEVICE_PATTERN, description=f"the former name of {f.name}")
            former.append(inspect.Parameter(spec.formerly, kw, default=None, annotation=Annotated[str | None, doc]))
    return out + former


_SPECS = tuple(specs(TableKey))


async def _key_query(request: Request, **given: Any) -> KeyQuery:  # async: no I/O, no threadpool hop
    values = []
    for f, spec in _SPECS:
        value = given[f.name]
        old = given.get(spec.formerly) if spec.formerly else None
        if old is not None:
            if f.name in request.query_params:  # both named, at the default too: which was meant is not ours to guess
                raise BadParameter(spec.formerly, f"give {f.name} only ({spec.formerly} is its former name)")
            try:
                value = spec.check(old) if spec.check else old
            except ValueError as exc:
                raise BadParameter(spec.formerly, str(exc)) from None
        values.append((f.name, value))
    return KeyQuery(tuple(values))


# FastAPI reads a dependency's parameters from its signature: this one's is the key's fields
_key_query.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request), *parameters()],
    return_annotation=KeyQuery,
)

#: A route's table key, from its query parameters.
KeyQueryDep = Annotated[KeyQuery, Depends(_key_query)]
