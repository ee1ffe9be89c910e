// The switch in front of a CUDA graph's conditional (SWITCH) node: it picks which compiled
// config's kernels run this replay, from the batch's prefix tokens, so one captured graph can
// hold a short-prefix config and a long-prefix config and run only the one that fits the step.
// bench/graph_switch.py captures it and the node; the kernels themselves are unchanged.
#include <cuda_runtime.h>

// Branch i runs when bounds[i-1] <= tokens < bounds[i] (ascending; n of them, at most 3).
extern "C" __global__ void verify_attn_switch(cudaGraphConditionalHandle handle, const int* __restrict__ indptr,
                                              int B, int n, int b0, int b1, int b2) {
  const int tokens = indptr[B] - indptr[0];
  const unsigned branch = (n > 0 && tokens >= b0) + (n > 1 && tokens >= b1) + (n > 2 && tokens >= b2);
  cudaGraphSetConditional(handle, branch);
}
