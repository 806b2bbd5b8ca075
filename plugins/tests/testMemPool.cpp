// Unit tests of the memory pool on the host backend, a fake backend with controllable fences, and the CUDA
// backend over stand-ins for the cudart calls it makes (what CUDA itself does is all that is faked).
#include "cudaBackend.h"
#include "memPool.h"
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

namespace
{
std::unique_ptr<MemPool> hostPool(std::size_t cap)
{
    return std::make_unique<MemPool>(std::make_unique<veo::HostBackend>(), cap);
}

void requireSound(MemPool const& pool)
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
} // namespace

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

VEO_TEST(fence_query_failure_keeps_pool_sound)
{
    // A fence query that throws (a lost device) in the middle of reclaiming must not leave reclaimed or
    // duplicated entries behind: the next reclaim would free them twice.
    struct FlakyBackend : FencedBackend
    {
        void* bad{nullptr};
        bool fenceDone(void* f) override
        {
            if (f == bad)
            {
                throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE, "fence query failed");
            }
            return FencedBackend::fenceDone(f);
        }
    };
    auto backend = std::make_unique<FlakyBackend>();
    FlakyBackend* fb = backend.get();
    MemPool pool(std::move(backend), 4 << 10);
    void* s = reinterpret_cast<void*>(0x100);
    void* a = pool.allocate(1024, s);
    void* b = pool.allocate(1024, s);
    void* c = pool.allocate(1024, s);
    pool.free(a, s); // fence 1: will be done
    pool.free(b, s); // fence 2: stays pending
    pool.free(c, s); // fence 3: its query throws
    fb->done.begin()->second = true;
    fb->bad = std::next(fb->done.begin(), 2)->first;
    VEO_CHECK_THROWS(pool.allocate(4096, s), PoolError, "fence query failed");
    fb->bad = nullptr;
    fb->completeAll();
    void* all = pool.allocate(4096); // everything reclaimed exactly once: the whole region is one slice
    VEO_CHECK_EQ(pool.stats().pendingFree, 0u);
    pool.free(all);
    requireSound(pool);
}

//! Fences are tickets; a ticket is done once `completed` passed it (a separate thread advances it).
class TicketBackend : public veo::HostBackend
{
public:
    std::atomic<std::uintptr_t> completed{0};
    std::uintptr_t next{1}; // touched only under the pool's lock
    void* recordFence(void*) override { return reinterpret_cast<void*>(next++); }
    bool fenceDone(void* f) override { return reinterpret_cast<std::uintptr_t>(f) <= completed.load(); }
    void waitFence(void* f) override
    {
        while (!fenceDone(f))
        {
            std::this_thread::yield();
        }
    }
    void releaseFence(void*) noexcept override {}
};

VEO_TEST(stream_ordered_free_threads)
{
    // Each thread is one stream: frees on its stream, allocates (and may reuse its own pending slices)
    // while a completer thread retires fences. No slice may reach another thread before its fence is done.
    auto backend = std::make_unique<TicketBackend>();
    TicketBackend* tb = backend.get();
    MemPool pool(std::move(backend), 8 << 20);
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0};
    std::thread completer([&] {
        while (!stop.load())
        {
            tb->completed.fetch_add(3);
            std::this_thread::yield();
        }
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
    {
        threads.emplace_back([&, t] {
            void* stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x1000 * (t + 1)));
            std::mt19937 rng(500 + t);
            std::vector<std::pair<unsigned char*, std::size_t>> mine;
            for (int i = 0; i < 5000; ++i)
            {
                if (mine.size() < 8 && (rng() % 2 == 0 || mine.empty()))
                {
                    std::size_t const n = 1 + rng() % 32768;
                    auto* p = static_cast<unsigned char*>(pool.allocate(n, stream));
                    std::memset(p, t + 1, n);
                    mine.emplace_back(p, n);
                }
                else
                {
                    auto [p, n] = mine.back();
                    mine.pop_back();
                    if (p[0] != t + 1 || p[n - 1] != t + 1)
                    {
                        ++errors;
                    }
                    pool.free(p, stream);
                }
            }
            for (auto [p, n] : mine)
            {
                pool.free(p, stream);
            }
        });
    }
    for (auto& th : threads)
    {
        th.join();
    }
    stop = true;
    completer.join();
    tb->completed = std::numeric_limits<std::uintptr_t>::max();
    void* all = pool.allocate(1); // reclaims everything pending
    pool.free(all);
    VEO_CHECK_EQ(errors.load(), 0);
    VEO_CHECK_EQ(pool.stats().inUse, 0u);
    VEO_CHECK_EQ(pool.stats().pendingFree, 0u);
    requireSound(pool);
}

