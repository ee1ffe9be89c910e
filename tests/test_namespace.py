"""The installed package is one namespace, `verify_tuner`: no module of the project imports a
generic top-level name, and the wheel puts nothing else into site-packages (an engine image that
also holds Hugging Face's `kernels` package must be able to hold this one)."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERIC = {"kernels", "api", "migrations", "tuner"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_no_module_imports_a_generic_top_level_name():
    bad = []
    for folder in ("tuner", "kernels", "api", "migrations", "tests", "bench", "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad += [
                f"{path.relative_to(ROOT)}:{line}: {name}"
                for line, name in _imports(path)
                if name.split(".")[0] in GENERIC
            ]
    assert bad == [], "\n".join(bad)


def test_the_wheel_installs_one_top_level_package(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,  # the assert below shows pip's stderr
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("verify_tuner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"verify_tuner"}, tops
    for shipped in (
        "verify_tuner/kernels/csrc/verify_attention.cu",
        "verify_tuner/migrations/script.py.mako",
        "verify_tuner/migrations/versions/0001_initial.py",
        "verify_tuner/api/routes/config.py",
        "verify_tuner/engine/client.py",
    ):
        assert shipped in names, shipped
    # every sub-package is in pyproject's `packages` list (setuptools ships only the listed ones)
    for name in _stages():
        assert f"{name.replace('.', '/')}/__init__.py" in names, f"{name}: add it to [tool.setuptools] packages"


# -- layering: the stages of the data flow and what each may import ---------------------------

#: Folders of the namespace outside tuner/ (pyproject's package-dir).
FOLDERS = {"verify_tuner.kernels": "kernels", "verify_tuner.api": "api", "verify_tuner.migrations": "migrations"}
#: Alembic's folder belongs to the store: env.py imports the tables, store.migrate points Alembic at
#: the folder. One stage in two folders (migrations/ is where Alembic's tooling expects it).
PART_OF = {"verify_tuner.migrations": "verify_tuner.store"}
#: `python -m verify_tuner`: runs the CLI, and nothing imports it.
PROGRAM = "verify_tuner.__main__"


def _stages() -> dict[str, Path]:
    """Every sub-package of the namespace, by name, with its folder."""
    found = {f"verify_tuner.{d.name}": d for d in sorted((ROOT / "tuner").iterdir()) if (d / "__init__.py").is_file()}
    return found | {name: ROOT / folder for name, folder in FOLDERS.items()}


def _root_modules() -> set[str]:
    return {f"verify_tuner.{p.stem}" for p in (ROOT / "tuner").glob("*.py") if p.stem != "__init__"}


def _node(name: str, stages: dict[str, Path], roots: set[str]) -> str | None:
    """The stage (or root module) an imported module belongs to; None outside the project."""
    parts = name.split(".")
    if parts[0] != "verify_tuner" or len(parts) == 1:
        return None
    head = ".".join(parts[:2])
    if head in stages:
        return PART_OF.get(head, head)
    assert head in roots, f"{name}: neither a sub-package nor a module of the namespace root"
    return head


def _project_imports(path: Path) -> list[tuple[int, str]]:
    """Every import of `path` (module level, in functions, under TYPE_CHECKING: all of them are
    dependencies), `from verify_tuner import x` read as verify_tuner.x."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (the layering check reads absolute ones)"
            if node.module == "verify_tuner":
                found += [(node.lineno, f"verify_tuner.{a.name}") for a in node.names]
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def _graph() -> tuple[dict[str, dict[str, list[str]]], dict[str, set[str]]]:
    """(node -> imported node -> where), and what each node's docstring allows it to import."""
    stages, roots = _stages(), _root_modules()
    files: dict[str, list[Path]] = {}
    for name, folder in stages.items():
        files.setdefault(PART_OF.get(name, name), []).extend(sorted(folder.rglob("*.py")))
    for name in roots - {PROGRAM}:
        files[name] = [ROOT / "tuner" / f"{name.split('.')[1]}.py"]
    allowed = {name: _allowed(stages[name] / "__init__.py", roots) for name in stages if name not in PART_OF}
    for name in roots:
        allowed[name] = _allowed(ROOT / "tuner" / "__init__.py", roots) | (roots - {PROGRAM})
    edges: dict[str, dict[str, list[str]]] = {}
    for node, paths in files.items():
        out = edges.setdefault(node, {})
        for path in paths:
            for line, name in _project_imports(path):
                target = _node(name, stages, roots)
                if target is not None and target != node:
                    out.setdefault(target, []).append(f"{path.relative_to(ROOT)}:{line}")
    return edges, allowed


