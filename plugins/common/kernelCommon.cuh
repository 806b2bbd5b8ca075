// Device helpers shared by the veo-edge kernels: FP16/FP32 load/store, warp reductions, launch errors.
#pragma once

#include "veoKernelStatus.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
//! VEO_KERNEL_OK, or VEO_KERNEL_CUDA_ERROR with cudaPeekAtLastError's text after a launch of `what`.
int checkLaunch(char const* what);

} // namespace veo
