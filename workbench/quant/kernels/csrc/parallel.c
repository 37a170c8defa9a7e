/* A minimal parallel-for on OS threads: started per call, joined before returning. The kernels are
 * memory-bound passes over large tensors, so thread start-up (tens of microseconds) is noise there,
 * and below min_total everything runs on the caller. */
#include "kernels.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <pthread.h>
#endif

typedef struct {
    wb_range_fn fn;
    void *ctx;
    int64_t begin, end;
    int worker;
} chunk_t;

static void run_chunk(chunk_t *chunk) { chunk->fn(chunk->ctx, chunk->begin, chunk->end, chunk->worker); }

#if defined(_WIN32)
static DWORD WINAPI thread_main(LPVOID arg) { run_chunk((chunk_t *)arg); return 0; }
#else
static void *thread_main(void *arg) { run_chunk((chunk_t *)arg); return NULL; }
#endif

void wb_parallel_for(int64_t total, int nthreads, int64_t min_total, int64_t align, wb_range_fn fn, void *ctx) {
    chunk_t chunks[WB_MAX_THREADS];
    if (total <= 0) return;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > WB_MAX_THREADS) nthreads = WB_MAX_THREADS;
    if (total < min_total) nthreads = 1;
    if (align < 1) align = 1;
    int64_t size = (total + nthreads - 1) / nthreads;
    size = ((size + align - 1) / align) * align;
    int used = 0;
    for (int t = 0; t < nthreads; ++t) {
        int64_t begin = (int64_t)t * size;
        if (begin >= total) break;
        chunks[t].fn = fn;
        chunks[t].ctx = ctx;
        chunks[t].begin = begin;
        chunks[t].end = begin + size < total ? begin + size : total;
        chunks[t].worker = t;
        used++;
    }
    int started = 1;
#if defined(_WIN32)
    HANDLE handles[WB_MAX_THREADS];
    for (int t = 1; t < used; ++t) {
        handles[t] = CreateThread(NULL, 0, thread_main, &chunks[t], 0, NULL);
        if (handles[t] == NULL) break;
        started++;
    }
#else
    pthread_t threads[WB_MAX_THREADS];
    for (int t = 1; t < used; ++t) {
        if (pthread_create(&threads[t], NULL, thread_main, &chunks[t]) != 0) break;
        started++;
    }
#endif
    run_chunk(&chunks[0]);
    for (int t = started; t < used; ++t) run_chunk(&chunks[t]); /* threads that could not start */
#if defined(_WIN32)
    for (int t = 1; t < started; ++t) { WaitForSingleObject(handles[t], INFINITE); CloseHandle(handles[t]); }
#else
    for (int t = 1; t < started; ++t) pthread_join(threads[t], NULL);
#endif
}
