"""Whether this tree's kernel source generates the same PTX as another revision's, for a set of
configs and arches (line info and comments stripped): a source change that is meant to touch
comments or flag-only paths is checked here, without a GPU, against the revision the gpu tests
and benchmarks measured.

    python bench/ptx_identity.py --base 5dfc59b --out OUT
    python bench/ptx_identity.py --base 6988d3a --function verify_attn_partial --out OUT   # one kernel's
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from verify_tuner.kernels.build import NVCC_FLAGS, SOURCE, nvcc_path
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.formats import KV_DTYPES, kv_format

CONFIGS = [
    (KernelConfig(132, 8, 32, 256, stages=3, wr=2, wk=2, sf=1, pipe=3), 9),
    (KernelConfig(132, 8, 32, 256, stages=2, wr=2, wk=4, pipe=1), 9),
    (KernelConfig(64, 4, 32, 256, stages=3, wr=2, wk=2, pipe=0), 9),
    (KernelConfig(264, 8, 32, 256, stages=2, wr=1, wk=4, pipe=1), 1),
    (KernelConfig(5, 1, 16, 256, stages=3, wr=1, wk=4, pipe=3), 9),
    (KernelConfig(94, 4, 16, 256, stages=2, wr=4, wk=2, pipe=1), 9),
    # e4m3's own 72-row and q=1 defaults on the H200 (unfolded scores, the seesaw at q=1)
    (KernelConfig(132, 8, 32, 256, stages=3, wr=2, wk=2, sf=0, pipe=3), 9),
    (KernelConfig(264, 8, 32, 256, stages=3, wr=1, wk=4, pipe=3), 1),
]
ARCHES = ("sm_80", "sm_90", "sm_120")


def _ptx(source: str, cfg: KernelConfig, q_len: int, arch: str, kv_dtype: str) -> str:
    consts = {**cfg.as_params(), "QN": q_len, "QT": cfg.row_tile(q_len), "KV_FMT": kv_format(kv_dtype).code}
    text = "".join(f"#define {k} {int(v)}\n" for k, v in sorted(consts.items())) + source
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "k.cu", Path(d) / "k.ptx"
        src.write_text(text)
        flags = [f for f in NVCC_FLAGS if f != "-lineinfo"]
        subprocess.run(
            [nvcc_path(), "-ptx", f"-arch={arch}", *flags, "-o", str(out), str(src)], check=True, capture_output=True
        )
        text = "\n".join(
            line for line in out.read_text().splitlines() if not line.strip().startswith((".loc", ".file", "//"))
        )
        # an anonymous namespace's functions are mangled with hashes of the source file: one
        # changed comment renames them all
        return re.sub(r"[0-9a-f]{8}_\d+_k_cu_[0-9a-f]{8}", "SRC", text)


def entry(ptx: str, name: str) -> str:
    """The PTX of one kernel: from its `.entry` line to the next entry or function."""
    lines = ptx.splitlines()
    start = next((i for i, line in enumerate(lines) if f".entry {name}(" in line), None)
    if start is None:
        raise SystemExit(f"no kernel {name} in the PTX")
    end = next((i for i in range(start + 1, len(lines)) if ".entry " in lines[i] or ".func " in lines[i]), len(lines))
    return "\n".join(lines[start:end])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--out", type=Path, required=True, help="folder the results are written to")
    ap.add_argument(
        "--kv-dtypes",
        default=",".join(KV_DTYPES),
        help="cache formats to build, comma-separated (default: the served ones)",
    )
    ap.add_argument("--function", help="compare this kernel's PTX only (e.g. verify_attn_partial)")
    args = ap.parse_args()
    kv_dtypes = args.kv_dtypes.split(",")
    for name in kv_dtypes:
        try:
            kv_format(name)
        except InvalidConfig as e:
            ap.error(str(e))
    rel = SOURCE.relative_to(ROOT)
    base = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.base}:{rel}"], capture_output=True, text=True, check=True
    ).stdout
    here = SOURCE.read_text()
    rows = []
    for kv in kv_dtypes:
        for cfg, q in CONFIGS:
            for arch in ARCHES:
                if int(arch.removeprefix("sm_")) < kv_format(kv).min_cc:
                    continue  # the format needs instructions the arch lacks (its build is an #error)
                a, b = _ptx(base, cfg, q, arch, kv), _ptx(here, cfg, q, arch, kv)
                same = entry(a, args.function) == entry(b, args.function) if args.function else a == b
                rows.append(f"| {kv} | {arch} | {q} | {cfg} | {'identical' if same else 'DIFFERENT'} |")
            print(rows[-1], flush=True)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    lines = [
        (
            f"# PTX of {rel}{f' ({args.function} only)' if args.function else ''} at {head} (working tree) vs "
            f"{args.base} — {dt.date.today().isoformat()}"
        ),
        "",
        (
            f"`python bench/ptx_identity.py --base {args.base}{f' --function {args.function}' if args.function else ''}`; nvcc {' '.join(NVCC_FLAGS)} without "
            "-lineinfo, `.loc`/`.file`/comment lines stripped."
        ),
        "",
        "| kv_dtype | arch | q_len | config | PTX |",
        "|---|---|---|---|---|",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ptx_identity.md").write_text("\n".join(lines + rows) + "\n")


if __name__ == "__main__":
    main()
