// veo-edge memory pool: regions, best-fit slices, coalescing, stream-ordered frees and bounded overflow
// (the paths that change the pool). Its read-only views are in memPoolInspect.cpp, the host backend in
// hostBackend.cpp.
#include "memPool.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace veo
{
namespace
{
//! `bytes` rounded up to the pool alignment; throws instead of wrapping to 0 for sizes near SIZE_MAX.
std::size_t alignedSize(std::size_t bytes, char const* what)
{
    if (bytes > std::numeric_limits<std::size_t>::max() - (MemPool::kALIGNMENT - 1))
    {
        std::ostringstream msg;
        msg << what << " of " << bytes << " bytes is too large (it overflows when rounded up to "
            << MemPool::kALIGNMENT << "); pass a real byte count";
        throw PoolError(PoolError::Code::kINVALID_ARGUMENT, msg.str());
    }
    return alignUp(bytes, MemPool::kALIGNMENT);
}
} // namespace

MemPool::MemPool(std::unique_ptr<PoolBackend> backend, std::size_t capacity)
    : mBackend(std::move(backend))
{
    if (!mBackend)
    {
        throw PoolError(PoolError::Code::kINVALID_ARGUMENT, "memory pool needs a backend, got none");
    }
    if (capacity == 0)
    {
        throw PoolError(PoolError::Code::kINVALID_ARGUMENT,
            "memory pool capacity is 0 bytes; pass the bytes to reserve (design: 4x the max-batch activation + I/O need)");
    }
    std::size_t const bytes = alignedSize(capacity, "memory pool capacity");
    addRegion(bytes, false);
    mDefaultOverflowLimit = bytes;
    mStats.overflowLimit = bytes;
}

MemPool::~MemPool()
{
    for (auto const& p : mPending)
    {
        mBackend->releaseFence(p.fence);
    }
    for (void* f : mOrphaned) // only a pool destroyed while a thread still waits in allocate leaves any
    {
        mBackend->releaseFence(f);
    }
    for (auto const& r : mRegions)
    {
        if (r.bytes != 0)
        {
            mBackend->release(r.base, r.bytes);
        }
    }
}

void MemPool::addRegion(std::size_t bytes, bool overflow)
{
    void* base = mBackend->reserve(bytes);
    auto const addr = reinterpret_cast<std::uintptr_t>(base);
    if (addr % kALIGNMENT != 0)
    {
        mBackend->release(base, bytes);
        throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE, "backend returned memory that is not 256-byte aligned");
    }
    auto const region = static_cast<std::uint32_t>(mRegions.size());
    mRegions.push_back(Region{base, bytes, overflow});
    mBlocks.emplace(addr, Block{bytes, region, true});
    mFree.emplace(bytes, addr);
    mStats.capacity += bytes;
    ++mStats.regionCount;
    if (overflow)
    {
        mStats.overflowBytes += bytes;
        ++mStats.overflowCount;
    }
}

void MemPool::eraseFreeIndexLocked(std::uintptr_t addr, std::size_t size)
{
    auto range = mFree.equal_range(size);
    for (auto it = range.first; it != range.second; ++it)
    {
        if (it->second == addr)
        {
            mFree.erase(it);
            return;
        }
    }
}

void* MemPool::takeLocked(FreeIndex::iterator it, std::size_t bytes)
{
    std::uintptr_t const addr = it->second;
    mFree.erase(it);
    Block& b = mBlocks.at(addr);
    if (b.size > bytes)
    {
        std::uintptr_t const rest = addr + bytes;
        mBlocks.emplace(rest, Block{b.size - bytes, b.region, true});
        mFree.emplace(b.size - bytes, rest);
        b.size = bytes;
    }
    b.free = false;
    return reinterpret_cast<void*>(addr);
}

void MemPool::makeFreeLocked(std::uintptr_t addr)
{
    auto it = mBlocks.find(addr);
    it->second.free = true;
    // Coalesce with the next block, then with the previous one, never across regions.
    auto next = std::next(it);
    if (next != mBlocks.end() && next->second.free && next->second.region == it->second.region
        && it->first + it->second.size == next->first)
    {
        eraseFreeIndexLocked(next->first, next->second.size);
        it->second.size += next->second.size;
        mBlocks.erase(next);
    }
    if (it != mBlocks.begin())
    {
        auto prev = std::prev(it);
        if (prev->second.free && prev->second.region == it->second.region
            && prev->first + prev->second.size == it->first)
        {
            eraseFreeIndexLocked(prev->first, prev->second.size);
            prev->second.size += it->second.size;
            mBlocks.erase(it);
            it = prev;
        }
    }
    mFree.emplace(it->second.size, it->first);
    releaseRegionIfFreeLocked(it->first);
}

