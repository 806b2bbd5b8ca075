// Runs the VeoAttention IPluginV3 glue, compiled against real TensorRT headers, without TensorRT or a GPU:
// check_trt_glue.sh links it with the glue and the TensorRT-free logic, and with stand-ins for the kernel
// library (a device of SM 9.0; the launcher records what enqueue hands it). It drives what TensorRT's
// builder and runtime call: both creators (versions 1 and 2), the format combinations with and without the
// bias, configurePlugin and onShapeChange with fitting and unfitting bias shapes, clone, serialization, and
// enqueue's arguments to the launcher. Exit status 0 when every check holds.
#include "veoAttentionKernel.h"
#include "veoAttentionPlugin.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace
{
struct Launch
{
    void const* bias{nullptr};
    int biasBatch{0};
    int biasHeads{0};
    int batch{0};
    int seq{0};
    int calls{0};
};
Launch gLaunch;
int gFailures = 0;

void expect(bool ok, char const* what)
{
    std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
    gFailures += ok ? 0 : 1;
}

nvinfer1::DynamicPluginTensorDesc desc(std::initializer_list<int64_t> dims, nvinfer1::DataType type)
{
    nvinfer1::DynamicPluginTensorDesc d{};
    d.desc.dims.nbDims = static_cast<int32_t>(dims.size());
    int i = 0;
    for (int64_t v : dims)
    {
        d.desc.dims.d[i++] = v;
    }
    d.desc.type = type;
    d.desc.format = nvinfer1::TensorFormat::kLINEAR;
    d.min = d.opt = d.max = d.desc.dims;
    return d;
}

nvinfer1::PluginFieldCollection const* attrs()
{
    static int32_t const heads = 2;
    static int32_t const headDim = 32;
    static float const scale = 0.F;
    static nvinfer1::PluginField const fields[] = {
        {"num_heads", &heads, nvinfer1::PluginFieldType::kINT32, 1},
        {"head_dim", &headDim, nvinfer1::PluginFieldType::kINT32, 1},
        {"scale", &scale, nvinfer1::PluginFieldType::kFLOAT32, 1},
    };
    static nvinfer1::PluginFieldCollection const fc{3, fields};
    return &fc;
}
} // namespace

// --- stand-ins for libveo_kernels.so
extern "C" char const* veoKernelLastError(void)
{
    return "";
}
extern "C" int veoDeviceComputeCapability(int* sm)
{
    *sm = 90;
    return VEO_KERNEL_OK;
}
extern "C" int veoAttentionForwardBias(void const*, void const* bias, int biasBatch, int biasHeads, void*, int,
    int batch, int seq, int, int, float, void*)
{
    gLaunch = Launch{bias, biasBatch, biasHeads, batch, seq, gLaunch.calls + 1};
    return VEO_KERNEL_OK;
}

