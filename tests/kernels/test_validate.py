from __future__ import annotations

from dataclasses import replace

import pytest
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import known_device
from verify_tuner.kernels.validate import check, smem_bytes, validate

H200 = known_device("h200")
PRO6000 = known_device("rtx-pro-6000")


def test_ht_must_divide_h():
    assert "does not divide" in check(KernelConfig(64, 3, 32, 256), H200, H=8, q_len=9)
    assert check(KernelConfig(64, 8, 32, 256), H200, H=8, q_len=9) is None


def test_smem_limit_depends_on_the_device():
    cfg = KernelConfig(nsplit=64, ht=8, tk=32, block=256)  # 72 rows: ~170 KB
    assert smem_bytes(cfg, 9) > PRO6000.max_smem_optin
    assert check(cfg, H200, H=8, q_len=9) is None
    reason = check(cfg, PRO6000, H=8, q_len=9)
    assert reason is not None and "shared memory" in reason and str(PRO6000.max_smem_optin) in reason


def test_register_pressure_is_rejected_before_compiling():
    # 8 heads x 16 nodes = 128 rows: the O^T accumulator (512 x 128 fp32) alone needs 256 registers
    # per thread at 256 threads, 128 at 512 threads (which allow 128 in all)
    reason = check(KernelConfig(nsplit=8, ht=8, tk=16, block=512, wr=4, wk=4, sf=1), H200, H=8, q_len=16)
    assert reason is not None and "registers" in reason
    assert "registers" in check(KernelConfig(nsplit=8, ht=8, tk=16, block=256, wr=4, wk=2, sf=1), H200, H=8, q_len=16)
    # 72 rows in one row group (9 row tiles a warp) fit: ptxas 254-255, no spills (test_compile.py);
    # 80 rows do not
    assert check(KernelConfig(nsplit=8, ht=8, tk=32, block=256, wr=1, wk=4), H200, H=8, q_len=9) is None
    assert "registers" in check(KernelConfig(nsplit=8, ht=8, tk=32, block=256, wr=1, wk=4), H200, H=8, q_len=10)
    assert check(KernelConfig(nsplit=8, ht=8, tk=32, block=256, wr=2, wk=4), H200, H=8, q_len=9) is None


def test_warp_grid_rules_name_the_constant():
    assert "WR*WK" in check(KernelConfig(8, 8, 32, 128, wr=2, wk=4), H200, H=8, q_len=9)  # 8 > 4 warps
    assert "do not tile" in check(KernelConfig(8, 8, 16, 256, wr=1, wk=4), H200, H=8, q_len=9)  # 2 groups, 1 m16
    assert "36 k-steps" in check(KernelConfig(8, 8, 32, 256, wr=1, wk=8), H200, H=8, q_len=9)
    assert "n8 row tiles" in check(KernelConfig(8, 1, 32, 256, wr=2, wk=4), H200, H=8, q_len=1)
    assert "SF=1" in check(KernelConfig(8, 8, 32, 256, wr=8, wk=1, sf=1), H200, H=8, q_len=9)
    assert "QT=9" in check(KernelConfig(8, 8, 32, 256, qt=9), H200, H=8, q_len=9)


def test_folded_scores_free_a_third_slot_at_72_rows():
    three = KernelConfig(nsplit=8, ht=8, tk=32, block=256, stages=3)
    assert "shared memory" in check(three, H200, H=8, q_len=9)
    assert check(KernelConfig(nsplit=8, ht=8, tk=32, block=256, stages=3, sf=1), H200, H=8, q_len=9) is None


def test_seesaw_rules():
    seesaw = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)
    assert check(seesaw, H200, H=8, q_len=9) is None
    assert smem_bytes(seesaw, 9) == 227448  # Q 82944 + 3 slots 110592 + 2 groups' scores 20736 + 2 P 11520 + ...
    for bad in (replace(seesaw, block=512), replace(seesaw, stages=2)):
        assert "PIPE=3" in check(bad, H200, H=8, q_len=9)
    assert "4 warps of a group" in check(replace(seesaw, wk=4, sf=0), H200, H=8, q_len=9)  # 2x4 fits 8 warps, not 4
    assert "shared memory" in check(replace(seesaw, sf=0), H200, H=8, q_len=9)  # a score buffer per k-slice and group
    assert check(replace(seesaw, wr=4, wk=1, sf=0), H200, H=8, q_len=9) is None


@pytest.mark.parametrize(
    "field,value", [("tk", 48), ("block", 96), ("stages", 5), ("nsplit", 5000), ("pipe", 2), ("sf", 2)]
)
def test_out_of_range_constants(field, value):
    kwargs = {"nsplit": 8, "ht": 1, "tk": 32, "block": 256, "stages": 2, "wr": 1} | {field: value}
    assert check(KernelConfig(**kwargs), H200, H=8, q_len=1) is not None


def test_q_len_bounds():
    assert "q_len" in check(KernelConfig(8, 1, 32, 256), H200, H=8, q_len=65)
    assert "q_len" in check(KernelConfig(8, 1, 32, 256), H200, H=8, q_len=0)


def test_validate_raises_typed_error():
    with pytest.raises(InvalidConfig):
        validate(KernelConfig(8, 3, 32, 256), H200, H=8, q_len=1)


def test_config_parsing_rejects_garbage():
    with pytest.raises(InvalidConfig, match="missing"):
        KernelConfig.from_params({"NSPLIT": 1})
    with pytest.raises(InvalidConfig, match="unknown"):
        KernelConfig.from_params({"NSPLIT": 1, "HT": 1, "TK": 16, "BLOCK": 128, "FOO": 1})
    with pytest.raises(InvalidConfig, match="positive"):
        KernelConfig(nsplit=0, ht=1, tk=16, block=128)
    assert KernelConfig.from_params({"nsplit": "4", "HT": 2, "TK": 16, "BLOCK": 128}).stages == 2


def test_same_device_takes_spellings_aliases_and_family_variants_not_other_gpus():
    from verify_tuner.kernels.limits import same_device

    assert same_device("NVIDIA H200", "nvidia_h200") and same_device("h200", "NVIDIA H200")
    assert same_device("NVIDIA H200 NVL", "NVIDIA H200")  # the family shares the H200's limits and table
    assert same_device("Some Future GPU", "some future  gpu")  # unknown, but spelt alike
    assert not same_device("NVIDIA H200", "NVIDIA L40S") and not same_device("Some Future GPU", "h200")
