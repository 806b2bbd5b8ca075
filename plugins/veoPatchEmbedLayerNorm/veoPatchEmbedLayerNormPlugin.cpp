#include "veoPatchEmbedLayerNormPlugin.h"

#include "veoPatchEmbedLayerNormKernel.h"
#include "veoPatchEmbedLayerNormSpec.h"

#include <utility>

namespace veo::plugin
{
namespace spec = veo::spec::veoPatchEmbedLayerNorm;
using namespace nvinfer1;

namespace
{
template <typename R, typename F>
R guarded(char const* method, R onError, F&& body) noexcept
{
    return plugin::guarded<R>(spec::kNAME, method, onError, std::forward<F>(body));
}
} // namespace

VeoPatchEmbedLayerNormPlugin::VeoPatchEmbedLayerNormPlugin(PatchEmbedConfig const& config)
    : mConfig(config)
    , mSerialized(config.toFields())
{
}

IPluginCapability* VeoPatchEmbedLayerNormPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* VeoPatchEmbedLayerNormPlugin::clone() noexcept
{
    // A copy of the whole state: IPluginV3OneCore::clone must hand over a configured plugin configured, and
    // the kernel parameters of the last onShapeChange are part of that (enqueue refuses to run without them).
    return guarded<IPluginV3*>("clone", nullptr, [&] { return new VeoPatchEmbedLayerNormPlugin(*this); });
}

char const* VeoPatchEmbedLayerNormPlugin::getPluginName() const noexcept
{
    return spec::kNAME;
}
char const* VeoPatchEmbedLayerNormPlugin::getPluginVersion() const noexcept
{
    return spec::kVERSION;
}
char const* VeoPatchEmbedLayerNormPlugin::getPluginNamespace() const noexcept
{
    return spec::kNAMESPACE;
}

int32_t VeoPatchEmbedLayerNormPlugin::getNbOutputs() const noexcept
{
    return mConfig.nbOutputs();
}

std::vector<Shape> VeoPatchEmbedLayerNormPlugin::shapesOf(PluginTensorDesc const* in, int32_t nbInputs) const
{
    std::vector<Shape> shapes;
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        shapes.push_back(toShape(in[i].dims));
    }
    return shapes;
}

int32_t VeoPatchEmbedLayerNormPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("configurePlugin", -1, [&] {
        if (nbOutputs != mConfig.nbOutputs())
        {
            throw PluginConfigError("expected " + std::to_string(mConfig.nbOutputs()) + " outputs (1 + has_layernorm), got "
                + std::to_string(nbOutputs));
        }
        std::vector<Shape> shapes;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            shapes.push_back(toShape(in[i].desc.dims));
        }
        mConfig.outputShapes(shapes); // throws with the reason when a shape or the input count is wrong
        if (!mConfig.kernelSupported())
        {
            throw PluginConfigError("no kernel for embed_dim " + std::to_string(mConfig.embedDim) + " (max "
                + std::to_string(VEO_PATCH_EMBED_MAX_EMBED_DIM) + "); export without --plugins to keep the ONNX path");
        }
        return 0;
    });
}

int32_t VeoPatchEmbedLayerNormPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != mConfig.nbOutputs() || nbInputs != mConfig.nbInputs())
    {
        return -1;
    }
    for (int32_t i = 0; i < nbOutputs; ++i)
    {
        outputTypes[i] = inputTypes[0];
    }
    return 0;
}

int32_t VeoPatchEmbedLayerNormPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const*,
    int32_t, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    return guarded<int32_t>("getOutputShapes", -1, [&] {
        int32_t const rank = 2 + mConfig.spatialRank();
        if (nbInputs != mConfig.nbInputs() || nbOutputs != mConfig.nbOutputs() || inputs[0].nbDims != rank)
        {
            throw PluginConfigError("expected " + std::to_string(mConfig.nbInputs()) + " inputs with x of rank "
                + std::to_string(rank) + ", got " + std::to_string(nbInputs) + " inputs, x of rank "
                + std::to_string(inputs[0].nbDims));
        }
        // tokens: (N, P + prod(spatial_i / patch_i), E)
        IDimensionExpr const* rows = exprBuilder.constant(1);
        for (int32_t i = 0; i < mConfig.spatialRank(); ++i)
        {
            auto const* grid = exprBuilder.operation(
                DimensionOperation::kFLOOR_DIV, *inputs[0].d[2 + i], *exprBuilder.constant(mConfig.patchSize[i]));
            rows = exprBuilder.operation(DimensionOperation::kPROD, *rows, *grid);
        }
        rows = exprBuilder.operation(DimensionOperation::kSUM, *rows, *exprBuilder.constant(mConfig.numPrefixTokens));
        for (int32_t o = 0; o < nbOutputs; ++o)
        {
            outputs[o].nbDims = 3;
            outputs[o].d[0] = inputs[0].d[0];
            outputs[o].d[1] = rows;
            outputs[o].d[2] = exprBuilder.constant(mConfig.embedDim);
        }
        return 0;
    });
}

bool VeoPatchEmbedLayerNormPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != mConfig.nbInputs() || nbOutputs != mConfig.nbOutputs() || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    auto const& d = inOut[pos].desc;
    bool const linear = d.format == TensorFormat::kLINEAR;
    return linear && (pos == 0 ? isSupportedType(d.type) : d.type == inOut[0].desc.type);
}

size_t VeoPatchEmbedLayerNormPlugin::getWorkspaceSize(
    DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*, int32_t) const noexcept
{
    return PatchEmbedConfig::workspaceSize();
}

int32_t VeoPatchEmbedLayerNormPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const*, int32_t) noexcept
{
    return guarded<int32_t>("onShapeChange", -1, [&] {
        // Validates the concrete shapes and computes the kernel parameters once per shape, so that enqueue
        // builds no vector and runs nothing that can throw.
        mParams = mConfig.kernelParams(shapesOf(in, nbInputs));
        mHaveParams = true;
        return 0;
    });
}

int32_t VeoPatchEmbedLayerNormPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*,
    void const* const* inputs, void* const* outputs, void*, cudaStream_t stream) noexcept
{
    if (!mHaveParams || inputDesc[0].dims.d[0] != mParams.batch)
    {
        logError("VeoPatchEmbedLayerNorm::enqueue: ", "called without onShapeChange for this batch size");
        return -1;
    }
    auto const opt = [&](int32_t idx) { return idx >= 0 ? inputs[idx] : nullptr; };
    int const status = veoPatchEmbedLayerNormForward(&mParams, toVeoDtype(inputDesc[0].type), inputs[0], inputs[1],
        inputs[2], opt(mConfig.prefixIndex()), opt(mConfig.posIndex()), opt(mConfig.lnWeightIndex()),
        opt(mConfig.lnBiasIndex()), outputs[0], mConfig.hasLayerNorm ? outputs[1] : nullptr, stream);
    if (status != VEO_KERNEL_OK)
    {
        logError("VeoPatchEmbedLayerNorm::enqueue: ", veoKernelLastError());
    }
    return static_cast<int32_t>(status);
}

IPluginV3* VeoPatchEmbedLayerNormPlugin::attachToContext(IPluginResourceContext*) noexcept
{
    return clone();
}

PluginFieldCollection const* VeoPatchEmbedLayerNormPlugin::getFieldsToSerialize() noexcept
{
    return guarded<PluginFieldCollection const*>("getFieldsToSerialize", nullptr, [&] {
        mSerialized.assign(mConfig.toFields());
        return mSerialized.collection();
    });
}

VeoPatchEmbedLayerNormPluginCreator::VeoPatchEmbedLayerNormPluginCreator()
    : mFieldNames({{spec::kATTR_PATCH_SIZE, false, true}, {spec::kATTR_IN_CHANNELS, false, false},
        {spec::kATTR_EMBED_DIM, false, false}, {spec::kATTR_NUM_PREFIX_TOKENS, false, false},
        {spec::kATTR_HAS_POS_EMBED, false, false}, {spec::kATTR_HAS_LAYERNORM, false, false},
        {spec::kATTR_EPSILON, true, false}})
{
}

char const* VeoPatchEmbedLayerNormPluginCreator::getPluginName() const noexcept
{
    return spec::kNAME;
}
char const* VeoPatchEmbedLayerNormPluginCreator::getPluginVersion() const noexcept
{
    return spec::kVERSION;
}
char const* VeoPatchEmbedLayerNormPluginCreator::getPluginNamespace() const noexcept
{
    return spec::kNAMESPACE;
}
PluginFieldCollection const* VeoPatchEmbedLayerNormPluginCreator::getFieldNames() noexcept
{
    return mFieldNames.collection();
}

IPluginV3* VeoPatchEmbedLayerNormPluginCreator::createPlugin(
    char const*, PluginFieldCollection const* fc, TensorRTPhase) noexcept
{
    return guarded<IPluginV3*>("createPlugin", nullptr, [&] {
        auto const config = PatchEmbedConfig::fromFields(toFields(fc));
        requireMinSm(spec::kNAME, spec::kMIN_SM); // build and deserialisation alike
        return new VeoPatchEmbedLayerNormPlugin(config);
    });
}

} // namespace veo::plugin
