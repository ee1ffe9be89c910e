"""The benchmarks' CPU-side parts, which only run on the lent GPU otherwise: a name the library
dropped (bench_kernel imported a removed template list) must fail here, not in a device call."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from verify_tuner.heuristic import blocks_per_sm, heuristic_config
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check, validate

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import bench_kernel
import graph_switch
import graph_switch_probe
import seesaw_model


@pytest.mark.parametrize("device", ["h200", "rtx-pro-6000"])
@pytest.mark.parametrize(("H", "Q", "P"), [(8, 9, 1024), (8, 1, 131072), (128, 9, 46000)])
def test_bench_kernel_sweep_holds_the_default_and_only_valid_configs(device, H, Q, P):
    limits = known_device(device)
    base = heuristic_config(limits, H=H, q_len=Q, prefix=P)
    configs = bench_kernel.sweep(limits, H, Q, P, base)
    assert base in configs
    assert len(configs) > 3  # neighbours and other templates, not the default alone
    assert all(check(c, limits, H=H, q_len=Q) is None for c in configs)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
def test_the_graph_switch_setter_compiles_for_every_arch(arch, tmp_path):
    cubin = graph_switch.compile_switch_cubin(arch, tmp_path)
    assert cubin[:4] == b"\x7fELF"
    assert graph_switch.compile_switch_cubin(arch, tmp_path) == cubin  # the second call reads the cache


def test_the_switch_bounds_and_the_branch_rule():
    assert graph_switch.check_bounds([1448, 4096], 3) == (1448, 4096)
    for bad, n in (([4096, 1448], 3), ([0], 2), ([1, 2], 2), ([1, 2, 3, 4], 5)):
        with pytest.raises(ValueError):
            graph_switch.check_bounds(bad, n)
    assert [graph_switch.branch_of(t, (1448, 4096)) for t in (0, 1447, 1448, 4095, 4096, 10**6)] == [0, 0, 1, 1, 2, 2]


def test_the_probe_configs_fit_the_h200():
    limits = known_device("h200")
    for text in graph_switch_probe.SHORT.values():
        validate(graph_switch_probe.parse_config(text), limits, H=graph_switch_probe.H, q_len=graph_switch_probe.Q)
    names = {"L", *graph_switch_probe.SHORT}
    assert all(set(branches) <= names for _, branches, _ in graph_switch_probe.SWITCHED)


def _out_options(path: Path) -> list[ast.Call]:
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    return [
        c
        for c in calls
        if isinstance(c.func, ast.Attribute)
        and c.func.attr == "add_argument"
        and c.args
        and isinstance(c.args[0], ast.Constant)
        and c.args[0].value == "--out"
    ]


def _writes_only_where_told(call: ast.Call) -> bool:
    kw = {k.arg: k.value for k in call.keywords}
    required, default = kw.get("required"), kw.get("default")
    if isinstance(required, ast.Constant) and required.value is True:
        return True
    return default is None or (isinstance(default, ast.Constant) and default.value is None)


def test_no_benchmark_writes_into_the_checkout_by_default():
    """bench/results holds the committed results: a benchmark run in a checkout without --out
    wrote over them. Every --out is required, or absent means "print, write nothing"."""
    found = {p.name: _out_options(p) for p in sorted(BENCH.glob("*.py"))}
    assert sum(len(calls) for calls in found.values()) >= 20  # the scan sees the scripts' options
    defaulted = [name for name, calls in found.items() for c in calls if not _writes_only_where_told(c)]
    assert defaulted == []


@pytest.mark.parametrize("script", ["load_test.py", "ptxas_report.py", "ab_versions.py"])
def test_a_benchmark_without_out_is_refused_and_writes_nothing(script, tmp_path):
    r = subprocess.run(
        [sys.executable, str(BENCH / script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2 and "--out" in r.stderr.splitlines()[-1], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_seesaw_model_passes_both_kernel_orders_and_rejects_a_hazard():
    """The kernel's order of the seesaw's turn and the one measured against it survive random
    interleavings; the control (PV(t-1) after the softmax on two P buffers and flags) must fail, so
    the model can see a hazard."""
    r = subprocess.run(
        [sys.executable, str(BENCH / "seesaw_model.py"), "--runs", "60"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = {tuple(line.split(None, 2)[:2]): line.split(None, 2)[2] for line in r.stdout.splitlines()}
    for stages in [f"STAGES={n}" for n in seesaw_model.STAGES]:
        assert lines[stages, "refill_first"] == "ok" and lines[stages, "softmax_first"] == "ok"
        assert lines[stages, "p_early"] == "ok"
        assert "must fail" in lines[stages, "early"] and "reads" in lines[stages, "early"], lines


def test_the_seesaw_model_catches_p_early_resetting_a_flag_the_other_group_still_reads(monkeypatch):
    """p_early's owner resets its tile's flag at the start of its turn: where the other orders
    reset the next tile's, at the end of the softmax, the other group may not have read it yet."""
    real = seesaw_model._p_early_ops

    def late_reset(t, ntiles, stages):
        ops = [o for o in real(t, ntiles, stages) if o[0] != "write" or not o[1].startswith("flag") or o[2] != -1]
        if t < ntiles:
            ops.insert(ops.index(("arrive", f"P{t & 1}", t)), ("write", f"flag{(t + 1) % 3}", -1))
        return ops

    monkeypatch.setattr(seesaw_model, "_p_early_ops", late_reset)
    rng = seesaw_model.random.Random(0)
    found = [why for n in range(2, 8) for _ in range(50) if (why := seesaw_model.run(n, 3, "p_early", rng))]
    assert any("reads flag" in w for w in found), found[:3]


