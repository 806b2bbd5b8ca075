// CUDA device-memory backend of the pool. libcudart is opened with dlopen on first use, so the pool
// library needs no CUDA at load time and the host backend works on machines without it.
#include "memPool.h"

#include <dlfcn.h>

#include <sstream>

namespace veo
{
namespace
{

// The few cudart entry points the pool needs, with their C ABI (cudaError_t is an int enum,
// cudaStream_t / cudaEvent_t are pointers). cudaSuccess = 0, cudaErrorNotReady = 600.
using CudaMallocFn = int (*)(void**, std::size_t);
using CudaFreeFn = int (*)(void*);
using CudaEventCreateWithFlagsFn = int (*)(void**, unsigned);
using CudaEventRecordFn = int (*)(void*, void*);
using CudaEventQueryFn = int (*)(void*);
using CudaEventDestroyFn = int (*)(void*);
using CudaGetErrorStringFn = char const* (*) (int);
constexpr int kCUDA_SUCCESS = 0;
constexpr int kCUDA_ERROR_NOT_READY = 600;
constexpr unsigned kCUDA_EVENT_DISABLE_TIMING = 0x02;

struct CudaRt
{
    void* handle{nullptr};
    CudaMallocFn malloc{nullptr};
    CudaFreeFn free{nullptr};
    CudaEventCreateWithFlagsFn eventCreate{nullptr};
    CudaEventRecordFn eventRecord{nullptr};
    CudaEventQueryFn eventQuery{nullptr};
    CudaEventDestroyFn eventDestroy{nullptr};
    CudaGetErrorStringFn errorString{nullptr};
    std::string loadError;
};

CudaRt const& cudaRt()
{
    static CudaRt const rt = [] {
        CudaRt r;
        char const* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};
        for (char const* n : names)
        {
            r.handle = dlopen(n, RTLD_NOW | RTLD_LOCAL);
            if (r.handle != nullptr)
            {
                break;
            }
        }
        if (r.handle == nullptr)
        {
            r.loadError = "could not load libcudart (tried libcudart.so.13/.12/.11.0/.so): install the CUDA "
                          "runtime or add its directory to LD_LIBRARY_PATH, or use the host backend";
            return r;
        }
        r.malloc = reinterpret_cast<CudaMallocFn>(dlsym(r.handle, "cudaMalloc"));
        r.free = reinterpret_cast<CudaFreeFn>(dlsym(r.handle, "cudaFree"));
        r.eventCreate = reinterpret_cast<CudaEventCreateWithFlagsFn>(dlsym(r.handle, "cudaEventCreateWithFlags"));
        r.eventRecord = reinterpret_cast<CudaEventRecordFn>(dlsym(r.handle, "cudaEventRecord"));
        r.eventQuery = reinterpret_cast<CudaEventQueryFn>(dlsym(r.handle, "cudaEventQuery"));
        r.eventDestroy = reinterpret_cast<CudaEventDestroyFn>(dlsym(r.handle, "cudaEventDestroy"));
        r.errorString = reinterpret_cast<CudaGetErrorStringFn>(dlsym(r.handle, "cudaGetErrorString"));
        if (!r.malloc || !r.free || !r.eventCreate || !r.eventRecord || !r.eventQuery || !r.eventDestroy
            || !r.errorString)
        {
            r.loadError = "libcudart was found but lacks cudaMalloc/cudaEvent* symbols; check the CUDA install";
        }
        return r;
    }();
    return rt;
}

class CudaBackend : public PoolBackend
{
public:
    CudaBackend()
        : mRt(cudaRt())
    {
        if (!mRt.loadError.empty())
        {
            throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE, mRt.loadError);
        }
    }
    char const* name() const noexcept override { return "cuda"; }

    void* reserve(std::size_t bytes) override
    {
        void* p = nullptr;
        int const rc = mRt.malloc(&p, bytes);
        if (rc != kCUDA_SUCCESS)
        {
            std::ostringstream msg;
            msg << "cudaMalloc of " << bytes << " bytes failed: " << mRt.errorString(rc)
                << "; use a smaller pool capacity or free device memory";
            throw PoolError(PoolError::Code::kOUT_OF_MEMORY, msg.str());
        }
        return p;
    }
    void release(void* base, std::size_t) noexcept override { mRt.free(base); }

    void* recordFence(void* stream) override
    {
        void* ev = nullptr;
        int rc = mRt.eventCreate(&ev, kCUDA_EVENT_DISABLE_TIMING);
        if (rc == kCUDA_SUCCESS)
        {
            rc = mRt.eventRecord(ev, stream);
        }
        if (rc != kCUDA_SUCCESS)
        {
            if (ev != nullptr)
            {
                mRt.eventDestroy(ev);
            }
            throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE,
                std::string("could not record a CUDA event for a stream-ordered free: ") + mRt.errorString(rc));
        }
        return ev;
    }
    bool fenceDone(void* fence) override
    {
        int const rc = mRt.eventQuery(fence);
        if (rc == kCUDA_SUCCESS)
        {
            return true;
        }
        if (rc == kCUDA_ERROR_NOT_READY)
        {
            return false;
        }
        throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE,
            std::string("CUDA event query failed (the device may be lost): ") + mRt.errorString(rc));
    }
    void destroyFence(void* fence) noexcept override
    {
        if (fence != nullptr)
        {
            mRt.eventDestroy(fence);
        }
    }

private:
    CudaRt const& mRt;
};

} // namespace

std::unique_ptr<PoolBackend> makeCudaBackend()
{
    return std::make_unique<CudaBackend>();
}

} // namespace veo
