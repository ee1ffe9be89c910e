// MLA verify attention for speculative decoding: KV-split flash-decode, partial + reduce (v3:
// the batch's work is shared out at run time, so one launch serves any batch a CUDA graph replays).
//
// Semantics (docs/kernel.md): for request b, draft node i, head h the query q[b,i,h,0:576]
// attends to every prefix slot of b and to the draft nodes j that bit j of tree_mask[b,i]
// allows; o = softmax(scale * q.k) @ v with v = kv[slot, 0:512]. The engine's own tensors are read
// in place: q as one 576-wide row or as q_nope (512) + q_pe (64) at any row strides, the prefix as
// slots at prefix_indptr or as a row of a table per request (SGLang's req_to_token at the
// requests' pool rows, or a block table of pages of 2^page_shift slots), the tree mask as rows of
// 1, 2, 4 or 8 bytes, the KV pool in the format KV_FMT names (kernels/formats.py): 0 bf16 rows;
// 1 e4m3 rows with one fp32 scale for the layer (kv = stored * kv_scale), kept as e4m3 in the
// ring and dequantized to f16 in registers after ldmatrix, q taken to f16 with a power-of-two
// scale per row, both MMAs on f16; 2 the same cache with q quantized to e4m3 per row and QK on
// e4m3 MMAs (sm_89+), PV as 1's; 3 FlashMLA's "fp8 with scale" rows (656 B: 512 e4m3 latent dims,
// an fp32 scale for each 128 of them, the 64 rope dims in bf16), as 1 with each token's 128-dim
// scale applied to its K and V fragments and the rope dims' QK on bf16 MMAs.
//
// Compile-time constants, rendered by kernels/build.py as #defines (kernels/config.py says
// which values are valid and kernels/validate.py checks them before anything is compiled):
//   NSPLIT  parts per head group (the grid)  HT   heads per block sharing one KV tile
//   TK      tokens per KV tile (16..128)     BLOCK threads per block (4..32 warps)
//   STAGES  cp.async ring slots (2..8)       QN   draft nodes per request (q_len, 1..64)
//   QT      draft nodes per block (row tile) WR, WK  QK warp grid: row groups, split-K
//   SF      score fold: 0 gives each of the WK k-slices a partial-score buffer; 1 halves them
//           (slice k+WK/2 adds into slice k's buffer after a barrier), which frees the shared
//           memory of a third ring slot at 72 rows
//   PIPE    pipeline: 0 fuses PV(t) and QK(t+1) (two barriers a tile), 1 refills a slot right
//           after its PV (three barriers, loads overlap a whole iteration even with two slots),
//           3 the seesaw: two groups of 4 warps alternate tiles for QK + softmax and both apply
//           every P to their half of the latent dims (named barriers only, 3 slots)
//
// Layout of the work. A block owns HT heads x QT nodes (ROWS = HT*QT query rows; a request has
// ceil(QN/QT) row tiles) and one part of the batch: a run of KV tiles over the requests' token
// sequences, each the prefix followed by the QN draft slots ("virtual tokens"). The grid is
// (NSPLIT, head groups x row tiles) whatever the batch; Plan (below) shares the batch's tiles
// out evenly at run time from prefix_indptr, so the grid and the arguments stay fixed while a
// captured graph is replayed over growing prefixes and changing batches (row splits, which ran a
// short batch's parts as blocks of a share of the rows, are compiled out: VA_ROWSPLIT below).
// Everything runs on mma.sync m16n8k16 (bf16 or f16 in, fp32 acc), which sm_80, sm_90 and sm_120
// share. Products are transposed
// -- tokens and latent dims on the M side, query rows on the N side -- because ROWS is small:
//   QK:  S^T[TK, ROWS]  = K[TK, 576]  . Q^T[576, ROWS]
//   PV:  O^T[512, ROWS] += V^T[512, TK] . P^T[TK, ROWS]
// QK warp grid: WR row groups x WT token groups x WK k-slices (WT = warps / (WR*WK), the warps
// of one group in PIPE 3). Each
// k-slice writes its partial scores to its own buffer; the softmax sums them. Smaller WK reads
// Q more often, larger WK moves more partial scores: the tuner picks. The O^T accumulator lives
// in registers, split over all warps by latent dim.
//
// Pipeline (PIPE): KV tiles stream through a ring of STAGES slots with cp.async; each refill also
// fetches, asynchronously, the slot indices of the tile STAGES-1 refills later, so no thread
// waits on an index load.
//   PIPE 0, two barriers a tile: [barrier] refill the slot of tile t-1; softmax(t); wait tile t+1
//           [barrier] PV(t), QK(t+1) back to back. Loads overlap compute only with STAGES >= 3.
//   PIPE 1, three barriers a tile: QK(t) [barrier] softmax(t) [barrier] PV(t); wait tile t+1
//           [barrier] refill the slot of tile t with tile t+STAGES: every load overlaps a whole
//           iteration of compute, also with two slots (which is all 72 rows leave room for).
//   PIPE 3, the seesaw (two groups of 4 warps; the loop below says how they take turns).
// Partials: normalised o/l in bf16 plus lse (log2 domain, fp32) per (row, part) of a request
// that several parts share; the reduce merges them with the log-sum-exp rule. A request one part
// holds whole is written to the output directly.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#if !defined(NSPLIT) || !defined(HT) || !defined(TK) || !defined(BLOCK) || !defined(STAGES) || \
    !defined(QN) || !defined(QT) || !defined(WR) || !defined(WK) || !defined(PIPE) || !defined(SF)
#error "NSPLIT, HT, TK, BLOCK, STAGES, QN, QT, WR, WK, PIPE and SF must be defined (kernels/build.py renders them)"
#endif

typedef __nv_bfloat16 bf16;

#ifndef KV_FMT
#define KV_FMT 0
#endif
static_assert(KV_FMT >= 0 && KV_FMT <= 3,
              "KV_FMT: 0 bf16, 1 e4m3 with a per-layer scale, 2 the same with QK on e4m3 MMAs, 3 FlashMLA's fp8 rows "
              "with a scale per 128 dims (kernels/formats.py)");
// Q and P hold 2-byte elements: bf16 for a bf16 cache and f16 for an e4m3 one (an e4m3 value and a
// power-of-two-scaled q row are exact in f16, which also keeps P in [0, 2^8] three more bits than
// bf16), and fp8_e4m3_qk rewrites Q as e4m3 bytes; the ring holds bf16 rows or the pool's e4m3
// rows. The buffers stay typed bf16 below.
constexpr bool FP8 = KV_FMT >= 1;
// fp8_ds_mla: a token's row is 512 e4m3 dims, 4 fp32 scales (one per 128 dims) and 64 bf16 rope
// dims; the ring keeps it as stored (41 chunks: odd, as the e4m3 ring's 37), the latent dims take
// the e4m3 register path times their token's scale, the rope dims stay bf16 (q's too, times the
// row's power of two) and run the last k-steps of each k-slice on bf16 MMAs.
constexpr bool DSMLA = KV_FMT == 3;
// fp8_e4m3_qk: q quantized to e4m3 per row, QK on mma.sync.m16n8k32.e4m3 straight from the ring's
// e4m3 rows (sm_89+: native on sm_89 and sm_120, emulated on sm_90); PV as the register path's.
constexpr bool F8QK = KV_FMT == 2;
#if KV_FMT == 2 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "KV_FMT 2 (fp8_e4m3_qk) needs e4m3 MMAs: compute capability 8.9 or newer (kernels/formats.py)"
#endif
// e4m3 (both formats): the ring keeps the pool's e4m3 rows (592-byte stride: half a bf16 ring)
// and QK and PV convert their fragments to f16 in registers after ldmatrix (fp8_e4m3_qk's QK reads
// them as they are), so no conversion pass runs between a tile's arrival and its QK
// (docs/kernel.md, "Cache formats").
// e4m3: P is stored in f16 times 2^7 (P <= 2^8 with the lazy max, f16's max is 65504), so weights
// far below the row's max stay normal numbers rather than flush to zero while l counts them.
constexpr float P_UNIT = 128.f;

// Programmatic dependent launch (sm_90+): the partial lets the reduce grid be scheduled early
// and the reduce waits for the partial's results in griddepcontrol.wait. kernels/launch.py reads
// kUsesPdl and launches the reduce with the matching attribute only when it is 1.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(VA_NO_PDL)
#define VA_PDL 1
#else
#define VA_PDL 0
#endif

namespace {
constexpr int D_QK = 576;
constexpr int D_V = 512;
constexpr int KSTRIDE = D_QK;  // bf16 per smem row (1152 B = 9 x 128 B); sw() swizzles 16-byte chunks
constexpr int CHUNKS = D_QK * 2 / 16;  // 16-byte chunks of a 2-byte row (Q, bf16 KV)
constexpr int DS_SCALE_DIMS = 128;               // fp8_ds_mla: latent dims under one scale
constexpr int DS_ROPE = D_V + 16;                 // fp8_ds_mla: byte offset of the bf16 rope dims (after the scales)
constexpr int DS_ROW = DS_ROPE + (D_QK - D_V) * 2;  // fp8_ds_mla: 656 bytes a token
// fp8_ds_mla: K and V carry their scales in f16 operands, times DS_UNIT (q's rope dims too, so the
// scores carry it whole; the softmax scale and 1/l take it back), which keeps the scale of a chunk
// whose largest |k| is 1.7e-3..4096 a normal f16 number and its values below f16's 65504.
constexpr float DS_UNIT = 16.f;
constexpr int KV_ROW_BYTES = DSMLA ? DS_ROW : FP8 ? D_QK : D_QK * 2;  // a token's row in the pool
constexpr int F8_CHUNKS = KV_ROW_BYTES / 16;          // 16-byte cp.async chunks of an e4m3 row (36, or 41)
// FP8: bytes between a slot's rows: 37 chunks (e4m3) or 41 (fp8_ds_mla, as stored), odd, so
// ldmatrix's eight rows at one column fall on eight different 16-byte bank quads without a swizzle
constexpr int F8_ROWB = DSMLA ? DS_ROW : D_QK + 16;
constexpr int KSTEPS = D_QK / 16;      // k16 steps of the QK product
constexpr int NQT = (QN + QT - 1) / QT;  // row tiles per head group
constexpr int ROWS = HT * QT;
constexpr int NR = (ROWS + 7) / 8;  // n8 tiles of query rows
constexpr int ROWS_PAD = NR * 8;
constexpr int NWARPS = BLOCK / 32;
constexpr int MW = (D_V / 16) / NWARPS;  // PV: latent-dim m16 tiles per warp
constexpr int TM = TK / 16;              // token m16 tiles per KV tile
constexpr int NGROUPS = PIPE == 3 ? 2 : 1;  // warp groups taking turns at QK + softmax (PIPE 3)
constexpr int GWARPS = NWARPS / NGROUPS;    // warps of one group: QK and softmax of a tile
constexpr int WT = GWARPS / (WR * WK);   // QK: token groups
constexpr int NSB = SF ? WK / 2 : WK;    // partial-score buffers
constexpr int SSTRIDE = TK + 4;          // floats per partial-score row (16 B aligned, conflict-free)
// Row splits (Plan): a short batch's parts are split RSPLIT ways by rows, RS n8 row tiles each.
// Compiled out by default (VA_ROWSPLIT=1; 3 compiles them in): between an engine's other kernels,
// which leave the instruction caches cold, the split's second copy of the segment loop cost more
// than the split saved at every short prefix (docs/kernel.md).
#ifndef VA_ROWSPLIT
#define VA_ROWSPLIT 1
#endif
constexpr int RSPLIT0 = NR > 1 && NSPLIT >= VA_ROWSPLIT && VA_ROWSPLIT > 1 ? (VA_ROWSPLIT < NR ? VA_ROWSPLIT : NR) : 1;
constexpr int RS = (NR + RSPLIT0 - 1) / RSPLIT0;
// As many splits as RS-tile shares fill: NR=4 over 3 would leave the third empty, so it is 2 + 2
// and the plan gets NSPLIT/2 parts instead of NSPLIT/3.
constexpr int RSPLIT = (NR + RS - 1) / RS;
// The QK grid of a row split's block (its RS tiles). Its score buffers are packed at the split's
// RS*8 rows within the NSB * ROWS_PAD rows the layout holds, so a block of few rows can take more
// k-slices, i.e. shorter mma chains, in the same space: for the seesaw, one row group and 4
// k-slices where they fit (a 24-row split of H=8 q=9: 3 n8 tiles a warp over 9 k-steps, not 2
// over 18), else the config's grid. VA_SPLIT_WR / _WK / _SF set it by hand (experiments).
constexpr bool split_grid_fits(int wr, int wk, int sf) {
  const int nsb = sf ? wk / 2 : wk;
  return wr >= 1 && wk >= 1 && GWARPS % (wr * wk) == 0 && TM % (GWARPS / (wr * wk)) == 0 && KSTEPS % wk == 0 &&
         (sf == 0 || wk % 2 == 0) && nsb * RS <= NSB * NR;
}
constexpr bool SPLIT_K4 = PIPE == 3 && RSPLIT > 1 && split_grid_fits(1, 4, SF);
#ifndef VA_SPLIT_WR
#define VA_SPLIT_WR (SPLIT_K4 ? 1 : WR)
#endif
#ifndef VA_SPLIT_WK
#define VA_SPLIT_WK (SPLIT_K4 ? 4 : WK)
#endif
#ifndef VA_SPLIT_SF
#define VA_SPLIT_SF SF
#endif
constexpr int SWR = VA_SPLIT_WR, SWK = VA_SPLIT_WK, SSF = VA_SPLIT_SF;
constexpr int NSB_S = SSF ? SWK / 2 : SWK;  // a row split's
// rows of each of a row split's score buffers: its own RS*8 when its grid differs from the config's
// (the config's grid keeps the config's rows)
constexpr int SBROWS = SWR != WR || SWK != WK || SSF != SF ? RS * 8 : ROWS_PAD;
constexpr int PSTRIDE = TK + 8;          // bf16 per P row (ldmatrix rows conflict-free)
constexpr float NEG_INF = -__builtin_huge_valf();
constexpr float RESCALE_LOG2 = 8.f;  // softmax: how far (log2) a row's max may pass its reference

static_assert(QN >= 1 && QN <= 64, "q_len must be in 1..64 (uint64 tree mask)");
static_assert(QT >= 1 && QT <= QN, "QT must be in 1..QN");
static_assert(TK % 16 == 0 && TK >= 16 && TK <= 128, "TK must be 16, 32, 64 or 128");
static_assert(BLOCK % 32 == 0 && (D_V / 16) % NWARPS == 0, "BLOCK/32 must divide 32");
static_assert(WR >= 1 && WK >= 1 && GWARPS % (WR * WK) == 0, "WR*WK must divide the (group's) warp count");
static_assert(TM % WT == 0, "the QK token groups must tile the KV tile");
static_assert(KSTEPS % WK == 0, "WK must divide the 36 k-steps");
static_assert(WR <= NR, "more QK row groups than n8 row tiles");
static_assert(split_grid_fits(SWR, SWK, SSF),
              "VA_SPLIT_*: the split's QK grid must tile its warps, the KV tile and the k-steps, and its score "
              "buffers fit the layout's (row groups past its RS tiles idle, as in the config's grid)");
static_assert(STAGES >= 2 && STAGES <= 8, "STAGES must be 2..8");
static_assert(PIPE == 0 || PIPE == 1 || PIPE == 3, "PIPE must be 0, 1 or 3");
static_assert(PIPE != 3 || (NWARPS == 8 && STAGES == 3), "PIPE 3 (seesaw) runs two groups of 4 warps on 3 slots");
static_assert(SF == 0 || (SF == 1 && WK % 2 == 0), "SF=1 needs an even WK");
static_assert(NSPLIT >= 1, "NSPLIT must be >= 1");
static_assert(TK <= BLOCK, "one thread per token fetches a tile's slot index");

constexpr int SMEM_Q = ROWS_PAD * KSTRIDE * 2;
// A ring row's elements (2-byte units): bf16 rows of 1152 B, or e4m3 rows of 592 B, which halves
// the ring (validate.smem_bytes mirrors it: the formats table's ring_row_bytes).
constexpr int RING_ROW = FP8 ? F8_ROWB / 2 : KSTRIDE;  // slot offsets stay s * TK * row: same code as before
constexpr int SMEM_K = STAGES * TK * RING_ROW * 2;
constexpr int NPB = PIPE == 3 ? 2 : 1;  // P and alpha buffers: PIPE 3 keeps tiles t and t+1 apart
constexpr int SMEM_S = NGROUPS * NSB * ROWS_PAD * SSTRIDE * 4;
constexpr int SMEM_P = NPB * ROWS_PAD * PSTRIDE * 2;
// m, l, alpha per row (and, for e4m3, q's row scale); two rescale flags (+pad); two segments
constexpr int SMEM_STATS = (2 + NPB + (FP8 ? 1 : 0)) * ROWS_PAD * 4 + 48;
constexpr int SMEM_MASK = QT * 8;
constexpr int SMEM_SLOTS = STAGES * TK * 4;
// softmax: LPR lanes share a row, each holding SPL consecutive scores; RPP rows per warp pass.
// As few passes as SPL <= 16 allows (one at 72 rows, 8 warps, TK=32): the passes are latency
// chains (loads, shuffles, exp) that the warps cannot overlap with anything else.
constexpr int pow2ceil(int x) { return x <= 1 ? 1 : 2 * pow2ceil((x + 1) / 2); }
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int cmin(int a, int b) { return a < b ? a : b; }
// (PIPE 3's softmax runs on 4 warps and allows 32 scores a lane, which keeps it at one pass.)
constexpr int LPR = cmin(cmin(TK / 4, 32), cmax(32 / cmin(32, pow2ceil((ROWS_PAD + GWARPS - 1) / GWARPS)),
                                                PIPE == 3 ? cmax(1, TK / 32) : TK / 16));
constexpr int SPL = TK / LPR;
constexpr int RPP = 32 / LPR;
static_assert(SPL % 4 == 0 && SPL <= 32 && LPR * SPL == TK, "softmax: a lane holds 4..32 scores");
// the epilogue stages O (bf16, rows of D_V) in the Q region
static_assert(D_V <= KSTRIDE, "O staging fits the Q rows");
static_assert(!FP8 || (F8_ROWB >= KV_ROW_BYTES && (F8_ROWB / 16) % 2 == 1 && KV_ROW_BYTES % 16 == 0),
              "FP8: a ring row holds the pool's row in an odd number of 16-byte chunks");
// fp8_ds_mla: the rope dims are the last 4 k-steps, and every k-slice (slice wk takes k-steps wk,
// wk + WK, ...) must end on its share of them at the same step: WK divides 4 (kernels/validate.py).
static_assert(!DSMLA || (4 % WK == 0 && 4 % SWK == 0), "fp8_ds_mla: WK must divide the 4 rope k-steps");
}  // namespace

