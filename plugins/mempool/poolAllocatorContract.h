// TensorRT's IGpuAsyncAllocator contract over a veo::MemPool, without TensorRT, so that it is tested on
// the host (plugins/tests/testMemPool.cpp) and PoolGpuAllocator (gpuAsyncAllocator.cpp) only forwards.
// From NvInferRuntime.h (10.3 and 11.x): a size-0 request returns nullptr; alignment is 0 or a power of two
// no larger than cudaMalloc's; a null stream is the legacy default stream (the deprecated synchronous
// allocate/deallocate forward nullptr too); deallocating nullptr succeeds; nothing may throw.
#pragma once

#include "memPool.h"

#include <cstdint>
#include <string>

namespace veo
{

//! A slice of at least `size` bytes ordered on `stream`, or nullptr (size 0, an alignment the pool cannot
//! meet, exhaustion, a backend failure); on failure `why` says what happened (empty for size 0).
void* poolAllocateAsync(MemPool& pool, std::uint64_t size, std::uint64_t alignment, void* stream,
    std::string& why) noexcept;

//! Returns `memory` ordered on `stream` (null: the legacy default stream, fenced like any other). True on
//! success and for nullptr; false with `why` for a pointer the pool does not know or a backend failure.
bool poolDeallocateAsync(MemPool& pool, void* memory, void* stream, std::string& why) noexcept;

} // namespace veo
