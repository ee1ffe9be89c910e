"""Host time of one verify-attention call outside a captured graph (an eager step: a batch larger
than the captured graphs), against an empty custom op with the op's schema in the same run: the
op itself, the SGLang backend's forward_extend (target verify, SGLang's absorbed head-major q;
save_kv_cache=False: the pool's own write is SGLang's code, the same for every backend) and the
older adapter's forward. The kinds are timed in interleaved rounds, so drift on a shared machine
moves them alike; reported: the median over rounds of µs per call and of the ratio to the empty op.

    python3 bench/host_cost.py --device cuda --out $OUT   # a GPU: the real op, launches and all
    python3 bench/host_cost.py --stub                      # no GPU: CPU tensors, cuda-python's
        # driver stood in (tests/engine/fake_driver.py: launches accepted, not run), so the op's
        # Python is timed without the driver's launch calls

The GPU run keeps each round's launches well inside the launch queue and synchronizes between
rounds, and its shapes are small, so the device never throttles the host.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/engine: the SGLang-shaped objects an engine hands the backend

H, Q, BS, PREFIX = 8, 9, 4, 64
_EMPTY: list = []


def empty_op():
    """torch.ops.verify_tuner_bench.empty: the op's schema, no body (registered once a process)."""
    if not _EMPTY:

        @torch.library.custom_op("verify_tuner_bench::empty", mutates_args=("out", "lse", "workspace"))
        def empty(
            q: torch.Tensor,
            q_pe: Optional[torch.Tensor],  # noqa: UP045
            kv: torch.Tensor,
            kv_indptr: torch.Tensor,
            kv_indices: torch.Tensor,
            kv_rows: Optional[torch.Tensor],  # noqa: UP045
            draft_slots: torch.Tensor,
            tree_mask: torch.Tensor,
            out: torch.Tensor,
            lse: Optional[torch.Tensor],  # noqa: UP045
            config: list[int],
            softmax_scale: float,
            workspace: Optional[torch.Tensor],  # noqa: UP045
            kv_dtype: str = "bf16",
            kv_scale: float = 1.0,
            kv_scale_tensor: Optional[torch.Tensor] = None,  # noqa: UP045
        ) -> None:
            return None

        _EMPTY.append(empty)
    return torch.ops.verify_tuner_bench.empty


def calls(device: str, cfg) -> dict:
    """name -> a zero-argument call of that kind, all on one SGLang-shaped verify step."""
    from verify_tuner.engine import op
    from verify_tuner.engine.adapter import VerifyBackend
    from verify_tuner.engine.sglang_backend import VerifyMLABackend
    from verify_tuner.engine.tree_masks import TreeMaskMode

    from tests.engine.sglang_doubles import ForwardBatch, ForwardMode, Layer, MLAPool, SpecInfo

    T, dev = BS * Q, torch.device(device)
    pool = MLAPool(size=BS * (PREFIX + Q) + 8, layers=1, device=device)
    req_to_token = torch.arange(BS * (PREFIX + Q), dtype=torch.int32, device=dev).view(BS, PREFIX + Q)
    be = VerifyMLABackend(
        pool=pool, req_to_token=req_to_token, heads=H, q_lens=(Q,), max_bs=BS, max_context_len=PREFIX + Q,
        pick_config=lambda q, bs: cfg, tree_mask_mode=TreeMaskMode.QLEN_ONLY,
    )  # fmt: skip
    fb = ForwardBatch(
        ForwardMode.TARGET_VERIFY, BS, torch.full((BS,), PREFIX, device=dev), torch.arange(BS, device=dev),
        req_to_token[:, PREFIX:].reshape(-1).long(), SpecInfo(torch.ones(BS * Q * Q, dtype=torch.bool, device=dev), Q, 4),
    )  # fmt: skip
    be.init_forward_metadata(fb)
    q_nope = torch.randn(H, T, 512, device=dev).to(torch.bfloat16).transpose(0, 1)  # SGLang's head-major q
    q_rope = torch.randn(T, H, 192, device=dev).to(torch.bfloat16)[..., 128:]
    layer = Layer(0, H, 0.1447)
    _, step, config, ws = be._current
    indptr, rows, draft, mask = step.views(BS)
    out = torch.empty(BS, Q, H, 512, dtype=torch.bfloat16, device=dev)
    args = (q_nope.view(BS, Q, H, 512), q_rope.view(BS, Q, H, 64), pool.kv_buffer[0].view(-1, 576), indptr,
            req_to_token, rows, draft, mask, out, None, config, 0.1447, ws)  # fmt: skip
    adapter = VerifyBackend(
        H=H, q_len=Q, kv_pool=pool.kv_buffer[0].view(-1, 576), pick_config=lambda bs: cfg, max_batch=BS,
        softmax_scale=0.1447, req_to_token=req_to_token,
    )  # fmt: skip
    adapter.init_forward_metadata(
        BS, seq_lens=fb.seq_lens, out_cache_loc=fb.out_cache_loc, tree_mask=mask.to(torch.int16),
        req_pool_indices=fb.req_pool_indices,
    )  # fmt: skip
    flat = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
    the_op, empty = torch.ops.verify_tuner.verify_attention, empty_op()
    assert op.config_list(cfg) == config
    return {
        "empty op": lambda: empty(*args),
        "op": lambda: the_op(*args),
        "backend forward_extend": lambda: be.forward_extend(q_nope, None, None, layer, fb, False, q_rope=q_rope),
        "adapter forward": lambda: adapter.forward(q_nope, q_rope, flat),
    }


def measure(kinds: dict, *, rounds: int, per_round: int, sync) -> dict:
    """Median µs per call of each kind, and of its per-round ratio to the empty op."""
    for fn in kinds.values():  # warm-up: the op's plans, the cubins, torch's dispatch caches
        for _ in range(20):
            fn()
    sync()
    us: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for name, fn in kinds.items():
            t0 = time.perf_counter_ns()
            for _ in range(per_round):
                fn()
            us[name].append((time.perf_counter_ns() - t0) / per_round / 1000)
            sync()
    base = us["empty op"]
    return {
        "us per call (median)": {k: round(statistics.median(v), 2) for k, v in us.items()},
        "ratio to the empty op (median of rounds)": {
            k: round(statistics.median(a / b for a, b in zip(v, base)), 2) for k, v in us.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (the real op) unless --stub")
    ap.add_argument("--stub", action="store_true", help="no GPU: CPU tensors, cuda-python's driver stood in")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--out", type=Path, help="folder to write host_cost_<mode>.json into")
    args = ap.parse_args()
    if args.stub:
        from tests.engine import fake_driver

        fake_driver.host_only(setattr, None)
        device, cfg, sync, where = "cpu", fake_driver.CFG, lambda: None, f"{platform.node()} (stub driver)"
    else:
        from verify_tuner.heuristic import heuristic_config
        from verify_tuner.kernels import runtime

        device, limits = args.device, runtime.read_limits(0)
        cfg, sync, where = (
            heuristic_config(limits, H=H, q_len=Q, prefix=PREFIX, batch=BS),
            torch.cuda.synchronize,
            limits.name,
        )
    doc = {
        "device": where, "date": dt.date.today().isoformat(), "torch": torch.__version__, "H": H, "q_len": Q,
        "batch": BS, "config": str(cfg), "rounds": args.rounds, "calls per round": args.per_round,
        **measure(calls(device, cfg), rounds=args.rounds, per_round=args.per_round, sync=sync),
    }  # fmt: skip
    print(json.dumps(doc, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"host_cost_{'stub' if args.stub else device}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
