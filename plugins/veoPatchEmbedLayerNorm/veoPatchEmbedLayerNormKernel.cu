// VeoPatchEmbedLayerNorm: patch gather + GEMM + bias + prefix/pos add + LayerNorm, one pass over the tokens.
//
// One CTA of 256 threads per (tile of 8 token rows, batch item). The GEMM runs as an implicit-GEMM
// convolution: for chunks of 8 along K = C*prod(patch), the CTA stages the weight chunk (transposed, FP32)
// and the 8 gathered patch rows in shared memory; thread t accumulates, in FP32 registers, the outputs
// e = t, t+256, ... of all 8 rows. Prefix rows (cls/dist) take prefix_tokens instead. The epilogue adds
// bias and position embedding, writes `tokens` once, block-reduces mean and then variance (two passes over
// the registers, no cancellation) and writes `tokens_ln` once.
#include "kernelCommon.cuh"
#include "veoPatchEmbedLayerNormKernel.h"

#include <cmath>
#include <string>

namespace veo
{
namespace
{

using patch_embed::kKC;
using patch_embed::kTHREADS;
using patch_embed::kTT;
using patch_embed::kWARPS;

struct Geometry
{
    int gt, gh, gw; // patch grid
    int numPatches; // L
    int rows;       // P + L
    int k;          // C * pt * ph * pw
};

template <typename T, int kEPT>
__global__ void __launch_bounds__(kTHREADS) patchEmbedKernel(veo_patch_embed_params p, Geometry g,
    T const* __restrict__ x, T const* __restrict__ w, T const* __restrict__ bias, T const* __restrict__ prefix,
    T const* __restrict__ pos, T const* __restrict__ lnW, T const* __restrict__ lnB, T* __restrict__ tokens,
    T* __restrict__ tokensLn)
{
    int const emb = p.embed_dim;
    int const ws = emb + 1; // padded row of the transposed weight chunk
    extern __shared__ float smem[];
    float* sW = smem;          // [kKC][ws]
    float* sX = sW + kKC * ws; // [kTT][kKC]
    __shared__ float sRed[kWARPS][kTT];
    __shared__ float sStat[kTT];

    int const tid = threadIdx.x;
    int const n = blockIdx.y;
    int const r0 = blockIdx.x * kTT;
    int const numPrefix = p.num_prefix_tokens;

    float acc[kTT][kEPT];
#pragma unroll
    for (int t = 0; t < kTT; ++t)
    {
#pragma unroll
        for (int i = 0; i < kEPT; ++i)
        {
            acc[t][i] = 0.F;
        }
    }

    bool anyPatch = r0 + kTT > numPrefix; // a tile of prefix rows only skips the GEMM
    for (int k0 = 0; anyPatch && k0 < g.k; k0 += kKC)
    {
        __syncthreads();
        for (int i = tid; i < kKC * emb; i += kTHREADS)
        {
            int const e = i / kKC;
            int const kk = i % kKC;
            int const k = k0 + kk;
            sW[kk * ws + e] = k < g.k ? toFloat(w[static_cast<size_t>(e) * g.k + k]) : 0.F;
        }
        if (tid < kTT * kKC)
        {
            int const t = tid / kKC;
            int const kk = tid % kKC;
            int const r = r0 + t;
            int const k = k0 + kk;
            float v = 0.F;
            if (r >= numPrefix && r < g.rows && k < g.k)
            {
                int const l = r - numPrefix;
                int const gw = l % g.gw;
                int const gh = (l / g.gw) % g.gh;
                int const gt = l / (g.gw * g.gh);
                int const iw = k % p.patch_w;
                int const ih = (k / p.patch_w) % p.patch_h;
                int const it = (k / (p.patch_w * p.patch_h)) % p.patch_t;
                int const c = k / (p.patch_w * p.patch_h * p.patch_t);
                size_t const idx
                    = ((((static_cast<size_t>(n) * p.in_channels + c) * p.in_t + gt * p.patch_t + it) * p.in_h
                           + gh * p.patch_h + ih)
                          * p.in_w)
                    + gw * p.patch_w + iw;
                v = toFloat(x[idx]);
            }
            sX[t * kKC + kk] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kKC; ++kk)
        {
            float wv[kEPT];
#pragma unroll
            for (int i = 0; i < kEPT; ++i)
            {
                int const e = tid + i * kTHREADS;
                wv[i] = e < emb ? sW[kk * ws + e] : 0.F;
            }
#pragma unroll
            for (int t = 0; t < kTT; ++t)
            {
                float const xv = sX[t * kKC + kk];
#pragma unroll
                for (int i = 0; i < kEPT; ++i)
                {
                    acc[t][i] = fmaf(xv, wv[i], acc[t][i]);
                }
            }
        }
    }

    // Epilogue 1: bias, prefix, position embedding; write tokens once.
    float part[kTT];
#pragma unroll
    for (int t = 0; t < kTT; ++t)
    {
        int const r = r0 + t;
        part[t] = 0.F;
#pragma unroll
        for (int i = 0; i < kEPT; ++i)
        {
            int const e = tid + i * kTHREADS;
            float v = 0.F;
            if (r < g.rows && e < emb)
            {
                if (r < numPrefix)
                {
                    v = toFloat(prefix[static_cast<size_t>(r) * emb + e]);
                }
                else
                {
                    v = acc[t][i] + toFloat(bias[e]);
                    if (p.pos_mode == VEO_POS_PATCHES)
                    {
                        v += toFloat(pos[static_cast<size_t>(r - numPrefix) * emb + e]);
                    }
                }
                if (p.pos_mode == VEO_POS_ALL)
                {
                    v += toFloat(pos[static_cast<size_t>(r) * emb + e]);
                }
                tokens[(static_cast<size_t>(n) * g.rows + r) * emb + e] = fromFloat<T>(v);
            }
            acc[t][i] = v;
            part[t] += v;
        }
    }
    if (!p.has_layernorm)
    {
        return;
    }

    // Epilogue 2: LayerNorm over e, per row: mean, then variance of the centred values.
    int const warp = tid / 32;
    int const lane = tid % 32;
    float mean[kTT];
    for (int pass = 0; pass < 2; ++pass)
    {
#pragma unroll
        for (int t = 0; t < kTT; ++t)
        {
            float const s = warpSum(part[t]);
            if (lane == 0)
            {
                sRed[warp][t] = s;
            }
        }
        __syncthreads();
        if (tid < kTT)
        {
            float s = 0.F;
#pragma unroll
            for (int wi = 0; wi < kWARPS; ++wi)
            {
                s += sRed[wi][tid];
            }
            sStat[tid] = s / static_cast<float>(emb);
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < kTT; ++t)
        {
            if (pass == 0)
            {
                mean[t] = sStat[t];
                part[t] = 0.F;
#pragma unroll
                for (int i = 0; i < kEPT; ++i)
                {
                    float const d = tid + i * kTHREADS < emb ? acc[t][i] - mean[t] : 0.F;
                    part[t] += d * d;
                }
            }
            else
            {
                float const rstd = rsqrtf(sStat[t] + p.epsilon);
                int const r = r0 + t;
#pragma unroll
                for (int i = 0; i < kEPT; ++i)
                {
                    int const e = tid + i * kTHREADS;
                    if (r < g.rows && e < emb)
                    {
                        float const y = (acc[t][i] - mean[t]) * rstd * toFloat(lnW[e]) + toFloat(lnB[e]);
                        tokensLn[(static_cast<size_t>(n) * g.rows + r) * emb + e] = fromFloat<T>(y);
                    }
                }
            }
        }
        __syncthreads(); // sRed / sStat are reused by the next pass
    }
}

template <typename T, int kEPT>
int launch(veo_patch_embed_params const& p, Geometry const& g, void const* const* in, void* tokens,
    void* tokensLn, cudaStream_t stream)
{
    // The 48 KiB check counts the kernel's static shared memory too (embed_dim 1519..1527 needs the opt-in
    // although its dynamic part alone fits), and the attribute is set once per device, not per launch.
    static SmemOptIn sOptIn;
    int const smem = patch_embed::dynamicSmemBytes(p.embed_dim);
    auto kernel = patchEmbedKernel<T, kEPT>;
    int const maxEmbed = kEPT * kTHREADS < VEO_PATCH_EMBED_MAX_EMBED_DIM ? kEPT * kTHREADS : VEO_PATCH_EMBED_MAX_EMBED_DIM;
    int const status
        = reserveSharedMemory(kernel, sOptIn, smem, patch_embed::dynamicSmemBytes(maxEmbed), "veoPatchEmbedLayerNorm");
    if (status != VEO_KERNEL_OK)
    {
        return status;
    }
    dim3 const grid((g.rows + kTT - 1) / kTT, p.batch);
    auto const c = [&](int i) { return static_cast<T const*>(in[i]); };
    kernel<<<grid, kTHREADS, smem, stream>>>(
        p, g, c(0), c(1), c(2), c(3), c(4), c(5), c(6), static_cast<T*>(tokens), static_cast<T*>(tokensLn));
    return checkLaunch("veoPatchEmbedLayerNorm");
}

template <typename T>
int dispatch(veo_patch_embed_params const& p, Geometry const& g, void const* const* in, void* tokens,
    void* tokensLn, cudaStream_t s)
{
    int const ept = (p.embed_dim + kTHREADS - 1) / kTHREADS;
    switch (ept)
    {
    case 1: return launch<T, 1>(p, g, in, tokens, tokensLn, s);
    case 2: return launch<T, 2>(p, g, in, tokens, tokensLn, s);
    case 3: return launch<T, 3>(p, g, in, tokens, tokensLn, s);
    case 4: return launch<T, 4>(p, g, in, tokens, tokensLn, s);
    case 5:
    case 6: return launch<T, 6>(p, g, in, tokens, tokensLn, s);
    default: return launch<T, 8>(p, g, in, tokens, tokensLn, s);
    }
}

} // namespace
} // namespace veo

