// The VeoAttention kernel's structure on the host (see attentionTileHost.h). Each step names the kernel
// line it stands for; the arithmetic itself is the kernel's, from veoAttentionTile.h.
#include "attentionTileHost.h"

#include "veoAttentionTile.h"

#include <cmath>
#include <cstddef>
#include <vector>

namespace
{
using namespace veo::tile;

constexpr int kWARPS = 4;
constexpr int kQ_PER_WARP = 8;
constexpr int kBQ = kWARPS * kQ_PER_WARP;
constexpr int kBK = 32;
constexpr int kLANES = 32;

//! __shfl_xor_sync butterflies: every lane ends with the same value, summed in the kernel's order.
float warpSum(float const (&v)[kLANES])
{
    float x[kLANES];
    for (int i = 0; i < kLANES; ++i)
    {
        x[i] = v[i];
    }
    for (int o = 16; o > 0; o >>= 1)
    {
        float y[kLANES];
        for (int i = 0; i < kLANES; ++i)
        {
            y[i] = x[i] + x[i ^ o];
        }
        for (int i = 0; i < kLANES; ++i)
        {
            x[i] = y[i];
        }
    }
    return x[0];
}

float warpMax(float const (&v)[kLANES])
{
    float m = v[0];
    for (int i = 1; i < kLANES; ++i)
    {
        m = fmaxf(m, v[i]);
    }
    return m;
}

template <int D>
void run(float const* qkv, float const* bias, int biasBatch, int biasHeads, float* out, int batch, int seq, int heads,
    float scaleLog2e, float lowest)
{
    constexpr int kDPL = (D + 31) / 32;
    int const e = heads * D;
    std::size_t const rowStride = 3 * static_cast<std::size_t>(e);
    std::vector<float> sQ(kBQ * D);
    std::vector<float> sK(kBK * D);
    std::vector<float> sV(kBK * D);
    std::vector<float> sB(kBQ * kBK);
    for (int b = 0; b < batch; ++b)
    {
        for (int h = 0; h < heads; ++h)
        {
            float const* base = qkv + static_cast<std::size_t>(b) * seq * rowStride + static_cast<std::size_t>(h) * D;
            float const* biasBH = bias ? bias + biasOffset(b, h, seq, biasBatch, biasHeads) : nullptr;
            for (int q0 = 0; q0 < seq; q0 += kBQ) // one CTA
            {
                for (int i = 0; i < kBQ * D; ++i) // sQ, pre-scaled
                {
                    int const q = q0 + i / D;
                    sQ[i] = q < seq ? base[q * rowStride + i % D] * scaleLog2e : 0.F;
                }
                RowState row[kWARPS][kQ_PER_WARP];
                float acc[kWARPS][kLANES][kQ_PER_WARP][kDPL] = {};
                for (int w = 0; w < kWARPS; ++w)
                {
                    for (int q = 0; q < kQ_PER_WARP; ++q)
                    {
                        row[w][q] = rowStart();
                    }
                }
                for (int k0 = 0; k0 < seq; k0 += kBK)
                {
                    for (int i = 0; i < kBK * D; ++i) // sK, sV
                    {
                        int const k = k0 + i / D;
                        sK[i] = k < seq ? base[k * rowStride + e + i % D] : 0.F;
                        sV[i] = k < seq ? base[k * rowStride + 2 * e + i % D] : 0.F;
                    }
                    for (int i = 0; biasBH && i < kBQ * kBK; ++i) // sB: the tile's bias block
                    {
                        int const q = q0 + i / kBK;
                        int const k = k0 + i % kBK;
                        sB[i] = q < seq && k < seq ? biasBH[static_cast<std::size_t>(q) * seq + k] : 0.F;
                    }
                    for (int w = 0; w < kWARPS; ++w)
                    {
                        float const* myQ = sQ.data() + w * kQ_PER_WARP * D;
                        float p[kLANES][kQ_PER_WARP]; // lane j's probabilities: what __shfl_sync hands round
                        float logits[kQ_PER_WARP][kLANES];
                        for (int lane = 0; lane < kLANES; ++lane)
                        {
                            float s[kQ_PER_WARP];
                            scoreKey<D>(myQ, sK.data() + lane * D, s);
                            for (int q = 0; q < kQ_PER_WARP; ++q)
                            {
                                float const logit = biasBH
                                    ? biasedLogit(s[q], sB[(w * kQ_PER_WARP + q) * kBK + lane], lowest)
                                    : s[q];
                                logits[q][lane] = maskedLogit(logit, k0 + lane < seq);
                            }
                        }
                        for (int q = 0; q < kQ_PER_WARP; ++q)
                        {
                            float const alpha = rowRescale(row[w][q], warpMax(logits[q]));
                            float probs[kLANES];
                            for (int lane = 0; lane < kLANES; ++lane)
                            {
                                probs[lane] = prob(row[w][q], logits[q][lane]);
                                p[lane][q] = probs[lane];
                                accRescale(acc[w][lane][q], alpha);
                            }
                            rowAccumulate(row[w][q], alpha, warpSum(probs));
                        }
                        for (int lane = 0; lane < kLANES; ++lane) // acc += P V, keys in lane order
                        {
                            for (int j = 0; j < kBK; ++j)
                            {
                                for (int q = 0; q < kQ_PER_WARP; ++q)
                                {
                                    for (int i = 0; i < kDPL; ++i)
                                    {
                                        int const d = lane + 32 * i;
                                        float const v = d < D ? sV[j * D + d] : 0.F;
                                        acc[w][lane][q][i] = accUpdate(acc[w][lane][q][i], p[j][q], v);
                                    }
                                }
                            }
                        }
                    }
                }
                for (int w = 0; w < kWARPS; ++w) // store
                {
                    for (int q = 0; q < kQ_PER_WARP; ++q)
                    {
                        int const qi = q0 + w * kQ_PER_WARP + q;
                        for (int lane = 0; qi < seq && lane < kLANES; ++lane)
                        {
                            for (int i = 0; i < kDPL; ++i)
                            {
                                int const d = lane + 32 * i;
                                if (d < D)
                                {
                                    out[(static_cast<std::size_t>(b) * seq + qi) * e + static_cast<std::size_t>(h) * D
                                        + d]
                                        = rowOutput(row[w][q], acc[w][lane][q][i]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

} // namespace

extern "C" int veoAttentionTileHost(float const* qkv, float const* bias, int bias_batch, int bias_heads, float* out,
    int batch, int seq, int heads, int head_dim, float scale, float lowest)
{
    if (bias != nullptr && (bias_batch < 1 || batch % bias_batch != 0 || (bias_heads != 1 && bias_heads != heads)))
    {
        return -1;
    }
    float const s = (scale > 0.F ? scale : 1.F / std::sqrt(static_cast<float>(head_dim))) * kLOG2E;
    switch (head_dim)
    {
    case 32: run<32>(qkv, bias, bias_batch, bias_heads, out, batch, seq, heads, s, lowest); return 0;
    case 48: run<48>(qkv, bias, bias_batch, bias_heads, out, batch, seq, heads, s, lowest); return 0;
    case 64: run<64>(qkv, bias, bias_batch, bias_heads, out, batch, seq, heads, s, lowest); return 0;
    case 80: run<80>(qkv, bias, bias_batch, bias_heads, out, batch, seq, heads, s, lowest); return 0;
    case 96: run<96>(qkv, bias, bias_batch, bias_heads, out, batch, seq, heads, s, lowest); return 0;
    case 128: run<128>(qkv, bias, bias_batch, bias_heads, out, batch, seq, heads, s, lowest); return 0;
    default: return -1;
    }
}
