/* VeoAttention's kernel run on the host: the CTA, warp and lane structure of veoAttentionKernel.cu
 * (query tiles of 32, 4 warps of 8 queries, key tiles of 32, one key per lane, xor-butterfly warp sums)
 * driving the same per-tile functions (veoAttentionTile.h) the kernel calls. For tests without a GPU:
 * testAttentionTile (ctest) and tests/plugins/test_attention_tile_math.py (against the numpy reference).
 *
 * Inputs are float: for FP16 I/O the caller passes values already rounded to FP16 (the kernel converts
 * each on load, exactly) and rounds the output to FP16 (the kernel's store, round to nearest even). */
#ifndef VEO_ATTENTION_TILE_HOST_H
#define VEO_ATTENTION_TILE_HOST_H

#ifdef __cplusplus
extern "C" {
#endif

/* qkv (batch, seq, 3*heads*head_dim); bias NULL or (bias_batch, bias_heads, seq, seq); out (batch, seq,
 * heads*head_dim). scale <= 0 means 1/sqrt(head_dim). lowest: the lowest finite value of the I/O type
 * (-65504 for FP16, -FLT_MAX for FP32), where the bias is clamped. Returns 0, or -1 for a head dim
 * without a kernel instance or a bias that does not fit. */
__attribute__((visibility("default"))) int veoAttentionTileHost(float const* qkv, float const* bias, int bias_batch,
    int bias_heads, float* out, int batch, int seq, int heads, int head_dim, float scale, float lowest);

#ifdef __cplusplus
}
#endif

#endif /* VEO_ATTENTION_TILE_HOST_H */
