// The VeoAttention kernel's per-tile math (veoAttentionTile.h) in the kernel's structure on the host
// (attentionTileHost.cpp), against a plain attention computed here in double; the tolerance is K times
// the error of the same plain attention in float (tests/plugins/test_attention_tile_math.py compares
// with the numpy reference, FP16 included).
#include "attentionTileHost.h"
#include "testHarness.h"
#include "veoAttentionTile.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

namespace
{
struct Problem
{
    int batch, seq, heads, headDim, biasBatch, biasHeads;
    bool withBias;
};

//! softmax(Q K^T * scale + clamp(bias)) V, one row at a time, in T (float or double).
template <typename T>
std::vector<T> plain(Problem const& p, std::vector<float> const& qkv, std::vector<float> const& bias, float scale)
{
    int const e = p.heads * p.headDim;
    std::vector<T> out(static_cast<std::size_t>(p.batch) * p.seq * e);
    std::vector<T> logits(p.seq);
    for (int b = 0; b < p.batch; ++b)
    {
        for (int h = 0; h < p.heads; ++h)
        {
            for (int i = 0; i < p.seq; ++i)
            {
                auto at = [&](int t, int part, int d) {
                    return static_cast<T>(qkv[(static_cast<std::size_t>(b) * p.seq + t) * 3 * e + part * e + h * p.headDim + d]);
                };
                T m = -INFINITY;
                for (int j = 0; j < p.seq; ++j)
                {
                    T s = 0;
                    for (int d = 0; d < p.headDim; ++d)
                    {
                        s += at(i, 0, d) * at(j, 1, d);
                    }
                    s *= scale;
                    if (p.withBias)
                    {
                        long long const off = veo::tile::biasOffset(b, h, p.seq, p.biasBatch, p.biasHeads);
                        s += std::max(static_cast<T>(bias[off + static_cast<long long>(i) * p.seq + j]), static_cast<T>(-FLT_MAX));
                    }
                    logits[j] = std::max(s, static_cast<T>(-FLT_MAX));
                    m = std::max(m, logits[j]);
                }
                T sum = 0;
                for (int j = 0; j < p.seq; ++j)
                {
                    logits[j] = std::exp(logits[j] - m);
                    sum += logits[j];
                }
                for (int d = 0; d < p.headDim; ++d)
                {
                    T acc = 0;
                    for (int j = 0; j < p.seq; ++j)
                    {
                        acc += logits[j] * at(j, 2, d);
                    }
                    out[(static_cast<std::size_t>(b) * p.seq + i) * e + h * p.headDim + d] = acc / sum;
                }
            }
        }
    }
    return out;
}

void check(Problem const& p)
{
    std::mt19937 gen(p.seq * 7 + p.headDim);
    std::normal_distribution<float> normal;
    int const e = p.heads * p.headDim;
    std::vector<float> qkv(static_cast<std::size_t>(p.batch) * p.seq * 3 * e);
    for (auto& x : qkv)
    {
        x = normal(gen);
    }
    std::vector<float> bias(static_cast<std::size_t>(p.biasBatch) * p.biasHeads * p.seq * p.seq);
    for (std::size_t i = 0; i < bias.size(); ++i)
    {
        int const row = static_cast<int>(i / p.seq % p.seq);
        int const col = static_cast<int>(i % p.seq);
        bias[i] = row == 0 ? -INFINITY : (row % 3 == 2 && col % 2 == 0 ? -100.F : normal(gen)); // row 0 masked
    }
    float const scale = 0.25F;
    std::vector<float> got(static_cast<std::size_t>(p.batch) * p.seq * e);
    VEO_CHECK_EQ(veoAttentionTileHost(qkv.data(), p.withBias ? bias.data() : nullptr, p.biasBatch, p.biasHeads,
                     got.data(), p.batch, p.seq, p.heads, p.headDim, scale, -FLT_MAX),
        0);
    auto const ref = plain<double>(p, qkv, bias, scale);
    auto const low = plain<float>(p, qkv, bias, scale);
    double err = 0;
    double base = 0;
    double peak = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
    {
        VEO_CHECK(std::isfinite(got[i]));
        err = std::max(err, std::fabs(got[i] - ref[i]));
        base = std::max(base, std::fabs(low[i] - ref[i]));
        peak = std::max(peak, std::fabs(ref[i]));
    }
    double const tol = 8 * base + 1e-5 * peak;
    if (!(err <= tol))
    {
        throw veo::test::Failure{"max abs " + std::to_string(err) + " > tolerance " + std::to_string(tol)};
    }
}
} // namespace

VEO_TEST(plain_attention_over_several_tiles)
{
    check(Problem{2, 50, 2, 48, 1, 1, false}); // 2 query and 2 key tiles, the last one partial
}

VEO_TEST(bias_per_head_and_per_window)
{
    check(Problem{1, 17, 2, 32, 1, 2, true}); // one table for the batch (BEiT)
    check(Problem{6, 40, 3, 80, 3, 1, true}); // 3 windows an image, shared by the heads (Swin masks)
}

VEO_TEST(a_row_masked_everywhere_stays_finite)
{
    // every key of the row at float32's lowest: equal logits, a uniform row, never 0/0
    veo::tile::RowState r = veo::tile::rowStart();
    float const logit = veo::tile::biasedLogit(3.F, -INFINITY, -FLT_MAX);
    VEO_CHECK_EQ(logit, -FLT_MAX);
    float const alpha = veo::tile::rowRescale(r, logit);
    VEO_CHECK_EQ(alpha, 0.F);
    veo::tile::rowAccumulate(r, alpha, 32 * veo::tile::prob(r, logit));
    VEO_CHECK_EQ(r.l, 32.F);
    // FP16 I/O: a -inf mask is FP16's lowest, so a fully masked row keeps its scores' softmax
    VEO_CHECK_EQ(veo::tile::biasedLogit(0.F, -INFINITY, veo::tile::kF16_LOWEST), -65504.F * veo::tile::kLOG2E);
}

VEO_TEST_MAIN()
