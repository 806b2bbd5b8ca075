// VeoPatchEmbedLayerNorm configuration: attribute parsing against the spec, which optional inputs are
// present (omitted, never empty), shape rules and kernel parameters. TensorRT-free, covered by ctest.
#pragma once

#include "pluginFields.h"
#include "veoPatchEmbedLayerNormKernel.h"

namespace veo
{

struct PatchEmbedConfig
{
    std::vector<int32_t> patchSize; //!< [ph, pw] or [pt, ph, pw]
    int32_t inChannels{0};
    int32_t embedDim{0};
    int32_t numPrefixTokens{0};
    int32_t hasPosEmbed{1};
    int32_t hasLayerNorm{1};
    float epsilon{1e-6F};

    static PatchEmbedConfig fromFields(Fields const& fields);
    Fields toFields() const;

    //! 3 + (P > 0) + has_pos_embed + 2 * has_layernorm, per the spec's omitted-optional-inputs rule.
    int32_t nbInputs() const;
    int32_t nbOutputs() const { return 1 + hasLayerNorm; }
    //! Position of each optional input among the present ones, or -1 when omitted.
    int32_t prefixIndex() const { return numPrefixTokens > 0 ? 3 : -1; }
    int32_t posIndex() const { return hasPosEmbed ? 3 + (numPrefixTokens > 0) : -1; }
    int32_t lnWeightIndex() const { return hasLayerNorm ? 3 + (numPrefixTokens > 0) + hasPosEmbed : -1; }
    int32_t lnBiasIndex() const { return hasLayerNorm ? lnWeightIndex() + 1 : -1; }
    int32_t spatialRank() const { return static_cast<int32_t>(patchSize.size()); }

    //! Number of patch tokens L for the spatial extents of x (all known), checking divisibility.
    int64_t numPatches(Shape const& x) const;
    //! Checks every input shape (extents of -1 are dynamic and pass) and returns the output shapes.
    std::vector<Shape> outputShapes(std::vector<Shape> const& inputs) const;
    //! Kernel parameters for concrete input shapes (after outputShapes accepted them).
    veo_patch_embed_params kernelParams(std::vector<Shape> const& inputs) const;
    bool kernelSupported() const { return embedDim <= VEO_PATCH_EMBED_MAX_EMBED_DIM; }
    static constexpr std::size_t workspaceSize() { return 0; }
};

} // namespace veo
