"""The engine op on the GPU: a cubin bundle loaded with nvcc off PATH and without PyCUDA, the op
captured in a torch CUDA graph on torch's current (non-default) stream, checked against the fp32
reference; bad tensors refused with the tensor's name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from verify_tuner.kernels.config import KernelConfig

pytestmark = pytest.mark.gpu

CFG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)

WORKER = r"""
import json, shutil, sys
import torch
import verify_tuner.engine.op as op
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.reference import make_inputs, reference, rel_error

cfg = KernelConfig.from_params(json.loads(sys.argv[1]))
torch.cuda.set_device(0)
steps = [make_inputs(prefix_lens=lens, q_len=9, H=8, seed=i) for i, lens in enumerate([[4096, 9], [46000, 0]])]
inp = steps[0]
kv = torch.empty(max(s.kv.shape[0] for s in steps), 576, dtype=torch.bfloat16, device="cuda")
idx = torch.empty(max(s.prefix_indices.numel() for s in steps), dtype=torch.int32, device="cuda")
bufs = {"q": inp.q.clone(), "indptr": inp.prefix_indptr.clone(), "draft": inp.draft_indices.clone(),
        "mask": inp.tree_mask.clone()}
out = torch.empty(2, 9, 8, 512, dtype=torch.bfloat16, device="cuda")
lse = torch.empty(2, 9, 8, dtype=torch.float32, device="cuda")

def load(s):
    kv[: s.kv.shape[0]].copy_(s.kv); idx[: s.prefix_indices.numel()].copy_(s.prefix_indices)
    bufs["q"].copy_(s.q); bufs["indptr"].copy_(s.prefix_indptr); bufs["draft"].copy_(s.draft_indices)
    bufs["mask"].copy_(s.tree_mask); out.fill_(float("nan")); lse.fill_(float("nan"))

def call():
    torch.ops.verify_tuner.verify_attention(bufs["q"], None, kv, bufs["indptr"], idx, None, bufs["draft"], bufs["mask"],
                                            out, lse, op.config_list(cfg), inp.scale, None)

side = torch.cuda.Stream()
load(steps[0])
with torch.cuda.stream(side):
    call()  # warm-up: loads the cubin, allocates the workspace
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph, stream=side):
    call()
errs = []
for s in steps:
    load(s)
    graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(s)
    errs.append([rel_error(out, ref_o), rel_error(lse, ref_lse)])
try:
    _ = torch.ops.verify_tuner.verify_attention(bufs["q"].float(), None, kv, bufs["indptr"], idx, None, bufs["draft"],
                                                       bufs["mask"], out, lse, op.config_list(cfg), inp.scale, None)
    bad = "accepted"
except Exception as exc:
    bad = str(exc)
print(json.dumps({"errs": errs, "pycuda": any(m.startswith("pycuda") for m in sys.modules),
                  "nvcc": shutil.which("nvcc"), "bad": bad}))
"""


def test_op_from_a_bundle_without_nvcc_in_a_graph_on_the_current_stream(tmp_path):
    from verify_tuner.engine.bundle import Item, write_bundle
    from verify_tuner.kernels.limits import read_device_limits

    arch = read_device_limits(0).arch
    write_bundle(tmp_path / "cubins", [Item(CFG, 9, "bf16", arch)], cache_dir=tmp_path / "cache")
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(p, "nvcc"))
    )
    env = {**os.environ, "PATH": path, "VERIFY_TUNER_CUBINS": str(tmp_path / "cubins"), "CUDA_HOME": "/nonexistent"}
    r = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(CFG.as_params())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["nvcc"] is None and res["pycuda"] is False
    for out_err, lse_err in res["errs"]:
        assert out_err <= 1e-2 and lse_err <= 1e-3, res
    assert "q must be bfloat16" in res["bad"], res["bad"]