VEO_TEST(stream_ordered_free)
{
    auto backend = std::make_unique<FencedBackend>();
    FencedBackend* fb = backend.get();
    MemPool pool(std::move(backend), 4096);
    void* s1 = reinterpret_cast<void*>(0x100);
    void* s2 = reinterpret_cast<void*>(0x200);
    void* a = pool.allocate(4096, s1);
    pool.free(a, s1);
    VEO_CHECK_EQ(pool.stats().pendingFree, 4096u);
    // The same stream may reuse it at once (stream order), without waiting.
    void* c = pool.allocate(4096, s1);
    VEO_CHECK_EQ(c, a);
    VEO_CHECK_EQ(fb->waits, 0);
    pool.free(c, s1);
    // Another stream gets the slice only after s1 passed the free: the pool waits on the fence rather than
    // opening an overflow region of the size asked.
    void* b = pool.allocate(4096, s2);
    VEO_CHECK_EQ(b, a);
    VEO_CHECK_EQ(fb->waits, 1);
    auto s = pool.stats();
    VEO_CHECK_EQ(s.fenceWaits, 1u);
    VEO_CHECK_EQ(s.overflowCount, 0u);
    VEO_CHECK_EQ(s.pendingFree, 0u);
    pool.free(b, s2);
    fb->completeAll();
    void* d = pool.allocate(4096); // fences done: reclaimed for everyone, no wait
    VEO_CHECK_EQ(fb->waits, 1);
    pool.free(d);
    requireSound(pool);
}

VEO_TEST(wait_picks_the_fitting_pending_free)
{
    auto backend = std::make_unique<FencedBackend>();
    FencedBackend* fb = backend.get();
    MemPool pool(std::move(backend), 8192);
    void* s1 = reinterpret_cast<void*>(0x100);
    void* small = pool.allocate(1024, s1);
    void* sep = pool.allocate(256);
    void* big = pool.allocate(8192 - 1024 - 256, s1);
    pool.free(small, s1); // oldest, but too small for what is asked next
    pool.free(big, s1);
    void* p = pool.allocate(4096); // no stream: waits on the free of `big` only
    VEO_CHECK_EQ(p, big);
    VEO_CHECK_EQ(fb->waits, 1);
    VEO_CHECK_EQ(pool.stats().pendingFree, 1024u);
    pool.free(p);
    pool.free(sep);
    fb->completeAll();
    requireSound(pool);
}

VEO_TEST(null_stream_is_the_legacy_default_stream)
{
    // TensorRT's deallocateAsync(ptr, nullptr) means the legacy default stream, not "free now": the slice
    // must stay fenced until that stream passed the free.
    auto backend = std::make_unique<FencedBackend>();
    FencedBackend* fb = backend.get();
    MemPool pool(std::move(backend), 4096);
    void* a = pool.allocate(4096, nullptr);
    pool.free(a, nullptr);
    VEO_CHECK_EQ(fb->streams.size(), 1u);
    VEO_CHECK(fb->streams[0] == nullptr); // fenced on the null (legacy default) stream
    VEO_CHECK_EQ(pool.stats().pendingFree, 4096u);
    void* b = pool.allocate(4096, nullptr); // the same (legacy) stream may reuse it at once
    VEO_CHECK_EQ(b, a);
    VEO_CHECK_EQ(fb->waits, 0);
    pool.free(b); // Stream::none(): complete at once, no fence
    VEO_CHECK_EQ(fb->streams.size(), 1u);
    VEO_CHECK_EQ(pool.stats().pendingFree, 0u);
    requireSound(pool);
}

VEO_TEST(cuda_special_stream_handles)
{
    // cudaStreamLegacy (0x1) is the null stream; cudaStreamPerThread (0x2) is one handle for a different
    // stream in every thread: a slice freed on it may be reused at once by the thread that freed it only.
    auto backend = std::make_unique<FencedBackend>();
    FencedBackend* fb = backend.get();
    MemPool pool(std::move(backend), 4096);
    void* const legacy = reinterpret_cast<void*>(veo::Stream::kLEGACY_HANDLE);
    void* const perThread = reinterpret_cast<void*>(veo::Stream::kPER_THREAD_HANDLE);
    void* a = pool.allocate(4096, nullptr);
    pool.free(a, nullptr);
    VEO_CHECK_EQ(pool.allocate(4096, legacy), a); // the same (legacy default) stream: at once
    VEO_CHECK_EQ(fb->waits, 0);
    pool.free(a, perThread);
    VEO_CHECK_EQ(pool.allocate(4096, perThread), a); // this thread's own per-thread stream: at once
    VEO_CHECK_EQ(fb->waits, 0);
    pool.free(a, perThread);
    void* other = nullptr;
    std::thread([&] { other = pool.allocate(4096, perThread); }).join(); // another thread's stream
    VEO_CHECK_EQ(other, a);
    VEO_CHECK_EQ(fb->waits, 1); // it waited for this thread's stream to pass the free
    pool.free(other);
    requireSound(pool);
}

