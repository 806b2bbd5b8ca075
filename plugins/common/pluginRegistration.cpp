// The one registration path of libveo_edge_plugins.so: TensorRT's dynamic plugin loading
// (IPluginRegistry::loadLibrary, trtexec --dynamicPlugins, the ONNX parser's plugin lookup) calls these.
#include "NvInferRuntime.h"
#include "pluginUtils.h"
#include "veoAttentionPlugin.h"
#include "veoPatchEmbedLayerNormPlugin.h"

#define VEO_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

VEO_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static veo::plugin::VeoAttentionPluginCreator sAttention;
    static veo::plugin::VeoPatchEmbedLayerNormPluginCreator sPatchEmbed;
    static nvinfer1::IPluginCreatorInterface* const kCREATORS[] = {&sAttention, &sPatchEmbed};
    nbCreators = 2;
    return kCREATORS;
}

VEO_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    veo::plugin::setLoggerFinder(finder);
}