// The reduce's block: 256 threads where a long request has many parts to merge.
namespace {
constexpr int RED_THREADS = NSPLIT > 64 ? 256 : 128;
// Thread groups that walk one item's parts at most (the first then combines them one by one).
constexpr int RED_GPI = RED_THREADS / 16;
constexpr int RED_SHARE = (NSPLIT + RED_GPI - 1) / RED_GPI;
constexpr int RED_UNROLL = RED_SHARE <= 24 ? RED_SHARE : 8;
// An item is one (row, piece) of a request's output, 4 or 16 pieces of 512 / pieces dims a row,
// chosen by the host (kernels/abi.py's reduce_grid; VA_RED_PIECES 4 caps it there): a request of
// few rows spreads its merges over more SMs.
#ifndef VA_RED_PIECES
#define VA_RED_PIECES 16
#endif
static_assert(VA_RED_PIECES == 4 || VA_RED_PIECES == 16, "reduce: 4 or 16 pieces a row");
}  // namespace

// Read back by kernels/launch.py to check that validate.py's smem formula matches this layout.
extern "C" __device__ const int kSmemBytes = SMEM_Q + SMEM_K + SMEM_S + SMEM_P + SMEM_STATS + SMEM_MASK + SMEM_SLOTS;
extern "C" __device__ const int kUsesPdl = VA_PDL;
extern "C" __device__ const int kReduceThreads = RED_THREADS;
extern "C" __device__ const int kReduceMaxPieces = VA_RED_PIECES;

// Offset of element (row, col) in a Q, KV or O-staging buffer. Rows are 1152 B (9 x 128 B, no
// padding) and the 16-byte chunk c of row r sits at chunk c ^ (r & 7) of its 128-byte group, so a
// warp's cp.async of 512 contiguous global bytes fills whole 128-byte shared-memory lines and
// ldmatrix's eight rows at one column read eight different chunks (all 32 banks, no conflict).
// Padded rows (1168 B) would split every 128-byte copy over two shared-memory lines.
__device__ __forceinline__ int sw(int row, int col) {
  return row * KSTRIDE + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// Byte offset, within its row, of 16-byte chunk c0 + D of a row r with r & 7 == r8, where c0 is a
// per-lane value and D a compile-time step: the XOR only touches the low three bits, so the
// result is a per-lane term for each D mod 8 (computed once) plus a constant for the rest of D.
__device__ __forceinline__ int swz(int c0, int r8, int D) {
  const int m = D & 7;
  return (((c0 + m) ^ r8) + (D - m)) * 16;
}

// Zero an mma accumulator array (any rank), fully unrolled: it stays in registers.
__device__ __forceinline__ void zero_fill(float& a) { a = 0.f; }
template <typename T, int N>
__device__ __forceinline__ void zero_fill(T (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_fill(a[i]);
}

// qk_tile's row tiles (qk_tile says why): 0 predicated as the warp index gives them, 1 with the
// warp's row group made visibly warp-uniform, 2 every warp running all NQ of them where that adds at
// most an eighth to the block's QK (else as 1). 2 measured 2-7 % faster than 0 at 72 rows on sm_90,
// and 1 5-13 % faster than 0 where 2 falls back (bench/results/ab_kernel_flags_sm_90.md); e4m3 with
// folded scores keeps 0 above 64 rows only, since 1 and 2 spill its 72-row seesaw on sm_80/89/90
// (e4m3's default there keeps a buffer per k-slice, SF=0); at 64 rows and fewer they build without
// spills, and 0 fenced 27 loads and MMAs of the RTX PRO 6000's and L40S's 17-24-row e4m3 defaults.
// fp8_ds_mla's scales take the registers 2 needs above 56 rows (its seesaw spilled there on sm_90),
// so it keeps 1 there.
#ifndef VA_QK_UNIFORM
#define VA_QK_UNIFORM (KV_FMT == 1 && SF == 1 && ROWS_PAD > 64 ? 0 : KV_FMT == 3 && ROWS_PAD > 56 ? 1 : 2)
#endif
#ifndef VA_QK_PREFETCH
#define VA_QK_PREFETCH 1  // QK's next operands load before the current MMAs (even k-step counts a warp; 0: each as used)
#endif
#ifndef VA_F8_KLEAN
#define VA_F8_KLEAN 1  // e4m3 QK: convert and use one m16 tile's K fragment at a time (fewer live registers)
#endif
#ifndef VA_SOFTMAX_TREE
#define VA_SOFTMAX_TREE 1  // a lane's max and sum over its SPL scores as trees (0: serial chains)
#endif

#ifndef VA_WARP_ROWS
#define VA_WARP_ROWS 1  // Q's copies and the output's stores a warp a row (0: a chunk a thread, each with its row's addresses)
#endif
#ifndef VA_EPI_STMATRIX
#define VA_EPI_STMATRIX 1  // the epilogue stages o / l with stmatrix where the arch has it (sm_90+) and bf16 fragments
#endif
// 1 (experiment): the epilogue stages o / l unswizzled at a padded pitch and each output row
// leaves as one cp.async.bulk (the copy engine, sm_90+) instead of a warp's 16-byte stores, in
// case the epilogue waits on one SM's store path rather than on its instructions; sm_80 keeps the
// stores either way.
#ifndef VA_EPI_BULK
#define VA_EPI_BULK 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && VA_EPI_BULK
constexpr bool EPI_BULK = true;
#else
constexpr bool EPI_BULK = false;
#endif
// The bulk epilogue's staging pitch (bf16): 16 bytes past a row of 512, so the 8 rows of an
// stmatrix tile fall on 8 different bank groups without a swizzle the copy engine cannot undo.
constexpr int OPITCH = D_V + 8;
static_assert(OPITCH <= KSTRIDE && OPITCH % 8 == 0, "the bulk epilogue's staging fits the Q rows, 16-byte aligned");

// 1: the seesaw's prologue loads tile 0 alone and its other tiles once Q has landed, so that a
// smaller first burst of copies lets Q, which every block's first QK waits for, land sooner. Off,
// since it costs the short prefixes more than it gains the long ones (bench/results/ab_kernel_flags_sm_90.md).
#ifndef VA_DEFER_PRO
#define VA_DEFER_PRO 0
#endif
#ifndef VA_OPAQUE_TID
#define VA_OPAQUE_TID 1  // 0: the segment loop's thread index is a plain one (an A/B of the hoisting guard)
#endif
// x, hidden from the optimiser: values derived from it are not loop-invariant.
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // src-size 0 zero-fills: masked tokens must be finite zeros
#if defined(VA_CP_L2_256B)  // ask the L2 to fetch 256-byte blocks around each 16-byte copy
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
#endif
}
// The same copy issued only where `pred` holds, as a predicated instruction (no branch).
__device__ __forceinline__ void cp_async16_if(bool pred, uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
#if defined(VA_CP_L2_256B)
#define VA_CP_OP "cp.async.cg.shared.global.L2::256B"
#else
#define VA_CP_OP "cp.async.cg.shared.global"
#endif
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n"
      "@p " VA_CP_OP " [%1], [%2], 16, %3;\n}\n" ::"r"((int)pred), "r"(dst), "l"(src), "r"(n));
#undef VA_CP_OP
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
#if KV_FMT >= 1
#define VA_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#else
#define VA_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#endif
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      VA_MMA " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// fp8_ds_mla's rope dims: bf16 K and q (q's row times its power of two, exact in bf16) into the
// same fp32 accumulators as the latent dims' f16 MMAs.
__device__ __forceinline__ void mma16816_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#if KV_FMT == 2
// S^T += K . Q^T over 32 k on e4m3 (fp32 accumulators): A 16x32 (a0 row g, k 4t..4t+3; a1 row g+8;
// a2, a3 the same at k 16+4t), B 32x8 (b0 col g, k 4t..4t+3; b1 k 16+4t..): four consecutive
// bytes of a row each, which ldmatrix (b16) on byte rows delivers as they are.
__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Two floats as e4m3 bytes (lo in the lower byte), rounded to nearest, saturated to +-448.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float lo, float hi) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif
__device__ __forceinline__ void ldsm_x1(uint32_t& r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(addr));
}

// Named barriers (PIPE 3): bar.sync waits for `n` threads to arrive at barrier `id`, bar.arrive
// counts this thread and goes on; both order the shared-memory accesses made before them.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Four e4m3 values (one 32-bit word, lowest byte first) as two f16x2 words. sm_89+ converts
// exactly (cvt); sm_80 has no fp8 conversion, so the bits are placed into f16's fields, which
// gives each value times 2^-8 exactly (subnormals included: e4m3's exponent bias is 7, f16's 15),
// and F8_UNIT undoes that factor where the scales are applied. VA_F8_BITS builds sm_80's way on
// any arch, so a newer GPU can check it (slower there: the loop is bound by issue, not by the
// conversion unit, bench/results/ab_kernel_flags_sm_90.md).
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890) || defined(VA_F8_BITS)
constexpr bool F8_BITS = true;
#else
constexpr bool F8_BITS = false;
#endif
constexpr float F8_UNIT = F8_BITS ? 256.f : 1.f;
// Bit placement: SEL_LO / SEL_HI pick the word's bytes that become lo's and hi's two values, at
// bits 8 and 24 with zeros below, so a caller's byte shuffle folds into them.
template <uint32_t SEL_LO, uint32_t SEL_HI>
__device__ __forceinline__ void e4m3x4_bits(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t t0 = __byte_perm(w, 0u, SEL_LO), t1 = __byte_perm(w, 0u, SEL_HI);
  lo = (t0 & 0x80008000u) | ((t0 >> 1) & 0x3F803F80u);  // sign stays; exponent and mantissa to f16's top bits
  hi = (t1 & 0x80008000u) | ((t1 >> 1) & 0x3F803F80u);
}
// cvt (sm_89+): bytes 0, 1 to lo, bytes 2, 3 to hi.
__device__ __forceinline__ void e4m3x4_cvt(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi) : "r"(w));
#endif
}

// An f16x2 word times an f16x2 (round to nearest).
__device__ __forceinline__ uint32_t hmul2_u32(uint32_t x, __half2 s) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&x), s);
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <bool V>
struct Flag {  // a compile-time choice passed to a generic lambda
  static constexpr bool value = V;
};
namespace {
constexpr int BAR_GROUP = 1;      // + group: the group's 128 threads
constexpr int BAR_P = 3;          // + tile parity: P(t) is ready (owner arrives, the other group syncs)
constexpr int BAR_EMPTY = 5;      // + slot: the owner's PV of the slot's tile is done (same roles)
}  // namespace

namespace {
// The block's slice of one request: which virtual tokens, where their slots come from.
struct Span {
  const int* prefix;  // the request's prefix entries: slots (page size 1) or its row of the page table
  const int* draft;   // the request's QN draft slots
  int P;              // prefix length
  int v0, v1;         // virtual tokens [v0, v1) of this split
  int shift;          // log2 of the page size: prefix token v lives in page prefix[v >> shift]

  // Index entry of virtual token v (a page for a paged prefix token, a slot otherwise), -1 past the split's end.
  __device__ __forceinline__ int entry(int v) const {
    if (v >= v1) return -1;
    return v < P ? __ldg(prefix + (v >> shift)) : __ldg(draft + (v - P));
  }
  // The KV slot of virtual token v from its index entry e.
  __device__ __forceinline__ int slot(int v, int e) const {
    return v < P ? (e << shift) + (v & ((1 << shift) - 1)) : e;
  }
};

// Row `i` of the tree mask, whose rows are 1, 2, 4 or 8 bytes wide (SGLang packs q_len <= 8, 16
// or 32 nodes into uint8/16/32): bit j says whether the row's node sees draft node j.
__device__ __forceinline__ unsigned long long mask_row(const void* mask, int bytes, size_t i) {
  switch (bytes) {
    case 1: return __ldg(static_cast<const unsigned char*>(mask) + i);
    case 2: return __ldg(static_cast<const unsigned short*>(mask) + i);
    case 4: return __ldg(static_cast<const unsigned int*>(mask) + i);
    default: return __ldg(static_cast<const unsigned long long*>(mask) + i);
  }
}
}  // namespace