void MemPool::releaseRegionIfFreeLocked(std::uintptr_t addr)
{
    auto it = mBlocks.find(addr);
    Region& r = mRegions.at(it->second.region);
    if (!r.overflow || it->second.size != r.bytes)
    {
        return; // the reservation stays; an overflow region stays while any part of it is used or pending
    }
    eraseFreeIndexLocked(addr, r.bytes);
    mBlocks.erase(it);
    mBackend->release(r.base, r.bytes);
    mStats.capacity -= r.bytes;
    mStats.overflowBytes -= r.bytes;
    --mStats.regionCount;
    ++mStats.overflowReleased;
    r.bytes = 0;
}

void MemPool::reclaimLocked()
{
    // Compacts mPending in place. If fenceDone throws (a lost device), the entries already reclaimed are
    // still dropped, so none is freed twice or has its fence released twice on the next call.
    auto keep = mPending.begin();
    auto it = mPending.begin();
    try
    {
        for (; it != mPending.end(); ++it)
        {
            if (mBackend->fenceDone(it->fence))
            {
                releaseFenceLocked(it->fence);
                mStats.pendingFree -= mBlocks.at(it->addr).size;
                makeFreeLocked(it->addr);
            }
            else
            {
                *keep++ = *it;
            }
        }
    }
    catch (...)
    {
        mPending.erase(keep, it);
        throw;
    }
    mPending.erase(keep, mPending.end());
}

void* MemPool::takePendingLocked(std::vector<Pending>::iterator it)
{
    // Taken whole (not split), so no part of a pending slice ever reaches another stream early.
    void* p = reinterpret_cast<void*>(it->addr);
    mStats.pendingFree -= mBlocks.at(it->addr).size;
    releaseFenceLocked(it->fence);
    mPending.erase(it);
    return p;
}

void MemPool::releaseFenceLocked(void* fence) noexcept
{
    if (std::find(mWaited.begin(), mWaited.end(), fence) == mWaited.end())
    {
        mBackend->releaseFence(fence);
        return;
    }
    try
    {
        mOrphaned.push_back(fence);
    }
    catch (...) // no room to remember it: leak one event rather than recycle one a thread waits on
    {
    }
}

bool MemPool::sameStream(Pending const& p, Stream s) noexcept
{
    auto const canonical = [](void* h) { // cudaStreamLegacy is the null (legacy default) stream
        return reinterpret_cast<std::uintptr_t>(h) == Stream::kLEGACY_HANDLE ? std::uintptr_t{0}
                                                                             : reinterpret_cast<std::uintptr_t>(h);
    };
    std::uintptr_t const h = canonical(s.handle());
    if (!s.ordered() || canonical(p.stream) != h)
    {
        return false;
    }
    return h != Stream::kPER_THREAD_HANDLE || p.thread == std::this_thread::get_id();
}

void* MemPool::takeFitLocked(std::size_t need, Stream stream)
{
    auto it = mFree.lower_bound(need); // best fit: the smallest free block that holds `need`
    if (it != mFree.end())
    {
        return takeLocked(it, need);
    }
    auto best = mPending.end();
    for (auto pit = mPending.begin(); pit != mPending.end(); ++pit)
    {
        std::size_t const sz = mBlocks.at(pit->addr).size;
        if (sameStream(*pit, stream) && sz >= need && (best == mPending.end() || sz < mBlocks.at(best->addr).size))
        {
            best = pit;
        }
    }
    return best != mPending.end() ? takePendingLocked(best) : nullptr;
}

void* MemPool::fenceToWaitLocked(std::size_t need)
{
    if (mPending.empty())
    {
        return nullptr;
    }
    // The smallest pending slice that holds `need` on its own; else the oldest free, whose slice may
    // coalesce with its neighbours into a fitting block.
    auto pick = mPending.begin();
    std::size_t best = 0;
    for (auto pit = mPending.begin(); pit != mPending.end(); ++pit)
    {
        std::size_t const sz = mBlocks.at(pit->addr).size;
        if (sz >= need && (best == 0 || sz < best))
        {
            pick = pit;
            best = sz;
        }
    }
    mWaited.push_back(pick->fence);
    return pick->fence;
}

