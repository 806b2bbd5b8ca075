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
    cudaError_t const err = cudaPeekAtLastError();
    if (err != cudaSuccess)
    {
        return kernelFail(VEO_KERNEL_CUDA_ERROR,
            std::string(what) + " launch failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
    }
    gKernelError.clear();
    return VEO_KERNEL_OK;
}

} // namespace veo

extern "C" const char* veoKernelLastError(void)
{
    return gKernelError.c_str();
}
