// A host-memory stand-in for the CUDA driver calls kvgeom makes, so that its
// device code paths run on a machine without a GPU (scripts/mock-cuda-check.sh).
// Device pointers are host allocations; async work on CU_STREAM_PER_THREAD is
// queued per thread and only runs at cuStreamSynchronize (or before a
// legacy-stream copy or a free), so a missing synchronisation shows up as
// wrong bytes. Every range is checked against a live allocation.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
#define OK 0
#define INVALID_VALUE 1
#define INVALID_HANDLE 400

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
struct alloc { CUdeviceptr p; size_t n; int live; };
static struct alloc allocs[1 << 16];
static int nallocs;
static long long live_bytes;

static int inside(CUdeviceptr p, size_t n) {
    int ok = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && p >= allocs[i].p && p + n <= allocs[i].p + allocs[i].n) { ok = 1; break; }
    pthread_mutex_unlock(&lock);
    if (!ok) fprintf(stderr, "mockcuda: range 0x%llx+%zu is in no live allocation\n", p, n);
    return ok;
}

struct op { int kind; CUdeviceptr dst, src; size_t n; unsigned char v; };
static __thread struct op *queue;
static __thread int qlen, qcap;
static __thread CUcontext current;

static void flush(void) {
    for (int i = 0; i < qlen; i++) {
        struct op *o = &queue[i];
        if (o->kind == 0) memmove((void *)o->dst, (void *)o->src, o->n);
        else memset((void *)o->dst, o->v, o->n);
    }
    qlen = 0;
}
static void push(struct op o) {
    if (qlen == qcap) { qcap = qcap ? qcap * 2 : 64; queue = realloc(queue, qcap * sizeof *queue); }
    queue[qlen++] = o;
}
static int stream_ok(CUstream s) { return s == (CUstream)0 || s == (CUstream)0x2; }
static int need_ctx(void) { if (!current) { fprintf(stderr, "mockcuda: no current context\n"); return 0; } return 1; }

CUresult cuInit(unsigned f) { (void)f; return OK; }
CUresult cuDeviceGetCount(int *c) { *c = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int o) { if (o != 0) return 101; *d = 0; return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)0x1234; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) { (void)a; (void)d; *v = 1; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
CUresult cuDeviceGetName(char *n, int len, CUdevice d) { (void)d; snprintf(n, len, "mock device"); return OK; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "mock error"; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; *s = "MOCK_ERROR"; return OK; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!need_ctx() || n == 0) return INVALID_VALUE;
    void *m = malloc(n);
    memset(m, 0x5c, n); // not zero: the caller must zero what it relies on
    pthread_mutex_lock(&lock);
    allocs[nallocs++] = (struct alloc){(CUdeviceptr)m, n, 1};
    live_bytes += n;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)m;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!need_ctx()) return INVALID_VALUE;
    flush();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && allocs[i].p == p) {
            allocs[i].live = 0; live_bytes -= allocs[i].n;
            memset((void *)p, 0xee, allocs[i].n); free((void *)p);
            pthread_mutex_unlock(&lock); return OK;
        }
    pthread_mutex_unlock(&lock);
    fprintf(stderr, "mockcuda: free of unknown pointer 0x%llx\n", p);
    return INVALID_VALUE;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    if (!need_ctx() || !inside(d, n)) return INVALID_VALUE;
    flush(); memcpy((void *)d, h, n); return OK;
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    if (!need_ctx() || !inside(d, n)) return INVALID_VALUE;
    flush(); memcpy(h, (void *)d, n); return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    if (!need_ctx() || !stream_ok(st)) return INVALID_HANDLE;
    if (!inside(d, n) || !inside(s, n)) return INVALID_VALUE;
    if (s < d + n && d < s + n && s != d) { fprintf(stderr, "mockcuda: overlapping device copy\n"); return INVALID_VALUE; }
    push((struct op){0, d, s, n, 0}); return OK;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    if (!need_ctx() || !stream_ok(st)) return INVALID_HANDLE;
    if (!inside(d, n)) return INVALID_VALUE;
    push((struct op){1, d, 0, n, v}); return OK;
}
CUresult cuStreamSynchronize(CUstream st) {
    if (!need_ctx() || !stream_ok(st)) return INVALID_HANDLE;
    flush(); return OK;
}
