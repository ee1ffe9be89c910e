"""docs/integration.md's SGLang section as written: its Python runs (on the CPU, with the client's
heuristic), and every flag of its launch command is one SGLang 0.5.23 defines (read from the
released wheel), with values it accepts."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.engine.sglang_source import VERSION, Source, fetch_wheel

DOC = Path(__file__).resolve().parents[2] / "docs" / "integration.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## In SGLang")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), flags=re.DOTALL)


def test_the_python_runs_as_written(monkeypatch, tmp_path):
    for var in ("VERIFY_TUNER_URL", "VERIFY_TUNER_CONFIG_DIR", "VERIFY_TUNER_CUBINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no snapshot of another test's table
    (code,) = _blocks("python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{DOC}:python", "exec"), {})  # noqa: S102
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("heuristic the built-in heuristic for NVIDIA H200")
    assert len(lines) == 9 and lines[-1].startswith("one workspace for every graph and layer: ")
    assert float(lines[-1].split(": ")[1].removesuffix(" MB")) > 0


def test_the_launch_command_s_flags_are_sglang_s():
    sglang = Source(fetch_wheel())
    (script,) = _blocks("bash")
    command = script[script.index("sglang serve") :].replace("\\\n", " ")
    argv = shlex.split(command)[2:]
    # `sglang serve`: the wheel's console script and its subcommand (launch_server is deprecated in it)
    scripts = sglang.zip.read(f"sglang-{VERSION}.dist-info/entry_points.txt").decode()
    assert re.search(r"^sglang = sglang\.cli\.main:main$", scripts, flags=re.MULTILINE)
    assert '"serve"' in sglang.text("sglang.cli.main")
    flags = dict(zip(argv[::2], argv[1::2]))
    assert all(f.startswith("--") for f in flags) and not any(v.startswith("--") for v in flags.values())
    fields = "".join(sglang.text(f"sglang.srt.arg_groups.fields.{m}") for m in _field_modules(sglang))
    for flag in flags:
        name = flag[2:].replace("-", "_")
        assert re.search(rf"^    {name}: A\[", fields, flags=re.MULTILINE), f"{flag}: SGLang {VERSION} has no such flag"
    assert flags["--attention-backend"] == "verify_tuner"  # the choice the plugin adds
    choices = sglang.text("sglang.srt.arg_groups.choices")
    drafts = choices[choices.index("DRAFT_ATTENTION_BACKEND_CHOICES = [") :].split("]", 1)[0]
    assert f'"{flags["--speculative-draft-attention-backend"]}"' in drafts
    assert "choices=ATTENTION_BACKEND_CHOICES" in sglang.text("sglang.srt.arg_groups.fields.exec_")
    assert "DeepseekV3ForCausalLM" in sglang.text("sglang.srt.arg_groups.speculative_hook")  # its NextN drafts


def _field_modules(sglang: Source) -> list[str]:
    names = sglang.zip.namelist()
    prefix = "sglang/srt/arg_groups/fields/"
    return [
        n[len(prefix) : -3] for n in names if n.startswith(prefix) and n.endswith(".py") and "/" not in n[len(prefix) :]
    ]
