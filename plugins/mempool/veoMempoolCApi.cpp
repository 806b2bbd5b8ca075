#include "veoMempool.h"

#include "memPool.h"

#include <cstring>
#include <exception>
#include <string>
#include <vector>

struct veo_mempool
{
    std::unique_ptr<veo::MemPool> pool;
};

namespace
{
thread_local std::string gLastError;

int fail(int status, std::string const& msg)
{
    gLastError = msg;
    return status;
}

template <typename F>
int guarded(F&& body) noexcept
{
    try
    {
        gLastError.clear();
        body();
        return VEO_MEMPOOL_OK;
    }
    catch (veo::PoolError const& e)
    {
        return fail(static_cast<int>(e.code()), e.what());
    }
    catch (std::bad_alloc const&)
    {
        return fail(VEO_MEMPOOL_OUT_OF_MEMORY, "host memory exhausted while updating the pool's bookkeeping");
    }
    catch (std::exception const& e)
    {
        return fail(VEO_MEMPOOL_INTERNAL, std::string("internal error in the memory pool: ") + e.what());
    }
}

int nullPool()
{
    return fail(VEO_MEMPOOL_INVALID_ARGUMENT, "pool handle is NULL; create it with veo_mempool_create first");
}
} // namespace

extern "C" {

int veo_mempool_abi_version(void)
{
    return VEO_MEMPOOL_ABI_VERSION;
}

int veo_mempool_create(int backend, uint64_t capacity, veo_mempool** out)
{
    if (out == nullptr)
    {
        return fail(VEO_MEMPOOL_INVALID_ARGUMENT, "veo_mempool_create: output pointer is NULL");
    }
    *out = nullptr;
    return guarded([&] {
        std::unique_ptr<veo::PoolBackend> b;
        if (backend == VEO_MEMPOOL_HOST)
        {
            b = std::make_unique<veo::HostBackend>();
        }
        else if (backend == VEO_MEMPOOL_CUDA)
        {
            b = veo::makeCudaBackend();
        }
        else
        {
            throw veo::PoolError(veo::PoolError::Code::kINVALID_ARGUMENT,
                "unknown pool backend " + std::to_string(backend) + "; expected 0 (host) or 1 (cuda)");
        }
        auto h = std::make_unique<veo_mempool>();
        h->pool = std::make_unique<veo::MemPool>(std::move(b), static_cast<std::size_t>(capacity));
        *out = h.release();
    });
}

int veo_mempool_destroy(veo_mempool* pool)
{
    delete pool;
    return VEO_MEMPOOL_OK;
}

int veo_mempool_alloc(veo_mempool* pool, uint64_t size, void* stream, void** out)
{
    if (pool == nullptr || out == nullptr)
    {
        return nullPool();
    }
    *out = nullptr;
    // NULL is "no stream" here (ABI 1); veo_mempool_alloc_async takes NULL as the legacy default stream
    veo::Stream const s = stream != nullptr ? veo::Stream(stream) : veo::Stream::none();
    return guarded([&] { *out = pool->pool->allocate(static_cast<std::size_t>(size), s); });
}

int veo_mempool_alloc_async(veo_mempool* pool, uint64_t size, void* stream, void** out)
{
    if (pool == nullptr || out == nullptr)
    {
        return nullPool();
    }
    *out = nullptr;
    return guarded([&] { *out = pool->pool->allocate(static_cast<std::size_t>(size), veo::Stream(stream)); });
}

int veo_mempool_free(veo_mempool* pool, void* ptr, void* stream)
{
    if (pool == nullptr)
    {
        return nullPool();
    }
    veo::Stream const s = stream != nullptr ? veo::Stream(stream) : veo::Stream::none();
    return guarded([&] { pool->pool->free(ptr, s); });
}

int veo_mempool_free_async(veo_mempool* pool, void* ptr, void* stream)
{
    if (pool == nullptr)
    {
        return nullPool();
    }
    return guarded([&] { pool->pool->free(ptr, veo::Stream(stream)); });
}

int veo_mempool_set_overflow_limit(veo_mempool* pool, uint64_t bytes)
{
    if (pool == nullptr)
    {
        return nullPool();
    }
    return guarded([&] { pool->pool->setOverflowLimit(static_cast<std::size_t>(bytes)); });
}

int veo_mempool_set_overflow(veo_mempool* pool, int allowed)
{
    if (pool == nullptr)
    {
        return nullPool();
    }
    return guarded([&] { pool->pool->setOverflowAllowed(allowed != 0); });
}

int veo_mempool_get_stats(veo_mempool* pool, veo_mempool_stats* out)
{
    if (pool == nullptr || out == nullptr)
    {
        return nullPool();
    }
    return guarded([&] {
        veo::PoolStats const s = pool->pool->stats();
        *out = veo_mempool_stats{s.capacity, s.inUse, s.peakInUse, s.pendingFree, s.largestFree, s.totalFree,
            s.fragmentation, s.allocCount, s.freeCount, s.overflowCount, s.regionCount, s.overflowBytes,
            s.overflowLimit, s.overflowReleased, s.fenceWaits};
    });
}

int veo_mempool_free_blocks(veo_mempool* pool, uint64_t* sizes, uint64_t capacity, uint64_t* count)
{
    if (pool == nullptr)
    {
        return nullPool();
    }
    if (count == nullptr || (sizes == nullptr && capacity != 0))
    {
        return fail(VEO_MEMPOOL_INVALID_ARGUMENT,
            "veo_mempool_free_blocks: count is NULL, or sizes is NULL with capacity > 0; pass both");
    }
    return guarded([&] {
        std::vector<std::size_t> const blocks = pool->pool->freeBlockSizes();
        *count = blocks.size();
        for (std::size_t i = 0; i < blocks.size() && i < capacity; ++i)
        {
            sizes[i] = blocks[i];
        }
    });
}

int veo_mempool_check(veo_mempool* pool, char* buf, uint64_t buf_len)
{
    if (pool == nullptr || buf == nullptr || buf_len == 0)
    {
        return nullPool();
    }
    return guarded([&] {
        std::string const r = pool->pool->checkInvariants();
        std::size_t const n = std::min<std::size_t>(r.size(), static_cast<std::size_t>(buf_len - 1));
        std::memcpy(buf, r.data(), n);
        buf[n] = '\0';
    });
}

const char* veo_mempool_last_error(void)
{
    return gLastError.c_str();
}

} // extern "C"
