// MLA verify attention for speculative decoding: KV-split flash-decode, partial + reduce.
//
// Semantics (../shared/docs/verify-attention.md): for request b, draft node i, head h the query
// q[b,i,h,0:576] attends to every prefix slot of b and to the draft nodes j that bit j of
// tree_mask[b,i] allows; o = softmax(scale * q.k) @ v with v = kv[slot, 0:512].
//
// Compile-time constants, prepended by kernels/build.py as #defines:
//   NSPLIT  KV splits per request          HT     heads per block sharing one KV tile
//   TK      tokens per KV tile (mult. 16)  BLOCK  threads per block (128..1024, power of two)
//   STAGES  cp.async pipeline depth (2, 3) QN     draft nodes per request (q_len, 1..64)
//
// Layout of the work. A block owns HT heads x all QN nodes of one request (ROWS = HT*QN query
// rows) and one split of the request's token sequence, which is the prefix followed by the QN
// draft slots ("virtual tokens"). Everything runs on mma.sync m16n8k16 (bf16 in, fp32 acc),
// available on sm_80, sm_90 and sm_120 alike. The products are formed transposed -- tokens and
// latent dims are the M side, query rows the N side -- because ROWS is small (8..128): n8 tiles
// waste at most 7 rows where m16 tiles would waste up to 15.
//   QK:  S^T[TK, ROWS]  = K[TK, 576]  . Q^T[576, ROWS]   (A = K tile from smem, B = Q from smem)
//   PV:  O^T[512, ROWS] += V^T[512, TK] . P^T[TK, ROWS]  (A = V tile via ldmatrix.trans)
// The O^T accumulator lives in registers, split over warps by latent dim.
#include <cuda_bf16.h>
#include <stdint.h>

#if !defined(NSPLIT) || !defined(HT) || !defined(TK) || !defined(BLOCK) || !defined(STAGES) || !defined(QN)
#error "NSPLIT, HT, TK, BLOCK, STAGES and QN must be defined (kernels/build.py renders them)"
#endif

typedef __nv_bfloat16 bf16;

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
constexpr int KSTRIDE = D_QK + 8;  // bf16 per smem row: +16 B keeps ldmatrix rows conflict-free
constexpr int CHUNKS = D_QK * 2 / 16;  // 16-byte cp.async chunks per KV row
constexpr int ROWS = HT * QN;
constexpr int NR = (ROWS + 7) / 8;  // n8 tiles of query rows
constexpr int ROWS_PAD = NR * 8;
constexpr int NWARPS = BLOCK / 32;
constexpr int MW = (D_V / 16) / NWARPS;  // latent-dim m16 tiles per warp in PV
constexpr int TM = TK / 16;              // token m16 tiles per KV tile
constexpr int WQM = NWARPS < TM ? NWARPS : TM;  // QK warp grid: WQM along tokens ...
constexpr int WQN = NWARPS / WQM;               // ... WQN along query rows
constexpr int MQ = TM / WQM;
constexpr int NQ = (NR + WQN - 1) / WQN;
constexpr int SSTRIDE = TK + 4;  // floats per score row (+16 B: conflict-free, 16 B aligned)
constexpr float NEG_INF = -__builtin_huge_valf();

static_assert(QN >= 1 && QN <= 64, "q_len must be in 1..64 (uint64 tree mask)");
static_assert(TK % 16 == 0 && TK >= 16 && TK <= 128, "TK must be 16, 32, 64 or 128");
static_assert(BLOCK % 32 == 0 && (D_V / 16) % NWARPS == 0, "BLOCK/32 must divide 32");
static_assert(NWARPS % WQM == 0 && TM % WQM == 0, "warp grid must tile the KV tile");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES must be 2..4");
static_assert(NSPLIT >= 1, "NSPLIT must be >= 1");

