// Tests of the TensorRT-free plugin logic: attributes against the spec, input counts, shape rules.
#include "launchChecks.h"
#include "testHarness.h"
#include "veoAttentionConfig.h"
#include "veoAttentionSpec.h"
#include "veoPatchEmbedLayerNormConfig.h"
#include "veoPatchEmbedLayerNormSpec.h"

#include <cmath>
#include <cstring>

using veo::AttentionConfig;
using veo::Field;
using veo::Fields;
using veo::PatchEmbedConfig;
using veo::PluginConfigError;
using veo::Shape;

namespace
{
Field intField(char const* name, std::vector<int64_t> v)
{
    Field f;
    f.name = name;
    f.ints = std::move(v);
    return f;
}
Field floatField(char const* name, double v)
{
    Field f;
    f.name = name;
    f.floats = {v};
    f.isFloat = true;
    return f;
}
} // namespace

VEO_TEST(spec_constants)
{
    namespace a = veo::spec::veoAttention;
    namespace p = veo::spec::veoPatchEmbedLayerNorm;
    VEO_CHECK_EQ(std::string(a::kNAME), std::string("VeoAttention"));
    VEO_CHECK_EQ(std::string(a::kVERSION), std::string("2"));
    VEO_CHECK_EQ(a::kNB_VERSIONS, 2);
    VEO_CHECK_EQ(std::string(a::kVERSIONS[0]), std::string("1"));
    VEO_CHECK_EQ(a::kNB_INPUTS_MAX_V1, 1);
    VEO_CHECK_EQ(a::kNB_INPUTS_MIN_V2, 1);
    VEO_CHECK_EQ(a::kNB_INPUTS_MAX_V2, 2);
    VEO_CHECK_EQ(std::string(a::kNAMESPACE), std::string("veo"));
    VEO_CHECK_EQ(std::string(p::kNAME), std::string("VeoPatchEmbedLayerNorm"));
    VEO_CHECK_EQ(p::kNB_INPUTS_MIN, 3);
    VEO_CHECK_EQ(p::kNB_INPUTS_MAX, 7);
    VEO_CHECK_EQ(p::kNB_OUTPUTS_MAX, 2);
}

VEO_TEST(attention_fields)
{
    auto c = AttentionConfig::fromFields({intField("num_heads", {12}), intField("head_dim", {64})});
    VEO_CHECK_EQ(c.numHeads, 12);
    VEO_CHECK_EQ(c.scale, 0.F);
    VEO_CHECK(std::fabs(c.effectiveScale() - 0.125F) < 1e-7F);
    VEO_CHECK(c.kernelSupported());
    auto back = AttentionConfig::fromFields(c.toFields()); // round trip through the serialized fields
    VEO_CHECK_EQ(back.headDim, 64);
    VEO_CHECK_THROWS(AttentionConfig::fromFields({intField("num_heads", {12})}), PluginConfigError,
        "VeoAttention: required attribute 'head_dim' is missing");
    VEO_CHECK_THROWS(AttentionConfig::fromFields({intField("num_heads", {0}), intField("head_dim", {64})}),
        PluginConfigError, "attribute 'num_heads' is 0, expected >= 1");
    VEO_CHECK_THROWS(
        AttentionConfig::fromFields({intField("num_heads", {2}), intField("head_dim", {64}), intField("heads", {1})}),
        PluginConfigError, "unknown attribute 'heads'; expected one of: num_heads head_dim scale");
    VEO_CHECK_THROWS(AttentionConfig::fromFields(
                         {intField("num_heads", {2}), intField("head_dim", {64}), floatField("scale", -1.0)}),
        PluginConfigError, "attribute 'scale' is -1");
    auto odd = AttentionConfig::fromFields({intField("num_heads", {2}), intField("head_dim", {40})});
    VEO_CHECK(!odd.kernelSupported());
}

VEO_TEST(attention_shapes)
{
    auto c = AttentionConfig::fromFields({intField("num_heads", {3}), intField("head_dim", {64})});
    auto out = c.outputShape(Shape{{-1, 197, 576}});
    VEO_CHECK_EQ(out.str(), std::string("(-1, 197, 192)"));
    VEO_CHECK_THROWS(c.outputShape(Shape{{1, 197, 575}}), PluginConfigError,
        "last dim 575, expected 3*num_heads*head_dim = 576");
    VEO_CHECK_THROWS(c.outputShape(Shape{{197, 576}}), PluginConfigError, "expected rank 3");
}

