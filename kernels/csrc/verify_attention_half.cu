// The entries of a config with HALF > 0. kernels/build.py renders verify_attention.cu twice before
// this file, as device-function bodies: in va_half with the config's short-batch companion (HT/2
// heads a block, NSPLIT/2 parts, one QK row group and 4 k-slices, no score fold; the rest the
// config's) and in va_full with the config itself; the macros in scope here are the config's.
//
// Why: a block of fewer heads has a shorter chain per KV tile (its Q load, QK, softmax and
// epilogue run on half the rows), which is what a batch too short to give every part several tiles
// waits on; a long batch wants the full block, which reads each KV tile once for twice the heads.
// One compiled config then serves both inside a captured graph. The two grids have the same number
// of blocks (twice the head groups over half the parts), so the launch is the config's grid and
// each block maps its linear index onto the companion's grid.
//
// The choice is made on the device from prefix_indptr alone (as the Plan), identically in both
// kernels: the half body runs while the batch has fewer than HALF KV tiles per part of the full
// grid. kernels/plan.py mirrors it (runs_half).

typedef __nv_bfloat16 bf16;

namespace {
static_assert(HALF >= 1, "verify_attention_half.cu is for HALF > 0");
static_assert(va_half::GRID_PARTS * 2 == va_full::GRID_PARTS, "the companion has half the parts");
static_assert(va_half::RED_THREADS == va_full::RED_THREADS, "both reduce bodies run in one block size");

__device__ __forceinline__ bool run_half(const int* __restrict__ prefix_indptr, int B) {
  // the plan's units (PLAN_C + P_b + QN a request) over the full config's tile: its W / TK
  const long long W = (long long)(__ldg(prefix_indptr + B) - __ldg(prefix_indptr)) + (long long)B * (QN + PLAN_C);
  return W / TK < (long long)NSPLIT * HALF;
}
constexpr int half_max(int a, int b) { return a > b ? a : b; }
}  // namespace

extern "C" __device__ const int kSmemBytes = half_max(va_half::SMEM_BYTES, va_full::SMEM_BYTES);
extern "C" __device__ const int kUsesPdl = VA_PDL;
extern "C" __device__ const int kReduceThreads = va_full::RED_THREADS;

extern "C" __global__ void __launch_bounds__(BLOCK, VA_MINB)
verify_attn_partial(const bf16* __restrict__ q, const bf16* __restrict__ q_pe, const bf16* __restrict__ kv,
                    const int* __restrict__ prefix_indices, const int* __restrict__ prefix_rows,
                    const int* __restrict__ prefix_indptr, const int* __restrict__ draft_indices,
                    const void* __restrict__ tree_mask, bf16* __restrict__ part_o, float* __restrict__ part_lse,
                    bf16* __restrict__ out, float* __restrict__ lse, int B, int H, int q_st, int q_sh, int pe_st,
                    int pe_sh, int page_shift, int page_stride, int mask_bytes, float scale_log2) {
#ifdef VA_FULL_FIRST
  if (!run_half(prefix_indptr, B)) {
    va_full::verify_attn_partial(q, q_pe, kv, prefix_indices, prefix_rows, prefix_indptr, draft_indices, tree_mask,
                                 part_o, part_lse, out, lse, B, H, q_st, q_sh, pe_st, pe_sh, page_shift, page_stride,
                                 mask_bytes, scale_log2, blockIdx.x, blockIdx.y);
  } else {
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    va_half::verify_attn_partial(q, q_pe, kv, prefix_indices, prefix_rows, prefix_indptr, draft_indices, tree_mask,
                                 part_o, part_lse, out, lse, B, H, q_st, q_sh, pe_st, pe_sh, page_shift, page_stride,
                                 mask_bytes, scale_log2, lin % va_half::GRID_PARTS, lin / va_half::GRID_PARTS);
  }
#else
#ifdef VA_HALF_UNLIKELY  // experiment: code layout (the full body's loops first)
  if (__builtin_expect(run_half(prefix_indptr, B), 0)) {
#else
  if (run_half(prefix_indptr, B)) {
#endif
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    va_half::verify_attn_partial(q, q_pe, kv, prefix_indices, prefix_rows, prefix_indptr, draft_indices, tree_mask,
                                 part_o, part_lse, out, lse, B, H, q_st, q_sh, pe_st, pe_sh, page_shift, page_stride,
                                 mask_bytes, scale_log2, lin % va_half::GRID_PARTS, lin / va_half::GRID_PARTS);
#ifdef VA_HALF_EXIT
    asm volatile("exit;");
    __builtin_unreachable();
#endif
  } else {
    va_full::verify_attn_partial(q, q_pe, kv, prefix_indices, prefix_rows, prefix_indptr, draft_indices, tree_mask,
                                 part_o, part_lse, out, lse, B, H, q_st, q_sh, pe_st, pe_sh, page_shift, page_stride,
                                 mask_bytes, scale_log2, blockIdx.x, blockIdx.y);
  }
#endif
}

extern "C" __global__ void __launch_bounds__(va_full::RED_THREADS)
verify_attn_reduce(const bf16* __restrict__ part_o, const float* __restrict__ part_lse,
                   const int* __restrict__ prefix_indptr, bf16* __restrict__ out, float* __restrict__ lse, int B,
                   int H, int per_block) {
  if (run_half(prefix_indptr, B))
    va_half::verify_attn_reduce(part_o, part_lse, prefix_indptr, out, lse, B, H, per_block);
  else
    va_full::verify_attn_reduce(part_o, part_lse, prefix_indptr, out, lse, B, H, per_block);
}
