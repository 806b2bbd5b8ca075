// VeoAttention: fused multi-head attention over packed QKV, flash-attention style.
//
// One CTA per (query tile of 32, head, batch); 4 warps, each owning 8 queries. The CTA walks the keys in
// tiles of 32: K and V of the tile go to shared memory (as FP32), each lane scores one key against the
// warp's 8 queries, and an online softmax (running max m, running sum l, FP32) rescales the FP32 output
// accumulators, which each lane holds for head-dim columns lane, lane+32, ... No SxS matrix exists
// anywhere; global memory sees qkv read and out written once per element.
//
// With a bias (VeoAttention v2) the CTA reads the bias block of each tile (its 32 queries x 32 keys) once,
// coalesced, into shared memory beside K and V; each lane then takes its key's column for the warp's
// queries. (Read straight from global memory by the lanes, the 8 strided loads per key cost 40-50 more
// registers in the D >= 80 instances and spilled at D = 128.) The bias table is (biasBatch, biasHeads,
// S, S): batch b reads row b mod biasBatch, head h row h or 0. The per-tile arithmetic lives in
// veoAttentionTile.h, shared with the host tests.
#include "kernelCommon.cuh"
#include "veoAttentionKernel.h"
#include "veoAttentionTile.h"

#include <cmath>
#include <string>

