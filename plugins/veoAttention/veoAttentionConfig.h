// VeoAttention configuration: attribute parsing against the spec, shape rule, kernel support and
// workspace size. TensorRT-free, covered by the ctest suite; the plugin glue only converts types.
#pragma once

#include "pluginFields.h"

namespace veo
{

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
    //! Whether the kernels have an instance for headDim.
    bool kernelSupported() const;
    static constexpr std::size_t workspaceSize() { return 0; }
};

} // namespace veo
