/* VeoPatchEmbedLayerNorm kernels: patch gather + GEMM + bias + prefix/pos add + LayerNorm in one pass over
 * the tokens, both outputs written once. Plain C launcher, callable without TensorRT. */
#ifndef VEO_PATCH_EMBED_LAYERNORM_KERNEL_H
#define VEO_PATCH_EMBED_LAYERNORM_KERNEL_H

#include "veoKernelStatus.h"

/* Largest embed_dim with a kernel instance (256 threads x 8 values per thread). */
#define VEO_PATCH_EMBED_MAX_EMBED_DIM 2048

#ifdef __cplusplus
extern "C" {
#endif

typedef enum veo_pos_mode
{
    VEO_POS_NONE = 0,    /* no pos_embed input */
    VEO_POS_PATCHES = 1, /* pos_embed (1, L, E): added to the patch tokens, before the prefix is prepended */
    VEO_POS_ALL = 2      /* pos_embed (1, P+L, E): added to all tokens after the prefix is prepended */
} veo_pos_mode;

typedef struct veo_patch_embed_params
{
    int batch;             /* N */
    int in_channels;       /* C */
    int embed_dim;         /* E */
    int in_t, in_h, in_w;  /* spatial extents of x; in_t = 1 for images */
    int patch_t, patch_h, patch_w; /* patch_t = 1 for images */
    int num_prefix_tokens; /* P */
    int pos_mode;          /* veo_pos_mode */
    int has_layernorm;
    float epsilon;
} veo_patch_embed_params;

/* x (N, C, [T,] H, W); weight (E, C, [pt,] ph, pw); bias (E); prefix (1, P, E) or NULL; pos (1, P+L or L, E)
 * or NULL; ln_weight/ln_bias (E) or NULL; tokens and tokens_ln (N, P+L, E), tokens_ln NULL without LayerNorm.
 * All tensors of `dtype` (veo_dtype). stream: a cudaStream_t. Returns a veo_kernel_status. */
VEO_KERNEL_API int veoPatchEmbedLayerNormForward(const veo_patch_embed_params* params, int dtype, const void* x,
    const void* weight, const void* bias, const void* prefix, const void* pos, const void* ln_weight,
    const void* ln_bias, void* tokens, void* tokens_ln, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* VEO_PATCH_EMBED_LAYERNORM_KERNEL_H */