VEO_TEST(attention_bias_layout_and_versions)
{
    auto c = AttentionConfig::fromFields({intField("num_heads", {2}), intField("head_dim", {32})});
    // BEiT: one table for every batch; Swin: a table per window of an image, the batch is images x windows
    auto beit = c.biasLayout(Shape{{-1, 17, 192}}, Shape{{1, 2, 17, 17}});
    VEO_CHECK_EQ(beit.batch, 1);
    VEO_CHECK_EQ(beit.heads, 2);
    auto swin = c.biasLayout(Shape{{8, 49, 192}}, Shape{{4, 1, 49, 49}});
    VEO_CHECK_EQ(swin.batch, 4);
    VEO_CHECK_EQ(swin.heads, 1);
    VEO_CHECK_THROWS(c.biasLayout(Shape{{6, 49, 192}}, Shape{{4, 2, 49, 49}}), PluginConfigError,
        "its first dim 4 must divide the batch 6");
    VEO_CHECK_THROWS(c.biasLayout(Shape{{-1, 49, 192}}, Shape{{1, 3, 49, 49}}), PluginConfigError,
        "its head dim 3 must be 1 or num_heads = 2");
    VEO_CHECK_THROWS(c.biasLayout(Shape{{-1, 50, 192}}, Shape{{1, 2, 49, 49}}), PluginConfigError,
        "must be the sequence length 50");
    VEO_CHECK_THROWS(c.biasLayout(Shape{{-1, 49, 192}}, Shape{{2, 49, 49}}), PluginConfigError, "expected rank 4");
    VEO_CHECK_EQ(AttentionConfig::inputCounts("1").second, 1);
    VEO_CHECK_EQ(AttentionConfig::inputCounts("2").second, 2);
    VEO_CHECK_THROWS(AttentionConfig::inputCounts("3"), PluginConfigError, "no version '3'");
}

namespace
{
Fields patchFields(std::vector<int64_t> patch, int p, int pos, int ln)
{
    return {intField("patch_size", std::move(patch)), intField("in_channels", {3}), intField("embed_dim", {192}),
        intField("num_prefix_tokens", {p}), intField("has_pos_embed", {pos}), intField("has_layernorm", {ln})};
}
} // namespace

VEO_TEST(patch_embed_fields_and_counts)
{
    auto c = PatchEmbedConfig::fromFields({intField("patch_size", {16, 16}), intField("in_channels", {3}),
        intField("embed_dim", {192})});
    VEO_CHECK_EQ(c.numPrefixTokens, 0); // defaults from the spec
    VEO_CHECK_EQ(c.hasPosEmbed, 1);
    VEO_CHECK_EQ(c.hasLayerNorm, 1);
    VEO_CHECK(std::fabs(c.epsilon - 1e-6F) < 1e-12F);
    VEO_CHECK_EQ(c.nbInputs(), 6);
    VEO_CHECK_EQ(c.nbOutputs(), 2);
    for (int p = 0; p <= 2; ++p)
    {
        for (int pos = 0; pos <= 1; ++pos)
        {
            for (int ln = 0; ln <= 1; ++ln)
            {
                auto k = PatchEmbedConfig::fromFields(patchFields({16, 16}, p, pos, ln));
                VEO_CHECK_EQ(k.nbInputs(), 3 + (p > 0) + pos + 2 * ln);
                VEO_CHECK_EQ(k.nbOutputs(), 1 + ln);
                VEO_CHECK_EQ(k.posIndex(), pos ? 3 + (p > 0) : -1);
                VEO_CHECK_EQ(k.lnBiasIndex(), ln ? k.nbInputs() - 1 : -1);
            }
        }
    }
    VEO_CHECK_THROWS(PatchEmbedConfig::fromFields(patchFields({16}, 0, 1, 1)), PluginConfigError,
        "'patch_size' has 1 values, expected 2");
    VEO_CHECK_THROWS(PatchEmbedConfig::fromFields(patchFields({16, 16}, 3, 1, 1)), PluginConfigError,
        "'num_prefix_tokens' is 3, expected in [0, 2]");
}