def test_the_seesaw_model_catches_a_wrong_barrier_id(monkeypatch):
    """The deadlock of a slot index advanced once a turn instead of twice: here the release synced on
    the slot of tile t instead of t-1."""
    real = seesaw_model.turn_ops

    def wrong(t, ntiles, stages, order):
        ops = real(t, ntiles, stages, order)
        return [
            ("sync", f"EMPTY{t % stages}", t - 1) if o[:1] == ("sync",) and o[1].startswith("EMPTY") else o for o in ops
        ]

    monkeypatch.setattr(seesaw_model, "turn_ops", wrong)
    rng = seesaw_model.random.Random(0)
    found = [why for n in range(2, 6) for _ in range(50) if (why := seesaw_model.run(n, 3, "softmax_first", rng))]
    assert found and any("mixes" in w or "deadlock" in w for w in found), found[:3]


def test_the_seesaw_model_catches_a_cp_async_wait_that_lets_a_tile_through(monkeypatch):
    """A turn's cp.async wait that leaves one group too many pending (the first turn's count applied
    to every turn) uses a tile before it lands, for a ring of three slots and of five."""
    real = seesaw_model.turn_ops

    def loose(t, ntiles, stages, order):
        return [("wait", (stages - 1) // 2, t) if o[0] == "wait" else o for o in real(t, ntiles, stages, order)]

    monkeypatch.setattr(seesaw_model, "turn_ops", loose)
    rng = seesaw_model.random.Random(0)
    for stages in (3, 5):
        found = [
            why for n in range(2, 8) for _ in range(30) if (why := seesaw_model.run(n, stages, "refill_first", rng))
        ]
        assert any("before its cp.async group landed" in w for w in found), (stages, found[:3])


def _gpu_checks_in(tmp_path, smoke: str) -> Path:
    """A checkout holding run_gpu_checks.sh, this tree's kernel (what the installed package reads)
    and `smoke` as bench/smoke.py."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "kernels" / "csrc").mkdir(parents=True)
    shutil.copy(BENCH / "run_gpu_checks.sh", tmp_path / "bench")
    shutil.copy(BENCH.parent / "kernels" / "csrc" / "verify_attention.cu", tmp_path / "kernels" / "csrc")
    (tmp_path / "bench" / "smoke.py").write_text(smoke)
    return tmp_path


def test_the_gpu_checks_refuse_an_installed_kernel_that_is_not_the_checkouts(tmp_path):
    """gpu-env.sh puts the carried wheel before the checkout: a wheel built before the last kernel
    edit tested and timed the old kernel. The script stops at once, in one line, exit 2."""
    _gpu_checks_in(tmp_path, "raise SystemExit('smoke ran')")
    with (tmp_path / "kernels" / "csrc" / "verify_attention.cu").open("a") as cu:
        cu.write("// edited since the wheel\n")
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")  # this env's python3
    r = subprocess.run(
        ["bash", "bench/run_gpu_checks.sh", "tests", str(tmp_path / "out")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "PATH": path},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "rebuild the wheel" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "out" / "gpu-tests.log").exists()


@pytest.mark.parametrize("smoke", ["import sys; sys.exit(1)", "import time; time.sleep(600)"], ids=["wrong", "hangs"])
def test_the_gpu_checks_stop_when_the_smoke_launch_fails_or_hangs(tmp_path, smoke):
    """A deadlocking kernel hung every step of a device call, which returned nothing after its
    limit: the script now stops after the smoke check, in one line, exit 3, running nothing else."""
    root = _gpu_checks_in(tmp_path, smoke)
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    # a short fake timeout stands in for the real 240 s one (the script calls `timeout -s KILL 240`)
    fake = root / "fakebin"
    fake.mkdir()
    (fake / "timeout").write_text("#!/bin/sh\nshift 3\nexec " + shutil.which("timeout") + ' -s KILL 3 "$@"\n')
    (fake / "timeout").chmod(0o755)
    r = subprocess.run(
        ["bash", "bench/run_gpu_checks.sh", "tests", str(root / "out")],
        cwd=root, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PATH": str(fake) + os.pathsep + path},
    )  # fmt: skip
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "bench/smoke.py failed or hung" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert sorted(p.name for p in (root / "out").iterdir()) == ["smoke.log"]


def test_the_gpu_checks_refuse_an_unknown_mode_before_any_gpu_work(tmp_path):
    root = _gpu_checks_in(tmp_path, "raise SystemExit('smoke ran')")
    r = subprocess.run(["bash", "bench/run_gpu_checks.sh", "nope", str(root / "out")], cwd=root,
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("usage:") and "smoke ran" not in r.stderr, r.stderr
    assert not (root / "out").exists()


def test_the_smoke_check_defaults_to_bf16_and_refuses_an_unknown_format(capsys):
    import smoke

    assert smoke.parse([]).kv_dtype == ["bf16"]
    assert smoke.parse(["--kv-dtype", "bf16", "--kv-dtype", "fp8_e4m3"]).kv_dtype == ["bf16", "fp8_e4m3"]
    with pytest.raises(SystemExit) as e:
        smoke.parse(["--kv-dtype", "fp16"])
    assert e.value.code == 2 and "fp16" in capsys.readouterr().err.splitlines()[-1]


def test_the_ab_of_two_versions_runs_its_base_side_without_out(monkeypatch, capsys):
    """ab_versions.py times the base tree in a child given --worker and --cache only: a required
    --out refused that child, so the A/B of a device call came back empty."""
    import ab_versions

    monkeypatch.setattr(ab_versions, "time_defaults", lambda shapes, cache: [{"shapes": shapes, "cache": cache}])
    monkeypatch.setattr(sys, "argv", ["ab_versions.py", "--worker", "[[8, 9, 100]]", "--cache", "/tmp/c"])
    ab_versions.main()
    assert capsys.readouterr().out.strip() == '[{"shapes": [[8, 9, 100]], "cache": "/tmp/c-base"}]'


def test_kernel_v7s_cases_are_the_issues_and_fit_their_devices(tmp_path):
    import kernel_v7

    for name, H, q, lens, kv, device in kernel_v7.CASES:
        limits = known_device(device)
        cfg = heuristic_config(limits, H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype=kv)
        assert check(cfg, limits, H=H, q_len=q, kv_dtype=kv) is None, name
    assert len(kernel_v7.REGRESSION) == 40 and len(kernel_v7.B32) == 32
    assert (kernel_v7.B32[0], kernel_v7.B32[-1]) == (20000, 70000)
    row = kernel_v7.row_of(kernel_v7.CASES[0], {"v7": 42.0, "v6": 42.0}, "cfg", 4.0e12)
    # H=8 q=9 P=46000: 53.0 MB once (bf16) at the anchor's 4.19 TB/s = 12.7 us, the issue's limit
    assert row["limit_us"] == pytest.approx(12.65, abs=0.05) and row["x_limit"] == pytest.approx(3.32, abs=0.01)
    # e4m3 halves the bytes: at q=9 the mma.sync ceiling (7.2 GFLOP / 645 TFLOP/s) binds instead
    fp8 = kernel_v7.row_of(kernel_v7.CASES[9], {"v7": 42.0, "bf16": 40.0}, "cfg", 4.0e12)
    assert fp8["mode"] == "dequant" and fp8["limit_us"] == pytest.approx(11.18, abs=0.01) and fp8["v6_us"] is None
    assert (fp8["bf16_us"], fp8["x_bf16"]) == (40.0, 1.05) and row["bf16_us"] is None  # the same rounds' bf16
    # the markdown table has a cell for each column of its header
    kernel_v7.write(tmp_path, known_device("h200"), [row, fp8])
    table = [ln for ln in (tmp_path / "kernel_v7_sm_90.md").read_text().splitlines() if ln.startswith("|")]
    assert len(table) == 4 and len({ln.count("|") for ln in table}) == 1, table
    assert "| fp8_e4m3 | 42.0 | — | 40.0 (1.05×) | 11.18 |" in table[3] and "| bf16 | 42.0 | 42.0 | — |" in table[2]
    # the limits' basis is stated, with this GPU's own copy bandwidth beside it (an H100 reads high)
    text = (tmp_path / "kernel_v7_sm_90.md").read_text()
    assert "the H200's anchors on every device (4191 GB/s copy bandwidth, 645 TFLOP/s" in text
    assert "measured in this call: 4000 GB/s." in text
    # the sm_120 template cases time v6's own sm_120 default on v6's side, valid on that device
    sm120 = [(H, q) for _, H, q, _, _, device in kernel_v7.CASES if device == "rtx-pro-6000"]
    assert sorted(sm120) == sorted(kernel_v7.V6_SM120)
    for H, q in sm120:
        old = kernel_v7.v6_config("rtx-pro-6000", H, q)
        assert old is not None and check(old, known_device("rtx-pro-6000"), H=H, q_len=q) is None
    assert kernel_v7.v6_config("h200", 8, 9) is None


def test_kernel_v7_times_another_fp8_format_in_the_fp8_cases_place(tmp_path):
    """--fp8 fp8_ds_mla --fp8-only: the issue's three fp8 cases on FlashMLA's rows (each valid at
    its default there), written beside the table of record, not over it."""
    import kernel_v7

    full = kernel_v7.cases_of(False, "fp8_e4m3", False, None)
    assert (
        len(full) == len(kernel_v7.CASES) + 40 and kernel_v7.cases_of(True, "fp8_e4m3", False, None) == kernel_v7.CASES
    )
    ds = kernel_v7.cases_of(True, "fp8_ds_mla", True, None)
    assert [c[4] for c in ds] == ["fp8_ds_mla"] * 3
    assert [c[0] for c in ds] == [c[0] for c in kernel_v7.CASES if c[4] == "fp8_e4m3"]
    for name, H, q, lens, kv, device in ds:
        limits = known_device(device)
        cfg = heuristic_config(limits, H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype=kv)
        assert check(cfg, limits, H=H, q_len=q, kv_dtype=kv) is None, name
    with pytest.raises(ValueError, match="names none of the cases"):
        kernel_v7.cases_of(True, "fp8_ds_mla", True, "sm_120")
    row = kernel_v7.row_of(ds[0], {"v7": 30.0, "bf16": 40.0}, "cfg", 4.0e12)
    assert (row["kv_format"], row["mode"], row["x_bf16"]) == ("fp8_ds_mla", "dequant", 0.75)
    kernel_v7.write(tmp_path, known_device("h200"), [row], "kernel_v7_fp8_ds_mla")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "kernel_v7_fp8_ds_mla_sm_90.json",
        "kernel_v7_fp8_ds_mla_sm_90.md",
    ]
    q1 = [kernel_v7.row_of(kernel_v7.CASES[i], {"v7": 50.0}, "cfg", 4.0e12)["limit_us"] for i in (6, 7)]
    assert q1[1] == pytest.approx(q1[0] / 2, rel=0.01)  # q_len 1 stays memory-bound: half the limit


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kernel_v7_compiles_another_source_with_this_trees_constants(tmp_path):
    import kernel_v7
    from verify_tuner.kernels.build import SOURCE

    cfg = heuristic_config(known_device("h200"), H=8, q_len=9, prefix=46000)
    cubin = kernel_v7.compile_v6(SOURCE, cfg, 9, "sm_90", tmp_path)  # any source with the kernels' names
    assert cubin[:4] == b"\x7fELF" and b"verify_attn_partial" in cubin


def test_the_sm120_structure_check_times_the_sm120_default_and_sm120_valid_configs_only():
    """Every config it times is valid on the RTX PRO 6000, carries the NSPLIT the heuristic would
    give it there, and the shape's sm_120 default is among them as the default itself."""
    import sm120_structures
    from verify_tuner.heuristic import one_wave_nsplit

    target = known_device("rtx-pro-6000")
    for _, H, q, P in sm120_structures.SHAPES:
        default, pool = sm120_structures.structures(H, q, 12, 0)
        assert default == heuristic_config(target, H=H, q_len=q, prefix=P) and default in pool
        assert 6 <= len(pool) <= 13 and len(set(pool)) == len(pool)
        for c in pool:
            assert check(c, target, H=H, q_len=q) is None and c.nsplit == one_wave_nsplit(c, target, H=H, q_len=q)
    # v6's sm_120 default at H=8 q=9: 36 rows in 5 n8 tiles over 4 row groups (2:1:1:1), and a warp
    # holds one m16 token tile x 2 row tiles of accumulators
    from verify_tuner.kernels.config import KernelConfig

    v6 = KernelConfig(nsplit=94, ht=4, tk=16, block=256, stages=2, wr=4, wk=2)
    assert sm120_structures.shape_of(v6, 9) == (False, 2)


def test_the_sm120_structure_check_of_the_e4m3_cache_reaches_32_token_tiles_at_36_rows():
    """On an e4m3 cache the structures are those valid for the fp8_e4m3 build on the RTX PRO 6000,
    timed against e4m3's own sm_120 default (what an engine on that cache gets), bf16's default
    structure among them: among them 32-token tiles at 36 rows, whose bf16 ring the 99 KB refuse."""
    import dataclasses

    import sm120_structures
    from verify_tuner.heuristic import one_wave_nsplit

    target = known_device("rtx-pro-6000")
    default, pool = sm120_structures.structures(8, 9, 40, 0, "fp8_e4m3")
    assert default == heuristic_config(target, H=8, q_len=9, prefix=46000, kv_dtype="fp8_e4m3") and default in pool
    bf16 = heuristic_config(target, H=8, q_len=9, prefix=46000)
    assert bf16 != default
    nsplit = one_wave_nsplit(bf16, target, H=8, q_len=9, kv_dtype="fp8_e4m3")
    assert dataclasses.replace(bf16, nsplit=nsplit) in pool
    # --config: a structure asked for is timed where the shape takes it (a 36-row block does not fit q=64's rows)
    balanced = KernelConfig(nsplit=1, ht=4, tk=32, block=256, stages=2, wr=1, wk=4, sf=1, pipe=1)
    _, with_it = sm120_structures.structures(8, 9, 10, 0, "fp8_e4m3", (balanced,))
    assert [c for c in with_it if dataclasses.replace(c, nsplit=1) == balanced]
    _, at_q64 = sm120_structures.structures(8, 64, 10, 0, "fp8_e4m3", (balanced,))
    assert not [c for c in at_q64 if dataclasses.replace(c, nsplit=1) == balanced]
    assert all(check(c, target, H=8, q_len=9, kv_dtype="fp8_e4m3") is None for c in pool)
    wide = [c for c in pool if c.tk == 32 and c.ht * (c.qt or 9) >= 36]
    assert wide
    for c in wide:
        reason = check(c, target, H=8, q_len=9)
        assert reason is not None and "shared memory" in reason, (c, reason)
    assert sm120_structures.file_stem("bf16") == "sm120_structures"
    assert sm120_structures.file_stem("fp8_e4m3") == "sm120_structures_fp8_e4m3"


def test_fp8_configs_candidates_follow_the_e4m3_builds_layout():
    """The e4m3 sweep's candidates are the configs the fp8_e4m3 build can run, the bf16 default
    first: its halved ring admits deeper rings and larger tiles a bf16 cache refuses."""
    import fp8_configs

    h200 = known_device("h200")
    for name, H, q, lens in fp8_configs.SHAPES:
        pool = fp8_configs.candidates(h200, H, q, lens)
        assert pool[0] == heuristic_config(h200, H=H, q_len=q, prefix=max(lens), batch=len(lens))
        own = heuristic_config(h200, H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype="fp8_e4m3")
        assert own in pool[:2]  # e4m3's own default is timed beside bf16's
        assert 1 < len(pool) <= fp8_configs.MAX_CANDIDATES and len(set(pool)) == len(pool)
        # the own default's other QK warp grids: how often each K fragment is dequantized
        same = [c for c in pool if (c.tk, c.stages, c.pipe, c.nsplit) == (own.tk, own.stages, own.pipe, own.nsplit)]
        assert len({(c.wr, c.wk) for c in same}) >= 2, name
        assert all(check(c, h200, H=H, q_len=q, kv_dtype="fp8_e4m3") is None for c in pool)
        new = [c for c in pool if check(c, h200, H=H, q_len=q) is not None]
        assert new, name  # structures only the halved ring fits
        for c in new:
            reason = check(c, h200, H=H, q_len=q)
            assert c.nsplit == pool[0].nsplit and "shared memory" in reason, (c, reason)
    # more blocks an SM at q=1 where they fit one: three on the e4m3 build, where bf16's ring holds two
    q1_default = heuristic_config(h200, H=8, q_len=1, prefix=131072)
    grids = {c.nsplit for c in fp8_configs.candidates(h200, 8, 1, [131072])}
    assert grids == {132, 264, 396} and max(grids) == blocks_per_sm(q1_default, 1, h200, "fp8_e4m3") * 132
    assert max(grids) > blocks_per_sm(q1_default, 1, h200, "bf16") * 132
    assert fp8_configs.file_stem("sm_90") == "fp8_configs_sm_90"


def test_the_phase_trace_has_the_issues_headline_shapes_and_files_each_set_apart():
    import phase_trace

    headline = phase_trace.CASES["headline"]
    assert {(H, q, len(lens), max(lens)) for H, q, lens in headline.values()} == {
        (8, 9, 1, 46000), (8, 9, 32, 70000), (64, 9, 1, 46000)
    }  # fmt: skip
    # each format's case runs at that format's own default, what an engine with that cache is served
    # (the e4m3 headline trace once ran bf16's SF=1 config on the e4m3 cache)
    h200 = known_device("h200")
    for H, q, lens in (c for cases in phase_trace.CASES.values() for c in cases.values()):
        for kv in ("bf16", "fp8_e4m3"):
            want = heuristic_config(h200, H=H, q_len=q, prefix=max(lens), batch=len(lens), kv_dtype=kv)
            assert phase_trace.case_config(h200, H, q, lens, kv) == want
    h8 = phase_trace.CASES["headline"]["H=8 q=9 P=46000"]
    assert phase_trace.case_config(h200, *h8, "fp8_e4m3") != phase_trace.case_config(h200, *h8, "bf16")
    assert phase_trace.file_name("sm_90", "default", "bf16") == "phase_trace_sm_90.json"  # the committed one
    assert phase_trace.file_name("sm_90", "headline", "fp8_e4m3") == "phase_trace_headline_fp8_e4m3_sm_90.json"


def test_the_sm120_projection_bounds_each_template_case_from_the_committed_h200_times(tmp_path):
    """The projection runs on the committed kernel_v7 result (no GPU): one row per sm_120 template
    case, each a range no faster than its memory floor, and a single point where the H200 ran one
    block an SM (nothing to share); a result without those rows is refused in one line."""
    import json

    r = subprocess.run([sys.executable, str(BENCH / "sm120_projection.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "sm120_projection.json").read_text())["rows"]
    assert [row["case"] for row in rows] == [
        "sm_120 template H=8 q=9 P=46000", "sm_120 template H=64 q=9 P=46000", "sm_120 template H=8 q=64 P=46000"
    ]  # fmt: skip
    for row in rows:
        lo, hi = row["projected_us"]
        assert row["memory_floor_us"] <= lo <= hi and row["tensor_floor_us"] <= lo
        assert (lo == hi) == (row["h200_blocks_per_sm"] == 1)
    empty = tmp_path / "no_sm120.json"
    empty.write_text(json.dumps({"device": "x", "date": "d", "rows": []}))
    r = subprocess.run([sys.executable, str(BENCH / "sm120_projection.py"), "--out", str(tmp_path), "--results",
                        str(empty)], capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 2 and "has no sm_120 template rows" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--b-flags=-DVA_NOT_A_MACRO"], "the kernel source never tests VA_NOT_A_MACRO"),
        (["--kv-dtype", "fp8_e4m3", "--b-flags=-DVA_F8"], "the kernel source never tests VA_F8"),  # VA_F8_BITS' prefix
        (["--b-flags=-DVA_F8_BITS"], "changes e4m3 builds only: pass --kv-dtype fp8_e4m3"),
        (["--kv-dtype", "fp8_e5m2", "--b-flags=-DVA_F8_BITS"], "unknown kv_dtype 'fp8_e5m2'"),
        (["--defaults-of", "rtx-9000", "--b-flags=-DVA_QK_UNIFORM=1"], "'rtx-9000': not a known device"),
        (["--batch", "0", "--b-flags=-DVA_TILED_PLAN=0"], "--batch 0: a batch holds at least one request"),
    ],
)
def test_ab_kernel_refuses_an_a_b_that_would_compare_a_with_a_before_touching_a_gpu(tmp_path, args, needle):
    r = subprocess.run([sys.executable, str(BENCH / "ab_kernel.py"), *args, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_ab_kernel_checks_variant_a_s_flags_against_its_own_source(tmp_path):
    """--a-source builds A from another revision: a flag that revision never tests is refused (this
    tree's source testing it does not count), and a missing file is one line."""
    old = tmp_path / "old.cu"
    old.write_text("#ifndef VA_PDL\n#endif\n")
    runs = {
        "never tests VA_RED_TREE": ["--a-source", str(old), "--a-flags=-DVA_RED_TREE=0"],
        "no such file": ["--a-source", str(tmp_path / "gone.cu")],
    }
    for needle, args in runs.items():
        r = subprocess.run([sys.executable, str(BENCH / "ab_kernel.py"), *args, "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_audit_of_every_default_covers_each_device_format_and_shape_once():
    """ptxas_report --every-default builds one kernel per distinct default; every (known device,
    format its arch reads, H, q_len) must map to exactly one of them, with that default's own
    structure and q_len, and fp8_e4m3_qk must not be built for sm_80 (no e4m3 MMA)."""
    import ptxas_report
    from verify_tuner.kernels.formats import KV_DTYPES, kv_format
    from verify_tuner.kernels.limits import KNOWN_DEVICES

    builds = ptxas_report.every_default()
    served = [(key[3], *s) for key, serves in builds.items() for s in serves]  # (kv_dtype, device, H, q_len)
    assert len(served) == len(set(served))
    expected = 0
    for limits in KNOWN_DEVICES.values():
        formats = [
            kv for kv in KV_DTYPES if not kv_format(kv).unsupported_reason(10 * limits.cc_major + limits.cc_minor)
        ]
        expected += len(formats) * 8 * 64
    assert len(served) == expected
    for (arch, built_cfg, q, kv), serves in builds.items():
        assert not (arch == "sm_80" and kv == "fp8_e4m3_qk")
        structure = [p for p in str(built_cfg).split() if not p.startswith("NSPLIT=")]
        name, H, q_served = serves[0]
        assert q_served == q
        limits = next(lim for lim in KNOWN_DEVICES.values() if lim.name == name)
        assert limits.arch == arch
        cfg = heuristic_config(limits, H=H, q_len=q, prefix=46000, kv_dtype=kv)
        assert [p for p in str(cfg).split() if not p.startswith("NSPLIT=")] == structure


def test_ptx_identity_reads_one_kernel_s_entry_and_refuses_a_missing_one():
    """--function compares one .entry: the partial's text alone, not the reduce that follows it."""
    from ptx_identity import entry

    lines = [".version 8.0", ".visible .entry verify_attn_partial(", "  mov.u32 %r1, 1;", "}",
             ".visible .entry verify_attn_reduce(", "  mov.u32 %r1, 2;", "}"]  # fmt: skip
    ptx = "\n".join(lines)
    assert entry(ptx, "verify_attn_partial") == ".visible .entry verify_attn_partial(\n  mov.u32 %r1, 1;\n}"
    assert "%r1, 2" in entry(ptx, "verify_attn_reduce") and "%r1, 1" not in entry(ptx, "verify_attn_reduce")
    with pytest.raises(SystemExit, match="no kernel verify_attn_reduce16"):
        entry(ptx, "verify_attn_reduce16")


def test_the_spread_summary_reads_the_blocks_a_trace_saves(tmp_path):
    """Synthetic blocks whose late starters finish last, on SMs holding two blocks each: the summary
    says so (the docs quote its figures), and a file traced without --blocks is a one-line error."""
    import spread_summary

    # block b starts its prologue at 1 + b/10 us, loops 5 us; block 3 never finished a loop
    us = [[0.0, 1.0, 1.0 + b / 10, 2.0 + b / 10, 7.0 + b / 10, 7.5, 7.6, None] for b in range(20)]
    us[3][4] = None
    blocks = {"slots": [], "block": list(range(20)), "sm": [b // 2 for b in range(20)], "us": us}
    s = spread_summary.summarize(blocks)
    assert s is not None and s["blocks"] == 19
    assert s["corr"] == pytest.approx(1.0)
    assert s["loop"] == pytest.approx((5.0, 5.0))
    assert s["done"][2] == pytest.approx(8.9) and s["done"][0] == pytest.approx(8.0)
    assert s["sm pair done apart"] == pytest.approx(0.1)  # block 3's SM holds one finished block
    assert s["plan to prologue by tenth"][0] == pytest.approx(0.05) and s["plan to prologue by tenth"][
        9
    ] == pytest.approx(1.85)
    assert spread_summary.summarize({**blocks, "us": [[0.0, 1.0] + [None] * 6] * 20}) is None
    assert "plan to indices" not in s  # slot 7 means when the index loads landed only in such a build
    # a build stamping when the index loads landed (slot 7): 0.5 us after the plan, the rest issuing
    staged = [[*u[:7], 1.5] for u in us]
    t = spread_summary.summarize({**blocks, "us": staged}, indices=True)
    assert t is not None and t["plan to indices"] == pytest.approx((0.5, 0.5, 0.5))
    assert t["indices to prologue issued"] == pytest.approx((0.5, 1.4))  # block 3 never finished
    row = {"case": "H=8 q=1 P=1", "kv_dtype": "fp8_e4m3", "variant": "default", "blocks": blocks}
    (f := tmp_path / "trace.json").write_text(json.dumps({"device": "d", "date": "x", "rows": [row]}))
    out = subprocess.run(
        [sys.executable, str(BENCH / "spread_summary.py"), str(f)], check=False, capture_output=True, text=True
    )
    assert (
        out.returncode == 0
        and "fp8_e4m3 H=8 q=1 P=1: 19 blocks" in out.stdout
        and "corr(done, prologue issued) 1.00" in out.stdout
    )
    (f := tmp_path / "plain.json").write_text(json.dumps({"rows": [{k: v for k, v in row.items() if k != "blocks"}]}))
    out = subprocess.run(
        [sys.executable, str(BENCH / "spread_summary.py"), str(f)], check=False, capture_output=True, text=True
    )
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "--blocks" in out.stderr


def test_the_seesaw_model_catches_a_deferred_tile_without_its_empty_group(monkeypatch):
    """The deferred prologue keeps each group's cp.async count by committing an empty group where a
    deferred tile was: without it the wait for Q counts one group too few and Q is used unlanded."""
    real = seesaw_model.prologue

    def no_empty(grp, stages, deferred):
        return [o for o in real(grp, stages, deferred) if o != ("commit", "empty", -1)]

    rng = seesaw_model.random.Random(0)

    def runs() -> list[str]:
        return [w for n in range(1, 7) for _ in range(30) if (w := seesaw_model.run(n, 3, "refill_first", rng, True))]

    assert not runs()
    monkeypatch.setattr(seesaw_model, "prologue", no_empty)
    found = runs()
    assert any("uses Q before its cp.async group landed" in w for w in found), found[:3]


def test_the_fp8_qk_probe_tells_the_two_q_scales_apart(tmp_path):
    """`fp8_qk_probe.py --analyze` reads a saved scores file and counts the scores that q quantized
    with each scale formula misses: the kernel's (one rounded division) none, torch's `448 /
    tensor` (two roundings) some -- on scores made here with the kernel's formula."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(5)
    q = (torch.randn(64, 9, 8, 576, generator=gen) * 2).to(torch.bfloat16)
    k = torch.randn(64 * 9, 576, generator=gen).to(torch.float8_e4m3fn)
    amax = q.float().abs().amax(dim=-1, keepdim=True)
    mul = torch.full_like(amax, 448.0) / amax
    qq = (q.float() * mul).to(torch.float8_e4m3fn).float() / mul
    lse = torch.einsum("bqhd,bqd->bqh", qq, k.float().view(64, 9, 576)) * 0.1447
    saved = {"scale": 0.1447, "q": q, "keys fp8_e4m3_qk": k.view(torch.uint8).view(64, 9, 576)}
    saved |= {"kv_scale fp8_e4m3_qk": 1.0, "lse fp8_e4m3_qk short": lse, "lse fp8_e4m3_qk default": lse}
    torch.save(saved, tmp_path / "scores.pt")
    r = subprocess.run(
        [sys.executable, str(BENCH / "fp8_qk_probe.py"), "--analyze", str(tmp_path / "scores.pt")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert lines["short, q scaled by 448 / amax, one rounding"].endswith(" 0 of 4608 scores off by more than 1e-4")
    off = lines["short, q scaled by 448 * (1 / amax), two roundings"].split(", ")[1]
    assert 0 < int(off.split(" of ")[0]) < 4608, off
