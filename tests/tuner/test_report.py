from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from click.testing import CliRunner
from verify_tuner.cli.commands import cli
from verify_tuner.kernels import kernel_hash
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.keys import ConfigKey, TableKey
from verify_tuner.store import best_configs, devices, migrate, plans
from verify_tuner.store.session import make_engine, session_factory, session_scope


def test_report_writes_table_and_plot(sqlite_url, tmp_path):
    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    h200 = replace(known_device("h200"), copy_bw_gbps=4200.0)
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=h200)
        for bucket, us in ((9, 20.0), (15, 75.0)):
            for bb in (0, 5):
                best_configs.upsert_best(
                    session=s,
                    row=best_configs.BestRow(
                        ConfigKey(h200.name, kernel_hash(), "bf16", 8, 9, bucket, bb),
                        KernelConfig(128, 8, 32, 256),
                        median_us=us * (1 + bb),
                        default_us=us * 1.2 * (1 + bb),
                    ),
                )
        plans.upsert_plan(
            session=s,
            plan=plans.PlanRow(
                table=TableKey(h200.name, kernel_hash(), "bf16", 8, 9),
                batch_bucket=5,
                bucket_lo=9,
                bucket_hi=15,
                range_lo=9,
                range_hi=15,
                weights_digest="d" * 64,
                weights={"source": "equal"},
                config=KernelConfig(128, 8, 32, 256),
                expected_us=300.0,
                per_bucket=[
                    {"bucket": 9, "prefix": 4000, "weight": 0.5, "us": 130.0, "best_us": 120.0, "regret": 130 / 120},
                    {"bucket": 15, "prefix": 40000, "weight": 0.5, "us": 450.0, "best_us": 450.0, "regret": 1.0},
                ],
                measured_by="NVIDIA H200 (test)",
            ),
        )
    r = CliRunner().invoke(cli, ["--database-url", sqlite_url, "study", "report", "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "tuned_nvidia-h200.md").read_text()
    assert "| 8 | 9 | 1 | [32768, 46341) |" in md and "1.20x" in md and "4200 GB/s" in md
    assert "| 8 | 9 | 17-32 | [32768, 46341) |" in md  # batch buckets on their own rows
    assert "## Graph plan bf16 H=8 q_len=9 batch 17-32" in md and "| 1.083x |" in md and "worst 1.083x" in md
    png = (tmp_path / "rep" / "tuned_nvidia-h200.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_report_keeps_each_kernel_builds_rows_apart_and_names_the_served_one(sqlite_url, tmp_path):
    """A database that outlived a kernel upgrade holds bests of both builds for the same keys: the
    report listed them in one table and joined them in one curve, the old build's beside the new."""
    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    h200, old = known_device("h200"), "0" * 16
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=h200)
        for kernel, nsplit, us in ((old, 64, 55.0), (kernel_hash(), 128, 42.0)):
            best_configs.upsert_best(
                session=s,
                row=best_configs.BestRow(
                    ConfigKey(h200.name, kernel, "bf16", 8, 9, 15),
                    KernelConfig(nsplit, 8, 32, 256),
                    median_us=us,
                    default_us=60.0,
                ),
            )
    r = CliRunner().invoke(cli, ["--database-url", sqlite_url, "study", "report", "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "tuned_nvidia-h200.md").read_text()
    ours = md.index(f"## Kernel {kernel_hash()} (this build: its sidecar serves these)")
    theirs = md.index(f"## Kernel {old} (another build: served only to workers that ask for this kernel_hash)")
    assert ours < md.index("NSPLIT=128") < theirs < md.index("NSPLIT=64"), md
    assert md.count("| kv_dtype | H | q_len | batch |") == 2  # a table per build
    assert (tmp_path / "rep" / "tuned_nvidia-h200.png").read_bytes()[:4] == b"\x89PNG"


def test_report_in_a_checkout_writes_to_the_working_directory_not_bench_results(sqlite_url, tmp_path):
    """`tuner study report` as the README showed it, run in a checkout: its default folder was
    bench/results, so it overwrote the committed tuned_nvidia-h200.md there."""
    migrate.upgrade(sqlite_url)
    sessions = session_factory(make_engine(sqlite_url))
    h200 = known_device("h200")
    with session_scope(sessions) as s:
        devices.upsert_device(session=s, limits=h200)
        best_configs.upsert_best(
            session=s,
            row=best_configs.BestRow(
                ConfigKey(h200.name, kernel_hash(), "bf16", 8, 9, 15),
                KernelConfig(128, 8, 32, 256),
                42.0,
                default_us=60.0,
            ),
        )
    checkout = tmp_path / "checkout"
    committed = checkout / "bench" / "results" / "tuned_nvidia-h200.md"
    committed.parent.mkdir(parents=True)
    committed.write_text("the committed result\n")
    (checkout / "pyproject.toml").write_text("[project]\nname = 'verify-tuner'\n")
    before = sorted(p.name for p in committed.parent.iterdir())

    r = subprocess.run(
        [sys.executable, "-m", "verify_tuner", "--database-url", sqlite_url, "study", "report"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the assert shows the output
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert committed.read_text() == "the committed result\n"
    assert sorted(p.name for p in committed.parent.iterdir()) == before
    assert "NSPLIT=128" in (checkout / "tuned_nvidia-h200.md").read_text()
    assert (checkout / "tuned_nvidia-h200.png").read_bytes()[:4] == b"\x89PNG"
    assert "wrote tuned_nvidia-h200.md" in r.stdout
