"""docs/examples/inference_worker.py as a user runs it from a fresh shell: the graphs per batch size
and prefix range from the table's graph plans, and an unknown device told in one line, not a
traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "inference_worker.py"


def run(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIFY_TUNER_")} | {"HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_the_example_captures_one_graph_per_batch_size_without_plans(tmp_path):
    r = run(tmp_path, "--device", "NVIDIA H200", "--batch-sizes", "1,8,32", "--steps", "50")
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("graph for")] == [
        "graph for batch 1 from prefix 0",
        "graph for batch 8 from prefix 0",
        "graph for batch 32 from prefix 0",
    ]
    assert "50 graph-less steps at batch 32" in r.stdout


def test_an_unknown_device_is_one_line_and_a_nonzero_exit(tmp_path):
    r = run(tmp_path, "--device", "NVIDIA B999", "--steps", "5")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "no verify-attention config for 'NVIDIA B999': use the engine's own attention"


def test_an_e4m3_cache_gets_its_own_table_and_says_so(tmp_path):
    """An fp8 operator running the example saw bf16's configs without being told: the format is an
    option, the table fetched is that format's, and its line names it; a format it cannot read is
    argparse's one-line error."""
    r = run(tmp_path, "--device", "NVIDIA H200", "--kv-dtype", "fp8_e4m3", "--batch-sizes", "1", "--steps", "5")
    assert r.returncode == 0, r.stderr
    assert "heuristic for NVIDIA H200, fp8_e4m3" in r.stdout.splitlines()[0], r.stdout
    r = run(tmp_path, "--device", "NVIDIA H200", "--kv-dtype", "fp8_e5m2", "--steps", "5")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "invalid choice: 'fp8_e5m2'" in r.stderr