void MemPool::waitUnlocked(std::unique_lock<std::mutex>& lock, void* fence)
{
    auto const done = [&] { // with the lock held again: drop the mark; the last waiter of an orphan frees it
        mWaited.erase(std::find(mWaited.begin(), mWaited.end(), fence));
        auto orphan = std::find(mOrphaned.begin(), mOrphaned.end(), fence);
        if (orphan != mOrphaned.end() && std::find(mWaited.begin(), mWaited.end(), fence) == mWaited.end())
        {
            mOrphaned.erase(orphan);
            mBackend->releaseFence(fence);
        }
    };
    lock.unlock();
    try
    {
        mBackend->waitFence(fence); // may throw (a lost device): nothing of the pool changed
    }
    catch (...)
    {
        lock.lock();
        done();
        throw;
    }
    lock.lock();
    done();
    ++mStats.fenceWaits;
}

void* MemPool::allocate(std::size_t bytes, Stream stream)
{
    if (bytes == 0)
    {
        throw PoolError(PoolError::Code::kINVALID_ARGUMENT, "cannot allocate 0 bytes from the memory pool; ask for > 0");
    }
    std::size_t const need = alignedSize(bytes, "allocation");
    std::unique_lock<std::mutex> lock(mMutex);
    void* p = nullptr;
    for (;;)
    {
        if (!mPending.empty())
        {
            reclaimLocked();
        }
        p = takeFitLocked(need, stream);
        if (p != nullptr)
        {
            break;
        }
        void* fence = fenceToWaitLocked(need); // a free still in flight on another stream beats growing
        if (fence == nullptr)
        {
            break;
        }
        waitUnlocked(lock, fence); // others allocate and free meanwhile: look again from the top
    }
    if (p == nullptr)
    {
        if (mStats.overflowBytes + need > mStats.overflowLimit)
        {
            std::ostringstream msg;
            msg << "memory pool exhausted: asked for " << need << " bytes, largest free slice is "
                << (mFree.empty() ? 0 : mFree.rbegin()->first) << " of " << mStats.capacity << " reserved, and "
                << mStats.overflowBytes << " of the " << mStats.overflowLimit
                << " overflow bytes allowed are in use; create the pool with a larger capacity or allow more overflow";
            throw PoolError(PoolError::Code::kOUT_OF_MEMORY, msg.str());
        }
        addRegion(need, true);
        p = takeLocked(mFree.lower_bound(need), need); // the new region's block: nothing else fit
    }
    std::size_t const got = mBlocks.at(reinterpret_cast<std::uintptr_t>(p)).size;
    mStats.inUse += got;
    mStats.peakInUse = std::max(mStats.peakInUse, mStats.inUse);
    ++mStats.allocCount;
    return p;
}

void MemPool::free(void* ptr, Stream stream)
{
    if (ptr == nullptr)
    {
        return;
    }
    auto const addr = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mMutex);
    auto it = mBlocks.find(addr);
    bool pending = false;
    for (auto const& p : mPending)
    {
        pending = pending || p.addr == addr;
    }
    if (it == mBlocks.end() || it->second.free || pending)
    {
        std::ostringstream msg;
        msg << "pointer " << ptr << " is not a live slice of this memory pool (double free, or memory from "
            << "elsewhere); free only what this pool's allocate returned, once";
        throw PoolError(PoolError::Code::kUNKNOWN_POINTER, msg.str());
    }
    // Both may throw, and nothing has changed yet: room for the pending entry first, then the fence (the
    // host backend returns none: the free is complete at once).
    mPending.reserve(mPending.size() + 1);
    void* fence = stream.ordered() ? mBackend->recordFence(stream.handle()) : nullptr;
    mStats.inUse -= it->second.size;
    ++mStats.freeCount;
    if (fence == nullptr)
    {
        makeFreeLocked(addr);
        return;
    }
    mPending.push_back(Pending{addr, stream.handle(), fence, std::this_thread::get_id()});
    mStats.pendingFree += it->second.size;
}

void MemPool::setOverflowAllowed(bool allowed)
{
    std::lock_guard<std::mutex> lock(mMutex);
    mStats.overflowLimit = allowed ? mDefaultOverflowLimit : 0;
}

void MemPool::setOverflowLimit(std::size_t bytes)
{
    std::lock_guard<std::mutex> lock(mMutex);
    mStats.overflowLimit = bytes;
}

} // namespace veo