def _allowed(init: Path, roots: set[str]) -> set[str]:
    """The names in backticks of the `May import:` clause of a package docstring (up to its first
    `;` or full stop); `verify_tuner` alone stands for the root's modules."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    text = " ".join(doc.split())
    assert "May import:" in text, f"{init.relative_to(ROOT)}: the docstring does not say what it may import"
    clause = re.split(r";|\.(?:\s|$)", text.split("May import:", 1)[1])[0]
    names = set(re.findall(r"`(verify_tuner[\w.]*)`", clause))
    if "verify_tuner" in names:
        names = (names - {"verify_tuner"}) | (roots - {PROGRAM})
    return {PART_OF.get(n, n) for n in names}


def test_every_stage_imports_only_what_its_docstring_allows():
    edges, allowed = _graph()
    bad = [
        f"{node} imports {target} ({', '.join(where[:3])}): not in its docstring's `May import`"
        for node, targets in sorted(edges.items())
        for target, where in sorted(targets.items())
        if target not in allowed[node]
    ]
    assert bad == [], "\n".join(bad)


def _cycle(edges: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One import cycle between nodes (as the path that closes it), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_stages():
    """Lazy imports count: a cycle held off by importing inside a function is still a cycle."""
    edges, _ = _graph()
    cycle = _cycle(edges)
    if cycle:
        where = [edges[a][b][0] for a, b in itertools.pairwise(cycle)]
        raise AssertionError("import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(where))


def test_the_cycle_check_finds_a_cycle():
    """The check itself, on a graph with one: a check that cannot fail proves nothing."""
    assert _cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": []}, "b": {}, "c": {"a": [], "b": []}}) is None


def test_modules_inside_a_stage_have_no_import_cycle():
    """Within a stage too (the search's study, trials and winner used to hold one off with
    TYPE_CHECKING): module level imports and TYPE_CHECKING ones form no cycle."""
    edges: dict[str, dict[str, list[str]]] = {}
    for name, folder in _stages().items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            mod = ".".join((name, *rel.parts)).removesuffix(".__init__")
            out = edges.setdefault(mod, {})
            tree = ast.parse(path.read_text())
            for node in _top_level_imports(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                else:
                    targets = [a.name for a in node.names]
                for t in targets:
                    if t.startswith(name + ".") and t != mod:
                        out.setdefault(t, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    known = set(edges)
    edges = {m: {t: w for t, w in ts.items() if t in known} for m, ts in edges.items()}
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports at module level and under `if TYPE_CHECKING:` (the ones that run, or would, at import)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If):
            out += [n for n in node.body if isinstance(n, ast.Import | ast.ImportFrom)]
    return out


# -- the bare install --------------------------------------------------------------------------

#: What the bare install (`pip install verify-tuner`, no extras) does not have.
SERVER_AND_GPU = (
    "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "pydantic", "click", "optuna",
    "prometheus_client", "h11", "anyio", "pycuda", "torch", "numpy", "cuda", "matplotlib",
)  # fmt: skip


def test_the_engine_client_and_the_shared_modules_import_without_the_extras(tmp_path):
    """An inference host installs the bare package: the client, every stage's __init__ and the
    root's shared modules (all but settings and study_files) import with every server and GPU
    package made unimportable, and the client answers from its heuristic."""
    stages, roots = _stages(), _root_modules()
    light = sorted(roots - {PROGRAM, "verify_tuner.settings", "verify_tuner.study_files"})
    code = f"""
import importlib, importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {SERVER_AND_GPU!r}:
            raise ModuleNotFoundError(f"blocked: {{name}}", name=name)
sys.meta_path.insert(0, Block())
for name in {sorted(stages) + light + ["verify_tuner.engine.client", "verify_tuner.engine.bundle"]!r}:
    importlib.import_module(name)
from verify_tuner.engine.client import ConfigClient
c = ConfigClient(H=8, q_len=9, device="NVIDIA H200", snapshot_dir=sys.argv[1])
src = c.fetch()
print(json.dumps({{"source": src, "nsplit": c.lookup(4096).nsplit, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in {SERVER_AND_GPU!r})}}))
"""
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("VERIFY_TUNER", "TUNER_"))},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.splitlines()[-1])
    assert res["heavy"] == [] and res["source"] == "heuristic" and res["nsplit"] >= 1, res