extern "C" int veoPatchEmbedLayerNormForward(veo_patch_embed_params const* params, int dtype, void const* x,
    void const* weight, void const* bias, void const* prefix, void const* pos, void const* ln_weight,
    void const* ln_bias, void* tokens, void* tokens_ln, void* stream)
{
    using veo::kernelFail;
    char const* op = "veoPatchEmbedLayerNorm: ";
    if (params == nullptr || x == nullptr || weight == nullptr || bias == nullptr || tokens == nullptr)
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT, std::string(op) + "params, x, weight, bias and tokens are required, got NULL");
    }
    veo_patch_embed_params const& p = *params;
    if (p.batch < 1 || p.batch > 65535 || p.in_channels < 1 || p.embed_dim < 1 || p.in_t < 1 || p.in_h < 1
        || p.in_w < 1 || p.patch_t < 1 || p.patch_h < 1 || p.patch_w < 1)
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT, std::string(op) + "sizes must all be >= 1 (batch <= 65535)");
    }
    if (p.in_t % p.patch_t || p.in_h % p.patch_h || p.in_w % p.patch_w)
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
            std::string(op) + "input extents (" + std::to_string(p.in_t) + ", " + std::to_string(p.in_h) + ", "
                + std::to_string(p.in_w) + ") are not divisible by the patch size");
    }
    if (p.embed_dim > VEO_PATCH_EMBED_MAX_EMBED_DIM)
    {
        return kernelFail(VEO_KERNEL_UNSUPPORTED,
            std::string(op) + "embed_dim " + std::to_string(p.embed_dim) + " > "
                + std::to_string(VEO_PATCH_EMBED_MAX_EMBED_DIM) + " has no kernel instance");
    }
    if (p.num_prefix_tokens < 0 || p.num_prefix_tokens > 2 || (p.num_prefix_tokens > 0 && prefix == nullptr))
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
            std::string(op) + "num_prefix_tokens must be 0..2 and prefix given when > 0");
    }
    if (p.pos_mode < VEO_POS_NONE || p.pos_mode > VEO_POS_ALL || (p.pos_mode != VEO_POS_NONE && pos == nullptr))
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT, std::string(op) + "pos_mode must be 0..2 and pos given when > 0");
    }
    if (p.has_layernorm && (ln_weight == nullptr || ln_bias == nullptr || tokens_ln == nullptr || !(p.epsilon > 0.F)))
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
            std::string(op) + "has_layernorm needs ln_weight, ln_bias, tokens_ln and epsilon > 0");
    }
    veo::Geometry g{};
    g.gt = p.in_t / p.patch_t;
    g.gh = p.in_h / p.patch_h;
    g.gw = p.in_w / p.patch_w;
    g.numPatches = g.gt * g.gh * g.gw;
    g.rows = g.numPatches + p.num_prefix_tokens;
    g.k = p.in_channels * p.patch_t * p.patch_h * p.patch_w;
    void const* in[7] = {x, weight, bias, prefix, pos, ln_weight, ln_bias};
    auto const st = static_cast<cudaStream_t>(stream);
    if (dtype == VEO_DTYPE_FLOAT32)
    {
        return veo::dispatch<float>(p, g, in, tokens, tokens_ln, st);
    }
    if (dtype == VEO_DTYPE_FLOAT16)
    {
        return veo::dispatch<__half>(p, g, in, tokens, tokens_ln, st);
    }
    return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
        std::string(op) + "dtype " + std::to_string(dtype) + " unknown; expected 0 (float32) or 1 (float16)");
}
