/* VeoAttention kernels: fused multi-head attention over packed QKV (flash-attention style: K/V tiles in
 * shared memory, online softmax, FP32 accumulation, no SxS matrix in global memory). Plain C launchers,
 * callable without TensorRT. */
#ifndef VEO_ATTENTION_KERNEL_H
#define VEO_ATTENTION_KERNEL_H

#include "veoKernelStatus.h"

/* Head dims with a kernel instance (a template per value). Keep in sync with the dispatch in the .cu:
 * the config code and the plugin use this list to refuse the others at build time. */
#define VEO_ATTENTION_HEAD_DIMS {32, 48, 64, 80, 96, 128}

#ifdef __cplusplus
extern "C" {
#endif

/* qkv: (batch, seq, 3*num_heads*head_dim) packed as torch does; out: (batch, seq, num_heads*head_dim).
 * dtype: VEO_DTYPE_FLOAT32 or VEO_DTYPE_FLOAT16 (both tensors). scale <= 0 means 1/sqrt(head_dim).
 * stream: a cudaStream_t (NULL = legacy default stream). Returns a veo_kernel_status. */
VEO_KERNEL_API int veoAttentionForward(const void* qkv, void* out, int dtype, int batch, int seq, int num_heads,
    int head_dim, float scale, void* stream);

/* veoAttentionForward with an additive bias (VeoAttention v2): softmax(Q K^T * scale + bias) V. bias is a
 * (bias_batch, bias_heads, seq, seq) table of the same dtype: batch b reads row b % bias_batch (the windows
 * of an image), head h row h, or row 0 when bias_heads is 1. bias_batch must divide batch. Bias values are
 * clamped to the dtype's lowest finite value, the biased logits to float32's (no NaN rows). bias NULL is
 * veoAttentionForward. */
VEO_KERNEL_API int veoAttentionForwardBias(const void* qkv, const void* bias, int bias_batch, int bias_heads,
    void* out, int dtype, int batch, int seq, int num_heads, int head_dim, float scale, void* stream);

/* 1 when a kernel instance exists for head_dim, else 0. */
VEO_KERNEL_API int veoAttentionSupportsHeadDim(int head_dim);

#ifdef __cplusplus
}
#endif

#endif /* VEO_ATTENTION_KERNEL_H */
