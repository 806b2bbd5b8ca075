/* Status codes and data types shared by the plain C kernel launchers. No CUDA, no TensorRT. */
#ifndef VEO_KERNEL_STATUS_H
#define VEO_KERNEL_STATUS_H

#if defined(__GNUC__)
#define VEO_KERNEL_API __attribute__((visibility("default")))
#else
#define VEO_KERNEL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum veo_kernel_status
{
    VEO_KERNEL_OK = 0,
    VEO_KERNEL_INVALID_ARGUMENT = 1, /* a size or pointer is wrong: see veoKernelLastError() */
    VEO_KERNEL_UNSUPPORTED = 2,      /* valid, but no kernel instance for it (e.g. head_dim 40) */
    VEO_KERNEL_CUDA_ERROR = 3        /* the launch failed: cudaGetLastError() text in veoKernelLastError() */
} veo_kernel_status;

/* Same values as nvinfer1::DataType::kFLOAT / kHALF. */
typedef enum veo_dtype
{
    VEO_DTYPE_FLOAT32 = 0,
    VEO_DTYPE_FLOAT16 = 1
} veo_dtype;

/* What the last failing launcher call on this thread said; "" after a success. */
VEO_KERNEL_API const char* veoKernelLastError(void);

/* Compute capability of the current device as major * 10 + minor (sm_87 -> 87). Returns a veo_kernel_status. */
VEO_KERNEL_API int veoDeviceComputeCapability(int* sm);

#ifdef __cplusplus
}
#endif

#endif /* VEO_KERNEL_STATUS_H */
