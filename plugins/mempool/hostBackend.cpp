// veo-edge memory pool: the host backend (aligned_alloc), used by the tests and on machines without CUDA.
#include "memPool.h"

#include <cstdlib>
#include <sstream>

namespace veo
{

void* HostBackend::reserve(std::size_t bytes)
{
    void* p = std::aligned_alloc(MemPool::kALIGNMENT, bytes);
    if (p == nullptr)
    {
        std::ostringstream msg;
        msg << "host backend could not reserve " << bytes << " bytes; ask for a smaller pool capacity";
        throw PoolError(PoolError::Code::kOUT_OF_MEMORY, msg.str());
    }
    return p;
}

void HostBackend::release(void* base, std::size_t) noexcept
{
    std::free(base);
}

} // namespace veo