constexpr int SMEM_Q = ROWS_PAD * KSTRIDE * 2;
constexpr int SMEM_K = STAGES * TK * KSTRIDE * 2;
constexpr int SMEM_S = ROWS_PAD * SSTRIDE * 4;
constexpr int SMEM_STATS = 3 * ROWS_PAD * 4;
constexpr int SMEM_MASK = QN * 8;
constexpr int SMEM_SLOTS = TK * 4;
// softmax: LPR lanes share a row, each holding 4 consecutive scores; RPP rows per warp pass
constexpr int LPR = TK / 4 < 32 ? TK / 4 : 32;
constexpr int RPP = 32 / LPR;
static_assert(TK / LPR == 4, "softmax: four scores per lane");
static_assert(TK <= BLOCK, "one thread per token fetches the next tile's slot");
}  // namespace

// Read back by kernels/build.py to check that its smem formula matches this layout.
extern "C" __device__ const int kSmemBytes = SMEM_Q + SMEM_K + SMEM_S + SMEM_STATS + SMEM_MASK + SMEM_SLOTS;
extern "C" __device__ const int kUsesPdl = VA_PDL;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // src-size 0 zero-fills: masked tokens must be finite zeros
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
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
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Slot of virtual token v, or -1 past the split's end.
__device__ __forceinline__ int slot_of(const int* __restrict__ prefix, const int* __restrict__ draft,
                                       int P, int v, int v1) {
  if (v >= v1) return -1;
  return v < P ? __ldg(prefix + v) : __ldg(draft + (v - P));
}

// Stage one KV tile into Kt; slots[t] < 0 zero-fills token t.
__device__ __forceinline__ void load_kv_tile(bf16* Kt, const bf16* __restrict__ kv, const int* slots) {
  for (int c = threadIdx.x; c < TK * CHUNKS; c += BLOCK) {
    const int t = c / CHUNKS;
    const int part = c - t * CHUNKS;
    const int slot = slots[t];
    cp_async16(smem_u32(Kt + t * KSTRIDE + part * 8), kv + (size_t)max(slot, 0) * D_QK + part * 8, slot >= 0);
  }
}

