from __future__ import annotations

import itertools

import pytest
from verify_tuner import space
from verify_tuner.heuristic import blocks_per_sm, heuristic_config
from verify_tuner.kernels.config import KernelConfig
from verify_tuner.kernels.errors import InvalidConfig
from verify_tuner.kernels.limits import KNOWN_DEVICES, known_device
from verify_tuner.kernels.validate import check, smem_bytes

H200 = known_device("h200")
PRO6000 = known_device("rtx-pro-6000")


@pytest.mark.parametrize("limits", [H200, PRO6000], ids=["sm_90", "sm_120"])
@pytest.mark.parametrize("H", [1, 8, 16, 64, 128])
@pytest.mark.parametrize("q_len", [1, 2, 9, 16])
@pytest.mark.parametrize("prefix", [0, 100, 4096, 46000, 1 << 20])
def test_default_is_valid_for_the_device(limits, H, q_len, prefix):
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix)
    assert check(cfg, limits, H=H, q_len=q_len) is None
    assert smem_bytes(cfg, q_len) <= limits.max_smem_optin


def _blocks(cfg, H, q_len=9):
    return (H // cfg.ht) * -(-q_len // cfg.row_tile(q_len)) * cfg.nsplit


@pytest.mark.parametrize("H", [8, 16, 64, 128])
def test_long_prefix_grid_fills_one_wave_and_no_more(H):
    cfg = heuristic_config(H200, H=H, q_len=9, prefix=46000)
    slots = H200.sm_count * blocks_per_sm(cfg, 9, H200, "bf16")
    assert slots / 2 <= _blocks(cfg, H) <= slots


def test_wave_rule_gives_more_splits_when_fewer_heads():
    few = heuristic_config(H200, H=8, q_len=9, prefix=46000)
    many = heuristic_config(H200, H=128, q_len=9, prefix=46000)
    assert few.nsplit > many.nsplit


@pytest.mark.parametrize("prefix", [0, 100, 1000, 4096, 46000, 131072])
def test_nsplit_is_one_wave_of_parts_whatever_the_prefix(prefix):
    """The runtime plan leaves parts idle when a batch has fewer tiles than parts, so the grid
    does not shrink with the prefix: a graph captured at a short prefix still fills the GPU at a
    long one."""
    cfg = heuristic_config(H200, H=8, q_len=9, prefix=prefix)
    assert cfg.nsplit == H200.sm_count and cfg.ht == 8


def test_rows_fill_an_n8_tile_when_heads_allow():
    assert heuristic_config(H200, H=64, q_len=1, prefix=1024).ht >= 8


def test_sm120_gets_a_smaller_footprint_than_sm90():
    a = heuristic_config(H200, H=8, q_len=9, prefix=46000)
    b = heuristic_config(PRO6000, H=8, q_len=9, prefix=46000)
    assert smem_bytes(b, 9) <= PRO6000.max_smem_optin < smem_bytes(a, 9)


def test_pure_function():
    assert heuristic_config(H200, H=16, q_len=9, prefix=5000) == heuristic_config(H200, H=16, q_len=9, prefix=5000)


KNOWN = [known_device(d) for d in ("h200", "h100", "rtx-pro-6000", "a100", "l40s")]


@pytest.mark.parametrize("limits", KNOWN, ids=[d.name for d in KNOWN])
def test_every_shape_has_a_valid_default_on_every_known_device(limits):
    """H in powers of two up to 128, every q_len 1..64, prefixes 0..2^20: row tiles make every
    q_len fit the 99 KB of the RTX PRO 6000 and L40S too."""
    for H in (1, 2, 4, 8, 16, 32, 64, 128):
        for q_len in range(1, 65):
            for prefix in (0, 1000, 46000, 1 << 20):
                cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix)
                assert check(cfg, limits, H=H, q_len=q_len) is None, (H, q_len, prefix, cfg)


@pytest.mark.parametrize("limits", KNOWN, ids=[d.name for d in KNOWN])
def test_every_default_grid_is_the_fullest_wave_whole_parts_a_row_group_allow(limits):
    """G row groups (head groups x row tiles) of NSPLIT parts each fill a wave only as far as
    G x (slots // G): the NSPLIT choices held that for head groups alone, so row-tiled grids
    fell short (the RTX PRO 6000 ran H=8 q=64's 16 row groups x 8 = 128 blocks of 188, not 176)."""
    for H in (1, 2, 4, 8, 16, 32, 64, 128):
        for q_len in range(1, 65):
            cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=46000)
            groups = H // cfg.ht * -(-q_len // cfg.row_tile(q_len))
            slots = limits.sm_count * blocks_per_sm(cfg, q_len, limits, "bf16")
            assert cfg.nsplit == max(1, slots // groups), (H, q_len, cfg)


def test_h8_q64_on_the_rtx_pro_6000_runs_176_blocks():
    cfg = heuristic_config(PRO6000, H=8, q_len=64, prefix=46000)
    assert (cfg.ht, cfg.row_tile(64), cfg.nsplit) == (1, 32, 11)  # 8 heads x 2 row tiles x 11 parts


def test_q_len_64_on_sm120_uses_row_tiles():
    cfg = heuristic_config(PRO6000, H=8, q_len=64, prefix=46000)
    assert 0 < cfg.qt < 64 and smem_bytes(cfg, 64) <= PRO6000.max_smem_optin


def test_impossible_shape_raises_with_reason():
    with pytest.raises(InvalidConfig, match="no config for"):
        heuristic_config(PRO6000, H=8, q_len=65, prefix=1000)


@pytest.mark.parametrize("limits", [H200, PRO6000], ids=["sm_90", "sm_120"])
@pytest.mark.parametrize(
    "H, q_len, prefix",
    [
        (8, 9, 46000),
        (8, 1, 131072),
        (64, 9, 46000),
        (16, 9, 4096),
        (128, 1, 1 << 20),
        (8, 9, 100),
        (8, 64, 46000),
        (1, 33, 5000),
    ],
)
def test_default_is_in_the_search_space_so_the_study_measures_it_first(limits, H, q_len, prefix):
    cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix)
    c = space.choices(H, limits=limits, q_len=q_len)
    assert all(v in c[k] for k, v in cfg.as_params().items())


