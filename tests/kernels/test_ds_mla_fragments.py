"""fp8_ds_mla (FlashMLA's 656-byte rows) in the kernel's QK and PV, on a model of shared memory.

The format's GPU tests (tests/kernels/test_ds_mla_gpu.py) run the kernel; this pins, without a GPU,
the addresses and fragments its code computes: a ring slot and the Q region are byte arrays laid
out as the kernel lays them (656-byte token rows as stored; q rows as convert_q stores them, the
latent dims permuted f16, the rope dims bf16 in order, 16-byte chunks swizzled), every ldmatrix
reads the 16-byte rows at the addresses the kernel's formulas give each lane (krow8, ksc, krope,
qaddr + swz in qk_tile; vrow8 and vsc in pv_tile), and the fragments go through the PTX ISA's
ldmatrix and m16n8k16 layouts. Values are small integers and powers of two, so every product is
exact and the checks are equalities."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_f8_fragments import LANES, mma

torch = pytest.importorskip("torch")
D_QK, D_V, ROWB8, DS_ROPE = 576, 512, 656, 528  # the .cu's D_QK, D_V, F8_ROWB and DS_ROPE for KV_FMT 3
KSTRIDE = D_QK  # 2-byte elements a Q row
DS_UNIT = 16.0  # the .cu's DS_UNIT: K, V and q's rope dims carry it, the softmax scale and 1/l take it back
TK = 32


def e4m3_bytes(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x.astype(np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def e4m3_value(b: int) -> float:
    return float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()[0])


def f16_bits(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint16)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def half_value(bits: int, bf16: bool) -> float:
    if bf16:
        return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def ring_slot(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of a TK-token ring slot of 656-byte rows, the rows' values as the reference dequantizes them)."""
    lat = rng.integers(-15, 16, size=(TK, D_V)).astype(np.float32) / 2  # exact in e4m3
    scales = np.exp2(rng.integers(-3, 4, size=(TK, 4))).astype(np.float32)  # exact in f16, times DS_UNIT too
    rope = rng.integers(-64, 65, size=(TK, D_QK - D_V)).astype(np.float32) / 4
    mem = np.zeros(TK * ROWB8, dtype=np.uint8)
    for t in range(TK):
        row = mem[t * ROWB8 : (t + 1) * ROWB8]
        row[:D_V] = e4m3_bytes(lat[t])
        row[D_V:DS_ROPE] = scales[t].view(np.uint8)
        row[DS_ROPE:] = bf16_bits(rope[t]).view(np.uint8)
    kv = np.concatenate([lat * np.repeat(scales, 128, axis=1), rope], axis=1)
    return mem, kv


def sw(row: int, col: int) -> int:
    """The .cu's sw(): element offset of (row, col) in the Q region."""
    return row * KSTRIDE + (((col >> 3) ^ (row & 7)) << 3) + (col & 7)


def swz(c0: int, r8: int, d: int) -> int:
    """The .cu's swz(): byte offset of 16-byte chunk c0 + d of a row with r & 7 == r8."""
    m = d & 7
    return (((c0 + m) ^ r8) + (d - m)) * 16