// ---- How the fixed grid shares a batch: the runtime plan, computed on the device from
// prefix_indptr by every block that needs it (no host step, nothing to refresh between CUDA-graph
// replays; kernels/plan.py mirrors it for the CPU tests and the workspace size). Request b costs
// L_b units, L_b = P_b + QN virtual tokens, after PLAN_C units of fixed cost for every request but
// the first (the Q load, prologue and epilogue of the segment a part adds by starting a request;
// every part pays its first one alike); U(b) counts the units before it and W = U(B). Part p of
// the N = min(NSPLIT, W / (PLAN_MIN_TILES * TK)) active parts takes units [p*W/N, (p+1)*W/N) (one
// request: N = min(NSPLIT, ceil(W / (PLAN_MIN_TILES * TK))), so no part holds more than
// ceil(tiles / N) tiles). A KV tile belongs to the part holding its first token's unit (a short
// last tile costs its part a whole tile), so parts split requests at tile boundaries, and every
// part between a request's first and last holds at least one of its tiles (parts span >= TK
// units, or one request's windows start on its tiles). Part p's partial of request b goes to
// workspace slot p + b (unique: parts and requests both advance along the units); a request whose
// tiles one part holds all of is written to `out` directly, and the reduce skips it. A short
// batch of several requests takes the tiled plan instead (VA_TILED_PLAN below).
#ifndef PLAN_C
#define PLAN_C 128
#endif
#ifndef PLAN_MIN_TILES
#define PLAN_MIN_TILES 1
#endif
// Row splits: a batch with fewer tiles than the grid has parts would leave parts idle; instead
// the plan gives each of N <= NSPLIT / RSPLIT parts RSPLIT blocks, each taking RS of the block's
// NR n8 row tiles over the same KV tiles, so a short prefix's chain -- Q load, QK, softmax, PV,
// epilogue -- runs on a third of the rows (and a request has fewer partials for the reduce to read).
// PLAN_SPLIT_TILES: split while the batch has fewer than that many tiles per grid part (its
// tiles, whatever PLAN_MIN_TILES: parts of two tiles need not be row splits).
#ifndef PLAN_SPLIT_TILES
#define PLAN_SPLIT_TILES 1
#endif
// Short batches: several requests whose tiles number no more than the grid's parts (and no row
// split). Windows of units a little wider than a tile hold two tile starts now and then, which
// left most such batches a part of two tiles; instead part p takes the batch's p-th tile (tiles
// numbered request by request): one tile and one segment a part. 0 builds the unit plan alone.
#ifndef VA_TILED_PLAN
#define VA_TILED_PLAN 1
#endif
namespace {
struct Seg {  // tiles [t0, t1] of one request (none when t0 > t1); direct: all of its tiles
  int t0, t1;
  bool direct;
};
struct Plan {
  const int* indptr;
  long long W;
  int N;
  int R;  // blocks per part: grid part g computes KV part g % N, n8 row tiles from (g / N) * RS
  __device__ __forceinline__ long long U(int b) const {
    return (long long)(__ldg(indptr + b) - __ldg(indptr)) + (long long)b * QN + (long long)max(b - 1, 0) * PLAN_C;
  }
  // The unit of request b's first tile's first token (b starts at Ub): its fixed cost first.
  __device__ __forceinline__ static long long start(long long Ub, int b) { return Ub + (b > 0 ? PLAN_C : 0); }
  __device__ __forceinline__ long long part_begin(int p) const { return (long long)p * W / N; }
  __device__ __forceinline__ int part_of(long long u) const { return (int)(((u + 1) * N - 1) / W); }
  // The tiles of a request (its first tile's first token at unit s0, L virtual tokens) whose first
  // token's unit lies in [u0, u1).
  __device__ __forceinline__ Seg segment(long long s0, int L, long long u0, long long u1) const {
    const int nt = (L + TK - 1) / TK;
    const long long x = u0 - s0, y = u1 - s0;
    Seg s;
    s.t0 = x <= 0 ? 0 : (int)((x + TK - 1) / TK);
    s.t1 = y <= 0 ? -1 : (int)min((long long)nt - 1, (y + TK - 1) / TK - 1);
    s.direct = s.t0 == 0 && s.t1 == nt - 1;
    return s;
  }
};
__device__ __forceinline__ Plan make_plan(const int* indptr, int B) {
  Plan p;
  p.indptr = indptr;
  p.W = p.U(B);
  // the units in spans of `step`: one request rounds up (its windows then start on its tiles'
  // starts, see above), several round down (every part spans a whole step)
  auto spans = [&](long long step) { return B == 1 ? (p.W + step - 1) / step : p.W / step; };
  const long long cap = spans(PLAN_MIN_TILES * TK);
  p.N = (int)(cap < 1 ? 1 : (cap < NSPLIT ? cap : NSPLIT));
  p.R = 1;
  // parts would idle (or hold few tiles): the batch's tiles, not PLAN_MIN_TILES' parts, decide
  if (RSPLIT > 1 && spans(TK) < (long long)NSPLIT * PLAN_SPLIT_TILES) {
    p.R = RSPLIT;
    p.N = max(1, min(p.N, NSPLIT / RSPLIT));
  }
  return p;
}
// Part `part`'s first segment from request b on, into seg: {t0, t1, direct, request} (request B: none left).
__device__ __forceinline__ void next_segment(int* seg, const int* indptr, int B, int part, int b) {
  const Plan pl = make_plan(indptr, B);
  const long long u0 = pl.part_begin(part), u1 = pl.part_begin(part + 1);
  for (; b < B; ++b) {
    const long long Ub = pl.U(b);
    if (Ub >= u1) break;
    const Seg s = pl.segment(Plan::start(Ub, b), __ldg(indptr + b + 1) - __ldg(indptr + b) + QN, u0, u1);
    if (s.t0 <= s.t1) {
      seg[0] = s.t0, seg[1] = s.t1, seg[2] = s.direct, seg[3] = b;
      return;
    }
  }
  seg[3] = B;
}
// One walk over a short batch's requests (the tiled plan): its tiles, those of the requests
// before request b (b's first part), and the request holding the batch's tile `part` with that
// request's first tile. The loads are independent; only the sums are chains.
struct TileScan {
  int total, before, req, req_first;
};
__device__ __forceinline__ TileScan tile_scan(const int* indptr, int B, int b, int part) {
  TileScan s{0, 0, B, 0};
  int prev = __ldg(indptr);
#pragma unroll 8
  for (int j = 0; j < B; ++j) {
    const int next = __ldg(indptr + j + 1), nt = (next - prev + QN + TK - 1) / TK;
    prev = next;
    if (j < b) s.before += nt;
    if (s.req == B && part < s.total + nt) s.req = j, s.req_first = s.total;
    s.total += nt;
  }
  return s;
}
// Whether the batch may take the tiled plan (several requests, tokens that fit the grid's tiles;
// not in a row-split build, whose short batches split rows instead): a batch's tiles are at least
// its tokens over TK and at least B, so only such a batch is walked (tile_scan) to see whether its
// tiles fit the grid's parts.
__device__ __forceinline__ bool may_tile(const int* indptr, int B) {
  return VA_TILED_PLAN && RSPLIT == 1 && B > 1 && B <= NSPLIT &&
         (long long)(__ldg(indptr + B) - __ldg(indptr)) + (long long)B * QN <= (long long)NSPLIT * TK;
}
// A tiled plan's part `part`: its one segment into seg (request B: no tile), or false when the
// batch's tiles outnumber the grid's parts (the unit plan then).
__device__ __noinline__ bool tiled_segment(int* seg, const int* indptr, int B, int part) {
  const TileScan s = tile_scan(indptr, B, 0, part);
  if (s.total > NSPLIT) return false;
  seg[3] = s.req;
  if (s.req < B) {
    const int nt = (__ldg(indptr + s.req + 1) - __ldg(indptr + s.req) + QN + TK - 1) / TK;
    seg[0] = seg[1] = part - s.req_first, seg[2] = nt == 1;
  }
  return true;
}
}  // namespace

// Index entries of tile X into the ring, asynchronously (threads < TK, one token each). Entries
// past the split's end are left alone: every reader checks v < v1 first.
// `t` is the thread's index among the threads that fetch (the block, or one PIPE 3 group).
__device__ __forceinline__ void fetch_indices(int* idx_s, const Span& sp, int X, int t) {
  const int v = sp.v0 + X * TK + t;
  if (t < TK && v < sp.v1)
    cp_async4(smem_u32(idx_s + (X % STAGES) * TK + t), v < sp.P ? sp.prefix + (v >> sp.shift) : sp.draft + (v - sp.P));
}

// Stage KV tile X into Kt from its ring indices; tokens past the split's end are zero-filled.
// Warp w of the NW copying warps (the block, or one PIPE 3 group) copies tokens w, w+NW, ...;
// lane l the 16-byte chunks l, l+32 and l+64 (< 72) of the token's 1152-byte row: one index
// read and one swizzle XOR per token (chunk l+32i lands at (l ^ (t&7)) + 32i), not a division
// and an index read per chunk. An e4m3 row's 36 chunks land unswizzled at F8_ROWB a token.
template <int NW>
__device__ __forceinline__ void load_kv_tile(bf16* Kt, const unsigned char* __restrict__ kv, const int* idx_s,
                                             const Span& sp, int X, int warp) {
#ifdef VA_PROFILE_SKIP_LOADS  // profiling: the tiles keep whatever shared memory holds
  return;
#endif
  const int* idx = idx_s + (X % STAGES) * TK;
  const int vb = sp.v0 + X * TK;
  const int lane = threadIdx.x & 31;
  const uint32_t base = smem_u32(Kt);
  // The warp's tokens warp + k*NW: every index read first, then the copies, all unrolled and
  // branch-free (the third chunk is a predicated copy, not a branch), so the index reads overlap
  // and no divergence region splits the tokens (a branch per token made the refill a visible
  // share of the stalls).
  constexpr int PER = (TK + NW - 1) / NW;
  constexpr bool EVEN = TK % NW == 0;
  int slot[PER];
  bool valid[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int t = warp + k * NW;
    valid[k] = (EVEN || t < TK) && vb + t < sp.v1;
    slot[k] = valid[k] ? sp.slot(vb + t, idx[t]) : 0;
  }
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int t = warp + k * NW;
    if (!EVEN && t >= TK) break;
    const unsigned char* src = kv + (size_t)slot[k] * KV_ROW_BYTES + lane * 16;
    if constexpr (FP8) {  // 36 chunks, unswizzled, at the e4m3 ring's row stride
      const uint32_t dst = base + t * F8_ROWB + lane * 16;
      cp_async16(dst, src, valid[k]);
      cp_async16_if(lane < F8_CHUNKS - 32, dst + 512, src + 512, valid[k]);
    } else {
      const uint32_t dst = base + t * (KSTRIDE * 2) + ((lane ^ (t & 7)) << 4);
      cp_async16(dst, src, valid[k]);
      cp_async16(dst + 512, src + 512, valid[k]);
      cp_async16_if(lane < CHUNKS - 64, dst + 1024, src + 1024, valid[k]);
    }
  }
}

// Rows r0 + i*NWARPS (i < QR, those below rhi) of the Q region (bf16 as loaded) into a warp's
// registers, chunk lane + 32j of row i in v[i][j] (zeros past the row), and each row's largest |q|,
// reduced over the warp. A row at a time, the prologue is a chain of dependent latencies (the
// row's loads, then five shuffles: docs/kernel.md measures it); VA_Q_ROWS rows at once overlap
// them (1: a row at a time, the A/B's other side).
#ifndef VA_Q_ROWS
#define VA_Q_ROWS 3
#endif
constexpr int QCH = (CHUNKS + 31) / 32;
// (no more than a warp has rows; one at 32 warps, whose 64 registers a thread hold a single row's
// chunks without spilling)
constexpr int QR_ROWS = (ROWS + NWARPS - 1) / NWARPS;
constexpr int QR = BLOCK > 512 ? 1 : (QR_ROWS < VA_Q_ROWS ? QR_ROWS : VA_Q_ROWS);
static_assert(VA_Q_ROWS >= 1 && VA_Q_ROWS <= 4, "VA_Q_ROWS: 1..4 q rows a warp converts at once");
__device__ __forceinline__ void load_q_rows(uint4 (&v)[QR][QCH], float (&amax)[QR], const bf16* Qs, int r0, int rhi,
                                            int lane) {
#pragma unroll
  for (int i = 0; i < QR; ++i) {
    const int r = r0 + i * NWARPS;
    amax[i] = 0.f;
#pragma unroll
    for (int j = 0; j < QCH; ++j) {
      const int c = lane + 32 * j;
      v[i][j] = c < CHUNKS && r < rhi ? *reinterpret_cast<const uint4*>(Qs + sw(r, 8 * c)) : make_uint4(0, 0, 0, 0);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[i][j]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h[e]);
        amax[i] = fmaxf(amax[i], fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < QR; ++i) amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], o));
}

// e4m3 cache: q rows [rlo, rhi) of the Q region, bf16 as loaded, into f16 scaled by a power of two
// per row that puts the row's largest |q| in [2^14, 2^15) (f16's range, whatever q's magnitude;
// exact, as a bf16 value has 8 significant bits to f16's 11); qsc_s[r] gets the inverse, which the
// softmax applies to the row's scores. One warp a row, QR rows at once.
__device__ __forceinline__ void convert_q(bf16* Qs, float* qsc_s, int rlo, int rhi, int warp, int lane) {
  for (int r0 = rlo + warp; r0 < rhi; r0 += QR * NWARPS) {
    uint4 rows[QR][QCH];
    float amaxes[QR];
    load_q_rows(rows, amaxes, Qs, r0, rhi, lane);
#pragma unroll
    for (int i = 0; i < QR; ++i) {
      const int r = r0 + i * NWARPS;
      if (r >= rhi) break;  // (the warp's rows: uniform across its lanes)
      const uint4(&v)[QCH] = rows[i];
      const float amax = amaxes[i];
      // 2^e with e = 14 - floor(log2 amax), at most 2^64 (scores of a row that small are 0 anyway), a zero row 1
      const int e = amax > 0.f ? max(-126, min(64, 14 - (((__float_as_int(amax) >> 23) & 0xFF) - 127))) : 0;
      const float mul = __int_as_float((127 + e) << 23);
#pragma unroll
      for (int j = 0; j < QCH; ++j) {
        const int c = lane + 32 * j;
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
        uint4 out;
        uint32_t* o32 = reinterpret_cast<uint32_t*>(&out);
        // fp8_ds_mla: the rope dims' chunks stay bf16 (times the same power of two and DS_UNIT:
        // exact) and in order, since K's rope dims are bf16 rows read as the bf16 kernel reads them
        const bool rope = DSMLA && c >= D_V / 8;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(h[k]);
          if (rope) {
            const __nv_bfloat162 x = __floats2bfloat162_rn(f.x * mul * DS_UNIT, f.y * mul * DS_UNIT);
            o32[k] = *reinterpret_cast<const uint32_t*>(&x);
          } else {
            const __half2 x = __floats2half2_rn(f.x * mul, f.y * mul);
            o32[k] = *reinterpret_cast<const uint32_t*>(&x);
          }
        }
        // K's fragments come from e4m3 rows: lane (g, t) holds dims 4t..4t+3 of each 16, which
        // the MMA takes as k 2t, 2t+1 and 2t+8, 2t+9. q is stored in the same order: dim pairs
        // 0,2,4,6 of the 16 in the even chunk, 1,3,5,7 in the odd one (chunks 2i, 2i+1 sit in
        // lanes 2i, 2i+1 of the same j; lanes past the row's chunks hold zeros and store nothing,
        // but every lane takes part in the exchange).
        uint32_t p32[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) p32[k] = __shfl_xor_sync(0xffffffffu, o32[k], 1);
        // (o32 aliases out: a rope chunk keeps out as converted, it must not be read back after the
        // exchange has overwritten it)
        const bool odd = c & 1;
        if (!rope) out = odd ? make_uint4(p32[1], p32[3], o32[1], o32[3]) : make_uint4(o32[0], o32[2], p32[0], p32[2]);
        if (c >= CHUNKS) continue;
        *reinterpret_cast<uint4*>(Qs + sw(r, 8 * c)) = out;
      }
      if (lane == 0) qsc_s[r] = __int_as_float((127 - e) << 23);
    }
  }
}

