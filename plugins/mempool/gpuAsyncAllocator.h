// TensorRT IGpuAsyncAllocator backed by a veo::MemPool (CUDA backend): TensorRT's allocations come from
// the pool's region, and stream-ordered frees are honoured. Pass it to IRuntime/IBuilder::setGpuAllocator.
#pragma once

#include "NvInferRuntime.h"
#include "memPool.h"

namespace veo::plugin
{

class PoolGpuAllocator : public nvinfer1::v_1_0::IGpuAsyncAllocator
{
public:
    //! The pool must outlive the allocator and every TensorRT object that uses it.
    explicit PoolGpuAllocator(MemPool& pool) noexcept
        : mPool(pool)
    {
    }
    void* allocateAsync(uint64_t const size, uint64_t const alignment, nvinfer1::AllocatorFlags const flags,
        cudaStream_t stream) noexcept override;
    bool deallocateAsync(void* const memory, cudaStream_t stream) noexcept override;

private:
    MemPool& mPool;
};

} // namespace veo::plugin
