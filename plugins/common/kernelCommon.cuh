// Device helpers shared by the veo-edge kernels: FP16/FP32 load/store, warp reductions, launch errors.
#pragma once

#include "launchChecks.h"
#include "veoKernelStatus.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace veo
{

__device__ __forceinline__ float toFloat(float v)
{
    return v;
}
__device__ __forceinline__ float toFloat(__half v)
{
    return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v)
{
    return __float2half_rn(v);
}

__device__ __forceinline__ float warpSum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
    {
        v += __shfl_xor_sync(0xffffffffU, v, o);
    }
    return v;
}

__device__ __forceinline__ float warpMax(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
    {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
    }
    return v;
}

//! Record why a launcher failed (thread-local, read with veoKernelLastError) and return `status`.
int kernelFail(int status, std::string const& msg);
//! VEO_KERNEL_OK, or VEO_KERNEL_CUDA_ERROR with the text of cudaGetLastError after a launch of `what`.
//! cudaGetLastError clears the error it returns, so an error is reported once, by the launch that saw it
//! first, and does not fail every later launch (sticky errors, a lost context, still fail every call).
int checkLaunch(char const* what);

//! Per kernel instance: its static shared memory (queried once) and the devices it was opted in on.
struct SmemOptIn
{
    std::atomic<int> staticBytes{-1};
    std::atomic<std::uint64_t> devices{0}; //!< bit d: opted in on device d (devices 0..63)
};

//! Makes `kernel` launchable with `dynamicBytes` of dynamic shared memory on the current device: when its
//! dynamic + static shared memory exceeds 48 KiB, sets cudaFuncAttributeMaxDynamicSharedMemorySize once per
//! device, to `maxDynamicBytes` (the most this instance ever asks for, clamped to what the device gives),
//! so an enqueue sets no attribute. Fails clearly when the device cannot give it.
template <typename K>
int reserveSharedMemory(K kernel, SmemOptIn& state, int dynamicBytes, int maxDynamicBytes, char const* what)
{
    int staticBytes = state.staticBytes.load(std::memory_order_relaxed);
    if (staticBytes < 0)
    {
        cudaFuncAttributes attr{};
        cudaError_t const err = cudaFuncGetAttributes(&attr, kernel);
        if (err != cudaSuccess)
        {
            return kernelFail(VEO_KERNEL_CUDA_ERROR, std::string(what) + ": cannot read the kernel's attributes: "
                + cudaGetErrorString(err) + " (no kernel image for this GPU? see the build's CUDA architectures)");
        }
        staticBytes = static_cast<int>(attr.sharedSizeBytes);
        state.staticBytes.store(staticBytes, std::memory_order_relaxed);
    }
    if (!smemPlan(dynamicBytes, staticBytes, 0).optIn)
    {
        return VEO_KERNEL_OK;
    }
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    std::uint64_t const bit = device >= 0 && device < 64 ? std::uint64_t{1} << device : 0;
    if (err == cudaSuccess && bit != 0 && (state.devices.load(std::memory_order_acquire) & bit) != 0)
    {
        return VEO_KERNEL_OK;
    }
    int optin = 0;
    if (err == cudaSuccess)
    {
        err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    if (err == cudaSuccess && !smemPlan(dynamicBytes, staticBytes, optin).fits)
    {
        return kernelFail(VEO_KERNEL_UNSUPPORTED, std::string(what) + ": needs " + std::to_string(dynamicBytes)
            + " + " + std::to_string(staticBytes) + " (static) bytes of shared memory per CTA, this GPU gives "
            + std::to_string(optin));
    }
    if (err == cudaSuccess)
    {
        int const want = maxDynamicBytes + staticBytes <= optin ? maxDynamicBytes : optin - staticBytes;
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, want);
    }
    if (err != cudaSuccess)
    {
        cudaGetLastError(); // the failed call's error is reported here, not by the next launch
        return kernelFail(VEO_KERNEL_CUDA_ERROR, std::string(what) + ": cannot reserve "
            + std::to_string(dynamicBytes) + " bytes of shared memory: " + cudaGetErrorString(err)
            + " (needs sm_80 or newer)");
    }
    state.devices.fetch_or(bit, std::memory_order_acq_rel);
    return VEO_KERNEL_OK;
}

} // namespace veo