#if KV_FMT == 2
// fp8_e4m3_qk: q rows [rlo, rhi) of the Q region, bf16 as loaded, into e4m3 bytes in place, scaled
// per row so that its largest |q| maps to 448 (a scale per token and head); qsc_s[r] gets the
// inverse, which the softmax applies to the row's scores. The e4m3 chunk c (dims 16c..16c+15) of
// row r goes to 16-byte slot c ^ (r & 7) of the row, so ldmatrix's eight rows at one chunk read
// eight bank quads. A row is read whole before its bytes are rewritten (a lane writes bytes other
// lanes read: __syncwarp orders them). One warp a row, QR rows at once.
constexpr float E4M3_MAX = 448.f;  // e4m3's largest finite value
__device__ __forceinline__ void convert_q_e4m3(bf16* Qs, float* qsc_s, int rlo, int rhi, int warp, int lane) {
  unsigned char* Qb = reinterpret_cast<unsigned char*>(Qs);
  for (int r0 = rlo + warp; r0 < rhi; r0 += QR * NWARPS) {
    uint4 rows[QR][QCH];
    float amaxes[QR];
    load_q_rows(rows, amaxes, Qs, r0, rhi, lane);
#pragma unroll
    for (int i = 0; i < QR; ++i) {
      const int r = r0 + i * NWARPS;
      if (r >= rhi) break;  // (the warp's rows: uniform across its lanes)
      const uint4(&v)[QCH] = rows[i];
      const float amax = amaxes[i];
      // Rounded division (fast-math's approximate one overflows to inf below ~1e-36 and returns 0
      // above 2^126), on amax held to [1e-30, 1e30] as the reference does; a zero row stays zero.
      const float mul = amax > 0.f ? __fdiv_rn(E4M3_MAX, fminf(fmaxf(amax, 1e-30f), 1e30f)) : 1.f;
      __syncwarp();  // every lane's loads of the rows are done before any lane overwrites them
#pragma unroll
      for (int j = 0; j < QCH; ++j) {
        const int c = lane + 32 * j;  // bf16 chunk c: the low (c even) or high half of e4m3 chunk c / 2
        if (c >= CHUNKS) continue;
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
        uint32_t w[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float2 a = __bfloat1622float2(h[2 * k]), b = __bfloat1622float2(h[2 * k + 1]);
          w[k] = f32x2_to_e4m3x2(a.x * mul, a.y * mul) | (f32x2_to_e4m3x2(b.x * mul, b.y * mul) << 16);
        }
        *reinterpret_cast<uint2*>(Qb + r * (KSTRIDE * 2) + (((c >> 1) ^ (r & 7)) << 4) + (c & 1) * 8) =
            make_uint2(w[0], w[1]);
      }
      if (lane == 0) qsc_s[r] = __frcp_rn(mul);
    }
  }
}

// fp8_e4m3_qk: the warp's k-steps on e4m3 MMAs, k32 = its k-steps j and j+1 (16 dims each). K's x4
// (tokens +8: mat&1, step j+1: mat>>1) is the A fragment as it lands; q's e4m3 chunks (at slot
// chunk ^ r8 of their rows) give B, x2 per n8 row tile. An odd last step runs with zeros for the
// missing half.
template <int QMQ, int NQ, int QWR, int QWK, int QKS, typename QAddr, typename Live>
__device__ __forceinline__ void qk_e4m3_steps(float (&acc)[QMQ][NQ][4], QAddr qaddr, uint32_t kt, int wt, int wk,
                                              int mat, int r8, Live live) {
  constexpr int ROWB = KSTRIDE * 2;
  const uint32_t krow = kt + (wt * QMQ * 16 + r8 + (mat & 1) * 8) * F8_ROWB + (wk + QWK * (mat >> 1)) * 16;
  const int cq = wk + QWK * (mat & 1);  // q x2 (lanes 0..15): step j (+1: mat&1); an e4m3 chunk is a k-step
#pragma unroll
  for (int j = 0; j + 1 < QKS; j += 2) {
    uint32_t fa[QMQ][4];
#pragma unroll
    for (int a = 0; a < QMQ; ++a) ldsm_x4(fa[a], krow + a * 16 * F8_ROWB + QWK * j * 16);
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      if (!live(n)) continue;
      uint32_t fb[2];
      ldsm_x2(fb, qaddr(n) + swz(cq, r8, QWK * j));
#pragma unroll
      for (int a = 0; a < QMQ; ++a) mma_e4m3(acc[a][n], fa[a], fb);
    }
  }
  if constexpr (QKS % 2 == 1) {
    constexpr int j = QKS - 1;
    uint32_t fa[QMQ][4];
#pragma unroll
    for (int a = 0; a < QMQ; ++a) {  // lanes 0..15 give the addresses, and mat >> 1 is 0 there
      uint32_t raw[2];
      ldsm_x2(raw, krow + a * 16 * F8_ROWB + QWK * j * 16);
      fa[a][0] = raw[0], fa[a][1] = raw[1], fa[a][2] = 0u, fa[a][3] = 0u;
    }
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      if (!live(n)) continue;
      uint32_t fb[2] = {0u, 0u};
      ldsm_x1(fb[0], qaddr(n) + swz(wk, r8, QWK * j));  // lanes 0..7: step j
#pragma unroll
      for (int a = 0; a < QMQ; ++a) mma_e4m3(acc[a][n], fa[a], fb);
    }
  }
}
#endif

// FP8: K's A fragments from e4m3 rows. ldmatrix (b16) on bytes gives lane (g, t) the four dims
// 4t..4t+3 of token g in a 16-dim chunk; as f16 (two words) they are the m16n8k16 A fragment's
// k 2t, 2t+1 (low word) and 2t+8, 2t+9 (high word), the order convert_q stores q in. One x4 covers
// 16 tokens over two k-steps: matrices (tokens +8: mat&1, step j+1: mat>>1).
__device__ __forceinline__ void f8_k_frags(uint32_t (&fa)[4], uint32_t tokens_lo, uint32_t tokens_hi) {
  if constexpr (F8_BITS) {
    e4m3x4_bits<0x1404, 0x3424>(tokens_lo, fa[0], fa[2]);
    e4m3x4_bits<0x1404, 0x3424>(tokens_hi, fa[1], fa[3]);
  } else {
    e4m3x4_cvt(tokens_lo, fa[0], fa[2]);
    e4m3x4_cvt(tokens_hi, fa[1], fa[3]);
  }
}
// S^T partial of this warp's k-slice: raw dot products into its buffer of Ss[row][token] (fp32);
// with SF=1 the upper half of the k-slices adds into the lower half's buffers after a barrier
// (every thread of the block calls this at the same point). The k-slices interleave: slice wk
// takes k-steps wk, wk+WK, wk+2WK, ..., so each ldmatrix address is a per-lane base plus a
// compile-time offset (swz) once the loop is unrolled. The block's n8 row tiles are NT from nlo
// (all NR from 0, or a row split's RS).
// QWR, QWK, QSF: the grid of this instantiation (a row split's block may use another than WR, WK,
// SF); its QNSB buffers hold BROWS rows each, from row `rbase` (0, or the split's first).
template <int NT, int QWR, int QWK, int QSF, int BROWS>
__device__ __forceinline__ void qk_tile(const bf16* Qs, const bf16* Kt, float* Ss, int warp, int lane, int grp, int nlo) {
  constexpr int QWT = GWARPS / (QWR * QWK), QMQ = TM / QWT;  // its token groups, m16 tiles a warp
  constexpr int QKS = KSTEPS / QWK, QNSB = QSF ? QWK / 2 : QWK;
  // k-steps a warp runs on the latent's loop: all QKS, or for fp8_ds_mla the e4m3 ones (its last
  // 4 / QWK are the bf16 rope dims', run after it)
  constexpr int QKS_N = DSMLA ? (KSTEPS - 4) / QWK : QKS;
  constexpr int NQ = (NT + QWR - 1) / QWR;  // n8 row tiles per warp (strided over row groups)
  // A per-warp predicate on an ldmatrix or mma that the compiler cannot prove warp-uniform gets a
  // WARPSYNC before and after it, which also pins every load right before its MMAs. The warp index
  // comes from opaque(); VA_QK_UNIFORM 1 passes the row group through a shuffle, whose result the
  // compiler knows to be warp-uniform, so the predicates stay but need no fence.
  // UNI (VA_QK_UNIFORM 2): every warp runs all NQ row tiles' loads and MMAs, a missing last tile on
  // a duplicate of tile 0's rows (its scores are not stored), so no predicate remains. Only the whole
  // block's tiles (NT == NR, nlo 0) leave the last tile the only one that can be missing. Where that
  // would cost more, 2 keeps the predicates and makes them uniform as 1 does.
  constexpr bool UNI = VA_QK_UNIFORM == 2 && NT == NR && (NQ * QWR - NT) * 8 <= NT;
  constexpr bool SHFL = VA_QK_UNIFORM == 1 || (VA_QK_UNIFORM == 2 && !UNI);
  const int wk = warp % QWK, wt = warp / (QWK * QWR);
  const int wr = SHFL ? __shfl_sync(0xffffffffu, (warp / QWK) % QWR, 0) : (warp / QWK) % QWR;
  const int mat = lane >> 3, r8 = lane & 7, g = lane >> 2, tq = lane & 3;
  // row tile n of this warp exists: within the block's NT and the request's NR (a last split may hold fewer)
  auto live = [&](int n) { return wr + n * QWR < NT && nlo + wr + n * QWR < NR; };
  auto on = [&](int n) { return UNI || live(n); };
  float acc[QMQ][NQ][4];
  zero_fill(acc);
  constexpr int ROWB = KSTRIDE * 2;
  const uint32_t qrow = smem_u32(Qs) + (nlo * 8 + wr * 8 + r8) * ROWB;              // + n*QWR*8 rows
  const uint32_t qlast = !UNI || live(NQ - 1) ? qrow + (NQ - 1) * QWR * 8 * ROWB : qrow;
  auto qaddr = [&](int n) { return UNI && n == NQ - 1 ? qlast : qrow + n * QWR * 8 * ROWB; };
  const uint32_t krow = smem_u32(Kt) + (wt * QMQ * 16 + r8 + (mat & 1) * 8) * ROWB;  // + a*16 rows
  const int cq = 2 * wk + 2 * QWK * (mat >> 1) + (mat & 1);  // Q x4: steps j, j+1 (mat>>1), k halves (mat&1)
  const int ck = 2 * wk + (mat >> 1);                       // K x4: tokens +8 (mat&1), k halves (mat>>1)
  // FP8: token wt*QMQ*16 + r8 (+8: mat&1) (+ a*16) of the e4m3 ring, chunk (= k-step) wk (+QWK: mat>>1) (+ QWK*j)
  const uint32_t krow8 = smem_u32(Kt) + (wt * QMQ * 16 + r8 + (mat & 1) * 8) * F8_ROWB + (wk + QWK * (mat >> 1)) * 16;
  // fp8_ds_mla: the scales of the K fragments' tokens (m16 tile a: g low, g+8 high, one f16 pair:
  // a register a tile, which the 72-row seesaw's registers have room for) for the 128-dim chunk
  // of k-step pair j (WK divides 4, so a pair of one slice, k-steps wk + QWK*j and wk + QWK*(j+1),
  // lies in one chunk of 8 k-steps).
  const unsigned char* ksc = reinterpret_cast<const unsigned char*>(Kt) + (wt * QMQ * 16 + g) * F8_ROWB + D_V;
  auto ds_k_scales = [&](__half2(&sk)[QMQ], int j) {
#pragma unroll
    for (int a = 0; a < QMQ; ++a) {
      if constexpr (DSMLA) {
        const unsigned char* p = ksc + a * 16 * F8_ROWB + 4 * (QWK * j * 16 / DS_SCALE_DIMS);
        sk[a] = __floats2half2_rn(*reinterpret_cast<const float*>(p) * (F8_UNIT * DS_UNIT),
                                  *reinterpret_cast<const float*>(p + 8 * F8_ROWB) * (F8_UNIT * DS_UNIT));
      } else {
        sk[a] = __float2half2_rn(1.f);  // (unused)
      }
    }
  };
  // ... applied to one m16 tile's K fragment (tokens g: fk[0], fk[2]; g+8: fk[1], fk[3])
  auto ds_scale_k = [&](uint32_t(&fk)[4], __half2 s2) {
    if constexpr (DSMLA) {
      const __half2 lo = __low2half2(s2), hi = __high2half2(s2);
      fk[0] = hmul2_u32(fk[0], lo), fk[2] = hmul2_u32(fk[2], lo);
      fk[1] = hmul2_u32(fk[1], hi), fk[3] = hmul2_u32(fk[3], hi);
    }
  };
  // One k-step j alone against the m16 tiles' K fragments fa: q's two k halves (x2: mat&1) of each
  // row tile, the MMAs on the format's type or (bf: fp8_ds_mla's rope, a constant once inlined) bf16.
  const int cq1 = 2 * wk + (mat & 1);
  auto q_x2_step = [&](const uint32_t(&fa)[QMQ][4], int j, bool bf) {
#pragma unroll
    for (int n = 0; n < NQ; ++n) {
      if (!on(n)) continue;
      uint32_t fb[2];
      ldsm_x2(fb, qaddr(n) + swz(cq1, r8, 2 * QWK * j));
#pragma unroll
      for (int a = 0; a < QMQ; ++a) {
        if (bf) mma16816_bf16(acc[a][n], fa[a], fb);
        else mma16816(acc[a][n], fa[a], fb);
      }
    }
  };
  // e4m3: step h of a k-step pair, one m16 tile's converted K at a time (4 registers, not 4*QMQ)
  auto f8_pair_step = [&](const uint32_t(&rw)[QMQ][4], const uint32_t(&qb)[NQ][4], const __half2(&sk)[QMQ],
                          int h) {
#pragma unroll
    for (int a = 0; a < QMQ; ++a) {
      uint32_t fk[4];
      f8_k_frags(fk, rw[a][2 * h], rw[a][2 * h + 1]);
      ds_scale_k(fk, sk[a]);
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
        if (!on(n)) continue;
        const uint32_t fb[2] = {qb[n][2 * h], qb[n][2 * h + 1]};
        mma16816(acc[a][n], fk, fb);
      }
    }
  };
#if KV_FMT == 2  // (the e4m3 MMA's helpers exist only in this format's builds)
  if constexpr (F8QK) {
    qk_e4m3_steps<QMQ, NQ, QWR, QWK, QKS>(acc, qaddr, smem_u32(Kt), wt, wk, mat, r8, on);
  } else