extern "C" __global__ void __launch_bounds__(BLOCK, 1)
verify_attn_partial(const bf16* __restrict__ q,              // [B, QN, H, 576]
                    const bf16* __restrict__ kv,             // [S, 576]
                    const int* __restrict__ prefix_indices,  // [sum P_b]
                    const int* __restrict__ prefix_indptr,   // [B + 1]
                    const int* __restrict__ draft_indices,   // [B, QN]
                    const unsigned long long* __restrict__ tree_mask,  // [B, QN]
                    float* __restrict__ part_o,    // [B*QN*H, NSPLIT, 512]
                    float2* __restrict__ part_ml,  // [B*QN*H, NSPLIT]: (max, sum), log2 domain
                    int H, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + ROWS_PAD * KSTRIDE;
  float* Ss = reinterpret_cast<float*>(Ks + STAGES * TK * KSTRIDE);
  float* m_s = Ss + ROWS_PAD * SSTRIDE;
  float* l_s = m_s + ROWS_PAD;
  float* a_s = l_s + ROWS_PAD;
  unsigned long long* mask_s = reinterpret_cast<unsigned long long*>(a_s + ROWS_PAD);
  int* slot_s = reinterpret_cast<int*>(mask_s + QN);

  const int split = blockIdx.x, h0 = blockIdx.y * HT, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#if VA_PDL
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the reduce may be scheduled now
#endif
#if defined(VA_TEST_FAULT)  // test-only variants: prove the tuner survives a faulting / hanging kernel
  if (tid == 0) *reinterpret_cast<volatile int*>(part_o - (1ll << 40)) = 1;
#elif defined(VA_TEST_HANG)
  if (tid == 0) { volatile int spin = 1; while (spin) __nanosleep(1000); }
#endif
  const int p0 = prefix_indptr[b];
  const int P = prefix_indptr[b + 1] - p0;
  const int L = P + QN;
  const int chunk = ((L + NSPLIT - 1) / NSPLIT + TK - 1) / TK * TK;
  const int v0 = split * chunk;
  const int v1 = min(L, v0 + chunk);
  const int* prefix = prefix_indices + p0;
  const int* draft = draft_indices + b * QN;

  auto row_index = [&](int r) {  // query row r -> flat (b, i, h)
    return ((size_t)b * QN + r / HT) * H + h0 + r % HT;
  };

  if (v0 >= v1) {  // empty split: contributes nothing to the reduce
    for (int r = tid; r < ROWS; r += BLOCK) part_ml[row_index(r) * NSPLIT + split] = make_float2(NEG_INF, 0.f);
    return;
  }

  for (int c = tid; c < ROWS_PAD * CHUNKS; c += BLOCK) {  // Q rows r = i*HT + hl; pad rows zero
    const int r = c / CHUNKS, part = c - r * CHUNKS;
    const bool valid = r < ROWS;
    const bf16* src = valid ? q + row_index(r) * D_QK + part * 8 : q;
    cp_async16(smem_u32(Qs + r * KSTRIDE + part * 8), src, valid);
  }
  for (int r = tid; r < ROWS_PAD; r += BLOCK) { m_s[r] = NEG_INF; l_s[r] = 0.f; }
  for (int i = tid; i < QN; i += BLOCK) mask_s[i] = tree_mask[b * QN + i];

  // Slot indices are fetched one iteration before their tile is issued, so the index load's
  // latency hides behind a tile of compute instead of stalling every thread at the issue.
  const int ntiles = (v1 - v0 + TK - 1) / TK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) {
      if (tid < TK) slot_s[tid] = slot_of(prefix, draft, P, v0 + s * TK + tid, v1);
      __syncthreads();
      load_kv_tile(Ks + s * TK * KSTRIDE, kv, slot_s);
      __syncthreads();
    }
    cp_async_commit();
  }
  if (tid < TK) slot_s[tid] = slot_of(prefix, draft, P, v0 + (STAGES - 1) * TK + tid, v1);

  const int g = lane >> 2, tq = lane & 3;
  const int wm = warp % WQM, wn = warp / WQM;
  float acc[MW][NR][4];
#pragma unroll
  for (int mw = 0; mw < MW; ++mw)
#pragma unroll
    for (int nr = 0; nr < NR; ++nr)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mw][nr][c] = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nt = it + STAGES - 1;
    if (nt < ntiles) load_kv_tile(Ks + (nt % STAGES) * TK * KSTRIDE, kv, slot_s);
    cp_async_commit();
    const int next_slot = tid < TK ? slot_of(prefix, draft, P, v0 + (nt + 1) * TK + tid, v1) : -1;
    const bf16* Kt = Ks + (it % STAGES) * TK * KSTRIDE;
    const int vbase = v0 + it * TK;

#ifndef VA_PROFILE_SKIP_QK  // profiling variants leave one phase out (bench/profile_kernel.py)
    // ---- S^T = K . Q^T, written to smem as scaled, masked log2-domain scores S[row][token]
    {
      float sacc[2][MQ][NQ][4];  // even and odd k-steps: two independent mma chains
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int a = 0; a < MQ; ++a)
#pragma unroll
          for (int n = 0; n < NQ; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) sacc[h][a][n][c] = 0.f;
      const int mat = lane >> 3, r8 = lane & 7;
