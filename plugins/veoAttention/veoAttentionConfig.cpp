#include "veoAttentionConfig.h"

#include "veoAttentionKernel.h"
#include "veoAttentionSpec.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace veo
{
namespace aspec = veo::spec::veoAttention;

AttentionConfig AttentionConfig::fromFields(Fields const& fields)
{
    FieldReader r(fields, aspec::kNAME, {std::begin(aspec::kATTRIBUTE_NAMES), std::end(aspec::kATTRIBUTE_NAMES)});
    constexpr int64_t kMAX = std::numeric_limits<int32_t>::max();
    AttentionConfig c;
    c.numHeads = static_cast<int32_t>(
        r.getInt(aspec::kATTR_NUM_HEADS, aspec::kATTR_NUM_HEADS_REQUIRED, 0, aspec::kATTR_NUM_HEADS_MIN, kMAX));
    c.headDim = static_cast<int32_t>(
        r.getInt(aspec::kATTR_HEAD_DIM, aspec::kATTR_HEAD_DIM_REQUIRED, 0, aspec::kATTR_HEAD_DIM_MIN, kMAX));
    c.scale = r.getFloat(aspec::kATTR_SCALE, aspec::kATTR_SCALE_REQUIRED, aspec::kATTR_SCALE_DEFAULT);
    if (!(c.scale >= 0.F) || std::isinf(c.scale))
    {
        std::ostringstream msg;
        msg << aspec::kNAME << ": attribute 'scale' is " << c.scale << ", expected a finite value >= 0 (0 = 1/sqrt(head_dim))";
        throw PluginConfigError(msg.str());
    }
    return c;
}

Fields AttentionConfig::toFields() const
{
    Fields f(3);
    f[0].name = aspec::kATTR_NUM_HEADS;
    f[0].ints = {numHeads};
    f[1].name = aspec::kATTR_HEAD_DIM;
    f[1].ints = {headDim};
    f[2].name = aspec::kATTR_SCALE;
    f[2].floats = {scale};
    f[2].isFloat = true;
    return f;
}

float AttentionConfig::effectiveScale() const
{
    return scale > 0.F ? scale : 1.F / std::sqrt(static_cast<float>(headDim));
}

Shape AttentionConfig::outputShape(Shape const& qkv) const
{
    if (qkv.rank() != 3)
    {
        throw PluginConfigError(std::string(aspec::kNAME) + ": input qkv has shape " + qkv.str()
            + ", expected rank 3 (N, S, 3*num_heads*head_dim)");
    }
    int64_t const three = 3 * embedDim();
    if (qkv[2] >= 0 && qkv[2] != three)
    {
        std::ostringstream msg;
        msg << aspec::kNAME << ": input qkv has last dim " << qkv[2] << ", expected 3*num_heads*head_dim = " << three
            << " (num_heads=" << numHeads << ", head_dim=" << headDim << "); check the attributes";
        throw PluginConfigError(msg.str());
    }
    return Shape{{qkv[0], qkv[1], embedDim()}};
}

AttentionBias AttentionConfig::biasLayout(Shape const& qkv, Shape const& bias) const
{
    std::ostringstream msg;
    msg << aspec::kNAME << ": input bias has shape " << bias.str() << "; ";
    if (bias.rank() != 4)
    {
        msg << "expected rank 4 (B, 1 or num_heads, S, S)";
        throw PluginConfigError(msg.str());
    }
    int64_t const seq = qkv.rank() == 3 ? qkv[1] : -1;
    int64_t const batch = qkv.rank() == 3 ? qkv[0] : -1;
    if (bias[1] >= 0 && bias[1] != 1 && bias[1] != numHeads)
    {
        msg << "its head dim " << bias[1] << " must be 1 or num_heads = " << numHeads;
        throw PluginConfigError(msg.str());
    }
    for (std::size_t i = 2; i < 4; ++i)
    {
        if (bias[i] >= 0 && seq >= 0 && bias[i] != seq)
        {
            msg << "its last two dims must be the sequence length " << seq << " of qkv " << qkv.str();
            throw PluginConfigError(msg.str());
        }
    }
    if (bias[0] == 0 || (bias[0] > 0 && batch > 0 && batch % bias[0] != 0))
    {
        msg << "its first dim " << bias[0] << " must divide the batch " << batch
            << " (batch b reads bias row b mod " << bias[0] << ": the windows of each image)";
        throw PluginConfigError(msg.str());
    }
    return AttentionBias{static_cast<int32_t>(bias[0] > 0 ? bias[0] : 1), static_cast<int32_t>(bias[1] > 0 ? bias[1] : 1)};
}

std::pair<int32_t, int32_t> AttentionConfig::inputCounts(char const* version)
{
    std::string const v = version == nullptr ? "" : version;
    if (v == "1")
    {
        return {aspec::kNB_INPUTS_MIN_V1, aspec::kNB_INPUTS_MAX_V1};
    }
    if (v == "2")
    {
        return {aspec::kNB_INPUTS_MIN_V2, aspec::kNB_INPUTS_MAX_V2};
    }
    throw PluginConfigError(std::string(aspec::kNAME) + ": no version '" + v + "'; this library has versions 1 and 2");
}

bool AttentionConfig::kernelSupported() const
{
    for (int d : VEO_ATTENTION_HEAD_DIMS)
    {
        if (d == headDim)
        {
            return true;
        }
    }
    return false;
}

} // namespace veo
