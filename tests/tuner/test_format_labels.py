"""Keys of one shape in different KV formats are told apart wherever a key is printed: the study's
progress line and summary table, `configs verify`'s lines (three identical lines for bf16, fp8_e4m3
and fp8_e4m3_qk rows of one shape were printed before)."""

from __future__ import annotations

import types

from verify_tuner.cli.study_output import Bar, summary_table
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.keys import ConfigKey
from verify_tuner.search.key_search import Progress
from verify_tuner.search.verify import describe
from verify_tuner.store.plans import VerificationRow

CFG = KernelConfig(132, 8, 32, 256, stages=3, wr=2, wk=2, sf=1, pipe=3)


def _keys() -> dict[str, ConfigKey]:
    return {k: ConfigKey("NVIDIA H200", "k" * 16, k, 8, 9, 15) for k in ("bf16", "fp8_e4m3", "fp8_e4m3_qk")}


def test_the_progress_line_and_the_summary_name_a_non_default_format(capsys):
    bar = Bar()
    for key in _keys().values():
        bar(Progress(key, 3, 10, 40.0, 44.0, "-"))
    lines = capsys.readouterr().err.replace("\r", "\n").split("\n")
    starts = [line.split(" [")[0].strip() for line in lines if line.strip()]
    assert starts == ["H=8 q=9 b15 B0", "H=8 q=9 fp8_e4m3 b15 B0", "H=8 q=9 fp8_e4m3_qk b15 B0"]
    outcome = types.SimpleNamespace(
        counts={}, best_m=None, default_m=None, speedup=None, workload=types.SimpleNamespace(prefix=46000, batch=1),
        default="d", best="b", decision="kept", wall_s=1.0,
    )  # fmt: skip
    table = summary_table([_with(outcome, k) for k in _keys().values()])
    rows = [line.split(" | ")[0] for line in table.splitlines()[2:]]
    assert rows == ["| H=8 q=9 b15 B0", "| H=8 q=9 fp8_e4m3 b15 B0", "| H=8 q=9 fp8_e4m3_qk b15 B0"]


def _with(outcome: types.SimpleNamespace, key: ConfigKey) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{**vars(outcome), "key": key})


def test_verify_lines_name_a_non_default_format():
    lines = [
        describe(VerificationRow(key, CFG, 40.0, 41.0, 40.5, 41.5, CFG, 44.0, 43.5, 44.5, 0.01, "moved", "r", "me"))
        for key in _keys().values()
    ]
    assert len(set(lines)) == 3
    assert [line.split(" prefix")[0] for line in lines] == [
        "H=8 q_len=9",
        "H=8 q_len=9 fp8_e4m3",
        "H=8 q_len=9 fp8_e4m3_qk",
    ]
