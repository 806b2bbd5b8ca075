// Unit tests of the memory pool on the host backend: alignment, best fit, coalescing, overflow, bad frees,
// threads, steady-state growth and the C ABI. Stream-ordered frees: testMemPoolFences.cpp; the CUDA
// backend over stand-ins for cudart: testMemPoolCuda.cpp.
#include "cudaBackend.h"
#include "memPool.h"
#include "memPoolTestUtil.h"
#include "testHarness.h"
#include "veoMempool.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <random>
#include <thread>

using veo::MemPool;
using veo::PoolError;
using veo::test::FencedBackend;
using veo::test::hostPool;
using veo::test::requireSound;

VEO_TEST(alignment)
{
    auto pool = hostPool(64 << 20);
    std::mt19937 rng(1234);
    std::uniform_int_distribution<std::size_t> size(1, 300000);
    std::vector<void*> live;
    for (int i = 0; i < 200; ++i)
    {
        std::size_t const n = size(rng);
        void* p = pool->allocate(n);
        VEO_CHECK_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
        VEO_CHECK(pool->sliceSize(p) >= n);
        VEO_CHECK_EQ(pool->sliceSize(p) % 256, 0u);
        live.push_back(p);
    }
    for (void* p : live)
    {
        pool->free(p);
    }
    VEO_CHECK_EQ(pool->stats().inUse, 0u);
    requireSound(*pool);
}

VEO_TEST(random_trace_no_overlap)
{
    for (unsigned seed : {1u, 2u, 3u, 42u, 2024u})
    {
        auto pool = hostPool(16 << 20);
        std::mt19937 rng(seed);
        std::uniform_int_distribution<std::size_t> size(1, 200000);
        std::map<std::uintptr_t, std::pair<std::size_t, unsigned char>> live; // addr -> (bytes, fill)
        for (int op = 0; op < 20000; ++op)
        {
            bool const doAlloc = live.empty() || (live.size() < 32 && rng() % 2 == 0);
            if (doAlloc)
            {
                std::size_t const n = size(rng);
                auto const p = reinterpret_cast<std::uintptr_t>(pool->allocate(n));
                auto after = live.lower_bound(p);
                VEO_CHECK(after == live.end() || p + n <= after->first);
                if (after != live.begin())
                {
                    auto before = std::prev(after);
                    VEO_CHECK(before->first + before->second.first <= p);
                }
                auto const fill = static_cast<unsigned char>(rng());
                std::memset(reinterpret_cast<void*>(p), fill, n);
                live[p] = {n, fill};
            }
            else
            {
                auto it = live.begin();
                std::advance(it, rng() % live.size());
                auto const* bytes = reinterpret_cast<unsigned char const*>(it->first);
                for (std::size_t i = 0; i < it->second.first; i += 97)
                {
                    VEO_CHECK_EQ(int(bytes[i]), int(it->second.second)); // nobody else wrote into it
                }
                pool->free(reinterpret_cast<void*>(it->first));
                live.erase(it);
            }
            if (op % 1000 == 0)
            {
                requireSound(*pool);
            }
        }
        for (auto const& kv : live)
        {
            pool->free(reinterpret_cast<void*>(kv.first));
        }
        requireSound(*pool);
        auto const s = pool->stats();
        VEO_CHECK_EQ(s.inUse, 0u);
        // Everything coalesces back: one free block per region.
        VEO_CHECK_EQ(s.overflowCount, 0u);
        VEO_CHECK_EQ(s.largestFree, s.capacity); // everything coalesced back into one block
    }
}

VEO_TEST(coalescing)
{
    std::size_t const cap = 4096 * 256;
    auto pool = hostPool(cap);
    void* a = pool->allocate(cap / 4);
    void* b = pool->allocate(cap / 4);
    void* c = pool->allocate(cap / 4);
    void* d = pool->allocate(cap / 4);
    VEO_CHECK_EQ(pool->stats().totalFree, 0u);
    VEO_CHECK_EQ(pool->stats().fragmentation, 0.0);
    pool->free(a);
    pool->free(c);
    auto s = pool->stats();
    VEO_CHECK_EQ(s.totalFree, cap / 2);
    VEO_CHECK_EQ(s.largestFree, cap / 4);
    VEO_CHECK_EQ(s.fragmentation, 0.5);
    pool->free(b); // joins a and c
    s = pool->stats();
    VEO_CHECK_EQ(s.largestFree, 3 * cap / 4);
    VEO_CHECK_EQ(s.fragmentation, 0.0);
    pool->free(d);
    s = pool->stats();
    VEO_CHECK_EQ(s.largestFree, cap);
    VEO_CHECK_EQ(s.peakInUse, cap);
    // The whole region is one block again: a full-size allocation fits without overflow.
    void* all = pool->allocate(cap);
    VEO_CHECK_EQ(pool->stats().overflowCount, 0u);
    pool->free(all);
    requireSound(*pool);
}

