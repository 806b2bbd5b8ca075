// veo-edge memory pool: one region reserved up front, 256-byte aligned best-fit slices, coalescing on
// free, stream-ordered frees, and an explicit, counted, bounded overflow path whose regions are given back
// once they are free again. No TensorRT, no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace veo
{

//! The stream a call is ordered on. `Stream::none()` (the default) means no stream: a free is reusable at
//! once, an allocation reuses no pending slice. Any other value is a cudaStream_t, and a null one is the
//! legacy default stream (what TensorRT's IGpuAsyncAllocator means by a null stream), fenced like any other.
//! CUDA's two special handles (driver_types.h) are understood: cudaStreamLegacy (0x1) is the same stream as
//! null, and cudaStreamPerThread (0x2) is a different stream in every thread that passes it.
class Stream
{
public:
    static constexpr std::uintptr_t kLEGACY_HANDLE = 0x1;     //!< cudaStreamLegacy
    static constexpr std::uintptr_t kPER_THREAD_HANDLE = 0x2; //!< cudaStreamPerThread
    constexpr Stream(void* handle) noexcept // NOLINT(google-explicit-constructor): a cudaStream_t converts
        : mHandle(handle)
        , mOrdered(true)
    {
    }
    static constexpr Stream none() noexcept { return Stream(); }
    constexpr bool ordered() const noexcept { return mOrdered; }
    constexpr void* handle() const noexcept { return mHandle; }

private:
    constexpr Stream() noexcept = default;
    void* mHandle{nullptr};
    bool mOrdered{false};
};

//! Where the pool's memory comes from and how stream-ordered frees are fenced. A stream and a fence are
//! opaque handles (cudaStream_t / cudaEvent_t for the CUDA backend). The pool calls every method under its
//! lock except waitFence, which it calls with the lock released (a wait may take a stream's whole queue):
//! waitFence must be safe alongside the other methods; the pool keeps the fence alive (never passes it to
//! releaseFence) until every wait on it has returned.
class PoolBackend
{
public:
    virtual ~PoolBackend() = default;
    virtual char const* name() const noexcept = 0;
    //! Reserve `bytes` (a multiple of 256); returns a 256-byte aligned pointer or throws PoolError.
    virtual void* reserve(std::size_t bytes) = 0;
    virtual void release(void* base, std::size_t bytes) noexcept = 0;
    //! Record a fence on `stream` (nullptr: the legacy default stream); returns nullptr when there is
    //! nothing to wait for (the host backend).
    virtual void* recordFence(void* stream) = 0;
    //! True once the work queued on the fence's stream before recordFence has finished.
    virtual bool fenceDone(void* fence) = 0;
    //! Block until fenceDone(fence) would be true. Called without the pool's lock.
    virtual void waitFence(void* fence) = 0;
    //! The pool is done with `fence`; the backend may recycle it for a later recordFence.
    virtual void releaseFence(void* fence) noexcept = 0;
};

//! Host memory (aligned_alloc). Streams are ignored: every free is complete at once.
class HostBackend : public PoolBackend
{
public:
    char const* name() const noexcept override { return "host"; }
    void* reserve(std::size_t bytes) override;
    void release(void* base, std::size_t bytes) noexcept override;
    void* recordFence(void*) override { return nullptr; }
    bool fenceDone(void*) override { return true; }
    void waitFence(void*) override {}
    void releaseFence(void*) noexcept override {}
};

//! CUDA device memory through libcudart (see cudaBackend.h): loaded with dlopen on first use, so that the
//! pool library loads and works with the host backend on machines without CUDA.
std::unique_ptr<PoolBackend> makeCudaBackend();

//! An error a caller can act on: the message says what, got, expected and what to do.
class PoolError : public std::runtime_error
{
public:
    enum class Code
    {
        kINVALID_ARGUMENT = 1,
        kOUT_OF_MEMORY = 2,
        kBACKEND_UNAVAILABLE = 3,
        kUNKNOWN_POINTER = 4,
    };
    PoolError(Code code, std::string const& msg)
        : std::runtime_error(msg)
        , mCode(code)
    {
    }
    Code code() const noexcept { return mCode; }

private:
    Code mCode;
};

struct PoolStats
{
    std::uint64_t capacity{0};       //!< bytes reserved, all regions
    std::uint64_t inUse{0};          //!< bytes in live slices (aligned sizes)
    std::uint64_t peakInUse{0};
    std::uint64_t pendingFree{0};    //!< bytes freed on a stream that has not passed the free yet
    std::uint64_t largestFree{0};
    std::uint64_t totalFree{0};
    double fragmentation{0.0};       //!< 1 - largestFree / totalFree (0 when nothing is free)
    std::uint64_t allocCount{0};     //!< successful allocations, ever
    std::uint64_t freeCount{0};
    std::uint64_t overflowCount{0};  //!< regions added because the pool was exhausted
    std::uint64_t regionCount{0};    //!< regions held now (the reservation + live overflow regions)
    std::uint64_t overflowBytes{0};  //!< bytes held now in overflow regions (part of capacity)
    std::uint64_t overflowLimit{0};  //!< most bytes overflow regions may hold at once
    std::uint64_t overflowReleased{0}; //!< overflow regions given back once entirely free
    std::uint64_t fenceWaits{0};     //!< allocations that waited on a pending free instead of growing
};

class MemPool
{
public:
    static constexpr std::size_t kALIGNMENT = 256;

    //! Reserves `capacity` bytes (rounded up to 256) from `backend` at once. Overflow regions may hold up
    //! to `capacity` bytes more until setOverflowLimit says otherwise.
    MemPool(std::unique_ptr<PoolBackend> backend, std::size_t capacity);
    ~MemPool();
    MemPool(MemPool const&) = delete;
    MemPool& operator=(MemPool const&) = delete;

    //! A 256-byte aligned slice of at least `bytes` (> 0). In this order: the best-fitting free slice; on
    //! an ordered `stream`, a slice freed on that same stream it has not passed yet (stream order makes that
    //! safe; cudaStreamPerThread counts as the same stream only in the thread that freed it); a slice freed
    //! on another stream, after waiting for that stream to pass the free (the pool's lock is released
    //! while it waits, so other threads allocate and free meanwhile); and only then a new overflow region
    //! (counted, within the overflow limit), else kOUT_OF_MEMORY.
    void* allocate(std::size_t bytes, Stream stream = Stream::none());
    //! Return a slice. On an ordered stream (null = the legacy default stream) the slice is reused by
    //! other streams only once that stream has passed this point; with Stream::none(), at once. An overflow
    //! region that is entirely free again is given back to the backend.
    void free(void* ptr, Stream stream = Stream::none());
    //! Size of the slice at `ptr` (as allocated, aligned), or throws kUNKNOWN_POINTER.
    std::size_t sliceSize(void const* ptr) const;
    PoolStats stats() const;
    //! Sizes of the free blocks, in address order: the fragmentation picture behind largestFree (the
    //! soak's free-block entropy). Blocks freed on a stream count once reclaimed, as in stats().
    std::vector<std::size_t> freeBlockSizes() const;
    //! With overflow disabled, exhaustion throws kOUT_OF_MEMORY instead of growing (= setOverflowLimit(0));
    //! enabling it restores the default limit (the initial capacity).
    void setOverflowAllowed(bool allowed);
    //! Most bytes the overflow regions may hold at once; an allocation past it throws kOUT_OF_MEMORY.
    void setOverflowLimit(std::size_t bytes);
    //! Check internal invariants (blocks tile the regions, no overlap, free index consistent).
    //! Returns an empty string when sound, else what is wrong. For tests.
    std::string checkInvariants() const;
    char const* backendName() const noexcept { return mBackend->name(); }

private:
    struct Block
    {
        std::size_t size;
        std::uint32_t region;
        bool free;
    };
    struct Pending
    {
        std::uintptr_t addr;
        void* stream; //!< the ordered stream of the free (nullptr: the legacy default stream)
        void* fence;
        std::thread::id thread; //!< who freed it: cudaStreamPerThread is a different stream in each thread
    };
    struct Region
    {
        void* base;
        std::size_t bytes; //!< 0 once released
        bool overflow;
    };
    using BlockMap = std::map<std::uintptr_t, Block>;
    using FreeIndex = std::multimap<std::size_t, std::uintptr_t>;

    void addRegion(std::size_t bytes, bool overflow);
    void reclaimLocked();
    //! The best-fitting free slice, else a pending slice freed on `stream` itself; nullptr when neither.
    void* takeFitLocked(std::size_t need, Stream stream);
    //! The fence to wait on for `need` (the best-fitting pending free, else the oldest), marked as waited
    //! on so that it outlives the wait; nullptr when nothing is pending.
    void* fenceToWaitLocked(std::size_t need);
    //! Waits on `fence` with `lock` released, then drops the mark (and the fence, if it was reclaimed
    //! meanwhile). Rethrows what the backend throws, with the lock held again.
    void waitUnlocked(std::unique_lock<std::mutex>& lock, void* fence);
    //! Gives `fence` back to the backend, or, while a thread waits on it, leaves that to the last waiter.
    void releaseFenceLocked(void* fence) noexcept;
    static bool sameStream(Pending const& p, Stream s) noexcept;
    void* takePendingLocked(std::vector<Pending>::iterator it);
    void makeFreeLocked(std::uintptr_t addr);
    void releaseRegionIfFreeLocked(std::uintptr_t addr);
    void* takeLocked(FreeIndex::iterator it, std::size_t bytes);
    void eraseFreeIndexLocked(std::uintptr_t addr, std::size_t size);

    std::unique_ptr<PoolBackend> mBackend;
    mutable std::mutex mMutex;
    std::vector<Region> mRegions;
    BlockMap mBlocks;
    FreeIndex mFree;
    std::vector<Pending> mPending;
    std::vector<void*> mWaited;   //!< fences a thread waits on without the lock (one entry per waiter)
    std::vector<void*> mOrphaned; //!< waited-on fences whose free was reclaimed: the last waiter releases them
    std::size_t mDefaultOverflowLimit{0};
    PoolStats mStats;
};

inline std::size_t alignUp(std::size_t n, std::size_t a)
{
    return (n + a - 1) / a * a;
}

} // namespace veo
