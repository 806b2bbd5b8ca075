// The CUDA backend's view of libcudart: the few entry points the pool needs as a plain function table,
// how the library is found, and a backend over any such table (the ctest suite passes stand-ins for what
// CUDA itself does; production passes the table dlsym'd from the process's libcudart).
#pragma once

#include "memPool.h"

#include <string>
#include <vector>

namespace veo
{

//! cudart entry points with their C ABI: cudaError_t is an int enum, streams and events are pointers.
struct CudaRt
{
    int (*malloc)(void**, std::size_t){nullptr};
    int (*free)(void*){nullptr};
    int (*eventCreateWithFlags)(void**, unsigned){nullptr};
    int (*eventRecord)(void*, void*){nullptr};
    int (*eventQuery)(void*){nullptr};
    int (*eventSynchronize)(void*){nullptr};
    int (*eventDestroy)(void*){nullptr};
    char const* (*errorString)(int){nullptr};
    std::string path;      //!< the file the table came from ("" for stand-ins)
    std::string loadError; //!< why no table could be loaded ("" when loaded)
};

//! Sonames to try, best first, for a driver reporting `driverVersion` (cuDriverGetVersion: 12040 = 12.4;
//! <= 0 when unknown): the driver's CUDA major first, then older majors, then the unversioned name. A
//! cudart newer than the driver is never listed: it would fail with cudaErrorInsufficientDriver.
std::vector<std::string> cudartCandidates(int driverVersion);

//! The process's cudart: one already loaded (by TensorRT, PyTorch, cuda-python) when there is one, else
//! the first of cudartCandidates(driver version) that loads. Looked up once; loadError says why not.
CudaRt const& processCudaRt();

//! A pool backend over `rt` (which must outlive it): cudaMalloc'd regions, pooled CUDA events as fences.
std::unique_ptr<PoolBackend> makeCudaBackend(CudaRt const& rt);

} // namespace veo