#endif
  if constexpr (VA_QK_PREFETCH && !FP8 && UNI && QKS % 2 == 0) {
    // Operand prefetch: the next step's K and the next pair's Q load before this step's MMAs, so
    // the MMAs do not wait on their own ldmatrix (a second set of operand registers).
    uint32_t fb4[NQ][4], fa[QMQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n) ldsm_x4(fb4[n], qaddr(n) + swz(cq, r8, 0));
#pragma unroll
    for (int a = 0; a < QMQ; ++a) ldsm_x4(fa[a], krow + a * 16 * ROWB + swz(ck, r8, 0));
#pragma unroll
    for (int j = 0; j < QKS; j += 2) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int next = j + h + 1;  // the step whose K loads now
        uint32_t fan[QMQ][4], fbn[NQ][4];
        if (next < QKS) {
#pragma unroll
          for (int a = 0; a < QMQ; ++a) ldsm_x4(fan[a], krow + a * 16 * ROWB + swz(ck, r8, 2 * QWK * next));
        }
        if (h == 1 && j + 2 < QKS) {
#pragma unroll
          for (int n = 0; n < NQ; ++n) ldsm_x4(fbn[n], qaddr(n) + swz(cq, r8, 2 * QWK * (j + 2)));
        }
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          const uint32_t fb[2] = {fb4[n][2 * h], fb4[n][2 * h + 1]};
#pragma unroll
          for (int a = 0; a < QMQ; ++a) mma16816(acc[a][n], fa[a], fb);
        }
        if (next < QKS) {
#pragma unroll
          for (int a = 0; a < QMQ; ++a)
#pragma unroll
            for (int i = 0; i < 4; ++i) fa[a][i] = fan[a][i];
        }
        if (h == 1 && j + 2 < QKS) {
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) fb4[n][i] = fbn[n][i];
        }
      }
    }
  } else if constexpr (VA_QK_PREFETCH && FP8 && VA_F8_KLEAN && UNI && QKS_N % 2 == 0) {
    // e4m3: the next pair's raw K (one x4 a tile holds both steps) and Q load before this pair's
    // conversions and MMAs.
    uint32_t fb4[NQ][4], raw[QMQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n) ldsm_x4(fb4[n], qaddr(n) + swz(cq, r8, 0));
#pragma unroll
    for (int a = 0; a < QMQ; ++a) ldsm_x4(raw[a], krow8 + a * 16 * F8_ROWB);
#pragma unroll
    for (int j = 0; j < QKS_N; j += 2) {
      uint32_t rawn[QMQ][4], fbn[NQ][4];
      if (j + 2 < QKS_N) {
#pragma unroll
        for (int a = 0; a < QMQ; ++a) ldsm_x4(rawn[a], krow8 + a * 16 * F8_ROWB + QWK * (j + 2) * 16);
#pragma unroll
        for (int n = 0; n < NQ; ++n) ldsm_x4(fbn[n], qaddr(n) + swz(cq, r8, 2 * QWK * (j + 2)));
      }
      __half2 sk[QMQ];
      ds_k_scales(sk, j);
#pragma unroll
      for (int h = 0; h < 2; ++h) f8_pair_step(raw, fb4, sk, h);
      if (j + 2 < QKS_N) {
#pragma unroll
        for (int a = 0; a < QMQ; ++a)
#pragma unroll
          for (int i = 0; i < 4; ++i) raw[a][i] = rawn[a][i];
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) fb4[n][i] = fbn[n][i];
      }
    }
  } else {
#pragma unroll
  for (int j = 0; j + 1 < QKS_N; j += 2) {  // the warp's k-step pairs (j, j+1): ks = wk + QWK*j
    uint32_t fb4[NQ][4];
#pragma unroll
    for (int n = 0; n < NQ; ++n)
      if (on(n)) ldsm_x4(fb4[n], qaddr(n) + swz(cq, r8, 2 * QWK * j));
    uint32_t raw[FP8 ? QMQ : 1][4];  // FP8: one x4 holds both steps' e4m3 K fragments
    __half2 sk[QMQ];
    if constexpr (FP8) {
#pragma unroll
      for (int a = 0; a < QMQ; ++a) ldsm_x4(raw[a], krow8 + a * 16 * F8_ROWB + QWK * j * 16);
      ds_k_scales(sk, j);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // (with the unfenced QK only: on the predicated one it splits each fenced region in two)
      if constexpr (FP8 && VA_F8_KLEAN && UNI) {
        f8_pair_step(raw, fb4, sk, h);
        continue;
      }
      uint32_t fa[QMQ][4];
#pragma unroll
      for (int a = 0; a < QMQ; ++a) {
        if constexpr (FP8) {
          f8_k_frags(fa[a], raw[a][2 * h], raw[a][2 * h + 1]);
          ds_scale_k(fa[a], sk[a]);
        } else ldsm_x4(fa[a], krow + a * 16 * ROWB + swz(ck, r8, 2 * QWK * (j + h)));
      }
#pragma unroll
      for (int n = 0; n < NQ; ++n) {
        if (!on(n)) continue;
        const uint32_t fb[2] = {fb4[n][2 * h], fb4[n][2 * h + 1]};
#pragma unroll
        for (int a = 0; a < QMQ; ++a) mma16816(acc[a][n], fa[a], fb);
      }
    }
  }
  if constexpr (QKS_N % 2 == 1) {  // odd k-slice: the last step alone (never fp8_ds_mla's: 32 / WK is even)
    constexpr int j = QKS_N - 1;
    uint32_t fa[QMQ][4];
#pragma unroll
    for (int a = 0; a < QMQ; ++a) {
      if constexpr (FP8) {  // x2: its two token halves (lanes 0..15 give the addresses, and mat >> 1 is 0 there)
        uint32_t raw[2];
        ldsm_x2(raw, krow8 + a * 16 * F8_ROWB + QWK * j * 16);
        f8_k_frags(fa[a], raw[0], raw[1]);
      } else {
        ldsm_x4(fa[a], krow + a * 16 * ROWB + swz(ck, r8, 2 * QWK * j));
      }
    }
    q_x2_step(fa, j, false);
  }
  }
  if constexpr (DSMLA) {
    // fp8_ds_mla's rope dims: k-steps 32..35, the slice's last 4 / QWK (j = QKS_N..QKS-1), bf16 at
    // byte DS_ROPE of the row. K as the bf16 kernel reads it (x4: tokens +8 mat&1, k halves
    // mat>>1, 32 bytes a step), q's bf16 chunks x2 (k halves: mat&1), the MMAs on bf16.
    const uint32_t krope = smem_u32(Kt) + (wt * QMQ * 16 + r8 + (mat & 1) * 8) * F8_ROWB + DS_ROPE +
                           32 * (wk - (KSTEPS - 4)) + 16 * (mat >> 1);  // + 32*QWK*j, j >= QKS_N
#pragma unroll
    for (int j = QKS_N; j < QKS; ++j) {
      uint32_t fa[QMQ][4];
#pragma unroll
      for (int a = 0; a < QMQ; ++a) ldsm_x4(fa[a], krope + a * 16 * F8_ROWB + 32 * QWK * j);
      q_x2_step(fa, j, true);
    }
  }
  float* Sw = Ss + (wk % QNSB) * BROWS * SSTRIDE;
  const int rbase = BROWS == ROWS_PAD ? 0 : nlo * 8;  // row r at r - rbase of its buffer
#pragma unroll
  for (int pass = 0; pass < (QSF ? 2 : 1); ++pass) {
    if (QSF && pass == 1) {  // the lower half's partials are in place
      if constexpr (PIPE == 3) bar_sync(BAR_GROUP + grp, GWARPS * 32);
      else __syncthreads();
    }
    if (wk / QNSB == pass) {
#pragma unroll
      for (int a = 0; a < QMQ; ++a)
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          if (!live(n)) continue;
          const int nj = nlo + wr + n * QWR;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int t = (wt * QMQ + a) * 16 + g + (c >> 1) * 8;
            const int r = nj * 8 + 2 * tq + (c & 1);
            if (pass == 0) Sw[(r - rbase) * SSTRIDE + t] = acc[a][n][c];
            else Sw[(r - rbase) * SSTRIDE + t] += acc[a][n][c];
          }
        }
    }
  }
}

// Max and sum of a lane's N scores as pairwise trees: log2(N) dependent steps instead of N.
template <int N, typename Op>
__device__ __forceinline__ float tree_reduce(const float (&s)[N], Op op) {
  if constexpr (N == 1) {
    return s[0];
  } else {
    float t[N / 2];
#pragma unroll
    for (int j = 0; j < N / 2; ++j) t[j] = op(s[j], s[j + N / 2]);
    return tree_reduce<N / 2>(t, op);
  }
}

// Online softmax of one query row r of tile `it` (LPR lanes, SPL scores each): sums the NSB
// partial-score buffers, masks, updates the row's running max and sum, writes P (the MMAs' type) and the
// rescale factor PV applies to the row's accumulator; raises the tile's rescale flag when a row
// that already holds weight moves its reference max (PV skips the rescale otherwise: alpha is
// 1, or the row's accumulator is still 0).
// QNSB score buffers of BROWS rows each, row r at r - rbase (as qk_tile wrote them).
template <int QNSB, int BROWS>
__device__ __forceinline__ void softmax_row(const float* Ss, bf16* Ps, float* m_s, float* l_s, float* a_s,
                                            int* resc, const float* qsc_s, const unsigned long long* mask_s,
                                            const Span& sp, int rows_here, int vbase, float scale_log2, int r, int sl,
                                            int rhi, int rbase) {
  // RPP need not divide the rows: lanes past the block's last (rhi - 1) compute on it (their
  // shuffles stay converged) and store nothing
  const bool real = r < rhi;
  r = real ? r : rhi - 1;
  if constexpr (FP8) scale_log2 *= qsc_s[r];  // undo the row's q scale (a power of two, or e4m3's)
  float s[SPL];
#pragma unroll
  for (int j = 0; j < SPL; ++j) s[j] = 0.f;
#pragma unroll
  for (int k = 0; k < QNSB; ++k)
#pragma unroll
    for (int q4 = 0; q4 < SPL / 4; ++q4) {
      const float4 x = *reinterpret_cast<const float4*>(Ss + (k * BROWS + r - rbase) * SSTRIDE + sl * SPL + q4 * 4);
      s[4 * q4] += x.x; s[4 * q4 + 1] += x.y; s[4 * q4 + 2] += x.z; s[4 * q4 + 3] += x.w;
    }
  const bool row_ok = real && r < rows_here;
  float mx = NEG_INF;
  if (vbase + TK <= sp.P && vbase + TK <= sp.v1) {  // a whole prefix tile of the split (warp-uniform)
#pragma unroll
    for (int j = 0; j < SPL; ++j) {
      s[j] = row_ok ? s[j] * scale_log2 : NEG_INF;
      if (!VA_SOFTMAX_TREE) mx = fmaxf(mx, s[j]);
    }
  } else {  // the split's end or the draft nodes: per-token bounds and the tree mask
    const unsigned long long tmask = row_ok ? mask_s[r / HT] : 0ull;
#pragma unroll
    for (int j = 0; j < SPL; ++j) {
      const int v = vbase + sl * SPL + j;
      bool ok = row_ok && v < sp.v1;
      if (ok && v >= sp.P) ok = (tmask >> (v - sp.P)) & 1ull;
      s[j] = ok ? s[j] * scale_log2 : NEG_INF;
      if (!VA_SOFTMAX_TREE) mx = fmaxf(mx, s[j]);
    }
  }
  if constexpr (VA_SOFTMAX_TREE) mx = tree_reduce<SPL>(s, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  // Lazy reference max (exact either way: P, l and O all use the same reference): a row keeps its
  // max until a tile's exceeds it by more than RESCALE_LOG2, so P stays below 2^RESCALE_LOG2 (far
  // inside bf16 and fp32) and PV rescales the accumulators on few tiles instead of most (at 72
  // rows some row's max grows in most tiles of a split). A first finite max always replaces -inf.
  const float m_old = m_s[r];
  const float m_new = mx > m_old + RESCALE_LOG2 ? mx : m_old;
  const float base = m_new == NEG_INF ? 0.f : m_new;  // a row with nothing visible stays 0
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < SPL; ++j) {
    s[j] = exp2f(s[j] - base);
    if (!VA_SOFTMAX_TREE) sum += s[j];
  }
  if constexpr (VA_SOFTMAX_TREE) sum = tree_reduce<SPL>(s, [](float a, float b) { return a + b; });
#pragma unroll
  for (int o = LPR / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!real) return;
#pragma unroll
  for (int q8 = 0; q8 < SPL / 4; ++q8) {  // 8-byte stores of 4 values, in the MMAs' element type
    uint2 pk;
    if constexpr (FP8) {  // times P_UNIT: f16's headroom above 2^8, so small weights keep their bits
      __half2 h[2] = {__floats2half2_rn(s[4 * q8] * P_UNIT, s[4 * q8 + 1] * P_UNIT),
                      __floats2half2_rn(s[4 * q8 + 2] * P_UNIT, s[4 * q8 + 3] * P_UNIT)};
      pk = *reinterpret_cast<const uint2*>(h);
    } else {
      __nv_bfloat162 h[2] = {__floats2bfloat162_rn(s[4 * q8], s[4 * q8 + 1]),
                             __floats2bfloat162_rn(s[4 * q8 + 2], s[4 * q8 + 3])};
      pk = *reinterpret_cast<const uint2*>(h);
    }
    *reinterpret_cast<uint2*>(Ps + r * PSTRIDE + sl * SPL + q8 * 4) = pk;
  }
  if (sl == 0) {
    const float alpha = exp2f(m_old - base);
    m_s[r] = m_new;
    l_s[r] = l_s[r] * alpha + sum;
    a_s[r] = alpha;
    if (m_old != NEG_INF && m_new != m_old) *resc = 1;  // every writer writes 1
  }
}

// Online softmax of tile `it` over the summed partial scores: LPR lanes per row, RPP rows per
// warp pass; writes P (the MMAs' type) and the row's rescale factor for PV.
template <int QNSB, int BROWS>
__device__ __forceinline__ void softmax_tile(const float* Ss, bf16* Ps, float* m_s, float* l_s, float* a_s,
                                             int* resc_s, const float* qsc_s, const unsigned long long* mask_s,
                                             const Span& sp, int rows_here, int it, float scale_log2, int warp, int lane,
                                             int rlo, int rhi) {
  const int vbase = sp.v0 + it * TK;
  const int sub = lane / LPR, sl = lane % LPR;
  constexpr int PASSES = (ROWS_PAD + GWARPS * RPP - 1) / (GWARPS * RPP);
  // (the passes stay rolled: unrolling them so their loads overlap measured no faster)
#pragma unroll 1
  for (int pass = 0; pass < PASSES; ++pass) {
    const int r0 = rlo + (pass * GWARPS + warp) * RPP;
    if (r0 >= rhi) break;  // uniform across the warp: the shuffles below stay converged
    softmax_row<QNSB, BROWS>(Ss, Ps, m_s, l_s, a_s, resc_s + (it & 1), qsc_s, mask_s, sp, rows_here, vbase,
                             scale_log2, r0 + sub, sl, rhi, BROWS == ROWS_PAD ? 0 : rlo);
  }
  // the next tile's flag: last read by PV(it-1), which every thread finished before this tile's
  // scores were complete (a barrier lies between them in PIPE 0 and 1; in PIPE 3 this group's
  // PV(it-1) precedes its S barrier, and the other group's precedes the EMPTY sync before this
  // softmax)
  if (warp == 0 && lane == 0) resc_s[(it + 1) & 1] = 0;
}

// FP8: V^T's A fragments from e4m3 rows. ldmatrix.trans (b16) on bytes gives lane (g, t) the
// byte pairs (dims 2g, 2g+1) of tokens 2t and 2t+1 in a 16-dim chunk; one prmt gathers each dim's
// two tokens, so the f16 words are the A fragment's rows g and g+8 for dims 2g and 2g+1: O^T's
// rows are permuted within each 16 (slot g holds dim 2g, slot g+8 dim 2g+1), which the epilogue
// undoes when it stages O.
__device__ __forceinline__ void f8_v_frags(uint32_t (&fa)[4], uint32_t tokens_lo, uint32_t tokens_hi) {
  if constexpr (F8_BITS) {  // the 0x3120 shuffle folded into the selectors: bytes 0, 2 to lo, 1, 3 to hi
    e4m3x4_bits<0x2404, 0x3414>(tokens_lo, fa[0], fa[1]);
    e4m3x4_bits<0x2404, 0x3414>(tokens_hi, fa[2], fa[3]);
  } else {
    e4m3x4_cvt(__byte_perm(tokens_lo, 0u, 0x3120), fa[0], fa[1]);
    e4m3x4_cvt(__byte_perm(tokens_hi, 0u, 0x3120), fa[2], fa[3]);
  }
}