def test_space_has_the_devices_one_wave_grid():
    assert H200.sm_count in space.nsplit_choices(8, H200)
    assert H200.sm_count not in space.nsplit_choices(8)  # without a device: the fixed list only
    assert heuristic_config(H200, H=8, q_len=9, prefix=46000).nsplit == H200.sm_count


@pytest.mark.parametrize("limits", [known_device(d) for d in ("h200", "rtx-pro-6000")], ids=lambda x: x.arch)
@pytest.mark.parametrize("batch", [2, 8, 32, 256, 4096])
def test_batched_defaults_are_valid_and_keep_the_grid(limits, batch):
    """More requests per launch share the same parts: the grid (head groups x row tiles x NSPLIT)
    is the B=1 one, at most one wave, and the config valid for the device."""
    for H, q_len, prefix in ((8, 9, 46000), (64, 9, 4096), (8, 1, 131072), (1, 64, 300)):
        one = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix)
        cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=prefix, batch=batch)
        assert check(cfg, limits, H=H, q_len=q_len) is None
        assert cfg.nsplit == one.nsplit
        blocks = (H // cfg.ht) * -(-q_len // cfg.row_tile(q_len)) * cfg.nsplit
        assert blocks <= 2 * limits.sm_count  # one wave of (up to) two blocks per SM


@pytest.mark.parametrize("limits", KNOWN, ids=[d.name for d in KNOWN])
def test_every_head_count_has_a_valid_default_not_only_powers_of_two(limits):
    """H=41 q_len=1 on a 99 KB device: its only full head tile (41 rows) fits no template, and one
    head a block was never tried, so the sidecar answered 422 and the worker's heuristic raised."""
    for H in range(1, 129):
        for q_len in range(1, 65):
            cfg = heuristic_config(limits, H=H, q_len=q_len, prefix=0)
            assert check(cfg, limits, H=H, q_len=q_len) is None, (H, q_len, cfg)


def test_few_rows_take_the_seesaws_three_slots_only_where_two_blocks_share_an_sm():
    """At q_len 1 the seesaw's three slots beat the two-slot template where two of its blocks fit an
    SM (e4m3's halved ring on the H200) and lose where one does (bf16): each known device and format
    gets it exactly when two blocks fit, and bf16 never does on the H200."""
    deep = {"tk": 32, "block": 256, "stages": 3, "wr": 1, "wk": 4, "sf": 0, "pipe": 3}
    for limits in KNOWN_DEVICES.values():
        for kv in ("bf16", "fp8_e4m3"):
            cfg = heuristic_config(limits, H=8, q_len=1, prefix=131072, kv_dtype=kv)
            probe = KernelConfig(nsplit=1, ht=8, **deep)
            two = check(probe, limits, H=8, q_len=1, kv_dtype=kv) is None and blocks_per_sm(probe, 1, limits, kv) >= 2
            is_deep = all(getattr(cfg, k) == v for k, v in deep.items())
            assert is_deep == two, (limits.name, kv, cfg)
    h200 = KNOWN_DEVICES["NVIDIA H200"]
    assert heuristic_config(h200, H=8, q_len=1, prefix=131072, kv_dtype="fp8_e4m3").pipe == 3
    assert heuristic_config(h200, H=8, q_len=1, prefix=131072).pipe == 1  # the measured bf16 default stays


@pytest.mark.parametrize("device", ["rtx-pro-6000", "l40s"])
def test_e4m3_on_99_kb_takes_the_balanced_32_token_template_where_the_split_one_came_first(device):
    """Where e4m3's 33-40-row tiles fit no 8-warp template with whole row groups, the 99 KB devices
    take 4 warps in one row group (every warp all 5 n8 row tiles), not 4 row groups splitting them
    2:1:1:1; the H200 structure check timed it at 0.74x and 0.70x the split one (H=8 and H=64 q=9).
    bf16 keeps its 16-token template (no 32-token tile fits 99 KB) and the larger devices their
    seesaw."""
    limits = known_device(device)
    for H in (8, 64):
        cfg = heuristic_config(limits, H=H, q_len=9, prefix=46000, kv_dtype="fp8_e4m3")
        assert (cfg.tk, cfg.block, cfg.stages, cfg.wr, cfg.wk, cfg.sf, cfg.pipe) == (32, 128, 2, 1, 2, 0, 1), cfg
    assert heuristic_config(limits, H=8, q_len=9, prefix=46000).tk == 16
    larger = [known_device(d) for d in ("h200", "h100", "a100")]
    for other, kv, H, q_len in itertools.product(larger, ("bf16", "fp8_e4m3"), (8, 64), range(1, 65)):
        cfg = heuristic_config(other, H=H, q_len=q_len, prefix=46000, kv_dtype=kv)
        assert (cfg.block, cfg.wr, cfg.wk) != (128, 1, 2), (other.name, kv, H, q_len, cfg)