namespace veo
{
namespace
{

constexpr int kWARPS = 4;
constexpr int kTHREADS = kWARPS * 32;
constexpr int kQ_PER_WARP = 8;
constexpr int kBQ = kWARPS * kQ_PER_WARP; // queries per CTA
constexpr int kBK = 32;                   // keys per tile: one per lane

constexpr int kBS = kBK + 1; // bias block row stride: a warp reads a column without bank conflicts

template <int D, bool kBIAS>
constexpr int smemBytes()
{
    return (kBQ * D + kBK * (D + 1) + kBK * D + (kBIAS ? kBQ * kBS : 0)) * static_cast<int>(sizeof(float));
}

//! The lowest finite value of the I/O type: where a -inf mask in the bias is clamped to.
template <typename T>
struct Lowest;
template <>
struct Lowest<float>
{
    static constexpr float kVALUE = tile::kF32_LOWEST;
};
template <>
struct Lowest<__half>
{
    static constexpr float kVALUE = tile::kF16_LOWEST;
};

struct BiasArgs
{
    void const* data; //!< (batch, heads, S, S) table of T, or NULL
    int batch;        //!< attention batch b reads row b % batch
    int heads;        //!< 1 (shared by the heads) or the number of heads
};

template <typename T, int D, bool kBIAS>
__global__ void __launch_bounds__(kTHREADS) attentionKernel(
    T const* __restrict__ qkv, T* __restrict__ out, int seq, int heads, float scaleLog2e, BiasArgs biasArgs)
{
    constexpr int kDPL = (D + 31) / 32; // output columns per lane
    constexpr int kKS = D + 1;          // K row stride: lanes read a column without bank conflicts
    extern __shared__ float smem[];
    float* sQ = smem;            // [kBQ][D], pre-scaled by scale*log2(e)
    float* sK = sQ + kBQ * D;    // [kBK][kKS]
    float* sV = sK + kBK * kKS;  // [kBK][D]
    float* sB = sV + kBK * D;    // [kBQ][kBS], with a bias: the tile's block of it

    int const tid = threadIdx.x;
    int const warp = tid / 32;
    int const lane = tid % 32;
    int const q0 = blockIdx.x * kBQ;
    int const h = blockIdx.y;
    int const b = blockIdx.z;
    int const e = heads * D;
    size_t const rowStride = 3 * static_cast<size_t>(e);
    T const* base = qkv + static_cast<size_t>(b) * seq * rowStride + static_cast<size_t>(h) * D;

    for (int i = tid; i < kBQ * D; i += kTHREADS)
    {
        int const r = i / D;
        int const c = i % D;
        int const q = q0 + r;
        sQ[i] = q < seq ? toFloat(base[q * rowStride + c]) * scaleLog2e : 0.F;
    }

    tile::RowState row[kQ_PER_WARP];
    float acc[kQ_PER_WARP][kDPL];
#pragma unroll
    for (int q = 0; q < kQ_PER_WARP; ++q)
    {
        row[q] = tile::rowStart();
#pragma unroll
        for (int i = 0; i < kDPL; ++i)
        {
            acc[q][i] = 0.F;
        }
    }
    float const* myQ = sQ + warp * kQ_PER_WARP * D;
    T const* bias = nullptr;
    if constexpr (kBIAS)
    {
        bias = static_cast<T const*>(biasArgs.data) + tile::biasOffset(b, h, seq, biasArgs.batch, biasArgs.heads);
    }

    for (int k0 = 0; k0 < seq; k0 += kBK)
    {
        __syncthreads(); // the previous tile is consumed (and, the first time, Q is loaded)
        for (int i = tid; i < kBK * D; i += kTHREADS)
        {
            int const r = i / D;
            int const c = i % D;
            int const k = k0 + r;
            float kv = 0.F;
            float vv = 0.F;
            if (k < seq)
            {
                T const* row = base + k * rowStride + c;
                kv = toFloat(row[e]);
                vv = toFloat(row[2 * e]);
            }
            sK[r * kKS + c] = kv;
            sV[r * D + c] = vv;
        }
        if constexpr (kBIAS)
        {
            for (int i = tid; i < kBQ * kBK; i += kTHREADS)
            {
                int const r = i / kBK;
                int const c = i % kBK;
                int const q = q0 + r;
                int const k = k0 + c;
                sB[r * kBS + c] = q < seq && k < seq ? toFloat(bias[static_cast<size_t>(q) * seq + k]) : 0.F;
            }
        }
        __syncthreads();

        int const key = k0 + lane;
        bool const valid = key < seq;
        // Scores of key (k0 + lane) against the warp's queries, in log2 units.
        float s[kQ_PER_WARP];
        tile::scoreKey<D>(myQ, sK + lane * kKS, s);
        if constexpr (kBIAS)
        {
            float const* bq = sB + warp * kQ_PER_WARP * kBS + lane; // plus the bias of that key
#pragma unroll
            for (int q = 0; q < kQ_PER_WARP; ++q)
            {
                s[q] = tile::biasedLogit(s[q], bq[q * kBS], Lowest<T>::kVALUE);
            }
        }
        // Online softmax: at least one key of the tile is valid, so the new max is finite.
#pragma unroll
        for (int q = 0; q < kQ_PER_WARP; ++q)
        {
            float const sq = tile::maskedLogit(s[q], valid);
            float const alpha = tile::rowRescale(row[q], warpMax(sq)); // 0 on the first tile
            float const p = tile::prob(row[q], sq);
            tile::rowAccumulate(row[q], alpha, warpSum(p));
            s[q] = p;
            tile::accRescale(acc[q], alpha);
        }
        // acc += P V: lane holds columns lane + 32*i; p of key j comes from lane j.
#pragma unroll 4
        for (int j = 0; j < kBK; ++j)
        {
            float v[kDPL];
#pragma unroll
            for (int i = 0; i < kDPL; ++i)
            {
                int const d = lane + 32 * i;
                v[i] = d < D ? sV[j * D + d] : 0.F;
            }
#pragma unroll
            for (int q = 0; q < kQ_PER_WARP; ++q)
            {
                float const p = __shfl_sync(0xffffffffU, s[q], j);
#pragma unroll
                for (int i = 0; i < kDPL; ++i)
                {
                    acc[q][i] = tile::accUpdate(acc[q][i], p, v[i]);
                }
            }
        }
    }

#pragma unroll
    for (int q = 0; q < kQ_PER_WARP; ++q)
    {
        int const qi = q0 + warp * kQ_PER_WARP + q;
        if (qi >= seq)
        {
            continue;
        }
        T* o = out + (static_cast<size_t>(b) * seq + qi) * e + static_cast<size_t>(h) * D;
#pragma unroll
        for (int i = 0; i < kDPL; ++i)
        {
            int const d = lane + 32 * i;
            if (d < D)
            {
                o[d] = fromFloat<T>(tile::rowOutput(row[q], acc[q][i]));
            }
        }
    }
}

template <typename T, int D, bool kBIAS>
int launchOne(
    void const* qkv, void* out, int batch, int seq, int heads, float scale, BiasArgs const& bias, cudaStream_t stream)
{
    constexpr int kSmem = smemBytes<D, kBIAS>();
    static SmemOptIn sOptIn; // the attribute is set once per device, not per launch
    auto kernel = attentionKernel<T, D, kBIAS>;
    int const status = reserveSharedMemory(kernel, sOptIn, kSmem, kSmem, "veoAttention");
    if (status != VEO_KERNEL_OK)
    {
        return status;
    }
    dim3 const grid((seq + kBQ - 1) / kBQ, heads, batch);
    float const scaleLog2e = scale * tile::kLOG2E;
    kernel<<<grid, kTHREADS, kSmem, stream>>>(
        static_cast<T const*>(qkv), static_cast<T*>(out), seq, heads, scaleLog2e, bias);
    return checkLaunch("veoAttention");
}

template <typename T, int D>
int launch(
    void const* qkv, void* out, int batch, int seq, int heads, float scale, BiasArgs const& bias, cudaStream_t stream)
{
    return bias.data != nullptr ? launchOne<T, D, true>(qkv, out, batch, seq, heads, scale, bias, stream)
                                : launchOne<T, D, false>(qkv, out, batch, seq, heads, scale, bias, stream);
}

template <typename T>
int dispatch(void const* qkv, void* out, int batch, int seq, int heads, int headDim, float scale,
    BiasArgs const& bias, cudaStream_t s)
{
    switch (headDim)
    {
    case 32: return launch<T, 32>(qkv, out, batch, seq, heads, scale, bias, s);
    case 48: return launch<T, 48>(qkv, out, batch, seq, heads, scale, bias, s);
    case 64: return launch<T, 64>(qkv, out, batch, seq, heads, scale, bias, s);
    case 80: return launch<T, 80>(qkv, out, batch, seq, heads, scale, bias, s);
    case 96: return launch<T, 96>(qkv, out, batch, seq, heads, scale, bias, s);
    case 128: return launch<T, 128>(qkv, out, batch, seq, heads, scale, bias, s);
    default:
        return kernelFail(VEO_KERNEL_UNSUPPORTED,
            "veoAttention: no kernel for head_dim " + std::to_string(headDim)
                + "; supported: 32, 48, 64, 80, 96, 128 (use the ONNX reference path for others)");
    }
}

} // namespace
} // namespace veo