// O^T = alpha * O^T + V^T . P^T for one tile (V = the first 512 dims of the KV tile Kt); the
// alpha product only when the tile's rescale flag says some row needs it.
// The block's n8 row tiles: NT from nlo, as in qk_tile.
template <int NT>
__device__ __forceinline__ void pv_tile(float (&acc)[MW][NT][4], const bf16* Kt, const bf16* Ps, const float* a_s,
                                        bool rescale, int warp, int lane, int nlo) {
  const int tq = lane & 3, mat = lane >> 3, r8 = lane & 7;
  auto live = [&](int nr) { return nlo + nr < NR; };
  constexpr int ROWB = KSTRIDE * 2;
  const uint32_t vrow = smem_u32(Kt) + (r8 + (mat >> 1) * 8) * ROWB;
  const int cv = 2 * warp * MW + (mat & 1);
  if (rescale) {  // some row's max grew this tile (block-uniform)
#pragma unroll
    for (int nr = 0; nr < NT; ++nr) {
      if (!live(nr)) continue;
      const float a0 = a_s[(nlo + nr) * 8 + 2 * tq], a1 = a_s[(nlo + nr) * 8 + 2 * tq + 1];
#pragma unroll
      for (int mw = 0; mw < MW; ++mw) {
        acc[mw][nr][0] *= a0; acc[mw][nr][1] *= a1;
        acc[mw][nr][2] *= a0; acc[mw][nr][3] *= a1;
      }
    }
  }
  // FP8: token r8 (+8: mat&1), 16-dim chunk warp*MW (+1: mat>>1); + kk*16 rows, + mw chunks
  const uint32_t vrow8 = smem_u32(Kt) + (r8 + (mat & 1) * 8) * F8_ROWB + (warp * MW + (mat >> 1)) * 16;
  // fp8_ds_mla: the scales of the A fragments' tokens 2t, 2t+1 (fa[0], fa[1]) and 2t+8, 2t+9 (fa[2],
  // fa[3]) for the 128-dim chunk c, as f16 pairs (+ kk*16 rows)
  const unsigned char* vsc = reinterpret_cast<const unsigned char*>(Kt) + 2 * tq * F8_ROWB + D_V;
  auto ds_v_scales = [&](__half2(&sv)[2], int kk, int c) {
    const unsigned char* p = vsc + kk * 16 * F8_ROWB + 4 * c;
    auto at = [&](int t) { return *reinterpret_cast<const float*>(p + t * F8_ROWB) * (F8_UNIT * DS_UNIT); };
    sv[0] = __floats2half2_rn(at(0), at(1));
    sv[1] = __floats2half2_rn(at(8), at(9));
  };
#pragma unroll
  for (int kk = 0; kk < TM; ++kk) {
    uint32_t fb[NT][2];
#pragma unroll
    for (int nr = 0; nr < NT; ++nr)
      if (live(nr)) ldsm_x2(fb[nr], smem_u32(Ps + ((nlo + nr) * 8 + r8) * PSTRIDE + kk * 16 + (mat & 1) * 8));
    if constexpr (FP8) {
      // fp8_ds_mla: a warp's MW tiles (16 dims each) lie in one 128-dim chunk where MW <= 8 (MW
      // divides 8 and the warp's first dim is a multiple of 16 MW), else each 8 tiles in their own
      __half2 sv[2];
      if constexpr (DSMLA && MW <= 8) ds_v_scales(sv, kk, warp * MW * 16 / DS_SCALE_DIMS);
#pragma unroll
      for (int mw = 0; mw < MW; mw += 2) {  // an x4 covers two 16-dim tiles (an x2 the last of an odd MW)
        uint32_t fa[2][4];
        if (mw + 1 < MW) {
          uint32_t raw[4];
          ldsm_x4_t(raw, vrow8 + kk * 16 * F8_ROWB + mw * 16);
          f8_v_frags(fa[0], raw[0], raw[1]);
          f8_v_frags(fa[1], raw[2], raw[3]);
        } else {
          uint32_t raw[2];  // lanes 0..15 give the addresses, and mat >> 1 is 0 there
          ldsm_x2_t(raw, vrow8 + kk * 16 * F8_ROWB + mw * 16);
          f8_v_frags(fa[0], raw[0], raw[1]);
        }
        if constexpr (DSMLA) {
          if constexpr (MW > 8) ds_v_scales(sv, kk, (warp * MW + mw) * 16 / DS_SCALE_DIMS);  // (mw, mw+1: one chunk)
#pragma unroll
          for (int m2 = 0; m2 < 2 && mw + m2 < MW; ++m2) {
            fa[m2][0] = hmul2_u32(fa[m2][0], sv[0]), fa[m2][1] = hmul2_u32(fa[m2][1], sv[0]);
            fa[m2][2] = hmul2_u32(fa[m2][2], sv[1]), fa[m2][3] = hmul2_u32(fa[m2][3], sv[1]);
          }
        }
#pragma unroll
        for (int m2 = 0; m2 < 2 && mw + m2 < MW; ++m2)
#pragma unroll
          for (int nr = 0; nr < NT; ++nr)
            if (live(nr)) mma16816(acc[mw + m2][nr], fa[m2], fb[nr]);
      }
      continue;
    }
#pragma unroll
    for (int mw = 0; mw < MW; ++mw) {
      uint32_t fa[4];  // V^T: tokens kk*16 + r8 (+8: mat>>1), dims (warp*MW+mw)*16 (+8: mat&1)
      ldsm_x4_t(fa, vrow + kk * 16 * ROWB + swz(cv, r8, 2 * mw));
#pragma unroll
      for (int nr = 0; nr < NT; ++nr)
        if (live(nr)) mma16816(acc[mw][nr], fa, fb[nr]);
    }
  }
}

// Profiling variants leave one phase out (bench/sweep_structures.py --phases); their output is
// wrong by design and never checked.
#ifdef VA_PROFILE_SKIP_QK
#define QK_TILE(...)
#else
// a row split's block: its own QK grid (VA_SPLIT_*), score buffers of SBROWS rows
#define QK_TILE(...) qk_tile<NT, SPLIT ? SWR : WR, SPLIT ? SWK : WK, SPLIT ? SSF : SF, SPLIT ? SBROWS : ROWS_PAD>(__VA_ARGS__)
#endif
#ifdef VA_PROFILE_SKIP_SOFTMAX
#define SOFTMAX_TILE(...)
#else
#define SOFTMAX_TILE(...) softmax_tile<SPLIT ? NSB_S : NSB, SPLIT ? SBROWS : ROWS_PAD>(__VA_ARGS__)
#endif
#ifdef VA_PROFILE_SKIP_PV
#define PV_TILE(...)
#else
#define PV_TILE(...) pv_tile(__VA_ARGS__)
#endif

// Profiling (bench/phase_trace.py): thread 0 of each block stamps the global timer at phase
// boundaries into va_trace (partial: 8 stamps a block; the reduce: 7, slots 4-6 inside a merge of
// many parts, in its last round; a few-parts merge thread 0 takes after it rewrites slot 4), and
// its SM into va_trace_sm (which blocks share an SM, for the blocks' spread).
#ifdef VA_TRACE
extern "C" {
__device__ unsigned long long va_trace[2][8192][8];
__device__ unsigned int va_trace_sm[2][8192];  // the SM each block ran on (stamped with its entry)
}
__device__ __forceinline__ void trace_stamp(int kernel, int slot) {
  if (threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const int blk = blockIdx.y * gridDim.x + blockIdx.x;
  if (blk >= 8192) return;
  va_trace[kernel][blk][slot] = t;
  if (slot == 0) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    va_trace_sm[kernel][blk] = sm;
  }
}
#define TRACE(kernel, slot) trace_stamp(kernel, slot)
#else
#define TRACE(kernel, slot)
#endif

#ifndef VA_MINB
#define VA_MINB 1  // blocks per SM the register allocation must allow
#endif