VEO_TEST(patch_embed_shapes)
{
    auto c = PatchEmbedConfig::fromFields(patchFields({16, 16}, 1, 1, 1));
    std::vector<Shape> in{Shape{{8, 3, 224, 224}}, Shape{{192, 3, 16, 16}}, Shape{{192}}, Shape{{1, 1, 192}},
        Shape{{1, 197, 192}}, Shape{{192}}, Shape{{192}}};
    auto out = c.outputShapes(in);
    VEO_CHECK_EQ(out.size(), 2u);
    VEO_CHECK_EQ(out[1].str(), std::string("(8, 197, 192)"));
    auto k = c.kernelParams(in);
    VEO_CHECK_EQ(k.pos_mode, int(VEO_POS_ALL));
    VEO_CHECK_EQ(k.patch_t, 1);
    in[4] = Shape{{1, 196, 192}};
    VEO_CHECK_EQ(c.kernelParams(in).pos_mode, int(VEO_POS_PATCHES));
    in[4] = Shape{{1, 190, 192}};
    VEO_CHECK_THROWS(c.outputShapes(in), PluginConfigError, "pos_embed covers 190 tokens, expected 197");
    in[4] = Shape{{1, 197, 192}};
    in[0] = Shape{{8, 3, 224, 220}};
    VEO_CHECK_THROWS(c.outputShapes(in), PluginConfigError, "extent 220 on axis 3, not divisible by patch size 16");
    in[0] = Shape{{-1, 3, 224, 224}}; // dynamic batch passes at build time
    VEO_CHECK_EQ(c.outputShapes(in)[0].str(), std::string("(-1, 197, 192)"));
    in.pop_back();
    VEO_CHECK_THROWS(c.outputShapes(in), PluginConfigError, "node has 6 inputs, expected 7");

    auto v = PatchEmbedConfig::fromFields(patchFields({2, 16, 16}, 0, 0, 0));
    std::vector<Shape> vin{Shape{{1, 3, 8, 224, 224}}, Shape{{192, 3, 2, 16, 16}}, Shape{{192}}};
    VEO_CHECK_EQ(v.outputShapes(vin)[0].str(), std::string("(1, 784, 192)"));
    auto vk = v.kernelParams(vin);
    VEO_CHECK_EQ(vk.in_t, 8);
    VEO_CHECK_EQ(vk.patch_t, 2);
    VEO_CHECK_EQ(vk.has_layernorm, 0);
    vin[1] = Shape{{192, 3, 16, 16}};
    VEO_CHECK_THROWS(v.outputShapes(vin), PluginConfigError, "input weight has shape (192, 3, 16, 16), expected");
}

VEO_TEST(patch_embed_shared_memory_counts_its_static_part)
{
    namespace pe = veo::patch_embed;
    int const optin = 163 * 1024; // sm_80 / sm_87 sharedMemPerBlockOptin
    // 1518 is the largest embed_dim whose dynamic + static shared memory fits the 48 KiB default; 1519..1527
    // used to skip the opt-in because only the dynamic part was compared with 48 KiB.
    VEO_CHECK(!veo::smemPlan(pe::dynamicSmemBytes(1518), pe::kSTATIC_SMEM_BYTES, optin).optIn);
    for (int e = 1519; e <= 1527; ++e)
    {
        VEO_CHECK(pe::dynamicSmemBytes(e) <= veo::kDEFAULT_SMEM_BYTES); // the old check said "no opt-in"
        VEO_CHECK(veo::smemPlan(pe::dynamicSmemBytes(e), pe::kSTATIC_SMEM_BYTES, optin).optIn);
    }
    auto const widest = veo::smemPlan(pe::dynamicSmemBytes(VEO_PATCH_EMBED_MAX_EMBED_DIM), pe::kSTATIC_SMEM_BYTES, optin);
    VEO_CHECK(widest.optIn && widest.fits);
    VEO_CHECK(!veo::smemPlan(pe::dynamicSmemBytes(VEO_PATCH_EMBED_MAX_EMBED_DIM), pe::kSTATIC_SMEM_BYTES, 48 * 1024).fits);
    VEO_CHECK_EQ(pe::kSTATIC_SMEM_BYTES, 288);
}

VEO_TEST(minimum_sm_is_enforced_with_a_clear_error)
{
    namespace a = veo::spec::veoAttention;
    namespace p = veo::spec::veoPatchEmbedLayerNorm;
    VEO_CHECK_EQ(a::kMIN_SM, 80);
    VEO_CHECK_EQ(p::kMIN_SM, 80);
    VEO_CHECK_EQ(veo::minSmProblem(a::kNAME, 87, a::kMIN_SM), std::string()); // Orin
    VEO_CHECK_EQ(veo::minSmProblem(a::kNAME, 80, a::kMIN_SM), std::string()); // A100
    VEO_CHECK_EQ(veo::minSmProblem(p::kNAME, 75, p::kMIN_SM),
        std::string("VeoPatchEmbedLayerNorm needs a GPU of compute capability 8.0 or newer (sm_80), this one is "
                    "sm_75; build the engine without the plugins (veo-edge engine build --engine plain)"));
}

VEO_TEST_MAIN()