extern "C" int veoAttentionSupportsHeadDim(int head_dim)
{
    for (int d : VEO_ATTENTION_HEAD_DIMS)
    {
        if (d == head_dim)
        {
            return 1;
        }
    }
    return 0;
}

extern "C" int veoAttentionForward(void const* qkv, void* out, int dtype, int batch, int seq, int num_heads,
    int head_dim, float scale, void* stream)
{
    return veoAttentionForwardBias(qkv, nullptr, 1, 1, out, dtype, batch, seq, num_heads, head_dim, scale, stream);
}

extern "C" int veoAttentionForwardBias(void const* qkv, void const* bias, int bias_batch, int bias_heads, void* out,
    int dtype, int batch, int seq, int num_heads, int head_dim, float scale, void* stream)
{
    using veo::kernelFail;
    if (qkv == nullptr || out == nullptr)
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT, "veoAttention: qkv and out must be device pointers, got NULL");
    }
    if (batch < 1 || seq < 1 || num_heads < 1 || head_dim < 1 || batch > 65535 || num_heads > 65535)
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
            "veoAttention: batch=" + std::to_string(batch) + " seq=" + std::to_string(seq) + " num_heads="
                + std::to_string(num_heads) + " head_dim=" + std::to_string(head_dim)
                + "; expected all >= 1 and batch, num_heads <= 65535");
    }
    if (bias != nullptr
        && (bias_batch < 1 || batch % bias_batch != 0 || (bias_heads != 1 && bias_heads != num_heads)))
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
            "veoAttention: bias of " + std::to_string(bias_batch) + " x " + std::to_string(bias_heads)
                + " tables for batch=" + std::to_string(batch) + " num_heads=" + std::to_string(num_heads)
                + "; expected a bias batch dividing the batch and 1 or num_heads bias heads");
    }
    if (!(scale >= 0.F) || std::isinf(scale))
    {
        return kernelFail(VEO_KERNEL_INVALID_ARGUMENT, "veoAttention: scale must be finite and >= 0 (0 = 1/sqrt(D))");
    }
    float const s = scale > 0.F ? scale : 1.F / std::sqrt(static_cast<float>(head_dim));
    auto const st = static_cast<cudaStream_t>(stream);
    veo::BiasArgs const b{bias, bias_batch, bias_heads};
    if (dtype == VEO_DTYPE_FLOAT32)
    {
        return veo::dispatch<float>(qkv, out, batch, seq, num_heads, head_dim, s, b, st);
    }
    if (dtype == VEO_DTYPE_FLOAT16)
    {
        return veo::dispatch<__half>(qkv, out, batch, seq, num_heads, head_dim, s, b, st);
    }
    return kernelFail(VEO_KERNEL_INVALID_ARGUMENT,
        "veoAttention: dtype " + std::to_string(dtype) + " unknown; expected 0 (float32) or 1 (float16)");
}
