"""The e4m3 paths (fp8_e4m3 dequantized in registers, fp8_e4m3_qk) rest on index facts that no CPU
can run as the kernel's code: ldmatrix on byte rows, q stored in a permuted order, O^T's rows
permuted by the PV fragments, K and q read as k32 e4m3 fragments. This models a warp's lanes as
the PTX ISA defines ldmatrix (b16, plain and .trans) and the m16n8k16 / m16n8k32 fragments,
applies the kernel's choices (which matrix a lane addresses, which register feeds which fragment,
convert_q's word exchange, the epilogue's store, q's swizzled e4m3 chunks) and checks that QK and
PV compute the products they must. The kernel itself is checked on a GPU
(tests/kernels/test_fp8_gpu.py, test_fp8_qk_gpu.py); this pins the layout it implements."""

from __future__ import annotations

import numpy as np
import pytest

LANES = range(32)


def ldmatrix(rows: np.ndarray, trans: bool) -> list[tuple[float, float, float, float]]:
    """One 8x8 b16 matrix over 8 rows of 16 one-byte elements: each lane's register as its four
    bytes, lowest first (PTX ISA: lane l holds row l/4, b16 columns 2(l%4), 2(l%4)+1; with .trans
    rows 2(l%4), 2(l%4)+1 of b16 column l/4)."""
    out = []
    for lane in LANES:
        g, t = lane >> 2, lane & 3
        if trans:
            out.append((rows[2 * t, 2 * g], rows[2 * t, 2 * g + 1], rows[2 * t + 1, 2 * g], rows[2 * t + 1, 2 * g + 1]))
        else:
            out.append(tuple(rows[g, 4 * t : 4 * t + 4]))
    return out


def to_f16x4(word):
    """e4m3x4_to_f16x4: bytes 0,1 -> the low word's two halves, bytes 2,3 -> the high word's."""
    return (word[0], word[1]), (word[2], word[3])


def prmt_3120(word):
    """__byte_perm(w, 0, 0x3120): bytes 0, 2, 1, 3."""
    return (word[0], word[2], word[1], word[3])