extern "C" __global__ void __launch_bounds__(BLOCK, VA_MINB)
verify_attn_partial(const bf16* __restrict__ q,              // row (b*QN + i, h) at (b*QN + i)*q_st + h*q_sh: dims 0..511
                    const bf16* __restrict__ q_pe,           // the same rows' dims 512..575 (rope), at pe_st, pe_sh
                    const void* __restrict__ kv,             // [S, 576] in KV_FMT, 656 bytes a row for 3 (pages of 2^page_shift slots)
                    const int* __restrict__ prefix_indices,  // [sum P_b] slots, or a table: a row of page_stride per request
                    const int* __restrict__ prefix_rows,     // [B] request b's row of the table, or null: row b
                    const int* __restrict__ prefix_indptr,   // [B + 1] prefix tokens
                    const int* __restrict__ draft_indices,   // [B, QN] slots
                    const void* __restrict__ tree_mask,      // [B, QN] rows of mask_bytes
                    bf16* __restrict__ part_o,     // [NSPLIT + B - 1 slots, QN, H, 512]: o / l
                    float* __restrict__ part_lse,  // [NSPLIT + B - 1 slots, QN, H]: m + log2(l)
                    bf16* __restrict__ out,        // [B, QN, H, 512]: requests one part covers
                    float* __restrict__ lse,       // [B, QN, H] natural log, or null
                    int B, int H, int q_st, int q_sh, int pe_st, int pe_sh, int page_shift, int page_stride,
                    int mask_bytes, float scale_log2,
                    const float* __restrict__ kv_scale_ptr,  // e4m3: the layer's scale on the device, or null:
                    float kv_scale) {                        // ... the value (a captured graph reads the pointer)
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + ROWS_PAD * KSTRIDE;
  float* Ss = reinterpret_cast<float*>(Ks + STAGES * TK * RING_ROW);
  bf16* Ps = reinterpret_cast<bf16*>(Ss + NGROUPS * NSB * ROWS_PAD * SSTRIDE);  // [NPB] P buffers
  float* m_s = reinterpret_cast<float*>(Ps + NPB * ROWS_PAD * PSTRIDE);
  float* l_s = m_s + ROWS_PAD;
  float* a_s = l_s + ROWS_PAD;                                // [NPB] alpha buffers
  // [0..1] rescale flags by tile parity, [2] whether the plan is tiled, [3] pad
  int* resc_s = reinterpret_cast<int*>(a_s + NPB * ROWS_PAD);
  int* seg_s = resc_s + 4;  // [8] the segment at hand (Seg, request) and the next: in shared memory, not registers
  unsigned long long* mask_s = reinterpret_cast<unsigned long long*>(seg_s + 8);
  int* idx_s = reinterpret_cast<int*>(mask_s + QT);  // [STAGES][TK] slot indices, fetched ahead by cp.async
  float* qsc_s = reinterpret_cast<float*>(idx_s + STAGES * TK);  // [ROWS_PAD] e4m3: q's row scales (inverse)
  const unsigned char* kvb = static_cast<const unsigned char*>(kv);
  // e4m3: scores and outputs carry the layer's scale (and bit placement's 2^-8, F8_UNIT); fp8_ds_mla:
  // DS_UNIT's inverse; bf16: 1
  float vscale = 1.f;
  if constexpr (DSMLA) {  // its rows carry their own scales (F8_UNIT with them), times DS_UNIT
    vscale = 1.f / DS_UNIT;
    scale_log2 *= vscale;
  } else if constexpr (FP8) {
    vscale = (kv_scale_ptr != nullptr ? __ldg(kv_scale_ptr) : kv_scale) * F8_UNIT;
    scale_log2 *= F8QK ? vscale / F8_UNIT : vscale;  // e4m3 MMAs read K as stored: no 2^-8 in the scores
  }

  const int part_id = blockIdx.x, hg = blockIdx.y / NQT, qt = blockIdx.y % NQT;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int grp = NGROUPS == 1 ? 0 : warp / GWARPS, gw = NGROUPS == 1 ? warp : warp % GWARPS;  // PIPE 3's groups
#if VA_PDL
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the reduce may be scheduled now
#endif
  TRACE(0, 0);
#if defined(VA_PROFILE_EMPTY)  // profiling: the launch alone (outputs are garbage by design)
  return;
#endif
#if defined(VA_TEST_FAULT)  // test-only variants: prove the tuner survives a faulting / hanging kernel
  if (tid == 0) *reinterpret_cast<volatile int*>(part_lse - (1ll << 40)) = 1;
#elif defined(VA_TEST_HANG)
  if (tid == 0) { volatile int spin = 1; while (spin) __nanosleep(1000); }
#endif
  const int node0 = qt * QT;
  const int rows_here = HT * min(QT, QN - node0);  // the last row tile may hold fewer nodes
  auto row_index = [&](int X, int r) {  // query row r of this block in request (or slot) X -> flat (X, node, head)
    return ((size_t)X * QN + node0 + r / HT) * H + hg * HT + r % HT;
  };
  // The KV part this block computes and its first n8 row tile (a row split's block: see Plan).
  int split_kvp = part_id, split_lo = 0;
  // ---- the plan: which tiles of which requests this part takes (Plan says how parts share a batch).
  // Its 64-bit state stays out of the registers the tile loop needs: thread 0 finds each segment
  // and leaves it in seg_s.
  {
    const Plan pl = make_plan(prefix_indptr, B);
    const bool may = may_tile(prefix_indptr, B);  // the same in every thread
    if (may) {
      if (tid == 0) resc_s[2] = tiled_segment(seg_s, prefix_indptr, B, part_id);
      __syncthreads();
    }
    if (may && resc_s[2]) {  // one tile a part: part_id's, its only segment (the segment loop finds no next)
      if (seg_s[3] >= B) return;  // fewer tiles than the grid's parts
    } else {
      if (part_id >= pl.N * pl.R) return;  // fewer parts than the grid's have work: the batch is short
      split_kvp = part_id % pl.N;
      split_lo = pl.R > 1 ? part_id / pl.N * RS : 0;
      const long long u0 = pl.part_begin(split_kvp);
      // the request holding unit u0 (exactly one b has U(b) <= u0 < U(b+1)): the thread that finds
      // it finds the first segment too, so the Q load waits on one round trip of index loads
      for (int b = tid; b < B; b += BLOCK)
        if (pl.U(b) <= u0 && u0 < pl.U(b + 1)) next_segment(seg_s, prefix_indptr, B, split_kvp, b);
      // (where the scan ran it is 0 already: no thread can read another value)
      if (tid == BLOCK - 1) resc_s[2] = 0;
    }
    __syncthreads();
    split_lo = pl.R > 1 ? split_lo : -1;  // -1: every row (the segment loop below without the split)
  }
  TRACE(0, 1);
  // The segment loop, compiled twice: with every row tile (NT = NR from 0: the loops and the
  // accumulators as without the split, a runtime range there spilled at 72 rows) and with a row
  // split's RS tiles from a runtime nlo.
  auto segments = [&](auto split) {
    constexpr bool SPLIT = decltype(split)::value;
    constexpr int NT = SPLIT ? RS : NR;
    const int kvp = SPLIT ? split_kvp : part_id, nlo = SPLIT ? split_lo : 0;
    const int rlo = nlo * 8, rhi = (nlo + NT < NR ? nlo + NT : NR) * 8;  // its rows (with pad rows)
  // The request index is read from seg_s where it is used (not held in a register across the tile loop).
#pragma unroll 1
  while (seg_s[3] < B) {
    // The thread's indices, re-derived each segment through an opaque copy: otherwise the compiler
    // hoists every lane-dependent shared-memory address out of this loop, and the accumulators
    // plus those addresses no longer fit the register file (spills at 64 rows).
    const int tid = VA_OPAQUE_TID ? opaque(threadIdx.x) : (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int grp = NGROUPS == 1 ? 0 : warp / GWARPS, gw = NGROUPS == 1 ? warp : warp % GWARPS;
    // ---- prologue. Q first: its copies are in flight while the request's bounds and slot indices
    // load. Q rides in the first
    // cp.async group (PIPE 3: a group of its own); PIPE 0 keeps one slot free for the first
    // iteration to fill, PIPE 1 and 3 fill every slot now.
    if constexpr (VA_WARP_ROWS) {  // a warp a row: the row's addresses once, lanes across its chunks
      const long long tok0 = (long long)seg_s[3] * QN + node0;
      for (int r = rlo + warp; r < rhi; r += NWARPS) {  // Q rows r = i*HT + hl; pad rows zero
        const bool valid = r < rows_here;
        const long long tok = tok0 + r / HT, head = hg * HT + r % HT;
        const bf16* qr = q + tok * q_st + head * q_sh;
        const bf16* pr = q_pe + tok * pe_st + head * pe_sh;
        const uint32_t dst = smem_u32(Qs + r * KSTRIDE);
        const int r8 = r & 7;
#pragma unroll
        for (int k = 0; k < QCH; ++k) {
          const int part = lane + 32 * k;
          if (part >= CHUNKS) break;
          const bf16* src = part < D_V / 8 ? qr + part * 8 : pr + (part - D_V / 8) * 8;
          cp_async16(dst + ((part ^ r8) << 4), valid ? src : q, valid);
        }
      }
    } else {
      for (int c = tid; c < (rhi - rlo) * CHUNKS; c += BLOCK) {  // Q rows r = i*HT + hl; pad rows zero
        const int r = rlo + c / CHUNKS, part = c - (r - rlo) * CHUNKS;
        const bool valid = r < rows_here;
        const long long tok = (long long)seg_s[3] * QN + node0 + r / HT, head = hg * HT + r % HT;
        const bf16* src = part < D_V / 8 ? q + tok * q_st + head * q_sh + part * 8
                                         : q_pe + tok * pe_st + head * pe_sh + (part - D_V / 8) * 8;
        cp_async16(smem_u32(Qs + sw(r, part * 8)), valid ? src : q, valid);
      }
    }
    if constexpr (PIPE == 3) cp_async_commit();  // Q alone: each group then commits its own tiles
    // the mask rows now, so their round trip overlaps the index loads below (stored once those are done)
    const unsigned long long mrow =
        tid < QT && node0 + tid < QN ? mask_row(tree_mask, mask_bytes, (size_t)seg_s[3] * QN + node0 + tid) : 0ull;
    Span sp;
    {
      const int b = seg_s[3], p0 = prefix_indptr[b];
      sp.P = prefix_indptr[b + 1] - p0;
#ifdef VA_FLAT_ONLY  // profiling: the page-size-1 layout compiled in (what reading a page table costs)
      sp.shift = 0;
#else
      sp.shift = page_shift;
#endif
      // a table (page_stride > 0: SGLang's req_to_token at the requests' pool rows, or a block table) or flat slots
      const long long row = prefix_rows != nullptr ? __ldg(prefix_rows + b) : b;
      sp.prefix = prefix_indices + (page_stride > 0 ? row * page_stride : (long long)p0);
      sp.draft = draft_indices + b * QN;
      sp.v0 = seg_s[0] * TK;
      sp.v1 = min((seg_s[1] + 1) * TK, sp.P + QN);
    }
    const int ntiles = (sp.v1 - sp.v0 + TK - 1) / TK;
    constexpr int PRE = PIPE == 0 ? STAGES - 1 : STAGES;  // tiles the prologue loads

    // Index entries of tiles 0 .. PRE+STAGES-2 in one round trip (token i of the split is virtual
    // token v0+i): tiles < PRE go to the ring now and feed the prologue's copies; the rest, which the
    // first STAGES-1 refills use, take their ring entries once those copies have read theirs. From
    // then on each refill fetches, in its own cp.async group, the indices of the tile STAGES-1
    // refills later, so no thread ever waits on an index load.
    constexpr int NPI = (PRE + STAGES - 1) * TK, PER = (NPI + BLOCK - 1) / BLOCK;
    int pre_slot[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int i = tid + k * BLOCK;
      pre_slot[k] = i < NPI ? sp.entry(sp.v0 + i) : -1;
    }
#pragma unroll
    for (int k = 0; k < PER; ++k)
      if (tid + k * BLOCK < PRE * TK) idx_s[tid + k * BLOCK] = pre_slot[k];  // PRE <= STAGES: no wrap
    __syncthreads();
    constexpr bool DEFER = VA_DEFER_PRO && PIPE == 3;
#pragma unroll 1
    for (int s = PIPE == 3 ? grp : 0; s < PRE; s += NGROUPS) {  // PIPE 3: a tile's owner loads it
      if (s < ntiles && (!DEFER || s == 0)) load_kv_tile<GWARPS>(Ks + s * TK * RING_ROW, kvb, idx_s, sp, s, gw);
      cp_async_commit();  // DEFER: an empty group in a deferred tile's place (waits count from the newest)
    }
    __syncthreads();  // every prologue copy has read its index
    // The part's next segment, found while this one's tiles are in flight (by a thread of the
    // group that waits for tile 0 anyway), so the part goes on (or exits) without a round trip.
    // (a tiled plan's part holds one segment: none from request B on)
    if (tid == BLOCK - 1) next_segment(seg_s + 4, prefix_indptr, B, kvp, resc_s[2] ? B : seg_s[3] + 1);
    auto store_later_indices = [&] {
#pragma unroll
      for (int k = 0; k < PER; ++k) {
        const int i = tid + k * BLOCK;
        if (i >= PRE * TK && i < NPI && sp.v0 + i < sp.v1) idx_s[(i / TK % STAGES) * TK + i % TK] = pre_slot[k];
      }
    };
    if constexpr (!DEFER) store_later_indices();
    for (int r = tid; r < ROWS_PAD; r += BLOCK) {
      m_s[r] = NEG_INF; l_s[r] = 0.f; a_s[r] = 1.f;
      if constexpr (NPB == 2) a_s[ROWS_PAD + r] = 1.f;
    }
    if (tid < 2) resc_s[tid] = 0;
    static_assert(QT <= BLOCK, "one thread per mask row");
    if (tid < QT) mask_s[tid] = mrow;
    // Refill: KV tile X into its slot, and the indices of tile X+STAGES-1, as one cp.async group.
    // (PIPE 3: by the owner group of X, which also owns X+STAGES-1.)
    auto refill = [&](int X) {
      if (X < ntiles) load_kv_tile<GWARPS>(Ks + (X % STAGES) * TK * RING_ROW, kvb, idx_s, sp, X, gw);
      fetch_indices(idx_s, sp, X + STAGES - 1, NGROUPS == 1 ? tid : tid % (GWARPS * 32));
      cp_async_commit();  // possibly empty: keeps the group count uniform for the waits
    };

    float acc[MW][NT][4];
    zero_fill(acc);

    TRACE(0, 2);
#if PIPE == 3
    if (grp == 0) cp_async_wait<2>(); else cp_async_wait<1>();  // Q (0: tiles 0, 2 pending; 1: tile 1)
#else
    cp_async_wait<PRE - 1>();  // Q and tile 0 have landed
#endif
    __syncthreads();
    // The deferred tiles, each a group of its own after the empty one. A part of one tile has none
    // (nor later indices) and skips the barriers: its waits then count fewer groups, never more.
    if (DEFER && ntiles > 1) {
#pragma unroll 1
      for (int s = grp; s < PRE; s += NGROUPS) {
        if (s == 0) continue;
        if (s < ntiles) load_kv_tile<GWARPS>(Ks + s * TK * RING_ROW, kvb, idx_s, sp, s, gw);
        cp_async_commit();
      }
      __syncthreads();  // their copies have read their indices: the later tiles' may take the ring
      store_later_indices();
      __syncthreads();
    }
    if constexpr (FP8) {  // q to f16 (or e4m3) by rows
#if KV_FMT == 2
      convert_q_e4m3(Qs, qsc_s, rlo, rhi, warp, lane);
#else
      convert_q(Qs, qsc_s, rlo, rhi, warp, lane);
#endif
      __syncthreads();
    }
    TRACE(0, 3);
#if PIPE == 0
    // Two barriers a tile; PV(t) and QK(t+1) back to back. The slot of tile t-1 is refilled with
    // tile t+STAGES-1 at the first barrier, so STAGES-1 tiles are in flight while a tile computes
    // only when STAGES >= 3.
    QK_TILE(Qs, Ks, Ss, warp, lane, 0, nlo);
#pragma unroll 1
    for (int it = 0; it < ntiles; ++it) {
      __syncthreads();  // S(it) complete; PV(it-1) done, so the slot of tile it-1 is free
      refill(it + STAGES - 1);
      SOFTMAX_TILE(Ss, Ps, m_s, l_s, a_s, resc_s, qsc_s, mask_s, sp, rows_here, it, scale_log2, warp, lane, rlo, rhi);
      cp_async_wait<STAGES - 2>();  // tile it+1 has landed (this thread's copies)
      __syncthreads();              // P(it) ready; everyone's copies of tile it+1 visible
      PV_TILE(acc, Ks + (it % STAGES) * TK * RING_ROW, Ps, a_s, resc_s[it & 1] != 0, warp, lane, nlo);
      if (it + 1 < ntiles) QK_TILE(Qs, Ks + ((it + 1) % STAGES) * TK * RING_ROW, Ss, warp, lane, 0, nlo);
    }
#elif PIPE == 1
    // Three barriers a tile; the slot of tile t is refilled with tile t+STAGES right after PV(t),
    // so every load overlaps a whole iteration of compute even with two slots.
#pragma unroll 1
    for (int it = 0; it < ntiles; ++it) {
      const bf16* Kt = Ks + (it % STAGES) * TK * RING_ROW;
      QK_TILE(Qs, Kt, Ss, warp, lane, 0, nlo);
      __syncthreads();  // S(it) complete
      SOFTMAX_TILE(Ss, Ps, m_s, l_s, a_s, resc_s, qsc_s, mask_s, sp, rows_here, it, scale_log2, warp, lane, rlo, rhi);
      __syncthreads();  // P(it) ready
      PV_TILE(acc, Kt, Ps, a_s, resc_s[it & 1] != 0, warp, lane, nlo);
      cp_async_wait<STAGES - 2>();  // tile it+1 has landed (this thread's copies)
      __syncthreads();              // PV(it) done everywhere: the slot is free; tile it+1 visible
      refill(it + STAGES);
    }
#elif PIPE == 3
    // Seesaw: two groups of 4 warps. Group t&1 owns tile t: it loads it, computes S(t) and the
    // softmax; both groups apply P(t) to their half of the latent dims (warp w owns dims 64w..64w+63
    // as in the other pipelines). A group's turn at tile t: QK(t); PV(t-1) with the other group's
    // P; free the slot of t-1 and refill it with t+2 (its own); softmax(t) (after the other group's
    // softmax(t-1): the running max and sum pass along through the P barrier); PV(t). While one
    // group is in its softmax the other runs MMAs. Named barriers only: BAR_GROUP within a group,
    // BAR_P and BAR_EMPTY hand a tile from its owner to the other group (arrive / sync; each use
    // completes before the next use of the same id can start, see docs/kernel.md; bench/seesaw_model.py
    // runs these hand-offs under random interleavings: check a new order there before a GPU does).
    constexpr int SGROUP = NSB * ROWS_PAD * SSTRIDE, PBUF = ROWS_PAD * PSTRIDE;
    float* Sg = Ss + grp * SGROUP;
#pragma unroll 1
    for (int t = grp; t <= ntiles; t += 2) {
      const bool own = t < ntiles;
      bf16* const Kt = Ks + (t % STAGES) * TK * RING_ROW;
      if (own) {
        if (t == 0) cp_async_wait<1>(); else cp_async_wait<0>();  // tile t (group 0 has tile 2 pending at t=0)
        bar_sync(BAR_GROUP + grp, GWARPS * 32);                     // ... landed for the whole group
        QK_TILE(Qs, Kt, Sg, gw, lane, grp, nlo);
      }
      if (t >= 1) {
        const int u = t - 1;  // the other group's tile
        bar_sync(BAR_P + (u & 1), BLOCK);  // P(u), its alphas and flag are ready
        PV_TILE(acc, Ks + (u % STAGES) * TK * RING_ROW, Ps + (u & 1) * PBUF, a_s + (u & 1) * ROWS_PAD,
                resc_s[u & 1] != 0, warp, lane, nlo);
        bar_sync(BAR_EMPTY + u % STAGES, BLOCK);  // the owner's PV(u) is done too: the slot is free
        if (own) refill(t + STAGES - 1);
      }
      if (own) {
        bar_sync(BAR_GROUP + grp, GWARPS * 32);  // S(t) complete
        SOFTMAX_TILE(Sg, Ps + (t & 1) * PBUF, m_s, l_s, a_s + (t & 1) * ROWS_PAD, resc_s, qsc_s, mask_s, sp, rows_here,
                     t, scale_log2, gw, lane, rlo, rhi);
        bar_sync(BAR_GROUP + grp, GWARPS * 32);  // P(t) ready for this group
        const bool rescale = resc_s[t & 1] != 0;  // read before the arrive lets the other group's softmax reset it
        bar_arrive(BAR_P + (t & 1), BLOCK);      // ... and for the other
        PV_TILE(acc, Kt, Ps + (t & 1) * PBUF, a_s + (t & 1) * ROWS_PAD, rescale, warp, lane, nlo);
        bar_arrive(BAR_EMPTY + t % STAGES, BLOCK);
      }
    }
#endif
    cp_async_wait<0>();
    __syncthreads();  // every warp is past its last QK: the Q region can hold O
    TRACE(0, 4);

    // ---- epilogue: o / l as bf16 staged row-major in the Q region, then 16-byte stores
    const int g = lane >> 2, tq = lane & 3;
    bf16* Os = Qs;
    auto ost = [](int r, int d) { return EPI_BULK ? r * OPITCH + d : sw(r, d); };  // staged (row, dim)
#pragma unroll
    for (int nr = 0; nr < NT; ++nr) {
      if (nlo + nr >= NR) continue;  // a last row split's missing tiles
      const int r = (nlo + nr) * 8 + 2 * tq;
      const float l0 = l_s[r], l1 = l_s[r + 1];
      // V's scale (and, for e4m3, P's 2^7) with 1 / l
      const float inv = FP8 ? vscale / P_UNIT : 1.f;
      const float i0 = l0 > 0.f ? inv / l0 : 0.f, i1 = l1 > 0.f ? inv / l1 : 0.f;
#if __CUDA_ARCH__ >= 900
      if constexpr (VA_EPI_STMATRIX && !FP8 && MW % 2 == 0) {
        // Oᵀ's fragments hold (dim, two adjacent rows): transposed, four 8x8 tiles (two m16 tiles'
        // dim halves) land as 16-byte row pieces in one stmatrix, lane 8i+j addressing tile i's row j
        const uint32_t orow = smem_u32(Os) + ((nlo + nr) * 8 + (lane & 7)) * ((EPI_BULK ? OPITCH : KSTRIDE) * 2);
#pragma unroll
        for (int mw = 0; mw < MW; mw += 2) {
          uint32_t v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float* a = acc[mw + (i >> 1)][nr] + 2 * (i & 1);
            const __nv_bfloat162 h = __floats2bfloat162_rn(a[0] * i0, a[1] * i1);
            v[i] = *reinterpret_cast<const uint32_t*>(&h);
          }
          const int chunk = (warp * MW + mw) * 2 + (lane >> 3);
          asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                           orow + ((EPI_BULK ? chunk : chunk ^ (lane & 7)) << 4)),
                       "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                       : "memory");
        }
        continue;
      }
#endif
#pragma unroll
      for (int mw = 0; mw < MW; ++mw) {
        if constexpr (FP8) {  // slots g and g+8 hold dims 2g and 2g+1 (f8_v_frags): one bf16 pair a row
          const int d = (warp * MW + mw) * 16 + 2 * g;
          *reinterpret_cast<__nv_bfloat162*>(Os + ost(r, d)) = __floats2bfloat162_rn(acc[mw][nr][0] * i0, acc[mw][nr][2] * i0);
          *reinterpret_cast<__nv_bfloat162*>(Os + ost(r + 1, d)) =
              __floats2bfloat162_rn(acc[mw][nr][1] * i1, acc[mw][nr][3] * i1);
          continue;
        }
        const int d = (warp * MW + mw) * 16 + g;
        Os[ost(r, d)] = __float2bfloat16_rn(acc[mw][nr][0] * i0);
        Os[ost(r + 1, d)] = __float2bfloat16_rn(acc[mw][nr][1] * i1);
        Os[ost(r, d + 8)] = __float2bfloat16_rn(acc[mw][nr][2] * i0);
        Os[ost(r + 1, d + 8)] = __float2bfloat16_rn(acc[mw][nr][3] * i1);
      }
    }
    if constexpr (EPI_BULK) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // staged rows -> copy engine
    __syncthreads();
    constexpr int VCH = D_V * 2 / 16;  // 16-byte chunks per output row
    const int b = seg_s[3];
    const bool direct = seg_s[2] != 0;
    const int X = direct ? b : kvp + b;  // output row block: the request itself, or its workspace slot
    bf16* o_dst = direct ? out : part_o;
    const int r_end = rhi < rows_here ? rhi : rows_here;  // this block's real rows: [rlo, r_end)
    if constexpr (EPI_BULK) {  // a bulk copy a row, issued by a warp's lane 0 (the copy takes warp-uniform operands)
      if (lane == 0)
        for (int r = rlo + warp; r < r_end; r += NWARPS)
          asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(o_dst + row_index(X, r) * D_V),
                       "r"(smem_u32(Os + r * OPITCH)), "n"(D_V * 2)
                       : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    } else if constexpr (VA_WARP_ROWS) {  // a warp a row, as Q's copies
      for (int r = rlo + warp; r < r_end; r += NWARPS) {
        bf16* dst = o_dst + row_index(X, r) * D_V;
#pragma unroll
        for (int k = 0; k < VCH / 32; ++k) {
          const int part = lane + 32 * k;
          *reinterpret_cast<uint4*>(dst + part * 8) = *reinterpret_cast<const uint4*>(Os + sw(r, part * 8));
        }
      }
    } else {
      for (int c = tid; c < (r_end - rlo) * VCH; c += BLOCK) {
        const int r = rlo + c / VCH, part = c - (r - rlo) * VCH;
        const uint4 v = *reinterpret_cast<const uint4*>(Os + sw(r, part * 8));
        *reinterpret_cast<uint4*>(o_dst + row_index(X, r) * D_V + part * 8) = v;
      }
    }
    for (int r = rlo + tid; r < r_end; r += BLOCK) {
      const float l = l_s[r];
      const float lse2 = l > 0.f ? m_s[r] + log2f(l) : NEG_INF;  // log2 domain, as the reduce merges
      if (!direct) part_lse[row_index(X, r)] = lse2;
      else if (lse != nullptr) lse[row_index(X, r)] = lse2 * 0.69314718055994531f;
    }
    if constexpr (EPI_BULK) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the rows have left
    __syncthreads();  // every thread has read seg_s, and the Q region and stats are free again
    TRACE(0, 5);
    if (tid < 4) seg_s[tid] = seg_s[4 + tid];  // the next segment (found in the prologue)
    __syncthreads();
  }  // segments
  };