def q_region(Q: np.ndarray) -> np.ndarray:
    """The Q region's bytes after convert_q for fp8_ds_mla (rows of 576 2-byte elements): chunk c
    (8 dims) of the latent as f16 in the e4m3 order (dim pairs 0,2,4,6 of a 16 in the even chunk,
    1,3,5,7 in the odd one), the rope chunks as bf16 times DS_UNIT in order, at sw(r, 8c)."""
    rows = Q.shape[0]
    mem = np.zeros(rows * KSTRIDE, dtype=np.uint16)
    for r in range(rows):
        words = Q[r, :D_V].reshape(-1, 4, 2)  # chunk, word, element
        for c in range(D_QK // 8):
            if c < D_V // 8:
                mine, other = words[c], words[c ^ 1]
                out = [other[1], other[3], mine[1], mine[3]] if c & 1 else [mine[0], mine[2], other[0], other[2]]
                bits = f16_bits(np.concatenate(out))
            else:
                bits = bf16_bits(Q[r, 8 * c : 8 * c + 8] * DS_UNIT)
            mem[sw(r, 8 * c) : sw(r, 8 * c) + 8] = bits
    return mem.view(np.uint8)


def ldmatrix(mem: np.ndarray, addrs: list[int], n: int, trans: bool = False) -> list[list[bytes]]:
    """ldmatrix .x{n} (b16): matrix m's row i is the 16 bytes at lane 8m+i's address; lane (g, t)
    gets each matrix's row g, b16 columns 2t, 2t+1 (.trans: rows 2t, 2t+1 of b16 column g). Each
    lane's registers as 4 bytes, lowest first."""
    regs: list[list[bytes]] = [[] for _ in LANES]
    for m in range(n):
        rows = [mem[addrs[8 * m + i] : addrs[8 * m + i] + 16] for i in range(8)]
        for lane in LANES:
            g, t = lane >> 2, lane & 3
            if trans:
                w = bytes([*rows[2 * t][2 * g : 2 * g + 2], *rows[2 * t + 1][2 * g : 2 * g + 2]])
            else:
                w = bytes(rows[g][4 * t : 4 * t + 4])
            regs[lane].append(w)
    return regs


def e4m3x4_cvt(w: bytes) -> tuple[tuple[float, float], tuple[float, float]]:
    """Bytes 0, 1 to the low f16x2 word, 2, 3 to the high one (exact)."""
    v = [e4m3_value(b) for b in w]
    return (v[0], v[1]), (v[2], v[3])


def b16x2(w: bytes, bf16: bool) -> tuple[float, float]:
    lo, hi = np.frombuffer(w, dtype=np.uint16)
    return half_value(int(lo), bf16), half_value(int(hi), bf16)


def scale_at(slot: np.ndarray, addr: int) -> float:
    return float(slot[addr : addr + 4].view(np.float32)[0])


@pytest.mark.parametrize("qwk", [1, 2, 4])
def test_qk_reads_the_scaled_latent_and_the_bf16_rope_as_the_kernel_addresses_them(qwk):
    """qk_tile's fp8_ds_mla path, one warp (wt 0, row group 0) a k-slice, QMQ = 2 m16 token tiles
    of one n8 row tile: the e4m3 pairs with their tokens' scales (ksc) and the rope steps (krope),
    summed over the k-slices, give DS_UNIT times K . Q^T."""
    rng = np.random.default_rng(qwk)
    slot, kv = ring_slot(rng)
    Q = rng.integers(-8, 9, size=(8, D_QK)).astype(np.float32)
    qmem = q_region(Q)
    qmq, qks = TK // 16, 36 // qwk
    qks_n = (36 - 4) // qwk  # QKS_N
    S = np.zeros((TK, 8))
    for wk in range(qwk):
        acc = [np.zeros((16, 8)) for _ in range(qmq)]

        def qfrag(j: int, x4: bool, wk: int = wk):
            if x4:  # cq = 2wk + 2QWK (mat>>1) + (mat&1), rows r8
                addrs = [
                    (lane & 7) * KSTRIDE * 2
                    + swz(2 * wk + 2 * qwk * ((lane >> 3) >> 1) + ((lane >> 3) & 1), lane & 7, 2 * qwk * j)
                    for lane in LANES
                ]
                return ldmatrix(qmem, addrs, 4)
            addrs = [
                (lane & 7) * KSTRIDE * 2 + swz(2 * wk + ((lane >> 3) & 1), lane & 7, 2 * qwk * j) for lane in LANES
            ]
            return ldmatrix(qmem, addrs, 2)

        for j in range(0, qks_n, 2):
            fb4 = qfrag(j, x4=True)
            for a in range(qmq):
                addrs = [(r8 + (mat & 1) * 8) * ROWB8 + (wk + qwk * (mat >> 1)) * 16 + a * 16 * ROWB8 + qwk * j * 16
                         for lane in LANES for r8, mat in [(lane & 7, lane >> 3)]]  # fmt: skip
                raw = ldmatrix(slot, addrs, 4)
                chunk = qwk * j * 16 // 128
                for h in range(2):
                    a_regs, b_regs = [], []
                    for lane in LANES:
                        g = lane >> 2
                        p = g * ROWB8 + D_V + a * 16 * ROWB8 + 4 * chunk  # ksc
                        s_lo, s_hi = scale_at(slot, p) * DS_UNIT, scale_at(slot, p + 8 * ROWB8) * DS_UNIT
                        f0, f2 = e4m3x4_cvt(raw[lane][2 * h])  # f8_k_frags: tokens g
                        f1, f3 = e4m3x4_cvt(raw[lane][2 * h + 1])  # tokens g + 8
                        sc = lambda f, s: (f[0] * s, f[1] * s)
                        a_regs.append((sc(f0, s_lo), sc(f1, s_hi), sc(f2, s_lo), sc(f3, s_hi)))
                        b_regs.append((b16x2(fb4[lane][2 * h], False), b16x2(fb4[lane][2 * h + 1], False)))
                    acc[a] += mma(a_regs, b_regs)
        for j in range(qks_n, qks):  # the rope steps
            fb = qfrag(j, x4=False)
            b_regs = [(b16x2(fb[lane][0], True), b16x2(fb[lane][1], True)) for lane in LANES]
            for a in range(qmq):
                addrs = [(r8 + (mat & 1) * 8) * ROWB8 + DS_ROPE + 32 * (wk - 32) + 16 * (mat >> 1) + a * 16 * ROWB8 + 32 * qwk * j
                         for lane in LANES for r8, mat in [(lane & 7, lane >> 3)]]  # fmt: skip
                fa = ldmatrix(slot, addrs, 4)
                acc[a] += mma([tuple(b16x2(w, True) for w in fa[lane]) for lane in LANES], b_regs)
        S += np.concatenate(acc)
    np.testing.assert_array_equal(S, DS_UNIT * kv @ Q.T)


@pytest.mark.parametrize(("warp", "mw_count"), [(0, 4), (5, 4), (1, 16), (3, 8)])
def test_pv_applies_each_tokens_scale_of_the_warps_chunk(warp, mw_count):
    """pv_tile's fp8_ds_mla path: V^T's fragments (vrow8, .trans, prmt) times the scales of tokens
    2t, 2t+1, 2t+8, 2t+9 (vsc) of the warp's 128-dim chunk, undone by the epilogue's row order,
    give DS_UNIT times P . V for the warp's dims (MW 4: 8 warps, 16: 2 warps, 8: 4 warps)."""
    rng = np.random.default_rng(warp)
    slot, kv = ring_slot(rng)
    P = rng.integers(0, 4, size=(8, TK)).astype(np.float64)
    dims = range(warp * mw_count * 16, (warp + 1) * mw_count * 16)
    O = np.full((8, D_V), np.nan)
    acc = np.zeros((mw_count, 16, 8))
    for kk in range(TK // 16):
        b_regs = []
        for lane in LANES:  # P^T's B fragments (unchanged from the e4m3 path)
            g, t = lane >> 2, lane & 3
            b_regs.append(
                (
                    tuple(P[g, kk * 16 + 2 * t : kk * 16 + 2 * t + 2]),
                    tuple(P[g, kk * 16 + 8 + 2 * t : kk * 16 + 10 + 2 * t]),
                )
            )
        for mw in range(0, mw_count, 2):
            addrs = [(r8 + (mat & 1) * 8) * ROWB8 + (warp * mw_count + (mat >> 1)) * 16 + kk * 16 * ROWB8 + mw * 16
                     for lane in LANES for r8, mat in [(lane & 7, lane >> 3)]]  # fmt: skip
            raw = ldmatrix(slot, addrs, 4, trans=True)
            c = (warp * mw_count * 16 // 128) if mw_count <= 8 else ((warp * mw_count + mw) * 16 // 128)
            for m2 in range(2):
                a_regs = []
                for lane in LANES:
                    t = lane & 3
                    p = 2 * t * ROWB8 + D_V + kk * 16 * ROWB8 + 4 * c  # vsc
                    s0, s1 = scale_at(slot, p) * DS_UNIT, scale_at(slot, p + ROWB8) * DS_UNIT
                    s8, s9 = scale_at(slot, p + 8 * ROWB8) * DS_UNIT, scale_at(slot, p + 9 * ROWB8) * DS_UNIT
                    lo = raw[lane][2 * m2]
                    hi = raw[lane][2 * m2 + 1]
                    x0, y0 = e4m3x4_cvt(bytes([lo[0], lo[2], lo[1], lo[3]]))  # prmt 0x3120, then cvt
                    x1, y1 = e4m3x4_cvt(bytes([hi[0], hi[2], hi[1], hi[3]]))
                    a_regs.append(
                        (
                            (x0[0] * s0, x0[1] * s1),
                            (y0[0] * s0, y0[1] * s1),
                            (x1[0] * s8, x1[1] * s9),
                            (y1[0] * s8, y1[1] * s9),
                        )
                    )
                acc[mw + m2] += mma(a_regs, b_regs)
    for mw in range(mw_count):  # the epilogue: slot g is dim 2g, slot g + 8 dim 2g + 1
        base = (warp * mw_count + mw) * 16
        for g in range(8):
            O[:, base + 2 * g] = acc[mw][g]
            O[:, base + 2 * g + 1] = acc[mw][g + 8]
    want = DS_UNIT * P @ kv[:, :D_V]
    np.testing.assert_array_equal(O[:, list(dims)], want[:, list(dims)])


def test_the_656_byte_rows_are_conflict_free_and_hold_the_format():
    """41 chunks a row (odd): ldmatrix's eight rows at one column fall on eight bank quads; the
    ring row is the pool's row (kernels/formats.py), latent, scales and rope where the .cu reads them."""
    from verify_tuner.kernels.formats import DS_MLA_ROW, FORMATS

    assert ROWB8 == DS_MLA_ROW == FORMATS["fp8_ds_mla"].ring_row_bytes == FORMATS["fp8_ds_mla"].row_bytes
    assert len({(r * ROWB8 // 16) % 8 for r in range(8)}) == 8
    assert DS_ROPE == D_V + 4 * 4 and DS_ROPE + 2 * (D_QK - D_V) == ROWB8
