"""The installed package is one namespace, `verify_tuner`: no module of the project imports a
generic top-level name, and the wheel puts nothing else into site-packages (an engine image that
also holds Hugging Face's `kernels` package must be able to hold this one)."""

from __future__ import annotations

import ast
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
    ):
        assert shipped in names, shipped