#ifdef VA_PROFILE_REPEAT  // profiling: the part's work twice through the same code, the second
  // pass with warm instruction and constant caches (its stamps replace the first's; slot 7: its start)
  __shared__ int first_seg[4];  // (shared: registers held across the passes spilled)
  if (tid < 4) first_seg[tid] = seg_s[tid];
#pragma unroll 1
  for (int rep = 0; rep < 2; ++rep) {
    if (rep == 1) {
      __syncthreads();
      if (tid < 4) seg_s[tid] = first_seg[tid];
      __syncthreads();
      TRACE(0, 7);
    }
#endif
  // The order of the two instantiations in the binary is worth up to 25 %: the path whose tile loop
  // lands first in the kernel's code runs fastest (bench/results/ab_kernel_flags_sm_90.md).
  // VA_SPLIT_LIKELY (experiment) puts the row split's first.
#ifdef VA_SPLIT_LIKELY
  if (__builtin_expect(RSPLIT > 1 && split_lo >= 0, 1))
#else
  if (RSPLIT > 1 && split_lo >= 0)
#endif
    segments(Flag<true>());
  else
    segments(Flag<false>());
#ifdef VA_PROFILE_REPEAT
  }
#endif
  TRACE(0, 6);
}

// Online log-sum-exp merge of parts first, first + step, ... (< nparts) of one row's 8 dims
// (16-byte loads), U parts in flight per round: o, m and L carry the running (unnormalised) output,
// max and sum. The partials and their lse load together; no first pass over the lse.
template <int U>
__device__ __forceinline__ void merge_parts(const bf16* src, const float* lsrc, size_t slot_stride, int first,
                                            int step, int nparts, float (&o)[8], float& m, float& L) {
  for (int s0 = first; s0 < nparts; s0 += step * U) {
    uint4 raw[U];
    float x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * step;
      const bool have = s < nparts;
      raw[u] = have ? *reinterpret_cast<const uint4*>(src + s * slot_stride * D_V) : make_uint4(0, 0, 0, 0);
      x[u] = have ? lsrc[s * slot_stride] : NEG_INF;
    }
    float mx = m;
#pragma unroll
    for (int u = 0; u < U; ++u) mx = fmaxf(mx, x[u]);
    TRACE(1, 4);  // the round's lse loads have landed (its partials' were issued with them)
    const float base = mx == NEG_INF ? 0.f : mx;  // nothing seen yet: every weight is 0
    const float sc = exp2f(m - base);
    L *= sc;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] *= sc;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float w = exp2f(x[u] - base);
      const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(p[j]);
        o[2 * j] += w * f.x;
        o[2 * j + 1] += w * f.y;
      }
      L += w;
    }
    m = mx;
  }
}

// The normalised 8 dims of a merged row into out (and its lse, natural log, by the row's first lane).
__device__ __forceinline__ void store_merged(bf16* __restrict__ out, float* __restrict__ lse, size_t row, int dim,
                                             bool lse_lane, const float (&o)[8], float m, float L) {
  const float inv = L > 0.f ? 1.f / L : 0.f;
  uint4 packed;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int j = 0; j < 4; ++j) dst[j] = __floats2bfloat162_rn(o[2 * j] * inv, o[2 * j + 1] * inv);
  *reinterpret_cast<uint4*>(out + row * D_V + dim) = packed;
  if (lse != nullptr && lse_lane) lse[row] = L > 0.f ? ((m == NEG_INF ? 0.f : m) + log2f(L)) * 0.69314718055994531f : NEG_INF;
}

// Thread l of a group: its walk over an item's parts first, first + step, ...: the running output, max and
// sum of its 8 dims (from dim) of the (b, i, h) row. Every part between the request's first and last
// wrote its partial (Plan).
template <int U>
__device__ __forceinline__ void walk_item(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                                          size_t row, int dim, int b, int p_first, int nparts, int H, int first,
                                          int step, float (&o)[8], float& m, float& L) {
  const int nh = (int)(row % ((size_t)QN * H));
  const size_t slot_stride = (size_t)QN * H;               // rows of one workspace slot
  const size_t row0 = (size_t)(p_first + b) * slot_stride + nh;  // slot p + b of part p
  merge_parts<U>(part_o + row0 * D_V + dim, part_lse + row0, slot_stride, first, step, nparts, o, m, L);
}

// The reduce's shared memory: a thread's running results, each group's max, the block's items.
struct RedShared {
  float o[RED_THREADS][9];
  float l[RED_THREADS];
  float m[RED_THREADS / 4];
  int todo[RED_THREADS][3];  // item, p_first, parts: few parts from the front, many from the back
  int ntodo, nbig;
};

// Merge one item with the log-sum-exp rule: a group of TPG threads of 8 dims; `gpi` groups (this
// thread's is number `gl` of them, block group `grp`) walk the parts in parallel, RED_UNROLL parts in
// flight per thread, then the first combines their results in shared memory (the caller's barrier
// between: every thread of the block takes part in one round).
template <int TPG>
__device__ __forceinline__ void merge_item_walk(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                                                size_t row, int dim, int b, int p_first, int nparts, int H, int grp,
                                                int gl, int gpi, RedShared& sh) {
  float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  float m = NEG_INF, L = 0.f;  // this group's running max and sum
  walk_item<RED_UNROLL>(part_o, part_lse, row, dim, b, p_first, nparts, H, gl, gpi, o, m, L);
#pragma unroll
  for (int j = 0; j < 8; ++j) sh.o[threadIdx.x][j] = o[j];
  sh.l[threadIdx.x] = L;
  if (threadIdx.x % TPG == 0) sh.m[grp] = m;
}

// The first group of an item's `gpi` combines their running results (after merge_item_walk and a barrier).
template <int TPG>
__device__ __forceinline__ void merge_item_combine(bf16* __restrict__ out, float* __restrict__ lse, size_t row,
                                                   int dim, bool first_piece, int grp, int gpi, const RedShared& sh) {
  const int l = threadIdx.x % TPG;
  float M = NEG_INF;
  for (int k = grp; k < grp + gpi; ++k) M = fmaxf(M, sh.m[k]);
  const float base = M == NEG_INF ? 0.f : M;
  float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, L = 0.f;
  for (int k = grp; k < grp + gpi; ++k) {
    const float w = exp2f(sh.m[k] - base);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] += w * sh.o[k * TPG + l][j];
    L += w * sh.l[k * TPG + l];
  }
  store_merged(out, lse, row, dim, first_piece && l == 0, o, M, L);
}

// The same merge by one thread group alone (no block barrier), for items with few parts: the
// block's groups then merge that many items at once instead of one after another.
__device__ __forceinline__ void merge_item_group(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                                                 bf16* __restrict__ out, float* __restrict__ lse, size_t row,
                                                 int dim, bool lse_lane, int b, int p_first, int nparts, int H) {
  float o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  float m = NEG_INF, L = 0.f;
  walk_item<4>(part_o, part_lse, row, dim, b, p_first, nparts, H, 0, 1, o, m, L);
  store_merged(out, lse, row, dim, lse_lane, o, m, L);
}

// Items with at most this many parts are merged by one thread group each.
constexpr int RED_SMALL = 8;

// The reduce's work items are (row, piece) of every request, B*QN*H*PIECES of them; block g of
// the grid's G takes items g, g+G, ..., `per_block` of them (the launch sizes G so that a large
// batch does not pay the GPU's block-launch rate for requests that need no merge). Its threads
// check their items against the plan at once; only items of requests that several parts share
// merge. A piece's dims go to a group of 64 / PIECES threads, 8 dims each. False if the block had
// nothing to merge.
template <int PIECES>
__device__ __forceinline__ bool reduce_pieces(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                                              const int* __restrict__ prefix_indptr, bf16* __restrict__ out,
                                              float* __restrict__ lse, int B, int H, int per_block, RedShared& sh) {
  constexpr int TPG = 64 / PIECES, GROUPS = RED_THREADS / TPG, WIDTH = D_V / PIECES;
  const int tid = threadIdx.x;
  const long long items = (long long)B * QN * H * PIECES;
  if (tid < per_block) {
    const long long item = blockIdx.x + (long long)tid * gridDim.x;
    if (item < items) {
      const int b = (int)(item / ((long long)QN * H * PIECES));
      const Plan pl = make_plan(prefix_indptr, B);
      const int ntb = (prefix_indptr[b + 1] - prefix_indptr[b] + QN + TK - 1) / TK;
      int p_first, p_last;
      TileScan ts;
      if (may_tile(prefix_indptr, B) && (ts = tile_scan(prefix_indptr, B, b, 0)).total <= NSPLIT) {
        p_first = ts.before, p_last = p_first + ntb - 1;
      } else {
        const long long s0 = Plan::start(pl.U(b), b);  // the first tile's first token, then the last's
        p_first = pl.part_of(s0), p_last = pl.part_of(s0 + (long long)(ntb - 1) * TK);
      }
      if (p_first != p_last) {  // one part wrote this request's output itself otherwise
        const int np = p_last - p_first + 1;
        const int k = np > RED_SMALL ? RED_THREADS - 1 - atomicAdd(&sh.nbig, 1) : atomicAdd(&sh.ntodo, 1);
        sh.todo[k][0] = (int)item, sh.todo[k][1] = p_first, sh.todo[k][2] = np;
      }
    }
  }
  __syncthreads();
  const int n = sh.ntodo, nb = sh.nbig;
  TRACE(1, 1);
  if (n + nb == 0) return false;
#if VA_PDL
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the partial grid has finished and flushed
#endif
  TRACE(1, 2);
  // Many parts: the block's groups share a round's items out, up to RED_GPI groups each (a long
  // request's one item gets that many; several items of mid-length requests merge at once instead
  // of one after another).
  for (int k0 = 0; k0 < nb; k0 += GROUPS) {
    const int m = min(GROUPS, nb - k0), gpi = min(RED_GPI, GROUPS / m);
    const int grp = tid / TPG, k = grp / gpi, first = k * gpi;
    const int item = k < m ? sh.todo[RED_THREADS - 1 - (k0 + k)][0] : 0;
    const size_t row = (size_t)(item / PIECES);
    const int dim = (item % PIECES) * WIDTH + (tid % TPG) * 8;
    if (k < m) {
      const int* t = sh.todo[RED_THREADS - 1 - (k0 + k)];
      merge_item_walk<TPG>(part_o, part_lse, row, dim, (int)(row / ((size_t)QN * H)), t[1], t[2], H, grp, grp - first,
                           gpi, sh);
      TRACE(1, 5);
    }
    __syncthreads();
    if (k < m && grp == first) {
      merge_item_combine<TPG>(out, lse, row, dim, item % PIECES == 0, grp, gpi, sh);
      TRACE(1, 6);
    }
    __syncthreads();  // the shared results are free for the next round
  }
  for (int k = tid / TPG; k < n; k += GROUPS) {  // few parts: a thread group an item
    const int item = sh.todo[k][0], l = tid % TPG;
    const size_t row = (size_t)(item / PIECES);
    merge_item_group(part_o, part_lse, out, lse, row, (item % PIECES) * WIDTH + l * 8, item % PIECES == 0 && l == 0,
                     (int)(row / ((size_t)QN * H)), sh.todo[k][1], sh.todo[k][2], H);
  }
  return true;
}

// One block of the reduce over PIECES pieces a row.
template <int PIECES>
__device__ __forceinline__ void reduce_block(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                                             const int* __restrict__ prefix_indptr, bf16* __restrict__ out,
                                             float* __restrict__ lse, int B, int H, int per_block) {
  __shared__ RedShared sh;
  TRACE(1, 0);
  if (threadIdx.x == 0) sh.ntodo = 0, sh.nbig = 0;
  __syncthreads();
  if (reduce_pieces<PIECES>(part_o, part_lse, prefix_indptr, out, lse, B, H, per_block, sh)) TRACE(1, 3);
}

// The reduce over quarters of rows. Each count of pieces is a kernel of its own with the count a
// constant: one kernel holding both ran the quarters slower (bench/results/ab_kernel_flags_sm_90.md).
extern "C" __global__ void __launch_bounds__(RED_THREADS)
verify_attn_reduce(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                   const int* __restrict__ prefix_indptr,  // [B + 1]
                   bf16* __restrict__ out,                 // [B, QN, H, 512]
                   float* __restrict__ lse,                // [B, QN, H] natural log, or null
                   int B, int H, int per_block) {
  reduce_block<4>(part_o, part_lse, prefix_indptr, out, lse, B, H, per_block);
}

#if VA_RED_PIECES == 16
// The same over 16 pieces a row, for requests of few rows (kernels/abi.py's reduce_grid).
extern "C" __global__ void __launch_bounds__(RED_THREADS)
verify_attn_reduce16(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                     const int* __restrict__ prefix_indptr, bf16* __restrict__ out, float* __restrict__ lse, int B,
                     int H, int per_block) {
  reduce_block<16>(part_o, part_lse, prefix_indptr, out, lse, B, H, per_block);
}
#endif
