// veo-edge memory pool: one region reserved up front, 256-byte aligned best-fit slices, coalescing on
// free, stream-ordered frees, and an explicit, counted overflow path. No TensorRT, no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace veo
{

//! Where the pool's memory comes from and how stream-ordered frees are fenced.
//! A stream and an event are opaque handles (cudaStream_t / cudaEvent_t for the CUDA backend).
class PoolBackend
{
public:
    virtual ~PoolBackend() = default;
    virtual char const* name() const noexcept = 0;
    //! Reserve `bytes` (a multiple of 256); returns a 256-byte aligned pointer or throws PoolError.
    virtual void* reserve(std::size_t bytes) = 0;
    virtual void release(void* base, std::size_t bytes) noexcept = 0;
    //! Record a fence on `stream`; nullptr means "nothing to wait for".
    virtual void* recordFence(void* stream) = 0;
    //! True once the work queued on the fence's stream before recordFence has finished.
    virtual bool fenceDone(void* fence) = 0;
    virtual void destroyFence(void* fence) noexcept = 0;
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
    void destroyFence(void*) noexcept override {}
};

//! CUDA device memory through libcudart, loaded with dlopen on first use, so that the pool library
//! loads and works with the host backend on machines without CUDA.
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
    std::uint64_t regionCount{0};
};

class MemPool
{
public:
    static constexpr std::size_t kALIGNMENT = 256;

    //! Reserves `capacity` bytes (rounded up to 256) from `backend` at once.
    MemPool(std::unique_ptr<PoolBackend> backend, std::size_t capacity);
    ~MemPool();
    MemPool(MemPool const&) = delete;
    MemPool& operator=(MemPool const&) = delete;

    //! A 256-byte aligned slice of at least `bytes` (> 0). `stream` may reuse slices freed on the same
    //! stream that the stream has not passed yet (stream order makes that safe). When no free slice
    //! fits, the pool adds an overflow region (counted) unless overflow is disabled.
    void* allocate(std::size_t bytes, void* stream = nullptr);
    //! Return a slice. With a stream, the slice is reused by other streams only once `stream` has
    //! passed this point; without one, at once.
    void free(void* ptr, void* stream = nullptr);
    //! Size of the slice at `ptr` (as allocated, aligned), or throws kUNKNOWN_POINTER.
    std::size_t sliceSize(void const* ptr) const;
    PoolStats stats() const;
    //! Sizes of the free blocks, in address order: the fragmentation picture behind largestFree (the
    //! soak's free-block entropy). Blocks freed on a stream count once reclaimed, as in stats().
    std::vector<std::size_t> freeBlockSizes() const;
    //! With overflow disabled, exhaustion throws kOUT_OF_MEMORY instead of growing.
    void setOverflowAllowed(bool allowed);
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
        void* stream;
        void* fence;
    };
    using BlockMap = std::map<std::uintptr_t, Block>;
    using FreeIndex = std::multimap<std::size_t, std::uintptr_t>;

    void addRegion(std::size_t bytes);
    void reclaimLocked();
    void makeFreeLocked(std::uintptr_t addr);
    void* takeLocked(FreeIndex::iterator it, std::size_t bytes);
    void eraseFreeIndexLocked(std::uintptr_t addr, std::size_t size);

    std::unique_ptr<PoolBackend> mBackend;
    mutable std::mutex mMutex;
    std::vector<std::pair<void*, std::size_t>> mRegions;
    BlockMap mBlocks;
    FreeIndex mFree;
    std::vector<Pending> mPending;
    bool mOverflowAllowed{true};
    PoolStats mStats;
};

inline std::size_t alignUp(std::size_t n, std::size_t a)
{
    return (n + a - 1) / a * a;
}

} // namespace veo
