// Unit tests of the memory pool's CUDA backend over stand-ins for the cudart calls it makes (what CUDA
// itself does is all that is faked): pooled events, which libcudart it loads.
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


VEO_TEST_MAIN()
