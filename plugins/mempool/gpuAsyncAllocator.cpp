#include "gpuAsyncAllocator.h"

#include "pluginUtils.h"

namespace veo::plugin
{

void* PoolGpuAllocator::allocateAsync(
    uint64_t const size, uint64_t const alignment, nvinfer1::AllocatorFlags const, cudaStream_t stream) noexcept
{
    // Slices are 256-byte aligned; any power-of-two alignment up to 256 is met. kRESIZABLE needs no
    // special handling: reallocate() keeps IGpuAllocator's default (nullptr), so TensorRT allocates anew.
    if (alignment > MemPool::kALIGNMENT || (alignment & (alignment - 1)) != 0)
    {
        logError("PoolGpuAllocator: alignment " + std::to_string(alignment)
            + " requested; the pool serves power-of-two alignments up to 256");
        return nullptr;
    }
    return guarded<void*>("PoolGpuAllocator", "allocateAsync", nullptr,
        [&] { return mPool.allocate(static_cast<std::size_t>(size == 0 ? 1 : size), stream); });
}

bool PoolGpuAllocator::deallocateAsync(void* const memory, cudaStream_t stream) noexcept
{
    return guarded<bool>("PoolGpuAllocator", "deallocateAsync", false, [&] {
        mPool.free(memory, stream);
        return true;
    });
}

} // namespace veo::plugin