VEO_TEST(best_fit)
{
    auto pool = hostPool(1 << 20);
    void* a = pool->allocate(4096);
    void* sep1 = pool->allocate(256);
    void* b = pool->allocate(1024);
    void* sep2 = pool->allocate(256);
    pool->free(a);
    pool->free(b);
    VEO_CHECK_EQ(pool->allocate(1000), b); // the 1024 hole, not the 4096 one nor the tail
    VEO_CHECK_EQ(pool->allocate(4000), a);
    (void) sep1;
    (void) sep2;
    requireSound(*pool);
}

VEO_TEST(exhaustion_overflow_counted)
{
    auto pool = hostPool(1 << 16);
    void* a = pool->allocate(1 << 16);
    VEO_CHECK_EQ(pool->stats().overflowCount, 0u);
    VEO_CHECK_EQ(pool->stats().overflowLimit, 1u << 16); // default: overflow may double the reservation
    void* b = pool->allocate(1000); // exhausted: explicit overflow region
    auto s = pool->stats();
    VEO_CHECK_EQ(s.overflowCount, 1u);
    VEO_CHECK_EQ(s.regionCount, 2u);
    VEO_CHECK_EQ(s.overflowBytes, 1024u);
    VEO_CHECK_EQ(s.capacity, (1u << 16) + 1024u);
    pool->free(b); // the overflow region is entirely free again: given back
    s = pool->stats();
    VEO_CHECK_EQ(s.overflowReleased, 1u);
    VEO_CHECK_EQ(s.regionCount, 1u);
    VEO_CHECK_EQ(s.capacity, 1u << 16);
    VEO_CHECK_EQ(s.overflowBytes, 0u);
    pool->setOverflowAllowed(false);
    VEO_CHECK_THROWS(pool->allocate(1 << 20), PoolError, "memory pool exhausted: asked for 1048576 bytes");
    pool->free(a);
    requireSound(*pool);
}

VEO_TEST(overflow_is_bounded_and_released)
{
    auto pool = hostPool(1 << 16);
    void* a = pool->allocate(1 << 16);
    void* b = pool->allocate(1 << 15); // overflow 32 KiB of the 64 KiB allowed
    void* c = pool->allocate(1 << 14); // 48 KiB
    VEO_CHECK_THROWS(pool->allocate(1 << 15), PoolError, "49152 of the 65536 overflow bytes allowed are in use");
    auto s = pool->stats();
    VEO_CHECK_EQ(s.overflowCount, 2u);
    VEO_CHECK_EQ(s.overflowBytes, 3u << 14);
    pool->setOverflowLimit(1 << 20);
    void* d = pool->allocate(1 << 15); // within the raised limit
    VEO_CHECK_EQ(pool->stats().overflowCount, 3u);
    for (void* p : {b, c, d})
    {
        pool->free(p);
    }
    s = pool->stats();
    VEO_CHECK_EQ(s.overflowReleased, 3u);
    VEO_CHECK_EQ(s.capacity, 1u << 16);
    VEO_CHECK_EQ(s.regionCount, 1u);
    requireSound(*pool);
    pool->free(a);
    VEO_CHECK_EQ(pool->stats().largestFree, 1u << 16); // the reservation itself is never released
    requireSound(*pool);
}

VEO_TEST(bad_frees_are_reported)
{
    auto pool = hostPool(1 << 16);
    void* a = pool->allocate(100);
    pool->free(a);
    VEO_CHECK_THROWS(pool->free(a), PoolError, "not a live slice");
    int x = 0;
    VEO_CHECK_THROWS(pool->free(&x), PoolError, "double free, or memory from elsewhere");
    VEO_CHECK_THROWS(pool->allocate(0), PoolError, "cannot allocate 0 bytes");
    VEO_CHECK_THROWS(hostPool(0), PoolError, "capacity is 0 bytes");
}

VEO_TEST(huge_sizes_are_refused)
{
    // Sizes within 255 bytes of SIZE_MAX used to wrap to 0 when rounded up to 256: allocate then returned
    // an empty slice at an address that stayed in the free index, so the next allocation overlapped it.
    auto pool = hostPool(1 << 16);
    std::size_t const huge = std::numeric_limits<std::size_t>::max() - 100;
    VEO_CHECK_THROWS(pool->allocate(huge), PoolError, "too large");
    VEO_CHECK_THROWS(hostPool(huge), PoolError, "too large");
    void* a = pool->allocate(256);
    void* b = pool->allocate(256);
    VEO_CHECK(a != b);
    VEO_CHECK_EQ(pool->stats().inUse, 512u);
    pool->free(a);
    pool->free(b);
    requireSound(*pool);
}

