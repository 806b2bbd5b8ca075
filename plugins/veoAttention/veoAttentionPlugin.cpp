#include "veoAttentionPlugin.h"

#include "veoAttentionKernel.h"
#include "veoAttentionSpec.h"

#include <utility>

namespace veo::plugin
{
namespace spec = veo::spec::veoAttention;
using namespace nvinfer1;

namespace
{
template <typename R, typename F>
R guarded(char const* method, R onError, F&& body) noexcept
{
    return plugin::guarded<R>(spec::kNAME, method, onError, std::forward<F>(body));
}
} // namespace

VeoAttentionPlugin::VeoAttentionPlugin(AttentionConfig const& config, char const* version)
    : mConfig(config)
    , mVersion(version)
    , mSerialized(config.toFields())
{
}

void VeoAttentionPlugin::checkInputCount(int32_t nbInputs) const
{
    auto const [least, most] = AttentionConfig::inputCounts(mVersion);
    if (nbInputs < least || nbInputs > most)
    {
        throw PluginConfigError("version " + std::string(mVersion) + " takes " + std::to_string(least) + ".."
            + std::to_string(most) + " inputs (qkv" + (most > 1 ? ", bias" : "") + "), got " + std::to_string(nbInputs));
    }
}

IPluginCapability* VeoAttentionPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* VeoAttentionPlugin::clone() noexcept
{
    return guarded<IPluginV3*>("clone", nullptr, [&] {
        auto* copy = new VeoAttentionPlugin(mConfig, mVersion);
        copy->mHasBias = mHasBias;
        copy->mBias = mBias;
        return copy;
    });
}

char const* VeoAttentionPlugin::getPluginName() const noexcept
{
    return spec::kNAME;
}
char const* VeoAttentionPlugin::getPluginVersion() const noexcept
{
    return mVersion;
}
char const* VeoAttentionPlugin::getPluginNamespace() const noexcept
{
    return spec::kNAMESPACE;
}

int32_t VeoAttentionPlugin::getNbOutputs() const noexcept
{
    return spec::kNB_OUTPUTS_MAX;
}

int32_t VeoAttentionPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const*, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>("configurePlugin", -1, [&] {
        checkInputCount(nbInputs);
        if (nbOutputs != spec::kNB_OUTPUTS_MAX)
        {
            throw PluginConfigError("expected 1 output, got " + std::to_string(nbOutputs));
        }
        mConfig.outputShape(toShape(in[0].desc.dims)); // throws with the reason when inconsistent
        mHasBias = nbInputs == 2;
        if (mHasBias)
        {
            mBias = mConfig.biasLayout(toShape(in[0].desc.dims), toShape(in[1].desc.dims));
        }
        if (!mConfig.kernelSupported())
        {
            throw PluginConfigError("no kernel for head_dim " + std::to_string(mConfig.headDim)
                + "; supported: 32, 48, 64, 80, 96, 128. Export without --plugins to keep the ONNX path");
        }
        return 0;
    });
}

int32_t VeoAttentionPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs < 1 || nbInputs > AttentionConfig::inputCounts(mVersion).second)
    {
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    return 0;
}

int32_t VeoAttentionPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const*, int32_t,
    DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    return guarded<int32_t>("getOutputShapes", -1, [&] {
        checkInputCount(nbInputs);
        if (nbOutputs != 1 || inputs[0].nbDims != 3)
        {
            throw PluginConfigError("input qkv must be rank 3 (N, S, 3*num_heads*head_dim)");
        }
        if (nbInputs == 2)
        {
            Shape bias;
            for (int32_t i = 0; i < inputs[1].nbDims; ++i)
            {
                bias.d.push_back(inputs[1].d[i]->isConstant() ? inputs[1].d[i]->getConstantValue() : -1);
            }
            mConfig.biasLayout(Shape{{-1, -1, -1}}, bias); // rank and heads; S and the batch at configure
        }
        auto const* last = inputs[0].d[2];
        if (last->isConstant())
        {
            mConfig.outputShape(Shape{{-1, -1, last->getConstantValue()}}); // checks 3E
        }
        outputs[0].nbDims = 3;
        outputs[0].d[0] = inputs[0].d[0];
        outputs[0].d[1] = inputs[0].d[1];
        outputs[0].d[2] = exprBuilder.constant(mConfig.embedDim());
        return 0;
    });
}

