/* VeoAttention's per-tile arithmetic, shared by the CUDA kernel and the host tests: the scores of one key
 * against a warp's queries, the biased logit, the running max and sum of the online softmax, the output
 * update and the final division. Everything is FP32, whatever the I/O type (the kernel converts on load
 * and store). The logits are in log2 units (Q is pre-scaled by scale*log2(e), the bias multiplied by
 * log2(e)), so the exponentials are exp2f.
 *
 * Compiled by nvcc as __host__ __device__ functions, by a host compiler as plain inline functions: the
 * kernel calls exactly what plugins/tests/attentionTileHost.cpp and the tests check on the CPU. */
#ifndef VEO_ATTENTION_TILE_H
#define VEO_ATTENTION_TILE_H

#include <math.h>

#if defined(__CUDACC__)
#define VEO_HD __host__ __device__ __forceinline__
#else
#define VEO_HD inline
#endif

namespace veo
{
namespace tile
{

constexpr float kLOG2E = 1.4426950408889634F;
constexpr float kF32_LOWEST = -3.40282347e38F; //!< FLT_MAX negated
constexpr float kF16_LOWEST = -65504.F;        //!< the lowest finite float16

//! Scores of one key against Q queries, FP32 fused multiply-adds in head-dim order (one K element is read
//! once and used for every query): s[i] = sum_d q[i*D + d] * k[d]. `q` is pre-scaled.
template <int D, int Q>
VEO_HD void scoreKey(float const* q, float const* k, float (&s)[Q])
{
#pragma unroll
    for (int i = 0; i < Q; ++i)
    {
        s[i] = 0.F;
    }
#pragma unroll 16
    for (int d = 0; d < D; ++d)
    {
        float const kd = k[d];
#pragma unroll
        for (int i = 0; i < Q; ++i)
        {
            s[i] = fmaf(q[i * D + d], kd, s[i]);
        }
    }
}

//! The logit of a valid key with its additive bias: the bias is first raised to the I/O type's lowest
//! finite value (`lowest`; a -inf mask in FP16 becomes -65504), the sum to FP32's, so a row whose every
//! key is masked has finite, equal logits and never turns into NaN.
VEO_HD float biasedLogit(float score, float bias, float lowest)
{
    return fmaxf(fmaf(fmaxf(bias, lowest), kLOG2E, score), kF32_LOWEST);
}

//! A key past the end of the sequence takes no part in the softmax.
VEO_HD float maskedLogit(float logit, bool valid)
{
    return valid ? logit : -INFINITY;
}

//! One query row of the online softmax: the running max `m` (log2 units) and sum `l` of 2^(logit - m).
struct RowState
{
    float m;
    float l;
};

VEO_HD RowState rowStart()
{
    return RowState{-INFINITY, 0.F};
}

//! Takes in a tile whose largest logit is `tileMax` (finite: every tile has a valid key): moves the
//! running max and returns the factor alpha the sum and the output accumulators are rescaled by
//! (0 on the first tile).
VEO_HD float rowRescale(RowState& r, float tileMax)
{
    float const mNew = fmaxf(r.m, tileMax);
    float const alpha = exp2f(r.m - mNew);
    r.m = mNew;
    return alpha;
}

//! The unnormalised probability of a logit under the row's current max.
VEO_HD float prob(RowState const& r, float logit)
{
    return exp2f(logit - r.m);
}

//! Adds the tile's probabilities (their sum) to the rescaled running sum.
VEO_HD void rowAccumulate(RowState& r, float alpha, float tileSum)
{
    r.l = fmaf(r.l, alpha, tileSum);
}

//! The output accumulators of one row: rescaled once per tile, then acc += p * v for each key.
template <int N>
VEO_HD void accRescale(float (&acc)[N], float alpha)
{
#pragma unroll
    for (int i = 0; i < N; ++i)
    {
        acc[i] *= alpha;
    }
}

VEO_HD float accUpdate(float acc, float p, float v)
{
    return fmaf(p, v, acc);
}

//! The output of a row: its accumulator over the softmax's sum.
VEO_HD float rowOutput(RowState const& r, float acc)
{
    return acc * (1.F / r.l);
}

//! Element offset of bias[b mod biasBatch][h or 0][0][0] in a (biasBatch, biasHeads, S, S) table: the
//! broadcast strides of the Swin windows (b mod nW) and of a table shared by the heads.
VEO_HD long long biasOffset(int b, int h, int seq, int biasBatch, int biasHeads)
{
    long long const row = b % biasBatch;
    long long const head = biasHeads == 1 ? 0 : h;
    return (row * biasHeads + head) * static_cast<long long>(seq) * seq;
}

} // namespace tile
} // namespace veo

#endif /* VEO_ATTENTION_TILE_H */