int main()
{
    using namespace nvinfer1;
    using veo::plugin::VeoAttentionPluginCreator;
    auto const fp = DataType::kFLOAT;
    auto const half = DataType::kHALF;
    VeoAttentionPluginCreator v1("1");
    VeoAttentionPluginCreator v2("2");
    expect(std::strcmp(v1.getPluginVersion(), "1") == 0 && std::strcmp(v2.getPluginVersion(), "2") == 0,
        "a creator per version, both named VeoAttention");
    expect(std::strcmp(v2.getPluginName(), "VeoAttention") == 0 && v2.getFieldNames()->nbFields == 3,
        "v2 takes the v1 attributes");

    auto* p1 = v1.createPlugin("att", attrs(), TensorRTPhase::kBUILD);
    auto* p2 = v2.createPlugin("att", attrs(), TensorRTPhase::kBUILD);
    expect(p1 != nullptr && p2 != nullptr, "both create a plugin (SM 9.0)");
    auto* core2 = static_cast<IPluginV3OneCore*>(p2->getCapabilityInterface(PluginCapabilityType::kCORE));
    auto* build1 = static_cast<IPluginV3OneBuild*>(p1->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* build2 = static_cast<IPluginV3OneBuild*>(p2->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* run2 = static_cast<IPluginV3OneRuntime*>(p2->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    expect(std::strcmp(core2->getPluginVersion(), "2") == 0, "the v2 plugin says version 2");

    // formats: qkv, bias, out of one type, linear; v1 has no bias position
    DynamicPluginTensorDesc io[3] = {desc({-1, 16, 192}, half), desc({4, 2, 16, 16}, half), desc({-1, 16, 64}, half)};
    bool all = true;
    for (int pos = 0; pos < 3; ++pos)
    {
        all = all && build2->supportsFormatCombination(pos, io, 2, 1);
    }
    expect(all, "v2: FP16 qkv, bias and out are supported");
    io[1].desc.type = fp;
    expect(!build2->supportsFormatCombination(1, io, 2, 1), "v2: a bias of another type than qkv is not");
    DataType out{};
    DataType const ins[2] = {half, half};
    expect(build2->getOutputDataTypes(&out, 1, ins, 2) == 0 && out == half, "v2: the output has qkv's type");
    expect(build1->getOutputDataTypes(&out, 1, ins, 2) != 0, "v1: two inputs are refused");

    // configure: Swin windows, 4 a picture, batch 8 = 2 pictures
    DynamicPluginTensorDesc in[2] = {desc({8, 16, 192}, fp), desc({4, 2, 16, 16}, fp)};
    DynamicPluginTensorDesc o[1] = {desc({8, 16, 64}, fp)};
    expect(build2->configurePlugin(in, 2, o, 1) == 0, "v2 configures with a (4, 2, S, S) bias at batch 8");
    DynamicPluginTensorDesc bad[2] = {desc({6, 16, 192}, fp), desc({4, 2, 16, 16}, fp)};
    expect(build2->configurePlugin(bad, 2, o, 1) != 0, "v2 refuses a bias batch that does not divide the batch");
    expect(build1->configurePlugin(in, 2, o, 1) != 0, "v1 refuses a bias");
    expect(build1->configurePlugin(in, 1, o, 1) == 0, "v1 configures without one");

    // runtime: shapes bound, enqueue hands the bias and its broadcast to the launcher, clones keep it
    PluginTensorDesc rin[2] = {in[0].desc, in[1].desc};
    PluginTensorDesc rout[1] = {o[0].desc};
    expect(run2->onShapeChange(rin, 2, rout, 1) == 0, "v2 onShapeChange with the bias");
    auto* clone = p2->clone();
    auto* runClone = static_cast<IPluginV3OneRuntime*>(clone->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    float qkv = 0.F;
    float bias = 0.F;
    float y = 0.F;
    void const* inputs[2] = {&qkv, &bias};
    void* outputs[1] = {&y};
    expect(runClone->enqueue(rin, rout, inputs, outputs, nullptr, nullptr) == 0, "the clone enqueues");
    expect(gLaunch.calls == 1 && gLaunch.bias == &bias && gLaunch.biasBatch == 4 && gLaunch.biasHeads == 2
            && gLaunch.batch == 8 && gLaunch.seq == 16,
        "enqueue passes the bias, 4 tables of 2 heads, batch 8, S 16");
    expect(run2->onShapeChange(rin, 1, rout, 1) == 0, "v2 without a bias");
    expect(run2->enqueue(rin, rout, inputs, outputs, nullptr, nullptr) == 0 && gLaunch.bias == nullptr,
        "v2 without a bias launches without one");
    auto const* fields = run2->getFieldsToSerialize();
    expect(fields != nullptr && fields->nbFields == 3, "v2 serializes the v1 attributes");
    auto* back = v2.createPlugin("att", fields, TensorRTPhase::kRUNTIME);
    expect(back != nullptr, "v2 deserializes from them");
    delete back;
    delete clone;
    delete p1;
    delete p2;
    std::printf("%d check(s) failed\n", gFailures);
    return gFailures == 0 ? 0 : 1;
}