bool VeoAttentionPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    // qkv, [bias,] out: linear, FP32 or FP16, all of one type
    if (nbInputs < 1 || nbInputs > 2 || nbOutputs != 1 || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    auto const& d = inOut[pos].desc;
    bool const linear = d.format == TensorFormat::kLINEAR;
    return linear && (pos == 0 ? isSupportedType(d.type) : d.type == inOut[0].desc.type);
}

size_t VeoAttentionPlugin::getWorkspaceSize(
    DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*, int32_t) const noexcept
{
    return AttentionConfig::workspaceSize();
}

int32_t VeoAttentionPlugin::onShapeChange(PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const*, int32_t) noexcept
{
    return guarded<int32_t>("onShapeChange", -1, [&] {
        checkInputCount(nbInputs);
        mConfig.outputShape(toShape(in[0].dims));
        mHasBias = nbInputs == 2;
        if (mHasBias)
        {
            mBias = mConfig.biasLayout(toShape(in[0].dims), toShape(in[1].dims));
        }
        return 0;
    });
}

int32_t VeoAttentionPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*,
    void const* const* inputs, void* const* outputs, void*, cudaStream_t stream) noexcept
{
    auto const& dims = inputDesc[0].dims;
    // with a bias, its dims as bound now (the table is constant, but the descriptor is the truth)
    int const biasBatch = mHasBias ? static_cast<int>(inputDesc[1].dims.d[0]) : 1;
    int const biasHeads = mHasBias ? static_cast<int>(inputDesc[1].dims.d[1]) : 1;
    int const status = veoAttentionForwardBias(inputs[0], mHasBias ? inputs[1] : nullptr, biasBatch, biasHeads,
        outputs[0], toVeoDtype(inputDesc[0].type), static_cast<int>(dims.d[0]), static_cast<int>(dims.d[1]),
        mConfig.numHeads, mConfig.headDim, mConfig.effectiveScale(), stream);
    if (status != VEO_KERNEL_OK)
    {
        logError("VeoAttention::enqueue: ", veoKernelLastError()); // builds no string out here: noexcept-clean
    }
    return status;
}

IPluginV3* VeoAttentionPlugin::attachToContext(IPluginResourceContext*) noexcept
{
    return clone();
}

PluginFieldCollection const* VeoAttentionPlugin::getFieldsToSerialize() noexcept
{
    return guarded<PluginFieldCollection const*>("getFieldsToSerialize", nullptr, [&] {
        mSerialized.assign(mConfig.toFields());
        return mSerialized.collection();
    });
}

VeoAttentionPluginCreator::VeoAttentionPluginCreator(char const* version)
    : mVersion(version)
    , mFieldNames({{spec::kATTR_NUM_HEADS, false, false}, {spec::kATTR_HEAD_DIM, false, false},
          {spec::kATTR_SCALE, true, false}})
{
    AttentionConfig::inputCounts(version); // a version of the spec (throws at library load otherwise)
}

char const* VeoAttentionPluginCreator::getPluginName() const noexcept
{
    return spec::kNAME;
}
char const* VeoAttentionPluginCreator::getPluginVersion() const noexcept
{
    return mVersion;
}
char const* VeoAttentionPluginCreator::getPluginNamespace() const noexcept
{
    return spec::kNAMESPACE;
}
PluginFieldCollection const* VeoAttentionPluginCreator::getFieldNames() noexcept
{
    return mFieldNames.collection();
}

IPluginV3* VeoAttentionPluginCreator::createPlugin(char const*, PluginFieldCollection const* fc, TensorRTPhase) noexcept
{
    return guarded<IPluginV3*>("createPlugin", nullptr, [&] {
        auto const config = AttentionConfig::fromFields(toFields(fc));
        requireMinSm(spec::kNAME, spec::kMIN_SM); // build and deserialisation alike
        return new VeoAttentionPlugin(config, mVersion);
    });
}

} // namespace veo::plugin
