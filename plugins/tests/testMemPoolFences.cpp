// Unit tests of the memory pool's stream-ordered frees, on host backends whose fences the tests complete:
// pending frees, waits without the pool's lock, a failing fence query, the special stream handles.
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


VEO_TEST_MAIN()