VEO_TEST(thread_safety)
{
    auto pool = hostPool(32 << 20);
    std::atomic<int> errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
    {
        threads.emplace_back([&, t] {
            std::mt19937 rng(100 + t);
            std::vector<std::pair<unsigned char*, std::size_t>> mine;
            for (int i = 0; i < 20000; ++i)
            {
                if (mine.size() < 16 && (rng() % 2 == 0 || mine.empty()))
                {
                    std::size_t const n = 1 + rng() % 65536;
                    auto* p = static_cast<unsigned char*>(pool->allocate(n));
                    std::memset(p, t + 1, n);
                    mine.emplace_back(p, n);
                }
                else
                {
                    auto [p, n] = mine.back();
                    mine.pop_back();
                    if (p[0] != t + 1 || p[n - 1] != t + 1 || p[n / 2] != t + 1)
                    {
                        ++errors; // another thread wrote into this thread's slice
                    }
                    pool->free(p);
                }
            }
            for (auto [p, n] : mine)
            {
                pool->free(p);
            }
        });
    }
    for (auto& th : threads)
    {
        th.join();
    }
    VEO_CHECK_EQ(errors.load(), 0);
    VEO_CHECK_EQ(pool->stats().inUse, 0u);
    VEO_CHECK_EQ(pool->stats().overflowCount, 0u);
    requireSound(*pool);
}

VEO_TEST(zero_growth_million_cycles)
{
    auto pool = hostPool(16 << 20);
    std::mt19937 rng(7);
    void* held[4] = {};
    for (int i = 0; i < 1000000; ++i)
    {
        int const slot = i % 4;
        if (held[slot] != nullptr)
        {
            pool->free(held[slot]);
        }
        held[slot] = pool->allocate(1 + rng() % (1 << 20));
    }
    for (void* p : held)
    {
        pool->free(p);
    }
    auto const s = pool->stats();
    VEO_CHECK_EQ(s.allocCount, 1000000u);
    VEO_CHECK_EQ(s.capacity, 16u << 20);
    VEO_CHECK_EQ(s.regionCount, 1u);
    VEO_CHECK_EQ(s.overflowCount, 0u);
    VEO_CHECK_EQ(s.inUse, 0u);
    VEO_CHECK_EQ(s.largestFree, 16u << 20);
    requireSound(*pool);
}

VEO_TEST(c_abi)
{
    veo_mempool* pool = nullptr;
    VEO_CHECK_EQ(veo_mempool_create(7, 1024, &pool), int(VEO_MEMPOOL_INVALID_ARGUMENT));
    VEO_CHECK(std::string(veo_mempool_last_error()).find("expected 0 (host) or 1 (cuda)") != std::string::npos);
    VEO_CHECK_EQ(veo_mempool_create(VEO_MEMPOOL_HOST, 1000, &pool), int(VEO_MEMPOOL_OK));
    void* p = nullptr;
    VEO_CHECK_EQ(veo_mempool_alloc(pool, 10, nullptr, &p), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
    veo_mempool_stats s{};
    VEO_CHECK_EQ(veo_mempool_get_stats(pool, &s), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(s.capacity, 1024u);
    VEO_CHECK_EQ(s.in_use, 256u);
    VEO_CHECK_EQ(veo_mempool_free(pool, p, nullptr), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(veo_mempool_free(pool, p, nullptr), int(VEO_MEMPOOL_UNKNOWN_POINTER));
    VEO_CHECK_EQ(veo_mempool_abi_version(), 2);
    VEO_CHECK_EQ(veo_mempool_alloc_async(pool, 10, nullptr, &p), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(veo_mempool_free_async(pool, p, nullptr), int(VEO_MEMPOOL_OK)); // host: complete at once
    VEO_CHECK_EQ(veo_mempool_set_overflow_limit(pool, 0), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(veo_mempool_get_stats(pool, &s), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(s.overflow_limit, 0u);
    VEO_CHECK_EQ(s.in_use, 0u);
    VEO_CHECK_EQ(veo_mempool_alloc(pool, 2048, nullptr, &p), int(VEO_MEMPOOL_OUT_OF_MEMORY));
    char buf[256];
    VEO_CHECK_EQ(veo_mempool_check(pool, buf, sizeof(buf)), int(VEO_MEMPOOL_OK));
    VEO_CHECK_EQ(std::string(buf), std::string());
    VEO_CHECK_EQ(veo_mempool_destroy(pool), int(VEO_MEMPOOL_OK));
}


VEO_TEST_MAIN()
