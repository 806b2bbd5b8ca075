// VeoPatchEmbedLayerNorm as a TensorRT IPluginV3 and its IPluginCreatorV3One. Thin: parsing, validation,
// optional-input positions and shape rules live in veoPatchEmbedLayerNormConfig.
#pragma once

#include "NvInferRuntime.h"
#include "pluginUtils.h"
#include "veoPatchEmbedLayerNormConfig.h"

namespace veo::plugin
{

class VeoPatchEmbedLayerNormPlugin : public nvinfer1::IPluginV3,
                                     public nvinfer1::IPluginV3OneCore,
                                     public nvinfer1::IPluginV3OneBuild,
                                     public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit VeoPatchEmbedLayerNormPlugin(PatchEmbedConfig const& config);
    VeoPatchEmbedLayerNormPlugin(VeoPatchEmbedLayerNormPlugin const&) = default; //!< clone(): every member
    VeoPatchEmbedLayerNormPlugin& operator=(VeoPatchEmbedLayerNormPlugin const&) = delete;
    ~VeoPatchEmbedLayerNormPlugin() override = default;

    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    std::vector<Shape> shapesOf(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs) const;

    PatchEmbedConfig mConfig;
    FieldStorage mSerialized;
    veo_patch_embed_params mParams{}; //!< for the shapes of the last onShapeChange
    bool mHaveParams{false};
};

class VeoPatchEmbedLayerNormPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    VeoPatchEmbedLayerNormPluginCreator();
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    FieldNames mFieldNames;
};

} // namespace veo::plugin
