#include "kernelCommon.cuh"

namespace
{
thread_local std::string gKernelError;
}

namespace veo
{

int kernelFail(int status, std::string const& msg)
{
    gKernelError = msg;
    return status;
}

int checkLaunch(char const* what)
{
    // cudaGetLastError, not cudaPeekAtLastError: peeking never clears, so one stale error would fail every
    // later launch. Reading clears it: the launch that sees an error reports it, once.
    cudaError_t const err = cudaGetLastError();
    if (err != cudaSuccess)
    {
        return kernelFail(VEO_KERNEL_CUDA_ERROR,
            std::string(what) + " launch failed (or an earlier CUDA call on this thread left its error): "
                + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
    }
    gKernelError.clear();
    return VEO_KERNEL_OK;
}

} // namespace veo

extern "C" const char* veoKernelLastError(void)
{
    return gKernelError.c_str();
}

extern "C" int veoDeviceComputeCapability(int* sm)
{
    if (sm == nullptr)
    {
        return veo::kernelFail(VEO_KERNEL_INVALID_ARGUMENT, "veoDeviceComputeCapability: sm is NULL");
    }
    int device = 0;
    int major = 0;
    int minor = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess)
    {
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    }
    if (err == cudaSuccess)
    {
        err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    }
    if (err != cudaSuccess)
    {
        cudaGetLastError();
        return veo::kernelFail(VEO_KERNEL_CUDA_ERROR,
            std::string("cannot read the current GPU's compute capability: ") + cudaGetErrorString(err));
    }
    *sm = major * 10 + minor;
    return VEO_KERNEL_OK;
}
