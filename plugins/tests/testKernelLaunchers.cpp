// The kernels' C launchers on the host, without a GPU: every argument check answers before any CUDA
// call, with a status and a message; a launch on a machine without a usable device fails with
// VEO_KERNEL_CUDA_ERROR and says why, and the next call is judged on its own (no stale error).
// Built where nvcc is (VEO_HAVE_CUDA); runs on any machine, GPU or not.
#include "testHarness.h"
#include "veoAttentionKernel.h"
#include "veoPatchEmbedLayerNormKernel.h"

#include <string>

namespace
{
bool says(char const* needle)
{
    return std::string(veoKernelLastError()).find(needle) != std::string::npos;
}
int dummy[64];
} // namespace

VEO_TEST(attention_arguments_are_checked_first)
{
    VEO_CHECK_EQ(veoAttentionForward(nullptr, dummy, 0, 1, 8, 2, 64, 0.F, nullptr), int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK(says("qkv and out must be device pointers"));
    VEO_CHECK_EQ(veoAttentionForward(dummy, dummy, 0, 0, 8, 2, 64, 0.F, nullptr), int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK(says("batch=0 seq=8 num_heads=2 head_dim=64"));
    VEO_CHECK_EQ(veoAttentionForward(dummy, dummy, 0, 1, 8, 2, 64, -1.F, nullptr), int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK_EQ(veoAttentionForward(dummy, dummy, 7, 1, 8, 2, 64, 0.F, nullptr), int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK(says("dtype 7 unknown"));
    VEO_CHECK_EQ(veoAttentionForward(dummy, dummy, 0, 1, 8, 2, 40, 0.F, nullptr), int(VEO_KERNEL_UNSUPPORTED));
    VEO_CHECK(says("no kernel for head_dim 40"));
    // a bias whose rows do not divide the batch, or whose heads are neither 1 nor num_heads
    VEO_CHECK_EQ(veoAttentionForwardBias(dummy, dummy, 4, 2, dummy, 0, 6, 8, 2, 64, 0.F, nullptr),
        int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK(says("bias of 4 x 2 tables for batch=6 num_heads=2"));
    VEO_CHECK_EQ(veoAttentionForwardBias(dummy, dummy, 1, 3, dummy, 0, 6, 8, 2, 64, 0.F, nullptr),
        int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK_EQ(veoAttentionForwardBias(dummy, dummy, 0, 1, dummy, 0, 6, 8, 2, 64, 0.F, nullptr),
        int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK_EQ(veoAttentionSupportsHeadDim(80), 1);
    VEO_CHECK_EQ(veoAttentionSupportsHeadDim(40), 0);
}

VEO_TEST(patch_embed_arguments_are_checked_first)
{
    veo_patch_embed_params p{};
    p.batch = 1;
    p.in_channels = 3;
    p.embed_dim = 192;
    p.in_t = 1;
    p.in_h = 30; // not a multiple of 16
    p.in_w = 32;
    p.patch_t = 1;
    p.patch_h = 16;
    p.patch_w = 16;
    p.num_prefix_tokens = 1;
    p.pos_mode = VEO_POS_ALL;
    p.has_layernorm = 1;
    p.epsilon = 1e-6F;
    auto call = [&](veo_patch_embed_params const& q) {
        return veoPatchEmbedLayerNormForward(&q, 0, dummy, dummy, dummy, dummy, dummy, dummy, dummy, dummy, dummy, nullptr);
    };
    VEO_CHECK_EQ(call(p), int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK(says("not divisible by the patch size"));
    p.in_h = 32;
    auto wide = p;
    wide.embed_dim = VEO_PATCH_EMBED_MAX_EMBED_DIM + 1;
    VEO_CHECK_EQ(call(wide), int(VEO_KERNEL_UNSUPPORTED));
    VEO_CHECK(says("has no kernel instance"));
    auto noEps = p;
    noEps.epsilon = 0.F;
    VEO_CHECK_EQ(call(noEps), int(VEO_KERNEL_INVALID_ARGUMENT));
    VEO_CHECK(says("epsilon > 0"));
}

VEO_TEST(launch_without_a_device_fails_once_and_clearly)
{
    int sm = 0;
    if (veoDeviceComputeCapability(&sm) == VEO_KERNEL_OK)
    {
        throw veo::test::Skip{"a CUDA device is present: run plugins/tests/gpu/run_gpu_checks.py instead"};
    }
    VEO_CHECK(says("cannot read the current GPU's compute capability"));
    // valid arguments: the launcher reaches CUDA, which has no device to give
    VEO_CHECK_EQ(veoAttentionForward(dummy, dummy, 0, 1, 8, 2, 64, 0.F, nullptr), int(VEO_KERNEL_CUDA_ERROR));
    VEO_CHECK(says("veoAttention"));
    // the next call is judged on its own arguments, not failed by what the last one left behind
    VEO_CHECK_EQ(veoAttentionForward(dummy, dummy, 0, 1, 8, 2, 40, 0.F, nullptr), int(VEO_KERNEL_UNSUPPORTED));
    VEO_CHECK(says("no kernel for head_dim 40"));
}

VEO_TEST_MAIN()