#pragma unroll 2
      for (int ks2 = 0; ks2 < D_QK / 32; ++ks2) {
        // one ldmatrix.x4 brings an n-tile's Q fragments for both k-steps of the pair (measured
        // 0.5-1.9 % faster than an x2 per k-step: bench/results/ab_qk_*_sm_90.md)
        uint32_t fb4[NQ][4];
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          const int nj = wn + n * WQN;
          if (nj < NR) ldsm_x4(fb4[n], smem_u32(Qs + (nj * 8 + r8) * KSTRIDE + ks2 * 32 + mat * 8));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int ks = 2 * ks2 + h;
          uint32_t fa[MQ][4], fb[NQ][2];
#pragma unroll
          for (int a = 0; a < MQ; ++a) {
            const int tok = (wm + a * WQM) * 16 + r8 + (mat & 1) * 8;
            ldsm_x4(fa[a], smem_u32(Kt + tok * KSTRIDE + ks * 16 + (mat >> 1) * 8));
          }
#pragma unroll
          for (int n = 0; n < NQ; ++n) {
            fb[n][0] = fb4[n][2 * h];
            fb[n][1] = fb4[n][2 * h + 1];
          }
#pragma unroll
          for (int a = 0; a < MQ; ++a)
#pragma unroll
            for (int n = 0; n < NQ; ++n)
              if (wn + n * WQN < NR) mma16816(sacc[h][a][n], fa[a], fb[n]);
        }
      }
#pragma unroll
      for (int a = 0; a < MQ; ++a)
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          const int nj = wn + n * WQN;
          if (nj >= NR) continue;
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int t = (wm + a * WQM) * 16 + g + (c >> 1) * 8;
            const int r = nj * 8 + 2 * tq + (c & 1);
            const int v = vbase + t;
            bool ok = v < v1 && r < ROWS;
            if (ok && v >= P) ok = (mask_s[r / HT] >> (v - P)) & 1ull;
            Ss[r * SSTRIDE + t] = ok ? (sacc[0][a][n][c] + sacc[1][a][n][c]) * scale_log2 : NEG_INF;
          }
        }
    }
#endif
    __syncthreads();

#ifndef VA_PROFILE_SKIP_SOFTMAX
    // ---- online softmax: LPR lanes per row, RPP rows per warp pass; P (bf16) overwrites the
    // row's scores in place (every lane of the row has read before any lane writes)
    {
      const int sub = lane / LPR, sl = lane % LPR;
      for (int r0 = warp * RPP; r0 < ROWS_PAD; r0 += NWARPS * RPP) {
        const int r = r0 + sub;
        float* srow = Ss + r * SSTRIDE;
        constexpr int PER = TK / LPR;  // 4
        float s[PER];
        float mx = NEG_INF;
#pragma unroll
        for (int j = 0; j < PER; ++j) { s[j] = srow[sl * PER + j]; mx = fmaxf(mx, s[j]); }
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_old = m_s[r];
        const float m_new = fmaxf(m_old, mx);
        const float base = m_new == NEG_INF ? 0.f : m_new;  // a row with nothing visible stays 0
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < PER; ++j) { s[j] = exp2f(s[j] - base); sum += s[j]; }
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp();
        __nv_bfloat162* prow = reinterpret_cast<__nv_bfloat162*>(srow) + sl * (PER / 2);
#pragma unroll
        for (int j = 0; j < PER; j += 2) prow[j / 2] = __floats2bfloat162_rn(s[j], s[j + 1]);
        if (sl == 0) {
          const float alpha = exp2f(m_old - base);
          m_s[r] = m_new;
          l_s[r] = l_s[r] * alpha + sum;
          a_s[r] = alpha;
        }
      }
    }
#endif
    __syncthreads();

#ifndef VA_PROFILE_SKIP_PV
    // ---- O^T = alpha * O^T + V^T . P^T
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
      const float a0 = a_s[nr * 8 + 2 * tq], a1 = a_s[nr * 8 + 2 * tq + 1];
#pragma unroll
      for (int mw = 0; mw < MW; ++mw) {
        acc[mw][nr][0] *= a0; acc[mw][nr][1] *= a1;
        acc[mw][nr][2] *= a0; acc[mw][nr][3] *= a1;
      }
    }
    const bf16* Pb = reinterpret_cast<const bf16*>(Ss);
    const int mat = lane >> 3, r8 = lane & 7;
