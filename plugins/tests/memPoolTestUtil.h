// Helpers the memory pool's host tests share: a pool on host memory, its invariant check, and a host
// backend whose stream-ordered frees stay pending until a test completes their fences.
#pragma once

#include "memPool.h"
#include "testHarness.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace veo::test
{

inline std::unique_ptr<veo::MemPool> hostPool(std::size_t cap)
{
    return std::make_unique<veo::MemPool>(std::make_unique<veo::HostBackend>(), cap);
}

inline void requireSound(veo::MemPool const& pool)
{
    std::string const bad = pool.checkInvariants();
    if (!bad.empty())
    {
        throw veo::test::Failure{"pool invariants broken: " + bad};
    }
}

//! Host memory, but a free on a stream stays pending until the test completes that stream's fences.
class FencedBackend : public veo::HostBackend
{
public:
    std::map<void*, bool> done; // fence -> completed
    std::vector<void*> streams; // the stream of every recorded fence, in order
    int next{1};
    int waits{0};
    void* recordFence(void* stream) override
    {
        void* f = reinterpret_cast<void*>(static_cast<std::uintptr_t>(next++) << 8);
        done[f] = false;
        streams.push_back(stream);
        return f;
    }
    bool fenceDone(void* f) override { return done.at(f); }
    void waitFence(void* f) override // what cudaEventSynchronize does: the stream reaches the fence
    {
        ++waits;
        done.at(f) = true;
    }
    void releaseFence(void* f) noexcept override { done.erase(f); }
    void completeAll()
    {
        for (auto& kv : done)
        {
            kv.second = true;
        }
    }
};
} // namespace veo::test
