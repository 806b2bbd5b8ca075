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
