// The IPluginV3 glue itself, compiled against real TensorRT headers (no libnvinfer, no GPU needed): what a
// plugin object keeps across clone(), as TensorRT uses it (attachToContext clones the built plugin for
// every execution context). Built where nvcc and the TensorRT headers are found (TensorRT_ROOT, or an
// NVIDIA/TensorRT checkout's include/ via -DTensorRT_INCLUDE_DIR=...).
#include "testHarness.h"
#include "veoPatchEmbedLayerNormPlugin.h"

#include <memory>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace
{
//! Collects what the plugins log (the plugins find it through setLoggerFinder, as TensorRT passes one).
class Recorder : public ILogger
{
public:
    std::vector<std::string> lines;
    void log(Severity, AsciiChar const* msg) noexcept override { lines.emplace_back(msg); }
    bool saw(char const* needle) const
    {
        for (auto const& l : lines)
        {
            if (l.find(needle) != std::string::npos)
            {
                return true;
            }
        }
        return false;
    }
};
class Finder : public ILoggerFinder
{
public:
    Recorder recorder;
    ILogger* findLogger() override { return &recorder; }
};
Finder gFinder;

veo::Field intField(char const* name, std::vector<int64_t> v)
{
    veo::Field f;
    f.name = name;
    f.ints = std::move(v);
    return f;
}

PluginTensorDesc desc(std::vector<int64_t> const& dims)
{
    PluginTensorDesc d{};
    d.dims.nbDims = static_cast<int32_t>(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i)
    {
        d.dims.d[i] = dims[i];
    }
    d.type = DataType::kFLOAT;
    d.format = TensorFormat::kLINEAR;
    return d;
}
} // namespace

VEO_TEST(patch_embed_clone_keeps_the_shape_state)
{
    veo::plugin::setLoggerFinder(&gFinder);
    // vit-nano's patch embedding: 32x32 pictures, 8x8 patches, a cls token, pos embed over every token, LN
    auto config = veo::PatchEmbedConfig::fromFields({intField("patch_size", {8, 8}), intField("in_channels", {3}),
        intField("embed_dim", {64}), intField("num_prefix_tokens", {1}), intField("has_pos_embed", {1}),
        intField("has_layernorm", {1})});
    veo::plugin::VeoPatchEmbedLayerNormPlugin plugin(config);
    std::vector<PluginTensorDesc> in{desc({2, 3, 32, 32}), desc({64, 3, 8, 8}), desc({64}), desc({1, 1, 64}),
        desc({1, 17, 64}), desc({64}), desc({64})};
    std::vector<PluginTensorDesc> out{desc({2, 17, 64}), desc({2, 17, 64})};
    VEO_CHECK_EQ(plugin.onShapeChange(in.data(), 7, out.data(), 2), 0);

    std::unique_ptr<IPluginV3> copy(plugin.clone());
    VEO_CHECK(copy != nullptr);
    auto* runtime = static_cast<IPluginV3OneRuntime*>(copy->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<void const*> inputs(7, nullptr);
    std::vector<void*> outputs(2, nullptr);
    gFinder.recorder.lines.clear();
    // Null buffers: the launcher refuses them (no GPU is touched). What matters is that the clone reached
    // the launcher with the shape's parameters instead of refusing to run as if never configured.
    int32_t const status = runtime->enqueue(in.data(), out.data(), inputs.data(), outputs.data(), nullptr, nullptr);
    VEO_CHECK(!gFinder.recorder.saw("called without onShapeChange"));
    VEO_CHECK_EQ(status, int32_t(VEO_KERNEL_INVALID_ARGUMENT));

    // and a fresh plugin, never told a shape, does refuse: the check above can tell the two apart
    veo::plugin::VeoPatchEmbedLayerNormPlugin fresh(config);
    auto* freshRuntime = static_cast<IPluginV3OneRuntime*>(fresh.getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    VEO_CHECK_EQ(freshRuntime->enqueue(in.data(), out.data(), inputs.data(), outputs.data(), nullptr, nullptr), -1);
    VEO_CHECK(gFinder.recorder.saw("called without onShapeChange"));

    // the fields a serialised engine carries are the clone's too
    auto const* fields = runtime->getFieldsToSerialize();
    VEO_CHECK(fields != nullptr && fields->nbFields == 7);
}

VEO_TEST_MAIN()
