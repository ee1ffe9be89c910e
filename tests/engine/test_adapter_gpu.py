"""An SGLang-style decode loop on the GPU: the backend captures one graph per batch size, and
every step refills only its buffers (prefix lengths, pool rows or block table, draft slots,
packed mask) before the replay; each step's output is checked against the fp32 reference on
the same data. Page size 1 reads the engine's req_to_token in place; the paged pool takes a
block table; q comes as q_nope + q_pe."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

H, Q = 8, 9
#: Four requests over five verify steps: prefixes grow by what each step accepted, request 1
#: finishes and a new request takes another pool row at P=0, one request runs past 100k.
STEPS = [[1000, 37, 0, 4096], [1003, 40, 9, 4100], [1009, 0, 15, 50_000], [1012, 6, 18, 50_003], [1020, 9, 21, 131_072]]
ROWS = [[3, 7, 1, 12], [3, 7, 1, 12], [3, 9, 1, 12], [3, 9, 1, 12], [3, 9, 1, 12]]


def _pool(torch, slots: int):
    return torch.randn(slots, 576, device="cuda").to(torch.bfloat16)


def _reference(torch, kv, slots_of, lens, draft, mask, q, q_pe, scale):
    from verify_tuner.kernels.reference import Inputs, reference

    flat = torch.cat([slots_of(b, n) for b, n in enumerate(lens)]).to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    inp = Inputs(
        q=torch.cat([q, q_pe], dim=-1).view(len(lens), Q, H, 576),
        kv=kv.view(-1, 576),
        prefix_indices=flat,
        prefix_indptr=indptr,
        draft_indices=draft.view(len(lens), Q).to(torch.int32),
        tree_mask=mask.view(len(lens), Q).view(torch.int16).to(torch.int64) & 0xFFFF,
        scale=scale,
    )
    return reference(inp)


@pytest.mark.parametrize("mode", ["req_to_token", "block table (page 64)"])
def test_a_decode_loop_replays_one_graph_per_batch_size(mode, tmp_path, monkeypatch):
    import pycuda.autoprimaryctx  # noqa: F401
    import torch
    from verify_tuner.engine.adapter import VerifyBackend
    from verify_tuner.heuristic import heuristic_config
    from verify_tuner.kernels.limits import read_device_limits
    from verify_tuner.kernels.reference import random_tree_mask, rel_error

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    limits = read_device_limits(0)
    gen = torch.Generator().manual_seed(1)
    B, page, width = 4, 64, 131_072 + 64
    paged = mode != "req_to_token"
    if paged:  # each of 16 pool rows owns pages of a shared pool, its block-table row lists them
        pages_per = -(-(width + Q) // page)
        kv = _pool(torch, 16 * pages_per * page).view(-1, page, 576)
        order = torch.randperm(kv.shape[0], generator=gen).view(16, pages_per)
    else:  # SGLang's req_to_token: 16 pool rows of token slots (each row repeats 2 * width / 16 slots)
        kv = _pool(torch, 2 * width)
        req_to_token = torch.randperm(kv.shape[0], generator=gen).view(16, -1)
        req_to_token = req_to_token.repeat(1, 8)[:, :width].to(torch.int32).cuda()
    scale = 576**-0.5
    be = VerifyBackend(
        H=H, q_len=Q, kv_pool=kv, max_batch=B, softmax_scale=scale,
        pick_config=lambda bs: heuristic_config(limits, H=H, q_len=Q, prefix=46000, batch=bs),
        **({"max_pages": order.shape[1]} if paged else {"req_to_token": req_to_token}),
    )  # fmt: skip
    io = None
    for step, (lens, rows) in enumerate(zip(STEPS, ROWS)):
        rows_t = torch.tensor(rows, device="cuda")
        if paged:
            table = order[rows_t.cpu()].to(torch.int32).cuda()
            slots_of = lambda b, n, t=table: (t[b, torch.arange(n, device="cuda") // page].long() * page
                                              + torch.arange(n, device="cuda") % page)  # fmt: skip
            draft = torch.stack([slots_of(b, n + Q)[n:] for b, n in enumerate(lens)]).flatten()
        else:
            slots_of = lambda b, n, r=rows: req_to_token[r[b], :n].long()
            draft = torch.randperm(kv.shape[0], generator=gen)[: B * Q].cuda()  # out_cache_loc
        mask = torch.tensor([random_tree_mask(Q, gen) for _ in range(B)], dtype=torch.int32).to(torch.uint16).cuda()
        meta = {"seq_lens": torch.tensor(lens, device="cuda"), "out_cache_loc": draft, "tree_mask": mask}
        meta.update({"block_table": table} if paged else {"req_pool_indices": rows_t})
        be.init_forward_metadata(B, **meta)
        if io is None:
            io = be.capture(B, q_dims=512, lse=True)
        io["q"].copy_(torch.randn(B * Q, H, 512, device="cuda"))
        io["q_pe"].copy_(torch.randn(B * Q, H, 64, device="cuda"))
        io["out"].fill_(float("nan"))
        be.replay(B)
        torch.cuda.synchronize()
        ref_o, ref_lse = _reference(torch, kv, slots_of, lens, draft, mask, io["q"], io["q_pe"], scale)
        assert rel_error(io["out"].view(B, Q, H, 512), ref_o) <= 1e-2, f"step {step} {lens}"
        assert rel_error(io["lse"].view(B, Q, H), ref_lse) <= 1e-3, f"step {step} {lens}: lse"
