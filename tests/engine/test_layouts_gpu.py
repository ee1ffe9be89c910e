"""The engine layouts on the GPU: a paged pool with a page table, q as q_nope + q_pe views, and
SGLang's packed mask rows, each run through the tuner's PyCUDA launcher and through the engine
op, against the fp32 reference with poisoned outputs (tests/kernels/test_reference_layouts.py
holds the reference on these layouts to the dense form of the same data)."""

from __future__ import annotations

import pytest
from verify_tuner.kernels.config import KernelConfig

pytestmark = pytest.mark.gpu

H = 8
#: Besides the device's default for each q_len: small row tiles, TK below the page size.
ROW_TILES = KernelConfig(nsplit=48, ht=2, tk=16, block=128, stages=3, wr=1, wk=4, sf=1, pipe=0, qt=3)
#: (q_len, layout options): the prefixes are ragged, with an empty one and one across many pages.
CASES = {
    "paged 64": (9, {"page_size": 64}),
    "paged 16 contiguous": (9, {"page_size": 16, "layout": "contiguous"}),
    "paged 1 as a 3-d pool": (9, {"page_size": 1}),
    "q_nope + q_pe": (9, {"split_q": True}),
    "req_to_token rows": (9, {"req_to_token": True}),
    "uint8 mask": (8, {"mask_dtype": "uint8"}),
    "uint16 mask": (16, {"mask_dtype": "uint16"}),
    "uint32 mask": (32, {"mask_dtype": "uint32"}),
    "paged, split q, int16 mask": (9, {"page_size": 64, "split_q": True, "mask_dtype": "int16"}),
}
LENS = [46_000, 0, 1, 63, 64, 65, 5000, 130]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context)
    import torch
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.build import precompile
    from verify_tuner.kernels.limits import read_device_limits

    torch.cuda.init()
    limits, cache = read_device_limits(0), tmp_path_factory.mktemp("cubins")
    configs = {q: [heuristic_config(limits, H=H, q_len=q, prefix=max(LENS)), ROW_TILES] for q, _ in CASES.values()}
    for q_len, cfgs in configs.items():
        assert not precompile(cfgs, q_len, limits.arch, cache)
    return limits, cache, configs


def _inputs(q_len: int, opts: dict):
    import torch
    from verify_tuner.kernels.reference import make_inputs

    inp = make_inputs(prefix_lens=LENS, q_len=q_len, H=H, seed=q_len, spare_slots=100, **opts)
    if opts.get("page_size") == 1:  # the [pages, 1, 576] spelling of a page-size-1 pool
        inp.kv = inp.kv.view(-1, 1, 576)
    assert inp.kv.device.type == "cuda" and (inp.q_pe is None or inp.q_pe.is_cuda)
    return inp, torch


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_layout_through_the_tuner_launcher_and_the_engine_op(gpu, case, monkeypatch):
    from verify_tuner.kernels.launch import VerifyAttention
    from verify_tuner.kernels.reference import poisoned_run_error, reference

    q_len, opts = CASES[case]
    inp, torch = _inputs(q_len, opts)
    ref_o, ref_lse = reference(inp)
    out = torch.empty(len(LENS), q_len, H, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(len(LENS), q_len, H, dtype=torch.float32, device="cuda")
    limits, cache, configs = gpu
    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))  # the op finds the precompiled cubins (no bundle)
    from verify_tuner.engine import op

    for cfg in configs[q_len]:
        va = VerifyAttention(cfg, H=H, q_len=q_len, limits=limits, max_batch=len(LENS), cache_dir=cache)
        assert poisoned_run_error(lambda va=va: va.run(inp, out, lse=lse), out, ref_o) <= 1e-2, f"{cfg}: out"
        assert poisoned_run_error(lambda va=va: va.run(inp, out, lse=lse), lse, ref_lse) <= 1e-3, f"{cfg}: lse"

        def call(cfg=cfg):
            torch.ops.verify_tuner.verify_attention(
                inp.q, inp.q_pe, inp.kv, inp.prefix_indptr, inp.prefix_indices, inp.prefix_rows, inp.draft_indices,
                inp.tree_mask, out, lse, op.config_list(cfg), inp.scale, None,
            )  # fmt: skip

        assert poisoned_run_error(call, out, ref_o) <= 1e-2, f"{cfg}: op out"
        assert poisoned_run_error(call, lse, ref_lse) <= 1e-3, f"{cfg}: op lse"


def test_the_op_runs_in_a_caller_s_workspace_and_names_one_too_small(gpu, monkeypatch):
    from verify_tuner.engine import op
    from verify_tuner.kernels.reference import poisoned_run_error, reference

    _, cache, configs = gpu
    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))
    inp, torch = _inputs(9, {"page_size": 64})
    cfg = op.config_list(configs[9][0])
    need = op.workspace_bytes(cfg, H=H, q_len=9, batch=len(LENS))
    out = torch.empty(len(LENS), 9, H, 512, dtype=torch.bfloat16, device="cuda")

    def call(ws):
        torch.ops.verify_tuner.verify_attention(
            inp.q, inp.q_pe, inp.kv, inp.prefix_indptr, inp.prefix_indices, inp.prefix_rows, inp.draft_indices,
            inp.tree_mask, out, None, cfg, inp.scale, ws,
        )  # fmt: skip

    ws = torch.full((need,), 255, dtype=torch.uint8, device="cuda")
    assert poisoned_run_error(lambda: call(ws), out, reference(inp)[0]) <= 1e-2
    with pytest.raises(ValueError, match=f"workspace must be a contiguous uint8 tensor of at least {need} bytes"):
        call(ws[: need - 1])
