#include "gpuAsyncAllocator.h"

#include "pluginUtils.h"
#include "poolAllocatorContract.h"

namespace veo::plugin
{

// The contract (size 0, alignment, null stream = legacy default stream) lives in poolAllocatorContract.cpp,
// tested on the host; this only forwards and logs. kRESIZABLE needs no special handling: reallocate()
// keeps IGpuAllocator's default (nullptr), so TensorRT allocates anew.
void* PoolGpuAllocator::allocateAsync(
    uint64_t const size, uint64_t const alignment, nvinfer1::AllocatorFlags const, cudaStream_t stream) noexcept
{
    std::string why;
    void* p = poolAllocateAsync(mPool, size, alignment, stream, why);
    if (p == nullptr && !why.empty())
    {
        logError("PoolGpuAllocator::allocateAsync: ", why.c_str()); // noexcept-clean: no temporary here
    }
    return p;
}

bool PoolGpuAllocator::deallocateAsync(void* const memory, cudaStream_t stream) noexcept
{
    std::string why;
    bool const ok = poolDeallocateAsync(mPool, memory, stream, why);
    if (!ok)
    {
        logError("PoolGpuAllocator::deallocateAsync: ", why.c_str());
    }
    return ok;
}

} // namespace veo::plugin
