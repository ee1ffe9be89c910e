"""SGLang's released source, read without importing it: the 0.5.23 wheel from PyPI (pinned by its
sha256, fetched once into the user's cache, or named by TUNER_SGLANG_WHEEL for an offline machine),
parsed with `ast`; and the check that a method of ours can stand in for one of SGLang's.

A method of ours is compatible with SGLang's when every call SGLang's signature allows binds to
ours the same way: the same parameters in the same order, of the same kind and default; any
parameter we add comes after them and has a default; a `**kwargs` of SGLang's is kept.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import platformdirs

VERSION = "0.5.23"
#: The cp311 manylinux wheel's sha256 (PyPI): its Python sources are what the contract reads.
SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
WHEEL = f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"


def fetch_wheel() -> Path:
    """The wheel, downloaded with pip (no dependencies, this platform tag whatever runs the test,
    its hash required) into the user's cache (CI runs pytest without its cache plugin) unless it
    is there or TUNER_SGLANG_WHEEL names it. A failed download raises with pip's own words: the
    contract is never skipped."""
    given = os.environ.get("TUNER_SGLANG_WHEEL")
    if given:
        return Path(given)
    cache = Path(platformdirs.user_cache_dir("verify-tuner-tests")) / f"sglang-{VERSION}"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / WHEEL
    if path.is_file():
        return path
    req = cache / "requirements.txt"
    req.write_text(f"sglang=={VERSION} --hash=sha256:{SHA256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.11", "--platform", "manylinux_2_34_x86_64", "--implementation", "cp", "-r", str(req), "-d", str(cache)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not path.is_file():
        raise RuntimeError(
            f"could not download sglang=={VERSION} from PyPI ({done.stderr.strip()[-800:]}); "
            f"on a machine without PyPI set TUNER_SGLANG_WHEEL to {WHEEL}"
        )
    return path


class Source:
    """Modules of the wheel, parsed on demand."""

    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self._parsed: dict[str, ast.Module] = {}

    def text(self, module: str) -> str:
        return self.zip.read(module.replace(".", "/") + ".py").decode()

    def module(self, module: str) -> ast.Module:
        if module not in self._parsed:
            self._parsed[module] = ast.parse(self.text(module), filename=module)
        return self._parsed[module]

    def cls(self, module: str, name: str) -> ast.ClassDef:
        for node in self.module(module).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        raise LookupError(f"{module} defines no class {name}")


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def decorators(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(d) for d in fn.decorator_list}


def _their_params(fn: ast.FunctionDef) -> tuple[list[tuple[str, str, str | None]], bool]:
    """(name, kind, default source) of each parameter after self, and whether it takes **kwargs."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args][1:]
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = [(p.arg, "positional", d) for p, d in zip(positional, defaults)]
    out += [(p.arg, "keyword", None if d is None else ast.unparse(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return out, a.kwarg is not None


def _literal(source: str | None) -> str | None:
    """A default's value as repr() spells it (True, None, 1), or its source when it is no literal."""
    if source is None:
        return None
    try:
        return repr(ast.literal_eval(source))
    except ValueError:
        return source


def _default(p: inspect.Parameter) -> str | None:
    return None if p.default is inspect.Parameter.empty else repr(p.default)


def mismatches(ours: type, theirs: ast.ClassDef, names: list[str]) -> list[str]:
    """Why each named method of `ours` cannot stand in for SGLang's (`theirs`), or []."""
    found, problems = methods(theirs), []
    for name in names:
        where = f"{theirs.name}.{name}"
        if name not in found:
            problems.append(f"{where}: SGLang {VERSION} has no such method (ours: {ours.__name__}.{name})")
            continue
        fn, mine = found[name], inspect.getattr_static(ours, name)
        if ("property" in decorators(fn)) != isinstance(mine, property):
            problems.append(f"{where}: a property in one and a method in the other")
            continue
        if isinstance(mine, property):
            continue
        problems += _signature_mismatches(where, fn, inspect.signature(mine))
    return problems


def _signature_mismatches(where: str, fn: ast.FunctionDef, sig: inspect.Signature) -> list[str]:
    theirs, their_kwargs = _their_params(fn)
    mine = [p for p in list(sig.parameters.values())[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    by_name = {p.name: p for p in mine}
    kinds = {"positional": (inspect.Parameter.POSITIONAL_OR_KEYWORD,), "keyword": (inspect.Parameter.KEYWORD_ONLY,)}
    problems = []
    for i, (name, kind, default) in enumerate(theirs):
        p = by_name.get(name)
        if p is None:
            problems.append(f"{where}: SGLang passes {name!r}, ours has no such parameter")
        elif kind == "positional" and (i >= len(mine) or mine[i].name != name):
            at = [q.name for q in mine].index(name) + 1
            problems.append(f"{where}: {name!r} is parameter {i + 1} in SGLang, {at} in ours")
        elif p.kind not in kinds[kind] or _default(p) != _literal(default):
            problems.append(
                f"{where}: {name!r} is {kind} = {default} in SGLang, {p.kind.description} = {_default(p)} in ours"
            )
    extra = [p.name for p in mine if p.name not in {t[0] for t in theirs} and p.default is inspect.Parameter.empty]
    if extra:
        problems.append(f"{where}: ours requires {extra}, which SGLang does not pass")
    if their_kwargs and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        problems.append(f"{where}: SGLang's takes **kwargs (callers pass more), ours does not")
    return problems
