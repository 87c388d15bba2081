// A host-memory stand-in for the CUDA driver calls kvgeom makes, so that its
// device code paths run on a machine without a GPU (scripts/mock-cuda-check.sh,
// and scripts/gpu-check.sh run under .ci/run).
//
// What it holds to, as the driver does:
// - Device pointers are not host pointers: each allocation gets an address in
//   a range no host mapping uses (backed by host memory the caller never
//   sees), so host code that dereferences a device pointer faults, a host
//   pointer passed where a device pointer is required is refused
//   (CUDA_ERROR_INVALID_VALUE), and so is a device pointer passed as host
//   memory. Every range must lie inside one live allocation.
// - Work queued on CU_STREAM_PER_THREAD runs only when the stream is waited
//   for (or before a legacy-stream copy or a free on the same thread), so a
//   missing synchronisation shows up as wrong bytes.
// - Queued work that touches memory no longer allocated when it runs is an
//   illegal address, and that error is sticky: every later call returns
//   CUDA_ERROR_ILLEGAL_ADDRESS, as a real context does after a fault.
//   KVGEOM_MOCK_CUDA_FAULT_AT=N makes the Nth queued operation fault (to
//   check how kvgeom reports a sticky error).
// - Calls before cuInit return CUDA_ERROR_NOT_INITIALIZED; device memory is
//   limited (KVGEOM_MOCK_CUDA_MEMORY_MB, default 32768): beyond it
//   cuMemAlloc returns CUDA_ERROR_OUT_OF_MEMORY, as it does beyond 65,536
//   live allocations. Freed slots are reused, addresses are not.
//
// It implements none of the calls UCX's CUDA transports make, so NIXL on
// this "VRAM" is refused (UCX sees unknown memory as host memory).
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_ADDRESS 700

// Device addresses: above every canonical x86-64 user address with 4-level
// paging and far from any mapping with 5-level paging.
#define DEVICE_BASE 0x0000d00000000000ULL
#define DEVICE_ALIGN 512ULL
#define DEVICE_GAP 4096ULL
#define MAX_ALLOCS (1 << 16)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
struct alloc {
    CUdeviceptr dev;
    size_t n;
    unsigned char *host;
};
static struct alloc allocs[MAX_ALLOCS]; // host == NULL: a free slot
static int high_water;                  // slots [0, high_water) have been used
static int live_allocs;
static unsigned long long live_bytes, limit_bytes;
static CUdeviceptr next_dev = DEVICE_BASE;
static int initialized;
static CUresult sticky; // a fault's error, returned by every later call
static long long fault_at = -1, queued_ops;

static const char *name_of(CUresult e) {
    switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    default: return NULL;
    }
}

static CUresult fail(CUresult e, const char *what, CUdeviceptr p, size_t n) {
    fprintf(stderr, "mockcuda: %s (0x%llx+%zu): %s\n", what, p, n, name_of(e));
    return e;
}

// The host bytes behind [p, p + n) of one live allocation, or NULL.
// Call with the lock held.
static unsigned char *host_of(CUdeviceptr p, size_t n) {
    for (int i = 0; i < high_water; i++) {
        struct alloc *a = &allocs[i];
        if (a->host && p >= a->dev && p - a->dev <= a->n && n <= a->n - (p - a->dev))
            return a->host + (p - a->dev);
    }
    return NULL;
}

static int is_device_address(const void *h) {
    uintptr_t x = (uintptr_t)h;
    return x >= DEVICE_BASE && x < next_dev;
}

// The sticky error, or the precondition every call has.
static CUresult check_state(void) {
    if (sticky) return sticky;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

struct op {
    int kind; // 0: copy, 1: memset
    CUdeviceptr dst, src;
    size_t n;
    unsigned char v;
    int fault;
};
static __thread struct op *queue;
static __thread int qlen, qcap;
static __thread CUcontext current;

// Run this thread's queued work. A range no longer allocated (or an
// injected fault) is an illegal address: the error sticks.
static CUresult flush(void) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < qlen && r == CUDA_SUCCESS; i++) {
        struct op *o = &queue[i];
        unsigned char *d = host_of(o->dst, o->n);
        unsigned char *s = o->kind == 0 ? host_of(o->src, o->n) : NULL;
        if (o->fault || !d || (o->kind == 0 && !s)) {
            fprintf(stderr, "mockcuda: queued %s of %zu bytes at 0x%llx touches unallocated memory%s\n",
                    o->kind == 0 ? "copy" : "memset", o->n, o->dst, o->fault ? " (injected)" : "");
            sticky = r = CUDA_ERROR_ILLEGAL_ADDRESS;
        } else if (o->kind == 0) {
            memmove(d, s, o->n);
        } else {
            memset(d, o->v, o->n);
        }
    }
    pthread_mutex_unlock(&lock);
    qlen = 0;
    return r;
}

static CUresult push(struct op o) {
    if (qlen == qcap) {
        int cap = qcap ? qcap * 2 : 64;
        struct op *q = realloc(queue, (size_t)cap * sizeof *q);
        if (!q) return CUDA_ERROR_OUT_OF_MEMORY;
        queue = q;
        qcap = cap;
    }
    o.fault = fault_at >= 0 && __atomic_add_fetch(&queued_ops, 1, __ATOMIC_SEQ_CST) == fault_at;
    queue[qlen++] = o;
    return CUDA_SUCCESS;
}

static int stream_ok(CUstream s) { return s == (CUstream)0 || s == (CUstream)0x2; }