namespace
{
//! A FencedBackend whose waitFence blocks until the test opens the gate (a stream far behind the host),
//! counting what the pool gives back.
class GateBackend : public FencedBackend
{
public:
    std::promise<void> entered;
    std::promise<void> open;
    std::shared_future<void> gate{open.get_future().share()};
    std::map<void*, int> released;
    void waitFence(void* f) override
    {
        entered.set_value();
        gate.wait();
        FencedBackend::waitFence(f); // throws if the pool let the fence go while it was waited on
    }
    void releaseFence(void* f) noexcept override
    {
        ++released[f];
        FencedBackend::releaseFence(f);
    }
};

//! Runs `fn` on another thread; false when it has not finished within a deadlock bound.
bool finishes(std::function<void()> const& fn)
{
    auto f = std::async(std::launch::async, fn);
    return f.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
}
} // namespace

VEO_TEST(waits_on_a_fence_without_the_lock)
{
    // A thread that waits for another stream to pass a free must not stall every other thread's
    // allocations, frees and stats for as long as that stream's queue takes.
    auto backend = std::make_unique<GateBackend>();
    GateBackend* gb = backend.get();
    MemPool pool(std::move(backend), 8192);
    void* s1 = reinterpret_cast<void*>(0x100);
    void* s2 = reinterpret_cast<void*>(0x200);
    void* a = pool.allocate(4096, s1);
    void* b = pool.allocate(2048);
    pool.free(a, s1); // pending on s1; 2048 bytes stay free
    void* got = nullptr;
    std::thread waiter([&] { got = pool.allocate(4096, s2); }); // waits on s1's fence
    gb->entered.get_future().wait();
    void* c = nullptr;
    bool const free = finishes([&] {
        (void) pool.stats();
        pool.free(b);
        c = pool.allocate(1024);
    });
    gb->open.set_value();
    waiter.join();
    VEO_CHECK(free);
    VEO_CHECK_EQ(got, a);
    VEO_CHECK_EQ(pool.stats().fenceWaits, 1u);
    pool.free(got);
    pool.free(c);
    requireSound(pool);
}

VEO_TEST(a_waited_fence_outlives_its_reclaimed_free)
{
    // While one thread waits on a fence, the slice it waits for is taken back by its own stream: the pool
    // keeps the fence (the backend would recycle it) until the wait returns, then gives it back once.
    auto backend = std::make_unique<GateBackend>();
    GateBackend* gb = backend.get();
    MemPool pool(std::move(backend), 4096);
    void* s1 = reinterpret_cast<void*>(0x100);
    void* s2 = reinterpret_cast<void*>(0x200);
    void* a = pool.allocate(4096, s1);
    pool.free(a, s1);
    void* fence = gb->done.begin()->first;
    void* got = nullptr;
    std::thread waiter([&] { got = pool.allocate(4096, s2); });
    gb->entered.get_future().wait();
    void* again = nullptr;
    bool const free = finishes([&] { again = pool.allocate(4096, s1); }); // s1 reuses its own pending slice
    VEO_CHECK(free);
    VEO_CHECK_EQ(again, a);
    VEO_CHECK_EQ(gb->released.count(fence), 0u); // still waited on
    gb->open.set_value();
    waiter.join(); // nothing pending is left to wait on: the waiter grows an overflow region
    VEO_CHECK(got != nullptr && got != a);
    VEO_CHECK_EQ(gb->released[fence], 1);
    VEO_CHECK_EQ(pool.stats().overflowCount, 1u);
    pool.free(got);
    pool.free(again);
    requireSound(pool);
}

