// The one registration path of libveo_edge_plugins.so: TensorRT's dynamic plugin loading
// (IPluginRegistry::loadLibrary, trtexec --dynamicPlugins, the ONNX parser's plugin lookup) calls these.
#include "NvInferRuntime.h"
#include "pluginUtils.h"
#include "veoAttentionPlugin.h"
#include "veoAttentionSpec.h"
#include "veoPatchEmbedLayerNormPlugin.h"

#define VEO_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

VEO_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    // VeoAttention: a creator per version (graphs made before the bias input keep loading)
    namespace att = veo::spec::veoAttention;
    static_assert(att::kNB_VERSIONS == 2, "register a VeoAttention creator for every version of its spec");
    static veo::plugin::VeoAttentionPluginCreator sAttentionV1(att::kVERSIONS[0]);
    static veo::plugin::VeoAttentionPluginCreator sAttentionV2(att::kVERSIONS[1]);
    static veo::plugin::VeoPatchEmbedLayerNormPluginCreator sPatchEmbed;
    static nvinfer1::IPluginCreatorInterface* const kCREATORS[] = {&sAttentionV1, &sAttentionV2, &sPatchEmbed};
    nbCreators = static_cast<int32_t>(sizeof(kCREATORS) / sizeof(kCREATORS[0]));
    return kCREATORS;
}

VEO_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    veo::plugin::setLoggerFinder(finder);
}