def mma(a_regs, b_regs) -> np.ndarray:
    """m16n8k16 from each lane's fragments (PTX ISA layouts): A 16x16 (a0 row g k 2t..; a1 row g+8;
    a2 k 2t+8..; a3 both), B 16x8 (b0 k 2t.., col g; b1 k 2t+8..); the 16x8 product."""
    A, B = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    for lane in LANES:
        g, t = lane >> 2, lane & 3
        for i, (r, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[r, k : k + 2] = a_regs[lane][i]
        for i, k in enumerate((2 * t, 2 * t + 8)):
            B[k : k + 2, g] = b_regs[lane][i]
    assert not np.isnan(A).any() and not np.isnan(B).any()
    return A @ B


def convert_q_order(row: np.ndarray) -> np.ndarray:
    """convert_q for an e4m3 cache: 8-element chunks as lanes, each lane's four words exchanged with
    lane ^ 1 and kept as the kernel does (even chunk: its words 0, 2 and the odd chunk's 0, 2)."""
    words = row.reshape(-1, 4, 2)  # chunk, word, element
    out = np.empty_like(words)
    for c in range(len(words)):
        mine, other = words[c], words[c ^ 1]
        out[c] = [other[1], other[3], mine[1], mine[3]] if c & 1 else [mine[0], mine[2], other[0], other[2]]
    return out.reshape(-1)


def q_b_fragments(q_rows: np.ndarray, k0: int):
    """The B fragments of q rows (8 query rows, as stored) for the 16 k at k0: the staged path's
    ldmatrix of two 8-column halves, as for bf16."""
    regs = []
    for lane in LANES:
        g, t = lane >> 2, lane & 3
        regs.append(
            (tuple(q_rows[g, k0 + 2 * t : k0 + 2 * t + 2]), tuple(q_rows[g, k0 + 8 + 2 * t : k0 + 8 + 2 * t + 2]))
        )
    return regs


def test_qk_on_e4m3_rows_with_q_stored_in_the_kernels_order():
    rng = np.random.default_rng(0)
    K = rng.integers(-8, 8, size=(16, 32)).astype(float)  # 16 tokens x two k-steps of one x4
    Q = rng.integers(-8, 8, size=(8, 32)).astype(float)  # one n8 tile of query rows
    Qs = np.stack([convert_q_order(r) for r in Q])
    # qk_f8_steps' x4: matrices (tokens +8: mat & 1, next k-step: mat >> 1)
    raw = [
        ldmatrix(K[8 * (m & 1) : 8 * (m & 1) + 8, 16 * (m >> 1) : 16 * (m >> 1) + 16], trans=False) for m in range(4)
    ]
    S = np.zeros((16, 8))
    for h in range(2):
        a = []
        for lane in LANES:
            lo0, hi0 = to_f16x4(raw[2 * h][lane])  # f8_k_frags(fa, raw[2h], raw[2h+1])
            lo1, hi1 = to_f16x4(raw[2 * h + 1][lane])
            a.append((lo0, lo1, hi0, hi1))
        S += mma(a, q_b_fragments(Qs, 16 * h))
    np.testing.assert_array_equal(S, K @ Q.T)


def test_pv_on_e4m3_rows_and_the_epilogues_row_order():
    rng = np.random.default_rng(1)
    V = rng.integers(-8, 8, size=(16, 32)).astype(float)  # 16 tokens x two 16-dim tiles of one x4
    P = rng.integers(0, 4, size=(8, 16)).astype(float)  # 8 query rows x 16 tokens
    # pv_tile's x4 .trans: matrices (tokens +8: mat & 1, next 16 dims: mat >> 1)
    raw = [ldmatrix(V[8 * (m & 1) : 8 * (m & 1) + 8, 16 * (m >> 1) : 16 * (m >> 1) + 16], trans=True) for m in range(4)]
    b = []
    for lane in LANES:  # P^T's B fragments as pv_tile loads them (unchanged)
        g, t = lane >> 2, lane & 3
        b.append((tuple(P[g, 2 * t : 2 * t + 2]), tuple(P[g, 8 + 2 * t : 8 + 2 * t + 2])))
    O = np.full((8, 32), np.nan)  # rows x dims, as the epilogue stages them
    for tile in range(2):
        a = []
        for lane in LANES:
            x0, y0 = to_f16x4(prmt_3120(raw[2 * tile][lane]))  # f8_v_frags: tokens 0..7
            x1, y1 = to_f16x4(prmt_3120(raw[2 * tile + 1][lane]))  # tokens 8..15
            a.append((x0, y0, x1, y1))
        C = mma(a, b)  # 16 (permuted) dims x 8 rows
        for lane in LANES:  # the epilogue: slots g and g+8 are dims 2g and 2g+1, rows 2t and 2t+1
            g, t = lane >> 2, lane & 3
            for r in (2 * t, 2 * t + 1):
                O[r, 16 * tile + 2 * g] = C[g, r]
                O[r, 16 * tile + 2 * g + 1] = C[g + 8, r]
    np.testing.assert_array_equal(O, P @ V)


def test_the_e4m3_ring_rows_are_conflict_free_without_a_swizzle():
    """ldmatrix reads eight rows at one 16-byte column per phase: at a 592-byte stride (37 chunks)
    the eight rows fall on eight different 16-byte bank quads; at 576 (36) they would not."""

    def quads(stride: int) -> set[int]:
        return {(r * stride // 16) % 8 for r in range(8)}

    assert len(quads(592)) == 8
    assert len(quads(576)) < 8


def mma_k32(a_regs, b_regs) -> np.ndarray:
    """m16n8k32 on 8-bit elements (PTX ISA): A 16x32 (a0 row g, k 4t..4t+3; a1 row g+8; a2 row g,
    k 16+4t..; a3 row g+8, k 16+4t..), B 32x8 (b0 col g, k 4t..4t+3; b1 col g, k 16+4t..)."""
    A, B = np.full((16, 32), np.nan), np.full((32, 8), np.nan)
    for lane in LANES:
        g, t = lane >> 2, lane & 3
        for i, (r, k) in enumerate(((g, 4 * t), (g + 8, 4 * t), (g, 16 + 4 * t), (g + 8, 16 + 4 * t))):
            A[r, k : k + 4] = a_regs[lane][i]
        for i, k in enumerate((4 * t, 16 + 4 * t)):
            B[k : k + 4, g] = b_regs[lane][i]
    assert not np.isnan(A).any() and not np.isnan(B).any()
    return A @ B


def e4m3_q_rows(Q: np.ndarray) -> np.ndarray:
    """convert_q_e4m3's layout of q rows (row r, 16-dim chunk c at 16-byte slot c ^ (r & 7)), as
    8 rows x 40 slots x 16 elements."""
    out = np.full((Q.shape[0], 40, 16), np.nan)
    for r in range(Q.shape[0]):
        for c in range(Q.shape[1] // 16):
            out[r, c ^ (r & 7)] = Q[r, 16 * c : 16 * c + 16]
    return out


@pytest.mark.parametrize("odd_tail", [False, True])
def test_qk_on_e4m3_mmas_reads_k_and_q_as_they_lie(odd_tail):
    """fp8_e4m3_qk: K's x4 (tokens +8, next k-step) is the k32 A fragment as it lands; q's e4m3
    chunks, read at their swizzled slots by an x2 (steps j and j+1), are B; a slice's odd last
    step runs with zeros in a2, a3 and b1."""
    rng = np.random.default_rng(2)
    wk, QWK, j = 1, 4, 0  # k-slice 1 of 4: its steps are chunks 1, 5, 9, ...
    K = rng.integers(-8, 8, size=(16, 576)).astype(float)
    Q = rng.integers(-8, 8, size=(8, 576)).astype(float)
    Qs = e4m3_q_rows(Q)
    steps = [wk + QWK * j] if odd_tail else [wk + QWK * j, wk + QWK * (j + 1)]
    raw = [ldmatrix(K[8 * (m & 1) : 8 * (m & 1) + 8, 16 * steps[m >> 1] : 16 * steps[m >> 1] + 16], trans=False)
           for m in range(2 * len(steps))]  # fmt: skip
    qraw = [ldmatrix(np.stack([Qs[r, steps[m] ^ r] for r in range(8)]), trans=False) for m in range(len(steps))]
    zero = (0.0, 0.0, 0.0, 0.0)
    a = [tuple(raw[i][lane] if i < len(raw) else zero for i in range(4)) for lane in LANES]
    b = [tuple(qraw[i][lane] if i < len(qraw) else zero for i in range(2)) for lane in LANES]
    dims = np.concatenate([np.arange(16 * s, 16 * s + 16) for s in steps])
    np.testing.assert_array_equal(mma_k32(a, b), K[:, dims] @ Q[:, dims].T)
