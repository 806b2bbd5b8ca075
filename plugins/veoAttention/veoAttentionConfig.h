// VeoAttention configuration: attribute parsing against the spec, shape rule, kernel support and
// workspace size. TensorRT-free, covered by the ctest suite; the plugin glue only converts types.
#pragma once

#include "pluginFields.h"

#include <utility>

namespace veo
{

//! How a v2 node's bias table broadcasts: attention batch b reads row b % batch, head h row h or 0.
struct AttentionBias
{
    int32_t batch{1};
    int32_t heads{1};
};

struct AttentionConfig
{
    int32_t numHeads{0};
    int32_t headDim{0};
    float scale{0.F}; //!< as given; 0 means 1/sqrt(headDim)

    //! Parse and validate the node's attributes (names, defaults, bounds from the generated spec header).
    static AttentionConfig fromFields(Fields const& fields);
    Fields toFields() const;
    float effectiveScale() const;
    int64_t embedDim() const { return int64_t{numHeads} * headDim; }
    //! (N, S, 3E) -> (N, S, E); -1 extents pass through. Throws PluginConfigError when inconsistent.
    Shape outputShape(Shape const& qkv) const;
    //! The bias layout of a v2 node, from the shapes of qkv (N, S, 3E) and bias (B, 1|H, S, S); -1 extents
    //! (dynamic) are checked where known. Throws PluginConfigError when the bias does not fit.
    AttentionBias biasLayout(Shape const& qkv, Shape const& bias) const;
    //! How many inputs a node of `version` ("1" or "2") takes: {min, max}. Throws for an unknown version.
    static std::pair<int32_t, int32_t> inputCounts(char const* version);
    //! Whether the kernels have an instance for headDim.
    bool kernelSupported() const;
    static constexpr std::size_t workspaceSize() { return 0; }
};

} // namespace veo