#pragma unroll
    for (int kk = 0; kk < TM; ++kk) {
      uint32_t fb[NR][2];
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
        ldsm_x2(fb[nr], smem_u32(Pb + (nr * 8 + r8) * (2 * SSTRIDE) + kk * 16 + (mat & 1) * 8));
#pragma unroll
      for (int mw = 0; mw < MW; ++mw) {
        uint32_t fa[4];
        const int tok = kk * 16 + r8 + (mat >> 1) * 8;
        const int dim = (warp * MW + mw) * 16 + (mat & 1) * 8;
        ldsm_x4_t(fa, smem_u32(Kt + tok * KSTRIDE + dim));
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) mma16816(acc[mw][nr], fa, fb[nr]);
      }
    }
#endif
    if (tid < TK) slot_s[tid] = next_slot;
  }
  cp_async_wait<0>();

  // ---- unnormalised partials and (m, l) per row
#pragma unroll
  for (int mw = 0; mw < MW; ++mw)
#pragma unroll
    for (int nr = 0; nr < NR; ++nr)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = nr * 8 + 2 * tq + (c & 1);
        if (r >= ROWS) continue;
        const int d = (warp * MW + mw) * 16 + g + (c >> 1) * 8;
        part_o[(row_index(r) * NSPLIT + split) * D_V + d] = acc[mw][nr][c];
      }
  for (int r = tid; r < ROWS; r += BLOCK) part_ml[row_index(r) * NSPLIT + split] = make_float2(m_s[r], l_s[r]);
}

// Merge the NSPLIT partials of one (b, i, h) row with the log-sum-exp rule. Grid (rows, 4): a
// block covers 128 of the 512 latent dims; its RG warps walk the splits in parallel (lane = 4
// dims) so that many partial loads are in flight even when there are few rows (H*Q = 8).
namespace {
constexpr int RG = NSPLIT < 8 ? NSPLIT : 8;
}

extern "C" __global__ void __launch_bounds__(32 * RG)
verify_attn_reduce(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                   bf16* __restrict__ out,  // [B*QN*H, 512]
                   float* __restrict__ lse) {  // [B*QN*H] or null
  __shared__ float4 red_o[RG][32];
  __shared__ float red_l[RG];
  const size_t row = blockIdx.x;
#if VA_PDL
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the partial grid has finished and flushed
#endif
  const int lane = threadIdx.x % 32, grp = threadIdx.x / 32;
  const int dim4 = blockIdx.y * 32 + lane;  // float4 index within the 512 dims
  const float2* ml = part_ml + row * NSPLIT;
  float M = NEG_INF;
  for (int s = lane; s < NSPLIT; s += 32) M = fmaxf(M, ml[s].x);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float L = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = grp; s < NSPLIT; s += RG) {
    const float2 x = ml[s];
    if (x.y > 0.f) {  // empty splits never wrote their partial: skip, don't read it
      const float w = exp2f(x.x - M);
      const float4 p = reinterpret_cast<const float4*>(part_o + (row * NSPLIT + s) * D_V)[dim4];
      L += w * x.y;
      o.x += w * p.x; o.y += w * p.y; o.z += w * p.z; o.w += w * p.w;
    }
  }
  red_o[grp][lane] = o;
  if (lane == 0) red_l[grp] = L;
  __syncthreads();
  if (grp != 0) return;
  L = 0.f;
  o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int k = 0; k < RG; ++k) {
    L += red_l[k];
    o.x += red_o[k][lane].x; o.y += red_o[k][lane].y; o.z += red_o[k][lane].z; o.w += red_o[k][lane].w;
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(out + row * D_V + dim4 * 4);
  dst[0] = __floats2bfloat162_rn(o.x * inv, o.y * inv);
  dst[1] = __floats2bfloat162_rn(o.z * inv, o.w * inv);
  if (lse != nullptr && blockIdx.y == 0 && lane == 0)
    lse[row] = L > 0.f ? (M + log2f(L)) * 0.69314718055994531f : NEG_INF;
}
