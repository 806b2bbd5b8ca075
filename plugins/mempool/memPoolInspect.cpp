// veo-edge memory pool: what can be read of it without changing it: a slice's size, the counters and the
// fragmentation (stats), the free blocks in address order (the soak's entropy), and the invariants the
// tests check after every operation. The allocation and free paths are in memPool.cpp.
#include "memPool.h"

#include <sstream>

namespace veo
{

std::size_t MemPool::sliceSize(void const* ptr) const
{
    std::lock_guard<std::mutex> lock(mMutex);
    auto it = mBlocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == mBlocks.end() || it->second.free)
    {
        throw PoolError(PoolError::Code::kUNKNOWN_POINTER, "pointer is not a live slice of this memory pool");
    }
    return it->second.size;
}

PoolStats MemPool::stats() const
{
    std::lock_guard<std::mutex> lock(mMutex);
    PoolStats s = mStats;
    s.totalFree = 0;
    for (auto const& f : mFree)
    {
        s.totalFree += f.first;
    }
    s.largestFree = mFree.empty() ? 0 : mFree.rbegin()->first;
    s.fragmentation = s.totalFree == 0 ? 0.0 : 1.0 - double(s.largestFree) / double(s.totalFree);
    return s;
}

std::string MemPool::checkInvariants() const
{
    std::lock_guard<std::mutex> lock(mMutex);
    std::ostringstream err;
    std::vector<std::size_t> covered(mRegions.size(), 0);
    std::uint64_t overflow = 0;
    std::uint64_t live = 0;
    std::uintptr_t prevEnd = 0;
    std::size_t freeBlocks = 0;
    std::uint64_t used = 0;
    for (auto const& kv : mBlocks)
    {
        auto const& b = kv.second;
        if (kv.first % kALIGNMENT != 0 || b.size % kALIGNMENT != 0 || b.size == 0)
        {
            err << "block " << kv.first << " misaligned or empty; ";
        }
        if (kv.first < prevEnd)
        {
            err << "block " << kv.first << " overlaps its predecessor; ";
        }
        prevEnd = kv.first + b.size;
        auto const base = reinterpret_cast<std::uintptr_t>(mRegions.at(b.region).base);
        if (kv.first < base || prevEnd > base + mRegions[b.region].bytes)
        {
            err << "block " << kv.first << " outside its region; ";
        }
        covered[b.region] += b.size;
        if (b.free)
        {
            ++freeBlocks;
            auto next = mBlocks.upper_bound(kv.first);
            if (next != mBlocks.end() && next->second.free && next->second.region == b.region
                && next->first == prevEnd)
            {
                err << "free blocks " << kv.first << " and " << next->first << " not coalesced; ";
            }
        }
        else
        {
            used += b.size;
        }
    }
    for (std::size_t r = 0; r < mRegions.size(); ++r)
    {
        if (covered[r] != mRegions[r].bytes)
        {
            err << "region " << r << " not tiled by its blocks; ";
        }
        overflow += mRegions[r].overflow ? mRegions[r].bytes : 0;
        live += mRegions[r].bytes != 0;
        if (mRegions[r].overflow && mRegions[r].bytes != 0)
        {
            auto b = mBlocks.find(reinterpret_cast<std::uintptr_t>(mRegions[r].base));
            if (b != mBlocks.end() && b->second.free && b->second.size == mRegions[r].bytes)
            {
                err << "overflow region " << r << " is entirely free but was not released; ";
            }
        }
    }
    if (overflow != mStats.overflowBytes || live != mStats.regionCount)
    {
        err << "region accounting " << mStats.overflowBytes << " overflow bytes / " << mStats.regionCount
            << " regions != " << overflow << " / " << live << "; ";
    }
    if (freeBlocks != mFree.size())
    {
        err << "free index has " << mFree.size() << " entries for " << freeBlocks << " free blocks; ";
    }
    if (used != mStats.inUse + mStats.pendingFree)
    {
        err << "in-use accounting " << mStats.inUse << "+" << mStats.pendingFree << " != " << used << "; ";
    }
    return err.str();
}

std::vector<std::size_t> MemPool::freeBlockSizes() const
{
    std::lock_guard<std::mutex> lock(mMutex);
    std::vector<std::size_t> sizes;
    for (auto const& [addr, block] : mBlocks)
    {
        if (block.free)
        {
            sizes.push_back(block.size);
        }
    }
    return sizes;
}

} // namespace veo
