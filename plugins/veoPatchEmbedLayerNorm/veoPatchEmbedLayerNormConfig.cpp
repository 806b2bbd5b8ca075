#include "veoPatchEmbedLayerNormConfig.h"

#include "veoPatchEmbedLayerNormSpec.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace veo
{
namespace pspec = veo::spec::veoPatchEmbedLayerNorm;

namespace
{
[[noreturn]] void fail(std::string const& what)
{
    throw PluginConfigError(std::string(pspec::kNAME) + ": " + what);
}

//! Checks a shape against expected extents (-1 in either = not checked).
void expectShape(char const* input, Shape const& got, std::vector<int64_t> const& want, char const* hint)
{
    bool ok = got.rank() == want.size();
    for (std::size_t i = 0; ok && i < want.size(); ++i)
    {
        ok = got[i] < 0 || want[i] < 0 || got[i] == want[i];
    }
    if (!ok)
    {
        fail(std::string("input ") + input + " has shape " + got.str() + ", expected " + Shape{want}.str() + "; "
            + hint);
    }
}
} // namespace

PatchEmbedConfig PatchEmbedConfig::fromFields(Fields const& fields)
{
    FieldReader r(fields, pspec::kNAME, {std::begin(pspec::kATTRIBUTE_NAMES), std::end(pspec::kATTRIBUTE_NAMES)});
    constexpr int64_t kMAX = std::numeric_limits<int32_t>::max();
    PatchEmbedConfig c;
    auto const patch = r.getInts(pspec::kATTR_PATCH_SIZE, pspec::kATTR_PATCH_SIZE_REQUIRED);
    if (patch.size() != 2 && patch.size() != 3)
    {
        fail("attribute 'patch_size' has " + std::to_string(patch.size())
            + " values, expected 2 ([ph, pw], images) or 3 ([pt, ph, pw], video tubelets)");
    }
    for (int64_t p : patch)
    {
        if (p < 1 || p > kMAX)
        {
            fail("attribute 'patch_size' has value " + std::to_string(p) + ", expected every value >= 1");
        }
        c.patchSize.push_back(static_cast<int32_t>(p));
    }
    c.inChannels = static_cast<int32_t>(
        r.getInt(pspec::kATTR_IN_CHANNELS, pspec::kATTR_IN_CHANNELS_REQUIRED, 0, pspec::kATTR_IN_CHANNELS_MIN, kMAX));
    c.embedDim = static_cast<int32_t>(
        r.getInt(pspec::kATTR_EMBED_DIM, pspec::kATTR_EMBED_DIM_REQUIRED, 0, pspec::kATTR_EMBED_DIM_MIN, kMAX));
    c.numPrefixTokens = static_cast<int32_t>(r.getInt(pspec::kATTR_NUM_PREFIX_TOKENS,
        pspec::kATTR_NUM_PREFIX_TOKENS_REQUIRED, pspec::kATTR_NUM_PREFIX_TOKENS_DEFAULT,
        pspec::kATTR_NUM_PREFIX_TOKENS_MIN, pspec::kATTR_NUM_PREFIX_TOKENS_MAX));
    c.hasPosEmbed = static_cast<int32_t>(r.getInt(pspec::kATTR_HAS_POS_EMBED, pspec::kATTR_HAS_POS_EMBED_REQUIRED,
        pspec::kATTR_HAS_POS_EMBED_DEFAULT, pspec::kATTR_HAS_POS_EMBED_MIN, pspec::kATTR_HAS_POS_EMBED_MAX));
    c.hasLayerNorm = static_cast<int32_t>(r.getInt(pspec::kATTR_HAS_LAYERNORM, pspec::kATTR_HAS_LAYERNORM_REQUIRED,
        pspec::kATTR_HAS_LAYERNORM_DEFAULT, pspec::kATTR_HAS_LAYERNORM_MIN, pspec::kATTR_HAS_LAYERNORM_MAX));
    c.epsilon = r.getFloat(pspec::kATTR_EPSILON, pspec::kATTR_EPSILON_REQUIRED, pspec::kATTR_EPSILON_DEFAULT);
    if (!(c.epsilon > 0.F) || std::isinf(c.epsilon))
    {
        std::ostringstream msg;
        msg << "attribute 'epsilon' is " << c.epsilon << ", expected a finite value > 0";
        fail(msg.str());
    }
    return c;
}

Fields PatchEmbedConfig::toFields() const
{
    Fields f(7);
    f[0].name = pspec::kATTR_PATCH_SIZE;
    f[0].ints.assign(patchSize.begin(), patchSize.end());
    f[1].name = pspec::kATTR_IN_CHANNELS;
    f[1].ints = {inChannels};
    f[2].name = pspec::kATTR_EMBED_DIM;
    f[2].ints = {embedDim};
    f[3].name = pspec::kATTR_NUM_PREFIX_TOKENS;
    f[3].ints = {numPrefixTokens};
    f[4].name = pspec::kATTR_HAS_POS_EMBED;
    f[4].ints = {hasPosEmbed};
    f[5].name = pspec::kATTR_HAS_LAYERNORM;
    f[5].ints = {hasLayerNorm};
    f[6].name = pspec::kATTR_EPSILON;
    f[6].floats = {epsilon};
    f[6].isFloat = true;
    return f;
}

int32_t PatchEmbedConfig::nbInputs() const
{
    int32_t const n = pspec::kNB_INPUTS_MIN + (numPrefixTokens > 0) + hasPosEmbed + 2 * hasLayerNorm;
    return n; // <= pspec::kNB_INPUTS_MAX by the attribute bounds
}

int64_t PatchEmbedConfig::numPatches(Shape const& x) const
{
    int64_t l = 1;
    for (int32_t i = 0; i < spatialRank(); ++i)
    {
        int64_t const extent = x[2 + i];
        if (extent < 0)
        {
            return -1;
        }
        if (extent % patchSize[i] != 0)
        {
            fail("input x has spatial extent " + std::to_string(extent) + " on axis " + std::to_string(2 + i)
                + ", not divisible by patch size " + std::to_string(patchSize[i])
                + "; resize the input to a multiple of the patch size");
        }
        l *= extent / patchSize[i];
    }
    return l;
}

std::vector<Shape> PatchEmbedConfig::outputShapes(std::vector<Shape> const& in) const
{
    if (static_cast<int32_t>(in.size()) != nbInputs())
    {
        fail("node has " + std::to_string(in.size()) + " inputs, expected " + std::to_string(nbInputs())
            + " = 3 + (num_prefix_tokens>0) + has_pos_embed + 2*has_layernorm (optional inputs are omitted)");
    }
    Shape const& x = in[0];
    if (static_cast<int32_t>(x.rank()) != 2 + spatialRank())
    {
        fail("input x has shape " + x.str() + ", expected rank " + std::to_string(2 + spatialRank())
            + " for patch_size of " + std::to_string(spatialRank()) + " values");
    }
    int64_t const e = embedDim;
    int64_t const p = numPrefixTokens;
    std::vector<int64_t> xs(x.rank(), -1);
    xs[1] = inChannels;
    expectShape("x", x, xs, "channels must equal in_channels");
    std::vector<int64_t> w{e, inChannels};
    w.insert(w.end(), patchSize.begin(), patchSize.end());
    expectShape("weight", in[1], w, "weight is (embed_dim, in_channels, *patch_size)");
    expectShape("bias", in[2], {e}, "bias is (embed_dim)");
    if (prefixIndex() >= 0)
    {
        expectShape("prefix_tokens", in[prefixIndex()], {1, p, e}, "prefix tokens are (1, num_prefix_tokens, E)");
    }
    int64_t const l = numPatches(x);
    if (posIndex() >= 0)
    {
        Shape const& pos = in[posIndex()];
        expectShape("pos_embed", pos, {1, -1, e}, "pos_embed is (1, P+L or L, E)");
        if (pos[1] >= 0 && l >= 0 && pos[1] != l && pos[1] != l + p)
        {
            fail("input pos_embed covers " + std::to_string(pos[1]) + " tokens, expected " + std::to_string(l + p)
                + " (prefix + patches) or " + std::to_string(l) + " (patches only)");
        }
    }
    if (hasLayerNorm)
    {
        expectShape("ln_weight", in[lnWeightIndex()], {e}, "ln_weight is (embed_dim)");
        expectShape("ln_bias", in[lnBiasIndex()], {e}, "ln_bias is (embed_dim)");
    }
    Shape const out{{x[0], l < 0 ? -1 : l + p, e}};
    return std::vector<Shape>(static_cast<std::size_t>(nbOutputs()), out);
}

veo_patch_embed_params PatchEmbedConfig::kernelParams(std::vector<Shape> const& in) const
{
    outputShapes(in);
    Shape const& x = in[0];
    for (int64_t d : x.d)
    {
        if (d < 0)
        {
            fail("input x has dynamic extents " + x.str() + " at enqueue time; expected concrete dims");
        }
    }
    bool const video = spatialRank() == 3;
    veo_patch_embed_params k{};
    k.batch = static_cast<int>(x[0]);
    k.in_channels = inChannels;
    k.embed_dim = embedDim;
    k.in_t = video ? static_cast<int>(x[2]) : 1;
    k.in_h = static_cast<int>(x[video ? 3 : 2]);
    k.in_w = static_cast<int>(x[video ? 4 : 3]);
    k.patch_t = video ? patchSize[0] : 1;
    k.patch_h = patchSize[video ? 1 : 0];
    k.patch_w = patchSize[video ? 2 : 1];
    k.num_prefix_tokens = numPrefixTokens;
    k.pos_mode = VEO_POS_NONE;
    if (posIndex() >= 0)
    {
        k.pos_mode = in[posIndex()][1] == numPatches(x) ? VEO_POS_PATCHES : VEO_POS_ALL;
    }
    k.has_layernorm = hasLayerNorm;
    k.epsilon = epsilon;
    return k;
}

} // namespace veo
