// Launch decisions the kernels make, as plain C++ (no CUDA), so that ctest checks them on the host:
// when a kernel must opt in to more than 48 KiB of shared memory (its static shared memory counts too),
// whether the device can give it, and the minimum SM a plugin needs.
#pragma once

#include <cstdint>
#include <string>

namespace veo
{

//! Shared memory a CTA gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr int kDEFAULT_SMEM_BYTES = 48 * 1024;

struct SmemPlan
{
    bool optIn; //!< dynamic + static > 48 KiB: cudaFuncSetAttribute is needed before the launch
    bool fits;  //!< dynamic + static <= the device's opt-in limit (sharedMemPerBlockOptin)
};

//! `staticBytes` is cudaFuncAttributes::sharedSizeBytes of the kernel; `optinLimit` the device's
//! cudaDevAttrMaxSharedMemoryPerBlockOptin.
constexpr SmemPlan smemPlan(int dynamicBytes, int staticBytes, int optinLimit)
{
    return SmemPlan{dynamicBytes + staticBytes > kDEFAULT_SMEM_BYTES, dynamicBytes + staticBytes <= optinLimit};
}

//! "" when a device of compute capability `sm` (major * 10 + minor) runs `op`, else the reason.
inline std::string minSmProblem(char const* op, int sm, int minSm)
{
    if (sm >= minSm)
    {
        return {};
    }
    return std::string(op) + " needs a GPU of compute capability " + std::to_string(minSm / 10) + "."
        + std::to_string(minSm % 10) + " or newer (sm_" + std::to_string(minSm) + "), this one is sm_"
        + std::to_string(sm) + "; build the engine without the plugins (veo-edge engine build --engine plain)";
}

namespace patch_embed
{
constexpr int kTHREADS = 256;
constexpr int kWARPS = kTHREADS / 32;
constexpr int kTT = 8; //!< token rows per CTA
constexpr int kKC = 8; //!< K chunk
//! Dynamic shared memory of one CTA: the transposed weight chunk (padded rows) and the gathered patch rows.
constexpr int dynamicSmemBytes(int embedDim)
{
    return (kKC * (embedDim + 1) + kTT * kKC) * static_cast<int>(sizeof(float));
}
//! Its static shared memory (the LayerNorm reduction buffers sRed[kWARPS][kTT] and sStat[kTT]); the
//! launcher uses the compiler's figure (cudaFuncGetAttributes), this one is for host-side reasoning.
constexpr int kSTATIC_SMEM_BYTES = (kWARPS * kTT + kTT) * static_cast<int>(sizeof(float));
} // namespace patch_embed

} // namespace veo
