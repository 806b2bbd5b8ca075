// CUDA device-memory backend of the pool. libcudart is found with dlopen on first use (the one already in
// the process first), so the pool library needs no CUDA at load time and the host backend works without it.
#include "cudaBackend.h"

#include <dlfcn.h>

#include <sstream>

namespace veo
{
namespace
{

constexpr int kCUDA_SUCCESS = 0;
constexpr int kCUDA_ERROR_NOT_READY = 600;
constexpr unsigned kCUDA_EVENT_DISABLE_TIMING = 0x02;
//! CUDA majors whose cudart has a known soname, newest first (CUDA 11's soname is libcudart.so.11.0).
constexpr int kKNOWN_MAJORS[] = {13, 12, 11};

std::string soname(int major)
{
    return major == 11 ? "libcudart.so.11.0" : "libcudart.so." + std::to_string(major);
}

int driverVersion()
{
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr)
    {
        return 0;
    }
    int version = 0;
    auto get = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDriverGetVersion"));
    if (get == nullptr || get(&version) != 0)
    {
        version = 0;
    }
    dlclose(h);
    return version;
}

template <typename F>
void bind(void* handle, char const* name, F& fn)
{
    fn = reinterpret_cast<F>(dlsym(handle, name));
}

CudaRt fromHandle(void* h)
{
    CudaRt r;
    bind(h, "cudaMalloc", r.malloc);
    bind(h, "cudaFree", r.free);
    bind(h, "cudaEventCreateWithFlags", r.eventCreateWithFlags);
    bind(h, "cudaEventRecord", r.eventRecord);
    bind(h, "cudaEventQuery", r.eventQuery);
    bind(h, "cudaEventSynchronize", r.eventSynchronize);
    bind(h, "cudaEventDestroy", r.eventDestroy);
    bind(h, "cudaGetErrorString", r.errorString);
    if (!r.malloc || !r.free || !r.eventCreateWithFlags || !r.eventRecord || !r.eventQuery || !r.eventSynchronize
        || !r.eventDestroy || !r.errorString)
    {
        r.loadError = "libcudart was found but lacks cudaMalloc/cudaEvent* symbols; check the CUDA install";
        return r;
    }
    Dl_info info{};
    r.path = dladdr(reinterpret_cast<void*>(r.malloc), &info) != 0 && info.dli_fname ? info.dli_fname : "libcudart";
    return r;
}

class CudaBackend : public PoolBackend
{
public:
    explicit CudaBackend(CudaRt const& rt)
        : mRt(rt)
    {
        if (!mRt.loadError.empty())
        {
            throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE, mRt.loadError);
        }
    }
    ~CudaBackend() override
    {
        for (void* ev : mIdle)
        {
            mRt.eventDestroy(ev);
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
        // Events are pooled: one is created only when every earlier one is still pending.
        void* ev = nullptr;
        if (!mIdle.empty())
        {
            ev = mIdle.back();
            mIdle.pop_back();
        }
        int rc = ev != nullptr ? kCUDA_SUCCESS : mRt.eventCreateWithFlags(&ev, kCUDA_EVENT_DISABLE_TIMING);
        if (rc == kCUDA_SUCCESS)
        {
            rc = mRt.eventRecord(ev, stream); // a null stream is the legacy default stream
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
    void waitFence(void* fence) override
    {
        int const rc = mRt.eventSynchronize(fence);
        if (rc != kCUDA_SUCCESS)
        {
            throw PoolError(PoolError::Code::kBACKEND_UNAVAILABLE,
                std::string("waiting on a CUDA event of a stream-ordered free failed (the device may be lost): ")
                    + mRt.errorString(rc));
        }
    }
    void releaseFence(void* fence) noexcept override
    {
        if (fence == nullptr)
        {
            return;
        }
        try
        {
            mIdle.push_back(fence);
        }
        catch (...) // no room to keep it: destroy it instead
        {
            mRt.eventDestroy(fence);
        }
    }

private:
    CudaRt const& mRt;
    std::vector<void*> mIdle; //!< recorded-and-done events, ready for the next recordFence
};

} // namespace

std::vector<std::string> cudartCandidates(int driver)
{
    int const major = driver > 0 ? driver / 1000 : 0;
    std::vector<std::string> out;
    for (int m : kKNOWN_MAJORS)
    {
        if (m == major)
        {
            out.push_back(soname(m)); // the driver's own major first
        }
    }
    for (int m : kKNOWN_MAJORS)
    {
        if (m != major && (major == 0 || m < major))
        {
            out.push_back(soname(m));
        }
    }
    out.emplace_back("libcudart.so");
    return out;
}

CudaRt const& processCudaRt()
{
    static CudaRt const rt = [] {
        std::vector<std::string> const names = cudartCandidates(driverVersion());
        for (int const flags : {RTLD_NOW | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) // loaded ones first
        {
            for (auto const& n : names)
            {
                if (void* h = dlopen(n.c_str(), flags))
                {
                    return fromHandle(h);
                }
            }
        }
        CudaRt r;
        std::string tried;
        for (auto const& n : names)
        {
            tried += (tried.empty() ? "" : ", ") + n;
        }
        r.loadError = "could not load libcudart (tried " + tried
            + ", matching the driver's CUDA version): install the CUDA runtime or add its directory to "
              "LD_LIBRARY_PATH, or use the host backend";
        return r;
    }();
    return rt;
}

std::unique_ptr<PoolBackend> makeCudaBackend(CudaRt const& rt)
{
    return std::make_unique<CudaBackend>(rt);
}

std::unique_ptr<PoolBackend> makeCudaBackend()
{
    return makeCudaBackend(processCudaRt());
}

} // namespace veo