// Every memory call: no fault yet, initialised, a current context.
static CUresult ready(void) {
    CUresult r = check_state();
    if (r) return r;
    if (!current) {
        fprintf(stderr, "mockcuda: no current context\n");
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    return CUDA_SUCCESS;
}

// [p, p + n) must be device memory of one live allocation.
static CUresult device_range(CUdeviceptr p, size_t n, const char *what) {
    pthread_mutex_lock(&lock);
    int ok = host_of(p, n) != NULL;
    int host = !is_device_address((const void *)(uintptr_t)p);
    pthread_mutex_unlock(&lock);
    if (ok) return CUDA_SUCCESS;
    fprintf(stderr, "mockcuda: %s: %s\n", what,
            host ? "a host address where a device pointer is required"
                 : "a device range outside every live allocation");
    return fail(CUDA_ERROR_INVALID_VALUE, what, p, n);
}

// `h` must be host memory, not a device pointer.
static CUresult host_range(const void *h, size_t n) {
    pthread_mutex_lock(&lock);
    int dev = is_device_address(h);
    pthread_mutex_unlock(&lock);
    if (!dev && (h || n == 0)) return CUDA_SUCCESS;
    return fail(CUDA_ERROR_INVALID_VALUE, "a device pointer (or null) where host memory is required",
                (CUdeviceptr)(uintptr_t)h, n);
}

CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!initialized) {
        const char *mb = getenv("KVGEOM_MOCK_CUDA_MEMORY_MB");
        limit_bytes = (mb && atoll(mb) > 0 ? (unsigned long long)atoll(mb) : 32768ULL) << 20;
        const char *at = getenv("KVGEOM_MOCK_CUDA_FAULT_AT");
        fault_at = at && atoll(at) > 0 ? atoll(at) : -1;
        initialized = 1;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *c) { CUresult r = check_state(); if (r) return r; *c = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int o) {
    CUresult r = check_state();
    if (r) return r;
    if (o != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    CUresult r = check_state();
    if (r) return r;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *c = (CUcontext)0x1234;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return check_state(); }
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) {
    CUresult r = check_state();
    if (r) return r;
    (void)a;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *v = 1;
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    CUresult r = check_state();
    if (r) return r;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = limit_bytes;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext *c) { CUresult r = check_state(); if (r) return r; *c = current; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { CUresult r = check_state(); if (r) return r; current = c; return CUDA_SUCCESS; }
CUresult cuDeviceGetName(char *n, int len, CUdevice d) {
    CUresult r = check_state();
    if (r) return r;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(n, (size_t)len, "kvgeom stand-in driver (host memory)");
    return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
    const char *n = name_of(e);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *s = e == CUDA_ERROR_ILLEGAL_ADDRESS ? "an illegal memory access was encountered (stand-in driver)" : n;
    return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
    const char *n = name_of(e);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *s = n;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    CUresult r = ready();
    if (r) return r;
    if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int slot = -1;
    if (live_bytes + n <= limit_bytes && live_allocs < MAX_ALLOCS) {
        for (int i = 0; i < high_water; i++)
            if (!allocs[i].host) { slot = i; break; }
        if (slot < 0 && high_water < MAX_ALLOCS) slot = high_water++;
    }
    unsigned char *m = slot >= 0 ? malloc(n) : NULL;
    if (!m) {
        pthread_mutex_unlock(&lock);
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", 0, n);
    }
    memset(m, 0x5c, n); // not zero: the caller must zero what it relies on
    CUdeviceptr dev = next_dev;
    next_dev = (next_dev + n + DEVICE_GAP + DEVICE_ALIGN - 1) & ~(DEVICE_ALIGN - 1);
    allocs[slot] = (struct alloc){dev, n, m};
    live_allocs++;
    live_bytes += n;
    pthread_mutex_unlock(&lock);
    *p = dev;
    return CUDA_SUCCESS;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    CUresult r = ready();
    if (r) return r;
    r = flush();
    if (r) return r;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < high_water; i++)
        if (allocs[i].host && allocs[i].dev == p) {
            memset(allocs[i].host, 0xee, allocs[i].n);
            free(allocs[i].host);
            live_bytes -= allocs[i].n;
            live_allocs--;
            allocs[i] = (struct alloc){0, 0, NULL};
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&lock);
    return fail(CUDA_ERROR_INVALID_VALUE, "cuMemFree of a pointer that is not a live allocation", p, 0);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    CUresult r = ready();
    if (r || (r = device_range(d, n, "cuMemcpyHtoD")) || (r = host_range(h, n)) || (r = flush())) return r;
    pthread_mutex_lock(&lock);
    memcpy(host_of(d, n), h, n);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    CUresult r = ready();
    if (r || (r = device_range(d, n, "cuMemcpyDtoH")) || (r = host_range(h, n)) || (r = flush())) return r;
    pthread_mutex_lock(&lock);
    memcpy(h, host_of(d, n), n);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    CUresult r = ready();
    if (r) return r;
    if (!stream_ok(st)) return CUDA_ERROR_INVALID_HANDLE;
    if ((r = device_range(d, n, "copy destination")) || (r = device_range(s, n, "copy source"))) return r;
    if (s < d + n && d < s + n && s != d) return fail(CUDA_ERROR_INVALID_VALUE, "overlapping device copy", d, n);
    return push((struct op){0, d, s, n, 0, 0});
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    CUresult r = ready();
    if (r) return r;
    if (!stream_ok(st)) return CUDA_ERROR_INVALID_HANDLE;
    if ((r = device_range(d, n, "memset"))) return r;
    return push((struct op){1, d, 0, n, v, 0});
}
CUresult cuStreamSynchronize(CUstream st) {
    CUresult r = ready();
    if (r) return r;
    if (!stream_ok(st)) return CUDA_ERROR_INVALID_HANDLE;
    return flush();
}