namespace
{
//! Stand-ins for the cudart calls of the CUDA backend: host memory and counted events.
struct FakeCuda
{
    static inline int created = 0;
    static inline int destroyed = 0;
    static inline int records = 0;
    static inline int syncs = 0;
    static inline std::map<void*, bool> done;
    static int malloc(void** p, std::size_t n)
    {
        *p = std::aligned_alloc(256, n);
        return *p != nullptr ? 0 : 2;
    }
    static int free(void* p)
    {
        std::free(p);
        return 0;
    }
    static int create(void** ev, unsigned)
    {
        *ev = new int(++created);
        return 0;
    }
    static int record(void* ev, void*)
    {
        ++records;
        done[ev] = false;
        return 0;
    }
    static int query(void* ev) { return done.at(ev) ? 0 : 600; }
    static int sync(void* ev)
    {
        ++syncs;
        done.at(ev) = true;
        return 0;
    }
    static int destroy(void* ev)
    {
        ++destroyed;
        done.erase(ev);
        delete static_cast<int*>(ev);
        return 0;
    }
    static char const* error(int) { return "fake error"; }
    static veo::CudaRt table()
    {
        veo::CudaRt rt;
        rt.malloc = malloc;
        rt.free = free;
        rt.eventCreateWithFlags = create;
        rt.eventRecord = record;
        rt.eventQuery = query;
        rt.eventSynchronize = sync;
        rt.eventDestroy = destroy;
        rt.errorString = error;
        return rt;
    }
    static void completeAll()
    {
        for (auto& kv : done)
        {
            kv.second = true;
        }
    }
};
} // namespace

VEO_TEST(cuda_backend_pools_its_events)
{
    veo::CudaRt const rt = FakeCuda::table();
    {
        MemPool pool(veo::makeCudaBackend(rt), 1 << 20);
        void* s1 = reinterpret_cast<void*>(0x100);
        void* s2 = reinterpret_cast<void*>(0x200);
        for (int i = 0; i < 1000; ++i)
        {
            void* a = pool.allocate(4096, s1);
            void* b = pool.allocate(8192, s2);
            pool.free(a, s1);
            pool.free(b, s2);
            FakeCuda::completeAll(); // both streams pass their frees
        }
        VEO_CHECK_EQ(FakeCuda::records, 2000);
        VEO_CHECK(FakeCuda::created <= 2); // one event per concurrently pending free, not one per free
        VEO_CHECK_EQ(FakeCuda::destroyed, 0);
        // A pending free on another stream is waited on (cudaEventSynchronize), not grown around.
        void* all = pool.allocate(1 << 20, s1);
        pool.free(all, s1);
        void* again = pool.allocate(1 << 20, s2);
        VEO_CHECK_EQ(again, all);
        VEO_CHECK_EQ(FakeCuda::syncs, 1);
        VEO_CHECK_EQ(pool.stats().overflowCount, 0u);
        pool.free(again);
        requireSound(pool);
    }
    VEO_CHECK_EQ(FakeCuda::destroyed, FakeCuda::created); // the backend destroys its idle events
}

VEO_TEST(cudart_candidates_follow_the_driver)
{
    auto join = [](std::vector<std::string> const& v) {
        std::string s;
        for (auto const& n : v)
        {
            s += n + " ";
        }
        return s;
    };
    VEO_CHECK_EQ(join(veo::cudartCandidates(12040)), std::string("libcudart.so.12 libcudart.so.11.0 libcudart.so "));
    VEO_CHECK_EQ(join(veo::cudartCandidates(13000)),
        std::string("libcudart.so.13 libcudart.so.12 libcudart.so.11.0 libcudart.so "));
    VEO_CHECK_EQ(join(veo::cudartCandidates(11080)), std::string("libcudart.so.11.0 libcudart.so "));
    // no driver to ask: every known soname, newest first
    VEO_CHECK_EQ(join(veo::cudartCandidates(0)),
        std::string("libcudart.so.13 libcudart.so.12 libcudart.so.11.0 libcudart.so "));
}

VEO_TEST(cudart_already_loaded_is_preferred)
{
    // A cudart loaded by path from outside the loader's search path (as TensorRT's or PyTorch's wheels do)
    // must be the one the pool binds, not a second copy found by name: load a private copy first.
    char const* home = std::getenv("CUDA_HOME");
    std::string const dir = std::string(home != nullptr ? home : "/usr/local/cuda") + "/lib64/";
    std::string src;
    for (char const* n : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"})
    {
        if (std::filesystem::exists(dir + n))
        {
            src = dir + n;
            break;
        }
    }
    if (src.empty())
    {
        throw veo::test::Skip{"no libcudart under " + dir + " (set CUDA_HOME)"};
    }
    auto const tmp = std::filesystem::temp_directory_path() / ("veo-cudart-" + std::to_string(getpid()));
    std::filesystem::create_directories(tmp);
    auto const copy = tmp / std::filesystem::path(src).filename();
    std::filesystem::copy_file(src, copy, std::filesystem::copy_options::overwrite_existing);
    void* h = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
    VEO_CHECK(h != nullptr);
    veo::CudaRt const& rt = veo::processCudaRt();
    std::filesystem::remove_all(tmp); // the mapping stays valid
    VEO_CHECK_EQ(rt.loadError, std::string());
    VEO_CHECK_EQ(rt.path, copy.string());
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
