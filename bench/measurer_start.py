"""Where the measuring process's start goes (issue 15): every tuning job waits for it before its
first measurement, once per GPU, in one GPU's job and in several GPUs' alike.

A fresh interpreter per GPU, started the way verify_tuner.measure.gpu_backend starts the measurer (spawned, one
GPU visible), times each step the real start takes, in order, then a first and a second
measurement of the heuristic config (its cubin compiled beforehand: nvcc is not counted):

    python bench/measurer_start.py --out FILE [--devices 0,1]

With several devices the interpreters start at once, as `tuner study start --devices` does.
Seconds are from the moment the bench launched the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t0 = float(sys.argv[1]); marks = [("interpreter up", time.time() - t0)]
def mark(what):
    marks.append((what, round(time.time() - t0, 3)))
import verify_tuner.measure.gpu_backend, verify_tuner.measure.gpu
mark("verify_tuner.measure.gpu_backend + verify_tuner.measure.gpu imported")
limits = verify_tuner.measure.gpu.GpuMeasurer.probe_limits(); mark("probe_limits (pycuda, cuInit, attributes)")
import pycuda.autoprimaryctx; mark("pycuda.autoprimaryctx (the primary context)")
import torch; mark("import torch")
torch.cuda.init(); mark("torch.cuda.init")
from verify_tuner.kernels.timing import copy_bandwidth
bw = copy_bandwidth(); mark("copy_bandwidth probe")
from verify_tuner.measure.backend import Workload
from verify_tuner.measure.gpu import GpuMeasurer
from verify_tuner.heuristic import heuristic_config
m = GpuMeasurer(cache_dir=sys.argv[2])  # the steps above once more, all warm now (a second bandwidth probe)
mark("GpuMeasurer() with the steps above done")
wl = Workload(8, 9, 2048)
cfg = heuristic_config(m.limits, H=8, q_len=9, prefix=2048)
GpuMeasurer.build(cfg, 9, m.limits.arch, cache_dir=sys.argv[2]); mark("compile (cached or nvcc)")
m._prepare(wl); mark("first workload: rotating inputs + fp32 reference")
r1 = m.measure(cfg, wl); mark("first measurement")
r2 = m.measure(cfg, wl); mark("second measurement")
print(json.dumps({"marks": marks, "device": limits.name, "first_us": r1.median_us, "second_us": r2.median_us,
                  "states": [r1.state, r2.state]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--devices", default="0")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    devices = [int(d) for d in args.devices.split(",")]
    root = str(Path(__file__).resolve().parent.parent)
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        # the heuristic's cubin once, so no run below counts nvcc
        pre = subprocess.run(
            [sys.executable, "-c", CHILD, str(time.time()), cache],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "CUDA_VISIBLE_DEVICES": str(devices[0]),
                "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
            },
            check=False,  # its stderr goes into the exit message below
        )
        if pre.returncode != 0:
            sys.exit(f"the measuring start failed:\n{pre.stderr[-3000:]}")
        for rep in range(args.repeat):
            t0 = time.time()
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(t0), cache],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env={
                        **os.environ,
                        "CUDA_VISIBLE_DEVICES": str(d),
                        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    },
                )
                for d in devices
            ]
            for d, p in zip(devices, procs):
                out, err = p.communicate()
                if p.returncode != 0:
                    sys.exit(f"GPU {d}: the measuring start failed:\n{err[-3000:]}")
                res = json.loads(out.strip().splitlines()[-1])
                runs.append({"repeat": rep, "gpu": d, "together": len(devices), **res})
        real = isolated(devices, args.repeat, cache)
    for r in runs:
        print(f"GPU {r['gpu']} (repeat {r['repeat']}, {r['together']} at once), {r['device']}:")
        prev = 0.0
        for what, t in r["marks"]:
            print(f"  {t:7.3f} s  (+{t - prev:6.3f})  {what}")
            prev = t
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for r in real:
        print(
            f"IsolatedBackend on GPU {r['gpu']} ({r['together']} at once): limits {r['limits_s']:.3f} s, "
            f"ready {r['ready_s']:.3f} s, first measurement done {r['first_s']:.3f} s"
        )
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "runs": runs, "isolated": real}, indent=1))


def isolated(devices: list[int], repeat: int, cache: str) -> list[dict]:
    """The tuner's own path: IsolatedBackend's constructor (returns with the probed limits), the
    rest of the start, a first measurement (its cubin compiled first, in this process)."""
    import threading

    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.measure.backend import Workload
    from verify_tuner.measure.gpu import GpuMeasurer
    from verify_tuner.measure.gpu_backend import IsolatedBackend

    out = []
    for rep in range(repeat):
        t0 = time.time()
        rows: list[dict] = []

        def one(d: int, t0: float, rows: list[dict], rep: int) -> None:
            b = IsolatedBackend(measurer_kwargs={"cache_dir": cache}, device_ordinal=d)
            t_lim = time.time() - t0
            wl = Workload(8, 9, 2048)
            cfg = heuristic_config(b.limits, H=8, q_len=9, prefix=2048)
            GpuMeasurer.build(cfg, 9, b.limits.arch, cache_dir=cache)
            t_built = time.time() - t0
            b._await_ready()
            t_ready = time.time() - t0
            m = b.measure(cfg, wl)
            rows.append(
                {
                    "repeat": rep,
                    "gpu": d,
                    "together": len(devices),
                    "limits_s": round(t_lim, 3),
                    "compiled_s": round(t_built, 3),
                    "ready_s": round(t_ready, 3),
                    "first_s": round(time.time() - t0, 3),
                    "state": m.state,
                }
            )
            b.close()

        threads = [threading.Thread(target=one, args=(d, t0, rows, rep)) for d in devices]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out += sorted(rows, key=lambda r: r["gpu"])
    return out


if __name__ == "__main__":
    main()
