// Checks that the stand-in driver (libcuda.c) behaves as the driver does
// where kvgeom relies on it: calls before cuInit fail, freed slots are
// reused, device memory is limited, host and device pointers are not
// interchangeable, argument errors are not sticky, a fault is.
// Built and run by scripts/mock-cuda-check.sh; exit status 0 when all hold.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, void *);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, void *);
CUresult cuStreamSynchronize(void *);
CUresult cuGetErrorName(CUresult, const char **);

#define PER_THREAD ((void *)0x2)
static int failures;
#define EXPECT(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "selftest: FAILED: " __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static CUcontext ctx;
static CUdeviceptr shared_src;

static void *free_from_another_thread(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    EXPECT(cuMemFree_v2(shared_src) == 0, "a free on another thread");
    return NULL;
}

int main(void) {
    CUdeviceptr a, b;
    EXPECT(cuMemAlloc_v2(&a, 16) == 3, "cuMemAlloc before cuInit must be CUDA_ERROR_NOT_INITIALIZED");
    setenv("KVGEOM_MOCK_CUDA_MEMORY_MB", "64", 1);
    EXPECT(cuInit(0) == 0, "cuInit");
    EXPECT(cuMemAlloc_v2(&a, 16) == 201, "cuMemAlloc without a context must be CUDA_ERROR_INVALID_CONTEXT");
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0) == 0 && cuCtxSetCurrent(ctx) == 0, "context");

    // Slots are reused: far more allocations than the table holds at once.
    for (int i = 0; i < 200000; i++) {
        if (cuMemAlloc_v2(&a, 64) != 0 || cuMemFree_v2(a) != 0) {
            EXPECT(0, "allocation %d of 200000 (alloc then free) failed", i);
            break;
        }
    }
    // Device memory is limited.
    EXPECT(cuMemAlloc_v2(&a, 65u << 20) == 2, "65 MiB of 64 must be CUDA_ERROR_OUT_OF_MEMORY");
    EXPECT(cuMemAlloc_v2(&a, 1u << 20) == 0 && cuMemAlloc_v2(&b, 1u << 20) == 0, "two 1 MiB buffers");

    // Device pointers are not host pointers, and the other way round.
    static unsigned char host[4096], back[4096];
    for (int i = 0; i < 4096; i++) host[i] = (unsigned char)(i * 7 + 1);
    EXPECT(cuMemcpyHtoD_v2((CUdeviceptr)(size_t)host, host, 16) == 1, "a host pointer as the device side of HtoD");
    EXPECT(cuMemcpyDtoH_v2((void *)(size_t)b, a, 16) == 1, "a device pointer as the host side of DtoH");
    EXPECT(cuMemsetD8Async((CUdeviceptr)(size_t)host, 0, 16, PER_THREAD) == 1, "a host pointer to memset");
    EXPECT(cuMemcpyDtoDAsync_v2(b, a + (1u << 20) - 8, 16, PER_THREAD) == 1, "a copy past the end of its source");
    EXPECT(cuMemFree_v2(a + 1) == 1, "freeing an address inside an allocation");
    // Those errors are not sticky.
    EXPECT(cuMemcpyHtoD_v2(a, host, 4096) == 0, "HtoD after refused calls");
    EXPECT(cuMemcpyDtoDAsync_v2(b + 100, a, 4096, PER_THREAD) == 0, "queued DtoD");
    EXPECT(cuMemsetD8Async(b + 100, 0xab, 10, PER_THREAD) == 0, "queued memset");
    EXPECT(cuStreamSynchronize(PER_THREAD) == 0, "synchronize");
    EXPECT(cuMemcpyDtoH_v2(back, b + 100, 4096) == 0, "DtoH");
    EXPECT(memcmp(back + 10, host + 10, 4086) == 0 && back[0] == 0xab && back[9] == 0xab,
           "the queued copy and memset landed in order");

    // Queued work on memory freed before it ran faults, and the fault sticks.
    shared_src = a;
    EXPECT(cuMemcpyDtoDAsync_v2(b, a, 4096, PER_THREAD) == 0, "queued DtoD before the free");
    pthread_t t;
    pthread_create(&t, NULL, free_from_another_thread, NULL);
    pthread_join(t, NULL);
    EXPECT(cuStreamSynchronize(PER_THREAD) == 700, "the queued copy must fault (CUDA_ERROR_ILLEGAL_ADDRESS)");
    EXPECT(cuMemAlloc_v2(&a, 16) == 700, "the fault must stick to cuMemAlloc");
    EXPECT(cuMemcpyDtoH_v2(back, b, 16) == 700, "the fault must stick to DtoH");
    const char *name = NULL;
    EXPECT(cuGetErrorName(700, &name) == 0 && name && strcmp(name, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0,
           "the error's name");

    if (failures) {
        fprintf(stderr, "selftest: %d failure(s)\n", failures);
        return 1;
    }
    printf("mock-cuda selftest: all checks passed\n");
    return 0;
}
