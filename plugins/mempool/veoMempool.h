/* C ABI of the veo-edge memory pool, for ctypes (veo_edge/runtime/mempool.py) and other C callers.
 * Every function returns a veo_mempool_status; on failure veo_mempool_last_error() tells why (per thread). */
#ifndef VEO_MEMPOOL_H
#define VEO_MEMPOOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VEO_MEMPOOL_ABI_VERSION 2

#if defined(__GNUC__)
#define VEO_MEMPOOL_API __attribute__((visibility("default")))
#else
#define VEO_MEMPOOL_API
#endif

typedef enum veo_mempool_status
{
    VEO_MEMPOOL_OK = 0,
    VEO_MEMPOOL_INVALID_ARGUMENT = 1,
    VEO_MEMPOOL_OUT_OF_MEMORY = 2,
    VEO_MEMPOOL_BACKEND_UNAVAILABLE = 3,
    VEO_MEMPOOL_UNKNOWN_POINTER = 4,
    VEO_MEMPOOL_INTERNAL = 5
} veo_mempool_status;

typedef enum veo_mempool_backend
{
    VEO_MEMPOOL_HOST = 0,
    VEO_MEMPOOL_CUDA = 1
} veo_mempool_backend;

/* Field order is the ABI: append only, bump VEO_MEMPOOL_ABI_VERSION. */
typedef struct veo_mempool_stats
{
    uint64_t capacity;
    uint64_t in_use;
    uint64_t peak_in_use;
    uint64_t pending_free;
    uint64_t largest_free;
    uint64_t total_free;
    double fragmentation;
    uint64_t alloc_count;
    uint64_t free_count;
    uint64_t overflow_count;
    uint64_t region_count;
    /* ABI 2 */
    uint64_t overflow_bytes;    /* bytes held now in overflow regions (part of capacity) */
    uint64_t overflow_limit;    /* most bytes overflow regions may hold at once */
    uint64_t overflow_released; /* overflow regions given back once entirely free */
    uint64_t fence_waits;       /* allocations that waited on a pending free instead of growing */
} veo_mempool_stats;

typedef struct veo_mempool veo_mempool;

VEO_MEMPOOL_API int veo_mempool_abi_version(void);
/* Reserves `capacity` bytes (rounded up to 256) from the backend at once. */
VEO_MEMPOOL_API int veo_mempool_create(int backend, uint64_t capacity, veo_mempool** out);
VEO_MEMPOOL_API int veo_mempool_destroy(veo_mempool* pool);
/* 256-byte aligned slice; `stream` (cudaStream_t, or NULL for no stream) only matters for the CUDA backend. */
VEO_MEMPOOL_API int veo_mempool_alloc(veo_mempool* pool, uint64_t size, void* stream, void** out);
/* With a stream, the slice is reused by other streams only once `stream` has passed this point; with NULL
 * (no stream) at once. */
VEO_MEMPOOL_API int veo_mempool_free(veo_mempool* pool, void* ptr, void* stream);
VEO_MEMPOOL_API int veo_mempool_set_overflow(veo_mempool* pool, int allowed);
/* ABI 2. As alloc/free, but always stream-ordered: a NULL stream is the legacy default stream (what
 * TensorRT's IGpuAsyncAllocator means by it) and is fenced like any other. */
VEO_MEMPOOL_API int veo_mempool_alloc_async(veo_mempool* pool, uint64_t size, void* stream, void** out);
VEO_MEMPOOL_API int veo_mempool_free_async(veo_mempool* pool, void* ptr, void* stream);
/* ABI 2. Most bytes the overflow regions may hold at once (default: the capacity; 0 = no overflow). */
VEO_MEMPOOL_API int veo_mempool_set_overflow_limit(veo_mempool* pool, uint64_t bytes);
VEO_MEMPOOL_API int veo_mempool_get_stats(veo_mempool* pool, veo_mempool_stats* out);
/* Sizes of the free blocks in address order (added in ABI 1 without a bump: a new function only).
 * Writes min(capacity, total) sizes into `sizes` (may be NULL when capacity is 0) and the total number
 * of free blocks into `*count`; call with capacity 0 first to size the buffer. */
VEO_MEMPOOL_API int veo_mempool_free_blocks(veo_mempool* pool, uint64_t* sizes, uint64_t capacity,
    uint64_t* count);
/* Empty string when the pool's internal invariants hold, else what is wrong (for tests). */
VEO_MEMPOOL_API int veo_mempool_check(veo_mempool* pool, char* buf, uint64_t buf_len);
VEO_MEMPOOL_API const char* veo_mempool_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* VEO_MEMPOOL_H */
