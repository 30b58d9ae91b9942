/* tests/cuda_emu/cuda_emu.cpp - a CUDA emulator for tests: the .cu files of kernels/, compiled by g++, run on the
   host, so CI checks every kernel without a GPU. Test-only; never shipped in kernels/.

   Devices: DT_EMU_DEVICES=N (default 1) devices, each with its own PCI bus id (0: none, as on a
   machine without a GPU); the fake NCCL (tests/cuda_emu/nccl_emu.cpp, include/nccl.h) runs its
   operations on these streams. DT_EMU_TRACE=1 prints where each allocation, free, host<->device
   copy and host wait came from (see trace()). DT_EMU_FAIL_ALLOC=N makes the N-th allocation fail
   with cudaErrorMemoryAllocation (dt_emu_fail_alloc: the same from a test, tests/cuda_emu/k_oom.cpp).

   Build (tests/run.sh, group "cuda_emu", does this):
       g++ -x c++ -Itests/cuda_emu/include -Ikernels -c kernels/dt_x.cu     (each kernel file)
       g++ -Itests/cuda_emu/include -c tests/cuda_emu/cuda_emu.cpp          (this runtime)
       g++ tests/cuda_emu/k_x.cpp *.o -lopenblas -lpthread                 (a test program)
   The fake <cuda_runtime.h> and <cublas_v2.h> in tests/cuda_emu/include/ are all a kernel file
   sees of CUDA; kernels launch through DT_K_LAUNCH (kernels/dt_cuda.cuh), which here calls
   dt_emu_launch with a lambda that calls the kernel.

   How it runs a launch. Blocks run one at a time, so a __shared__ array can be one static copy
   (the fake header makes __shared__ a static in the section "dt_emu_shared"). Each CUDA thread of
   the block is a fiber (ucontext) on the launching host thread, which switches to the next ready
   thread only where a thread waits (run_fibers); in the ThreadSanitizer build, or with
   DT_EMU_THREADS=1, each is a host thread instead (pthread; a pool made once and reused by every
   block, run_block). Barriers are where threads meet:
     __syncthreads              waits until every thread of the block is waiting at one;
     shuffles, ballots, votes,  wait until every lane named in the mask is waiting at one; the
     __syncwarp, the gather     last lane to arrive computes every lane's result (the gather,
     of an emulated mma         dt_emu_warp_gather, hands every lane all 32 lanes' fragments:
                                kernels/dt_mma.cuh's mma.sync m16n8k16 is built on it).
   A thread that arrives at a barrier marks itself waiting and calls resolve(), which completes
   every barrier whose threads are all there and wakes them (host threads: under the block's mutex,
   through each thread's condition variable; fibers: into the block's ready queue).

   Modes (environment DT_EMU_MODE):
     parallel        (default) no imposed order: fibers run in the order they become ready (each
                     to its next barrier: thread order at the start, then the order of release);
                     host threads (TSan, DT_EMU_THREADS=1) run at once, as the OS schedules them.
     forward         one thread at a time: a baton passes from thread to thread. Each thread runs
     reverse         its segment up to its next barrier, in thread order 0,1,2... (forward),
     random:SEED     n-1...0 (reverse) or a seeded shuffle, new at every round (random); when all
                     have run, the barriers are resolved and the next round starts. A missing
                     __syncthreads then makes some thread read shared memory before the thread
                     that should write it has run: the result changes (and is the same every run
                     of a seed). Blocks also run in reverse / shuffled order in those modes.
   dt_emu_set_mode switches the order inside one process, for tests that compare a kernel's bits
   across orders.
   Checks, each a report on stderr ("dt_emu: ...") that makes the launch fail with
   cudaErrorLaunchFailure (dt_emu_last_report() returns the last one):
     - shared memory (static and dynamic) is filled with NaN bytes (0xff) at each block start,
       and cudaMalloc memory at allocation, so a read of what nobody wrote shows;
     - deadlock: every live thread of a block waits and no barrier can complete; the report lists
       which threads wait where (__FILE__:__LINE__ recorded by the barrier macros); the block is
       abandoned (its threads unwind);
     - a __syncthreads reached by only part of the block (the others returned), or by threads at
       different source lines (a barrier in divergent code);
     - a warp operation whose mask names lanes that never arrive (returned, or beyond blockDim),
       or does not name the calling lane, or lanes meeting at different kinds of operation;
     - a vector load or store (dt_k_load_vec / dt_k_store_vec: float4, int4, uint4, float2...)
       at an address that is not a multiple of its size: a GPU faults, so the launch fails with
       cudaErrorMisalignedAddress, as it would there;
     - cudaMemcpy / cudaMemset outside a cudaMalloc allocation, in the wrong direction, of NULL;
       cudaFree of a pointer cudaMalloc did not return; a destroyed or unknown stream; cuBLAS
       matrices outside their allocation; bad launch configurations (cudaErrorInvalidConfiguration).
   ThreadSanitizer build (DT_EMU_TSAN, run.sh "tsan:"): the kernels and tests are built with
   -fsanitize=thread, this file is built without it and wraps its own mutex and condition-variable
   calls in AnnotateIgnoreSync, so they order nothing. Each barrier instead orders exactly what a
   GPU barrier orders (__tsan_release on arrival, __tsan_acquire on departure, per block or per
   warp). A missing __syncthreads is then a data race on the shared array, reported by TSan.

   What it cannot see:
     - races between blocks: blocks run one after the other, and each starts after the last
       ended (atomics and plain stores to one global address from two blocks both "work");
     - a missing __threadfence: x86 orders memory more strongly than a GPU, and blocks do not
       overlap anyway;
     - stream races by default: work runs as soon as it is queued (DT_EMU_STREAMS=immediate),
       so a missing cudaStreamWaitEvent changes nothing. DT_EMU_STREAMS=deferred (see "streams
       and events" below) makes work on created streams wait until something waits for it, so
       a consumer not ordered after its producer reads stale data; even then two streams never
       run at the same time (no torn reads), and cuBLAS calls run at once whatever their stream;
     - inside an mma (kernels/dt_mma.cuh), the order and precision of the hardware's sums, which
       are unspecified: the emulator computes the exact A B + C rounded once (compare with a
       tolerance); the fragment layout, on the other hand, is the hardware's;
     - the GPU's own rounding (expf, __expf, fused multiply-add, TF32 is only
       rounded inputs; cuBLASLt's epilogues, include/cublasLt.h, are f32 formulas of the
       host's), warp scheduling, bank conflicts, occupancy and speed;
     - out-of-bounds accesses inside kernels (device memory is host memory: an ASan build would
       see them, this one does not);
     - a missing barrier between the last reads of a shared tile and the next cp.async (or
       store) into it, when every warp reads the tile at the same warp operations: the serial
       orders move the warps in step from barrier to barrier, so the early warp's copy comes
       after the others' reads. ThreadSanitizer (run.sh "tsan:") reports it as a race.
   ldmatrix (kernels/dt_mma.cuh) is a warp-collective operation that reads each lane's row as
   the lane arrives; cp.async fills its destination with NaN at the issue and copies at the
   issuing thread's wait (dt_emu_cp_async); both report addresses outside shared memory or off
   their boundary, and a thread ending with copies it never waited for.
   Cost: a fiber switch per thread per barrier (tens of nanoseconds on x86-64, dt_emu_fswitch;
   about a microsecond with glibc's swapcontext, which makes a system call, elsewhere); host
   threads cost tens of microseconds per thread per barrier (more on a loaded machine). Keep grids
   small all the same.
                                                        MIT licence (see dt_tensor.h) */
#include <memory> /* before the fake runtime: it defines __noinline__ */
#include "cuda_runtime.h"
#include "cublas_v2.h"
#include "cublasLt.h"

#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dlfcn.h>
#include <ucontext.h>
#include <execinfo.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

/* ---------------------------------------------------------------- ThreadSanitizer hooks */

#ifdef DT_EMU_TSAN
extern "C" {
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void AnnotateIgnoreSyncBegin(const char *file, int line);
void AnnotateIgnoreSyncEnd(const char *file, int line);
}
#define DT_EMU_ACQUIRE(p) __tsan_acquire(p)
#define DT_EMU_RELEASE(p) __tsan_release(p)
#define DT_EMU_QUIET_BEGIN() AnnotateIgnoreSyncBegin(__FILE__, __LINE__)
#define DT_EMU_QUIET_END() AnnotateIgnoreSyncEnd(__FILE__, __LINE__)
#else
#define DT_EMU_ACQUIRE(p) (void)(p)
#define DT_EMU_RELEASE(p) (void)(p)
#define DT_EMU_QUIET_BEGIN() (void)0
#define DT_EMU_QUIET_END() (void)0
#endif

/* The emulator's own locking: invisible to TSan (only barriers may order the kernel's threads). */
static void emu_lock(pthread_mutex_t *m) { DT_EMU_QUIET_BEGIN(); pthread_mutex_lock(m); DT_EMU_QUIET_END(); }
static void emu_unlock(pthread_mutex_t *m) { DT_EMU_QUIET_BEGIN(); pthread_mutex_unlock(m); DT_EMU_QUIET_END(); }
static void emu_wait(pthread_cond_t *c, pthread_mutex_t *m) { DT_EMU_QUIET_BEGIN(); pthread_cond_wait(c, m); DT_EMU_QUIET_END(); }
static void emu_signal(pthread_cond_t *c) { DT_EMU_QUIET_BEGIN(); pthread_cond_signal(c); DT_EMU_QUIET_END(); }

/* ---------------------------------------------------------------- global state */

thread_local uint3 dt_emu_threadIdx, dt_emu_blockIdx;
thread_local dim3 dt_emu_blockDim, dt_emu_gridDim;

/* One object in the section, so that __start_/__stop_dt_emu_shared exist in every program. */
__attribute__((section("dt_emu_shared"), used)) static char emu_section_anchor[16];
extern "C" char __start_dt_emu_shared[], __stop_dt_emu_shared[];

enum { MODE_PARALLEL, MODE_FORWARD, MODE_REVERSE, MODE_RANDOM, MODE_BAD };

static struct {
    int mode_set, mode;
    unsigned long long seed, rng;
    char mode_name[64];
    pthread_mutex_t lock; /* reports, the registry */
    int reports;
    std::string last_report;
    cudaError_t last_error;
    std::map<uintptr_t, size_t> allocs; /* cudaMalloc: base -> bytes */
    std::map<uintptr_t, size_t> pinned; /* cudaHostAlloc / cudaMallocHost: base -> bytes */
    std::set<void *> streams, events, handles;
    unsigned char *dyn_shared;
    cudaError_t fault; /* what the running launch fails with when it reports (a GPU's own fault code) */
    size_t dyn_bytes;  /* of dyn_shared */
} G = {0, 0, 0, 0, {0}, PTHREAD_MUTEX_INITIALIZER, 0, std::string(), cudaSuccess, {}, {}, {}, {}, {}, NULL,
       cudaSuccess, 0};

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emu_lock(&G.lock);
    G.reports++;
    G.last_report = buf;
    fprintf(stderr, "dt_emu: %s\n", buf);
    fflush(stderr);
    emu_unlock(&G.lock);
}

static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) G.last_error = e;
    return e;
}

/* splitmix64: the random mode's thread and block orders */
static unsigned long long emu_rand(void) {
    unsigned long long z = (G.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* MODE_BAD for a name that is not a mode; *seed set for random. */
static int parse_mode(const char *m, unsigned long long *seed) {
    *seed = 0;
    if (!strcmp(m, "parallel")) return MODE_PARALLEL;
    if (!strcmp(m, "forward")) return MODE_FORWARD;
    if (!strcmp(m, "reverse")) return MODE_REVERSE;
    if (!strcmp(m, "random")) return *seed = 1, MODE_RANDOM;
    if (!strncmp(m, "random:", 7) && m[7]) {
        char *end;
        *seed = strtoull(m + 7, &end, 10);
        return *end ? MODE_BAD : MODE_RANDOM;
    }
    return MODE_BAD;
}

static void init_mode(void) {
    const char *m = getenv("DT_EMU_MODE");
    if (G.mode_set) return;
    G.mode_set = 1;
    if (!m || !*m) m = "parallel";
    snprintf(G.mode_name, sizeof G.mode_name, "%s", m);
    G.mode = parse_mode(m, &G.seed);
    G.rng = G.seed;
    if (G.mode == MODE_BAD)
        report("DT_EMU_MODE = \"%s\"; expected parallel, forward, reverse or random:SEED", m);
}

const char *dt_emu_mode(void) { init_mode(); return G.mode_name; }
int dt_emu_set_mode(const char *m) {
    unsigned long long seed;
    int mode;
    init_mode();
    if (!m || (mode = parse_mode(m, &seed)) == MODE_BAD) return -1;
    snprintf(G.mode_name, sizeof G.mode_name, "%s", m);
    G.mode = mode, G.seed = seed, G.rng = seed;
    return 0;
}
int dt_emu_report_count(void) { return G.reports; }
const char *dt_emu_last_report(void) { return G.last_report.c_str(); }

/* ---------------------------------------------------------------- blocks and threads */

/* The fibers' switch. glibc's swapcontext saves and restores the signal mask with a system call
   at every switch (a third of the emulator's time in an mma-heavy kernel); on x86-64 the switch is
   these few instructions instead: push the callee-saved registers, swap stack pointers, pop, ret
   (a fiber starts by "returning" into fiber_start from a stack made to look so). Same thread, so
   nothing else needs saving (the signal mask, MXCSR and the x87 control word stay as they are).
   DT_EMU_UCONTEXT=1 at build time keeps swapcontext (any other machine does). */
#if defined(__x86_64__) && !defined(DT_EMU_UCONTEXT)
#define EMU_FSWITCH 1
extern "C" void dt_emu_fswitch(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".globl dt_emu_fswitch\n"
        ".type dt_emu_fswitch,@function\n"
        "dt_emu_fswitch:\n"
        "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
        "    ret\n"
        ".size dt_emu_fswitch, .-dt_emu_fswitch\n");
#else
#define EMU_FSWITCH 0
#endif

enum { T_RUN, T_WAIT_BLOCK, T_WAIT_WARP, T_EXITED };

struct emu_block;
struct emu_thread {
    pthread_cond_t cv;
    ucontext_t ctx;     /* fiber blocks: where it stopped (ucontext's switch) */
    void *sp;           /* fiber blocks: its saved stack pointer (x86-64's switch, emu_fswitch) */
    void *stack;
    bool ready, started, finished;
    emu_block *b;
    int id, state;
    const char *file; /* where it waits */
    int line;
    int op, arg, width; /* its warp operation */
    unsigned int mask;
    uint64_t value, result;
    const void *gather_src; /* DT_EMU_GATHER: this lane's payload, where all 32 go, its size */
    void *gather_dst;
    size_t gather_bytes;
    const char *gather_what;
    unsigned int gen; /* the barrier's generation when it arrived: its TSan sync object */
    struct cp_async { void *dst; const void *src; size_t bytes; unsigned group; const char *file; int line; };
    std::vector<cp_async> cp; /* its copies in flight (dt_emu_cp_async), by the group they join */
    unsigned cp_commits;      /* the groups it committed */
};

struct emu_block {
    pthread_mutex_t m;
    int n, nrun, nexited, nwait_block;
    std::vector<emu_thread> t;
    bool serial, aborted;
    std::vector<int> order; /* serial modes: this round's thread order */
    size_t pos;
    int baton;              /* serial modes: the one thread allowed to run */
    unsigned int block_gen;
    std::vector<unsigned int> warp_gen;
    char block_sync[2];     /* TSan sync objects, by generation parity */
    char start_sync, end_sync; /* TSan: the block's start and end (run_block) */
    bool lazy, spawned;     /* run_block: the launcher plays the threads one after another until one
                               meets a barrier (spawned: then the pool starts all the others) */
    std::vector<int> seq;   /* lazy: the order it plays them in (the mode's first round) */
    bool fiber;             /* the threads are fibers on the launcher's thread (run_block) */
    ucontext_t sched;
    void *sched_sp;
    std::deque<int> readyq;
    int next, nspawn;       /* lazy: seq[next] is the next to start; how many went to the pool */
    std::vector<char> warp_sync;
    const std::function<void()> *body;
    uint3 bid;
    dim3 bdim, gdim;
    const char *kernel, *file;
    int line;
};

struct emu_abort {}; /* unwinds the threads of a deadlocked block */

static thread_local emu_thread *self;

static const char *op_name(int op) {
    static const char *const names[] = {"__syncwarp", "__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync",
                                        "__shfl_up_sync", "__ballot_sync", "__all_sync", "__any_sync",
                                        "warp gather"};
    return op >= 0 && op < 9 ? names[op] : "?";
}
/* The name in reports: a gather's own (the mma that made it), else the operation's. */
static const char *thread_op_name(const emu_thread &t) {
    return t.op == DT_EMU_GATHER && t.gather_what ? t.gather_what : op_name(t.op);
}

/* "0-15,32-47": thread ids, compressed */
static std::string id_ranges(const std::vector<int> &ids) {
    std::string s;
    char buf[48];
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) j++;
        if (j > i) snprintf(buf, sizeof buf, "%s%d-%d", s.empty() ? "" : ",", ids[i], ids[j]);
        else snprintf(buf, sizeof buf, "%s%d", s.empty() ? "" : ",", ids[i]);
        s += buf;
        i = j + 1;
    }
    return s;
}

static std::string where_block(const emu_block *b) {
    char buf[512];
    snprintf(buf, sizeof buf, "block (%u,%u,%u) of %s (launched at %s:%d)", b->bid.x, b->bid.y, b->bid.z, b->kernel,
             b->file, b->line);
    return buf;
}

/* Threads grouped by where they wait: "threads 0-15: __syncthreads at f.cu:12; threads ...". */
static std::string waiting_sites(const emu_block *b, int only_state) {
    std::vector<std::string> keys;
    std::vector<std::vector<int> > ids;
    for (int i = 0; i < b->n; i++) {
        const emu_thread &t = b->t[i];
        char key[512];
        if (t.state == T_RUN || t.state == T_EXITED || (only_state >= 0 && t.state != only_state)) continue;
        if (t.state == T_WAIT_BLOCK) snprintf(key, sizeof key, "__syncthreads at %s:%d", t.file, t.line);
        else snprintf(key, sizeof key, "%s mask 0x%08x at %s:%d", thread_op_name(t), t.mask, t.file, t.line);
        size_t k = std::find(keys.begin(), keys.end(), std::string(key)) - keys.begin();
        if (k == keys.size()) keys.push_back(key), ids.push_back(std::vector<int>());
        ids[k].push_back(i);
    }
    std::string s;
    for (size_t k = 0; k < keys.size(); k++) s += (k ? "; threads " : "threads ") + id_ranges(ids[k]) + ": " + keys[k];
    return s;
}

/* The block's lock: none in a fiber block (one host thread; a fiber switches only at its waits). */
static void blk_lock(emu_block *b) { if (!b->fiber) emu_lock(&b->m); }
static void blk_unlock(emu_block *b) { if (!b->fiber) emu_unlock(&b->m); }

/* A thread of b may go on (its wait's predicate may now hold): a condition variable's signal, or in a
   fiber block a place in the ready queue. */
static void blk_signal(emu_block *b, emu_thread *t) {
    if (!b->fiber) { emu_signal(&t->cv); return; }
    if (t->ready || t->finished) return;
    t->ready = true;
    b->readyq.push_back(t->id);
}

static void release(emu_block *b, emu_thread &t) {
    t.state = T_RUN;
    b->nrun++;
    blk_signal(b, &t);
}

/* The lanes of warp w named in mask M are all waiting at a warp operation with mask M (or gone):
   compute each one's result and let them go. */
/* DT_EMU_GATHER: every lane present receives every lane's payload (an absent one's as 0xff bytes). */
static void gather(emu_block *b, int w, unsigned int M, unsigned int absent) {
    int base = w * 32;
    /* The copies move data between the lanes' stacks: under TSan they are ordered as the lanes'
       own accesses are (after every lane's arrival, before every lane's departure). */
    char *sync = &b->warp_sync[2 * w + (b->warp_gen[w] & 1)];
    DT_EMU_ACQUIRE(sync);
    for (int k = 0; k < 32; k++) {
        if (!(M >> k & 1) || (absent >> k & 1)) continue;
        emu_thread &u = b->t[base + k];
        for (int j = 0; j < 32; j++) {
            unsigned char *dst = (unsigned char *)u.gather_dst + (size_t)j * u.gather_bytes;
            const emu_thread *v = (M >> j & 1) && !(absent >> j & 1) ? &b->t[base + j] : NULL;
            if (v && v->op == DT_EMU_GATHER && v->gather_bytes == u.gather_bytes)
                memcpy(dst, v->gather_src, u.gather_bytes);
            else memset(dst, 0xff, u.gather_bytes);
        }
        const emu_thread &f = b->t[base + (31 - __builtin_clz(M & ~absent))];
        if (u.gather_bytes != f.gather_bytes)
            report("%s at %s:%d in %s, warp %d: lanes pass %zu and %zu bytes", thread_op_name(u), u.file, u.line,
                   where_block(b).c_str(), w, u.gather_bytes, f.gather_bytes);
    }
    DT_EMU_RELEASE(sync);
}

static void complete_warp(emu_block *b, int w, unsigned int M, unsigned int absent, unsigned int exited) {
    int base = w * 32, first = -1;
    for (int k = 0; k < 32; k++)
        if ((M >> k & 1) && !(absent >> k & 1)) { first = base + k; break; }
    const emu_thread &f = b->t[first];
    if (absent)
        report("%s at %s:%d in %s, warp %d: mask 0x%08x names lanes that never arrive: 0x%08x (%s)", thread_op_name(f),
               f.file, f.line, where_block(b).c_str(), w, M, absent,
               exited == absent ? "they returned" : exited ? "some returned, some are beyond blockDim"
                                                           : "beyond blockDim");
    for (int k = 0; k < 32; k++) {
        const emu_thread &u = b->t[base + k < b->n ? base + k : first];
        if ((M >> k & 1) && !(absent >> k & 1) && u.op != f.op) {
            report("lanes of warp %d in %s meet at different warp operations: %s at %s:%d and %s at %s:%d", w,
                   where_block(b).c_str(), thread_op_name(f), f.file, f.line, thread_op_name(u), u.file, u.line);
            break;
        }
    }
    if (f.op == DT_EMU_GATHER) gather(b, w, M, absent);
    uint64_t vote_or = 0, all = 1, any = 0;
    for (int k = 0; k < 32; k++) {
        if (!(M >> k & 1) || (absent >> k & 1)) continue;
        bool p = b->t[base + k].value != 0;
        vote_or |= (uint64_t)p << k;
        all &= p;
        any |= p;
    }
    for (int k = 0; k < 32; k++) {
        if (!(M >> k & 1) || (absent >> k & 1)) continue;
        emu_thread &u = b->t[base + k];
        int width = u.width, seg = k & ~(width - 1), src = k;
        switch (u.op) {
        case DT_EMU_SHFL: src = seg + (((u.arg % width) + width) % width); break;
        case DT_EMU_SHFL_XOR: src = k ^ u.arg; if (src < 0 || src >= seg + width) src = k; break;
        case DT_EMU_SHFL_DOWN: src = k + u.arg; if (src >= seg + width) src = k; break;
        case DT_EMU_SHFL_UP: src = k - u.arg; if (src < seg) src = k; break;
        default: break;
        }
        if (u.op == DT_EMU_BALLOT) u.result = vote_or;
        else if (u.op == DT_EMU_ALL) u.result = all;
        else if (u.op == DT_EMU_ANY) u.result = any;
        else if (u.op == DT_EMU_SYNCWARP) u.result = 0;
        else if (src >= 0 && src < 32 && (M >> src & 1) && !(absent >> src & 1)) u.result = b->t[base + src].value;
        else u.result = ~(uint64_t)0; /* a lane that is not there: NaN */
    }
    for (int k = 0; k < 32; k++)
        if ((M >> k & 1) && !(absent >> k & 1)) release(b, b->t[base + k]);
    b->warp_gen[w]++;
}

static bool resolve_warp(emu_block *b, int w) {
    int base = w * 32, nl = std::min(32, b->n - base);
    bool any = false;
    unsigned int failed[32];
    int nfailed = 0;
    for (int l = 0; l < nl; l++) {
        if (b->t[base + l].state != T_WAIT_WARP) continue;
        unsigned int M = b->t[base + l].mask, absent = 0, exited = 0;
        bool ok = true, seen = false;
        for (int f = 0; f < nfailed && !seen; f++) seen = failed[f] == M; /* a mask that cannot complete yet */
        if (seen) continue;
        for (int k = 0; k < 32 && ok; k++) {
            if (!(M >> k & 1)) continue;
            if (k >= nl) { absent |= 1u << k; continue; }
            const emu_thread &u = b->t[base + k];
            if (u.state == T_EXITED) absent |= 1u << k, exited |= 1u << k;
            else if (u.state != T_WAIT_WARP || u.mask != M) ok = false;
        }
        if (!ok) {
            failed[nfailed++] = M;
            continue;
        }
        complete_warp(b, w, M, absent, exited);
        any = true;
    }
    return any;
}

static bool resolve_block(emu_block *b) {
    if (b->nwait_block == 0 || b->nwait_block + b->nexited != b->n) return false;
    const emu_thread *f = NULL;
    bool divergent = false;
    for (int i = 0; i < b->n; i++) {
        const emu_thread &t = b->t[i];
        if (t.state != T_WAIT_BLOCK) continue;
        if (!f) f = &t;
        else if (t.line != f->line || strcmp(t.file, f->file)) divergent = true;
    }
    if (b->nexited) {
        std::vector<int> gone;
        for (int i = 0; i < b->n; i++)
            if (b->t[i].state == T_EXITED) gone.push_back(i);
        report("__syncthreads at %s:%d in %s is reached by %d of %d threads: threads %s returned before it "
               "(a barrier in divergent code)", f->file, f->line, where_block(b).c_str(), b->nwait_block, b->n,
               id_ranges(gone).c_str());
    }
    if (divergent)
        report("divergent __syncthreads in %s: %s", where_block(b).c_str(), waiting_sites(b, T_WAIT_BLOCK).c_str());
    for (int i = 0; i < b->n; i++)
        if (b->t[i].state == T_WAIT_BLOCK) release(b, b->t[i]);
    b->nwait_block = 0;
    b->block_gen++;
    return true;
}

/* warp: the warp whose lane just stopped, -1 for all, -2 for none (an arrival at __syncthreads
   cannot complete a warp operation). */
static void resolve(emu_block *b, int warp) {
    int nwarps = (b->n + 31) / 32;
    for (int w = 0; w < nwarps && warp != -2; w++)
        if (warp < 0 || w == warp) resolve_warp(b, w);
    resolve_block(b);
}

static void deadlock(emu_block *b) {
    report("deadlock in %s: every live thread waits and no barrier can complete: %s", where_block(b).c_str(),
           waiting_sites(b, -1).c_str());
    b->aborted = true;
    for (int i = 0; i < b->n; i++) blk_signal(b, &b->t[i]);
}

static void make_order(emu_block *b) {
    b->order.clear();
    for (int i = 0; i < b->n; i++)
        if (b->t[i].state == T_RUN) b->order.push_back(i);
    if (G.mode == MODE_REVERSE) std::reverse(b->order.begin(), b->order.end());
    if (G.mode == MODE_RANDOM)
        for (size_t i = b->order.size(); i > 1; i--) std::swap(b->order[i - 1], b->order[emu_rand() % i]);
    b->pos = 0;
}

/* Called (under the block's lock) by a thread that just stopped running: it waits at a barrier
   (a warp operation of warp `warp`, or -2: __syncthreads) or returned (its warp). */
static void after_stop(emu_block *b, int warp) {
    if (b->aborted) return;
    if (!b->serial) {
        resolve(b, warp);
        if (b->nrun == 0 && b->nexited < b->n) deadlock(b);
        return;
    }
    for (b->pos++; b->pos < b->order.size(); b->pos++) { /* the baton goes to the next in order */
        int i = b->order[b->pos];
        if (b->t[i].state == T_RUN) { b->baton = i; blk_signal(b, &b->t[i]); return; }
    }
    resolve(b, -1); /* the round is over: complete the barriers, start the next round */
    make_order(b);
    if (b->order.empty()) {
        b->baton = -1;
        if (b->nexited < b->n) deadlock(b);
        return;
    }
    b->baton = b->order[0];
    blk_signal(b, &b->t[b->baton]);
}

/* Waits (under the lock) until this thread may run again. */
static void wait_turn(emu_block *b, emu_thread *t) {
    while (!b->aborted && (t->state != T_RUN || (b->serial && b->baton != t->id))) {
        if (b->fiber) { /* the scheduler resumes it when signalled */
#if EMU_FSWITCH
            dt_emu_fswitch(&t->sp, b->sched_sp);
#else
            swapcontext(&t->ctx, &b->sched);
#endif
        }
        else emu_wait(&t->cv, &b->m);
    }
}

static void spawn_rest(emu_block *b);

void dt_emu_syncthreads(const char *file, int line) {
    emu_thread *t = self;
    if (!t) { report("__syncthreads at %s:%d called outside a kernel", file, line); return; }
    emu_block *b = t->b;
    blk_lock(b);
    spawn_rest(b);
    t->state = T_WAIT_BLOCK, t->file = file, t->line = line;
    b->nrun--, b->nwait_block++;
    t->gen = b->block_gen;
    DT_EMU_RELEASE(&b->block_sync[t->gen & 1]);
    after_stop(b, -2);
    wait_turn(b, t);
    bool aborted = b->aborted;
    blk_unlock(b);
    DT_EMU_ACQUIRE(&b->block_sync[t->gen & 1]);
    if (aborted) throw emu_abort();
}

static uint64_t warp_op(const char *file, int line, int op, unsigned int mask, uint64_t value, int arg, int width,
                        const char *what, const void *gsrc, void *gdst, size_t gbytes) {
    emu_thread *t = self;
    if (!what) what = op_name(op);
    if (!t) { report("%s at %s:%d called outside a kernel", what, file, line); return value; }
    emu_block *b = t->b;
    int lane = t->id & 31, w = t->id >> 5;
    if (width < 1 || width > 32 || (width & (width - 1))) {
        report("%s at %s:%d: width %d; expected a power of two in [1, 32]", what, file, line, width);
        width = 32;
    }
    if (!(mask >> lane & 1)) {
        report("%s at %s:%d in %s: mask 0x%08x does not name the calling lane %d (thread %d)", what, file,
               line, where_block(b).c_str(), mask, lane, t->id);
        mask |= 1u << lane;
    }
    blk_lock(b);
    spawn_rest(b);
    t->state = T_WAIT_WARP, t->file = file, t->line = line;
    t->op = op, t->mask = mask, t->value = value, t->arg = arg, t->width = width;
    t->gather_what = what, t->gather_src = gsrc, t->gather_dst = gdst, t->gather_bytes = gbytes;
    b->nrun--;
    t->gen = b->warp_gen[w];
    DT_EMU_RELEASE(&b->warp_sync[2 * w + (t->gen & 1)]);
    after_stop(b, w);
    wait_turn(b, t);
    bool aborted = b->aborted;
    uint64_t r = t->result;
    blk_unlock(b);
    DT_EMU_ACQUIRE(&b->warp_sync[2 * w + (t->gen & 1)]);
    if (aborted) throw emu_abort();
    return r;
}

uint64_t dt_emu_warp(const char *file, int line, int op, unsigned int mask, uint64_t value, int arg, int width) {
    return warp_op(file, line, op, mask, value, arg, width, NULL, NULL, NULL, 0);
}

void dt_emu_warp_gather(const char *file, int line, const char *what, unsigned int mask, const void *mine, void *all,
                        size_t bytes) {
    if (!self) memset(all, 0xff, 32 * bytes); /* reported below */
    (void)warp_op(file, line, DT_EMU_GATHER, mask, 0, 0, 32, what, mine, all, bytes);
}

/* The running launch fails with e unless it already faulted: true for its first fault, the one
   to report (a GPU stops at its first fault: one report a launch). */
static bool first_fault(cudaError_t e) {
    emu_lock(&G.lock);
    bool first = G.fault == cudaSuccess;
    if (first) G.fault = e;
    emu_unlock(&G.lock);
    return first;
}

/* One CUDA thread of a block, run by a pool worker (below) from its first instruction to its exit. */
static void run_thread(emu_thread *t) {
    emu_block *b = t->b;
    unsigned int bx = b->bdim.x, by = b->bdim.y;
    uint3 tid = {t->id % bx, (t->id / bx) % by, t->id / (bx * by)};
    dt_emu_threadIdx = tid;
    dt_emu_blockIdx = b->bid;
    dt_emu_blockDim = b->bdim;
    dt_emu_gridDim = b->gdim;
    self = t;
    blk_lock(b);
    wait_turn(b, t);
    bool run = !b->aborted;
    blk_unlock(b);
    if (run) {
        try {
            (*b->body)();
        } catch (emu_abort &) {
        }
    }
    if (run && !b->aborted && !t->cp.empty() && first_fault(cudaErrorLaunchFailure))
        report("thread %d of %s ends with %zu cp.async copies never waited for (the first issued at %s:%d): a GPU "
               "makes them at a time the kernel cannot know; wait for them (cp.async.wait_group), then a barrier",
               t->id, where_block(b).c_str(), t->cp.size(), t->cp[0].file, t->cp[0].line);
    t->cp.clear();
    blk_lock(b);
    if (t->state == T_RUN) b->nrun--;
    else if (t->state == T_WAIT_BLOCK) b->nwait_block--;
    t->state = T_EXITED;
    b->nexited++;
    after_stop(b, t->id >> 5);
    blk_unlock(b);
    self = NULL;
}

/* The workers that play a block's CUDA threads: made once, as many as the largest block asked for, and
   reused by every block after (a host thread made and joined per CUDA thread per block cost more than
   the kernels: 190 thousand thread starts in one step of the smallest gpt). Its handoffs go through the
   emulator's quiet locks, so for ThreadSanitizer a block's start orders exactly what a thread's creation
   ordered (the launcher's writes before every thread's first instruction: b->start_sync) and its end
   what a join ordered (b->end_sync), nothing between the threads of one block.
   Lazy start (DT_EMU_THREADS=1 without TSan): the launcher itself plays the block's threads one after another,
   in the mode's order, for as long as none meets a barrier: most kernels have none, and a block of 256
   threads then costs no wake-up at all. The first thread to meet a barrier (any __syncthreads or warp
   operation) hands every thread not yet started to the pool (spawn_rest) and waits there as before. It
   is one legal schedule of the mode: in parallel mode, threads that ran to their end before the others
   started (as an OS may schedule them); in the serial modes exactly their first round's order. TSan
   builds start every thread at once, so that TSan sees the threads of a block as concurrent. */
struct emu_worker {
    pthread_t th;
    pthread_cond_t cv;
    emu_thread *job; /* the CUDA thread to play; NULL while idle */
};
static struct {
    pthread_mutex_t m;
    pthread_cond_t done; /* the launcher waits here for the block's last worker */
    std::vector<emu_worker *> w;
    int finished; /* workers of the current block that are done with it */
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {}, 0};

static void *worker_main(void *arg) {
    emu_worker *me = (emu_worker *)arg;
    for (;;) {
        emu_lock(&P.m);
        while (!me->job) emu_wait(&me->cv, &P.m);
        emu_thread *t = me->job;
        emu_unlock(&P.m);
        emu_block *b = t->b;
        DT_EMU_ACQUIRE(&b->start_sync);
        run_thread(t);
        DT_EMU_RELEASE(&b->end_sync);
        emu_lock(&P.m); /* the last touch of b was above: the launcher may free it once finished counts us */
        me->job = NULL;
        P.finished++;
        emu_signal(&P.done);
        emu_unlock(&P.m);
    }
    return NULL;
}

/* At least n workers (fewer when the system will not start more): how many there are. */
static int workers(int n) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while ((int)P.w.size() < n) {
        emu_worker *w = new emu_worker();
        pthread_cond_init(&w->cv, NULL);
        w->job = NULL;
        if (pthread_create(&w->th, &attr, worker_main, w)) {
            pthread_cond_destroy(&w->cv);
            delete w;
            break;
        }
        P.w.push_back(w);
    }
    pthread_attr_destroy(&attr);
    return (int)P.w.size() < n ? (int)P.w.size() : n;
}

/* Under the block's lock: the threads not started yet go to the pool (once; see "Lazy start"). */
static void spawn_rest(emu_block *b) {
    if (!b->lazy || b->spawned) return;
    b->spawned = true;
    emu_lock(&P.m);
    for (int j = b->next; j < b->n; j++) {
        P.w[b->nspawn]->job = &b->t[b->seq[j]];
        emu_signal(&P.w[b->nspawn++]->cv);
    }
    emu_unlock(&P.m);
    b->next = b->n;
}

/* Fiber blocks (every build but TSan's, unless DT_EMU_THREADS=1): each CUDA thread is a fiber
   (ucontext) on the launcher's thread, so a barrier costs a context switch in user space instead of
   a host thread's sleep and wake-up (the default gpt's step on the emulator: 316 s with host threads,
   40 s with fibers). A wait (wait_turn) switches back to this scheduler, a signal (blk_signal) queues
   the thread, and the scheduler resumes queued threads first in, first out until all have exited;
   a thread resumed whose wait still holds waits again. The block's lock is then no lock at all
   (blk_lock): a fiber is switched out only at its waits. A block without barriers runs its threads
   one after another on one stack; stacks (512 KiB, as the host threads') are kept for later blocks. */
static std::vector<void *> fiber_stacks;
static const size_t FIBER_STACK = 512 * 1024;

#if EMU_FSWITCH
/* A fiber's first instruction (the "return address" its new stack holds): self is its thread. It
   ends by switching to the scheduler for good (its stack goes back to the pool). */
static void fiber_start(void) {
    emu_thread *t = self;
    run_thread(t);
    t->finished = true;
    dt_emu_fswitch(&t->sp, t->b->sched_sp);
    abort(); /* never resumed */
}
#else
static void fiber_entry(unsigned int lo, unsigned int hi) {
    emu_thread *t = (emu_thread *)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    run_thread(t);
    t->finished = true; /* returns to b->sched (uc_link) */
}
#endif

static void run_fibers(emu_block *b) {
    for (int i = 0; i < b->n; i++) {
        emu_thread *t = &b->t[b->seq[i]];
        t->ready = true, t->started = t->finished = false, t->stack = NULL;
        b->readyq.push_back(t->id);
    }
    while (!b->readyq.empty()) {
        emu_thread *t = &b->t[b->readyq.front()];
        b->readyq.pop_front();
        t->ready = false;
        if (t->finished) continue;
        if (!t->started) {
            if (fiber_stacks.empty()) fiber_stacks.push_back(malloc(FIBER_STACK));
            if (!fiber_stacks.back()) { /* the threads already started could not unwind: stop here */
                fprintf(stderr, "dt_emu: out of memory for a %zu-byte fiber stack (%s)\n", FIBER_STACK,
                        where_block(b).c_str());
                abort();
            }
            t->stack = fiber_stacks.back();
            fiber_stacks.pop_back();
#if EMU_FSWITCH
            { /* the six registers dt_emu_fswitch pops, then fiber_start as the return address; at
                 fiber_start's entry rsp = 8 mod 16, as after a call */
                uintptr_t *sp = (uintptr_t *)(((uintptr_t)t->stack + FIBER_STACK) & ~(uintptr_t)15);
                *--sp = 0;
                *--sp = (uintptr_t)fiber_start;
                for (int r = 0; r < 6; r++) *--sp = 0;
                t->sp = sp;
            }
#else
            getcontext(&t->ctx);
            t->ctx.uc_stack.ss_sp = t->stack, t->ctx.uc_stack.ss_size = FIBER_STACK;
            t->ctx.uc_link = &b->sched;
            uintptr_t v = (uintptr_t)t;
            makecontext(&t->ctx, (void (*)(void))fiber_entry, 2, (unsigned int)(v & 0xffffffffu),
                        (unsigned int)(v >> 32));
#endif
            t->started = true;
        }
        unsigned int bx = b->bdim.x, by = b->bdim.y;
        dt_emu_threadIdx = {t->id % bx, (t->id / bx) % by, t->id / (bx * by)};
        self = t;
#if EMU_FSWITCH
        dt_emu_fswitch(&b->sched_sp, t->sp);
#else
        swapcontext(&b->sched, &t->ctx);
#endif
        if (t->finished) {
            fiber_stacks.push_back(t->stack);
            t->stack = NULL;
        }
    }
    self = NULL;
    for (int i = 0; i < b->n; i++)
        if (!b->t[i].finished && b->t[i].started) {
            /* cannot happen: after_stop aborts a stuck block and every thread unwinds */
            report("%s: thread %d never finished (emulator fault)", where_block(b).c_str(), i);
            break;
        }
}

static void run_block(emu_block *b) {
    /* poison: what a block reads before anyone wrote it is NaN */
    memset(__start_dt_emu_shared, 0xff, (size_t)(__stop_dt_emu_shared - __start_dt_emu_shared));
    pthread_mutex_init(&b->m, NULL);
    b->t.assign(b->n, emu_thread());
    for (int i = 0; i < b->n; i++) {
        emu_thread &t = b->t[i];
        pthread_cond_init(&t.cv, NULL);
        t.b = b, t.id = i, t.state = T_RUN, t.file = "", t.line = 0;
    }
    b->nrun = b->n, b->nexited = 0, b->nwait_block = 0, b->aborted = false;
#ifdef DT_EMU_TSAN
    b->fiber = false; /* TSan must see the threads of a block as concurrent */
#else
    static int threads = -1;
    if (threads < 0) threads = getenv("DT_EMU_THREADS") && !strcmp(getenv("DT_EMU_THREADS"), "1");
    b->fiber = !threads;
#endif
    b->readyq.clear();
    b->block_gen = 0;
    b->warp_gen.assign((b->n + 31) / 32, 0);
    b->warp_sync.assign(2 * b->warp_gen.size(), 0);
    b->serial = G.mode != MODE_PARALLEL;
    b->baton = -1;
    b->seq.resize(b->n);
    for (int i = 0; i < b->n; i++) b->seq[i] = i;
    if (b->serial) {
        make_order(b);
        b->baton = b->order[0];
        b->seq = b->order;
    }
#ifdef DT_EMU_TSAN
    b->lazy = false;
#else
    b->lazy = true;
#endif
    b->spawned = false, b->next = 0, b->nspawn = 0;
    if (b->fiber) {
        b->lazy = false;
        run_fibers(b);
        for (int i = 0; i < b->n; i++) pthread_cond_destroy(&b->t[i].cv);
        pthread_mutex_destroy(&b->m);
        return;
    }
    int have = workers(b->n);
    if (have < b->n) { /* the threads that have a worker exit at once */
        report("%s: could not start thread %d of %d (pthread_create failed): use smaller blocks",
               where_block(b).c_str(), have, b->n);
        b->aborted = true, b->lazy = false;
    }
    DT_EMU_RELEASE(&b->start_sync);
    emu_lock(&P.m);
    P.finished = 0;
    emu_unlock(&P.m);
    if (b->lazy) {
        for (;;) {
            blk_lock(b);
            emu_thread *t = b->spawned || b->next >= b->n ? NULL : &b->t[b->seq[b->next++]];
            blk_unlock(b);
            if (!t) break;
            run_thread(t); /* here, on the launcher's own thread */
        }
    } else {
        emu_lock(&P.m);
        for (int i = 0; i < have; i++) {
            P.w[i]->job = &b->t[i];
            emu_signal(&P.w[i]->cv);
        }
        b->nspawn = have;
        emu_unlock(&P.m);
    }
    emu_lock(&P.m);
    while (P.finished < b->nspawn) emu_wait(&P.done, &P.m);
    emu_unlock(&P.m);
    DT_EMU_ACQUIRE(&b->end_sync);
    for (int i = 0; i < b->n; i++) pthread_cond_destroy(&b->t[i].cv);
    pthread_mutex_destroy(&b->m);
}

static bool valid_stream(cudaStream_t s) { return !s || G.streams.count((void *)s); }
static cudaError_t run_grid(const char *kernel, const char *file, int line, dim3 grid, dim3 block, size_t shmem_bytes,
                            const std::function<void()> &body);
static void drain_all(bool blocking_only);

cudaError_t dt_emu_launch(const char *kernel, const char *file, int line, dim3 grid, dim3 block, size_t shmem_bytes,
                          cudaStream_t stream, const std::function<void()> &body) {
    init_mode();
    if (G.mode == MODE_BAD) {
        report("%s launched at %s:%d: DT_EMU_MODE = \"%s\" is not a mode", kernel, file, line, G.mode_name);
        return fail(cudaErrorInvalidValue);
    }
    if (!valid_stream(stream)) {
        report("%s launched at %s:%d on stream %p, which cudaStreamCreate did not make (or it was destroyed)",
               kernel, file, line, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
        !grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 ||
        shmem_bytes > 48 * 1024) {
        report("%s launched at %s:%d with grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of dynamic shared memory: "
               "expected blocks of 1 to 1024 threads (x, y <= 1024, z <= 64), a grid of at least 1 block "
               "(x < 2^31, y, z <= 65535), at most 48 KiB", kernel, file, line, grid.x, grid.y, grid.z, block.x,
               block.y, block.z, shmem_bytes);
        return fail(cudaErrorInvalidConfiguration);
    }
    std::function<void()> fn = body; /* the lambda holds the arguments by value: it may run later */
    return dt_emu_enqueue(stream, kernel, [=](bool *done) {
        *done = true;
        return run_grid(kernel, file, line, grid, block, shmem_bytes, fn);
    });
}

/* Runs every block of a launch (when its stream gets to it). */
static cudaError_t run_grid(const char *kernel, const char *file, int line, dim3 grid, dim3 block, size_t shmem_bytes,
                            const std::function<void()> &body) {
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    int before = G.reports;
    G.fault = cudaSuccess;
    std::vector<unsigned char> dyn(shmem_bytes + 16);
    G.dyn_shared = dyn.data();
    G.dyn_bytes = shmem_bytes;
    unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    std::vector<unsigned long long> order;
    if (G.mode == MODE_RANDOM && nblocks <= (1u << 20)) { /* shuffled block order */
        order.resize(nblocks);
        for (unsigned long long i = 0; i < nblocks; i++) order[i] = i;
        for (unsigned long long i = nblocks; i > 1; i--) std::swap(order[i - 1], order[emu_rand() % i]);
    }
    for (unsigned long long k = 0; k < nblocks; k++) {
        unsigned long long i = order.empty() ? (G.mode == MODE_REVERSE ? nblocks - 1 - k : k) : order[k];
        emu_block b;
        b.n = (int)threads;
        b.bid.x = (unsigned int)(i % grid.x);
        b.bid.y = (unsigned int)(i / grid.x % grid.y);
        b.bid.z = (unsigned int)(i / grid.x / grid.y);
        b.bdim = block, b.gdim = grid, b.body = &body, b.kernel = kernel, b.file = file, b.line = line;
        memset(dyn.data(), 0xff, dyn.size());
        run_block(&b);
        if (b.aborted) break;
    }
    G.dyn_shared = NULL;
    G.dyn_bytes = 0;
    if (G.reports == before) return cudaSuccess;
    return fail(G.fault != cudaSuccess ? G.fault : cudaErrorLaunchFailure);
}

void *dt_emu_dynamic_shared(void) {
    if (!G.dyn_shared) report("DT_K_SHARED_DYNAMIC outside a kernel");
    return G.dyn_shared;
}

/* The access itself is done by the caller with memcpy (a misaligned one too, so the host does not
   trap on an aligned vector instruction): this only checks. */
static long long vector_accesses;
long long dt_emu_vector_accesses(void) { return __atomic_load_n(&vector_accesses, __ATOMIC_RELAXED); }
void dt_emu_vector_access(const void *p, size_t bytes, int store) {
    size_t off = (size_t)((uintptr_t)p % bytes);
    __atomic_fetch_add(&vector_accesses, 1, __ATOMIC_RELAXED);
    if (!off) return;
    emu_lock(&G.lock);
    bool first = G.fault != cudaErrorMisalignedAddress; /* a GPU stops at the first fault: one report a launch */
    G.fault = cudaErrorMisalignedAddress;
    emu_unlock(&G.lock);
    if (!first) return;
    if (self)
        report("misaligned %zu-byte vector %s at %p (%zu bytes past a %zu-byte boundary) by thread %d of %s: a GPU "
               "faults (cudaErrorMisalignedAddress); take the scalar path unless the pointer is aligned",
               bytes, store ? "store" : "load", p, off, bytes, self->id, where_block(self->b).c_str());
    else
        report("misaligned %zu-byte vector %s at %p outside a kernel", bytes, store ? "store" : "load", p);
}

int dt_emu_is_shared(const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p, s0 = (uintptr_t)__start_dt_emu_shared, s1 = (uintptr_t)__stop_dt_emu_shared;
    uintptr_t d0 = (uintptr_t)G.dyn_shared, d1 = d0 + G.dyn_bytes;
    return (a >= s0 && a <= s1 && bytes <= s1 - a) || (G.dyn_shared && a >= d0 && a <= d1 && bytes <= d1 - a);
}

int dt_emu_shared_access(const char *file, int line, const char *what, const void *p, size_t bytes) {
    bool shared = dt_emu_is_shared(p, bytes), aligned = (uintptr_t)p % bytes == 0;
    if (shared && aligned) return 1;
    bool first = first_fault(shared ? cudaErrorMisalignedAddress : cudaErrorIllegalAddress);
    if (first && self)
        report("%s at %s:%d by thread %d of %s: %zu bytes at %p %s", what, file, line, self->id,
               where_block(self->b).c_str(), bytes, p,
               shared ? "not on a boundary of that many bytes (a GPU faults: cudaErrorMisalignedAddress)"
                      : "outside shared memory (it reads only __shared__ and dynamic shared memory: a GPU "
                        "faults or reads another address)");
    else if (first)
        report("%s at %s:%d outside a kernel", what, file, line);
    return 0;
}

void dt_emu_cp_async(const char *file, int line, void *dst, const void *src, size_t bytes) {
    if (!dt_emu_shared_access(file, line, "cp.async (its shared-memory destination)", dst, bytes) || !self) return;
    if ((uintptr_t)src % bytes) {
        if (first_fault(cudaErrorMisalignedAddress))
            report("cp.async at %s:%d by thread %d of %s: its %zu-byte source %p is not on a boundary of that many "
                   "bytes (a GPU faults: cudaErrorMisalignedAddress)", file, line, self->id,
                   where_block(self->b).c_str(), bytes, src);
        return;
    }
    if (dt_emu_is_shared(src, 1)) {
        if (first_fault(cudaErrorIllegalAddress))
            report("cp.async at %s:%d by thread %d of %s: its source %p is shared memory (cp.async copies from "
                   "global memory)", file, line, self->id, where_block(self->b).c_str(), src);
        return;
    }
    memset(dst, 0xff, bytes); /* in flux from now until the wait: NaN to a reader in between */
    self->cp.push_back({dst, src, bytes, self->cp_commits, file, line});
}

void dt_emu_cp_async_commit(void) {
    if (self) self->cp_commits++;
}

void dt_emu_cp_async_wait(int n) {
    if (!self) return;
    unsigned keep = n < 0 ? 0u : (unsigned)n; /* the newest groups left in flight */
    unsigned done = keep >= self->cp_commits ? 0u : self->cp_commits - keep;
    size_t k = 0;
    for (size_t i = 0; i < self->cp.size(); i++) { /* in the order issued */
        emu_thread::cp_async &c = self->cp[i];
        if (c.group < done) memcpy(c.dst, c.src, c.bytes);
        else self->cp[k++] = c;
    }
    self->cp.resize(k);
}

/* ---------------------------------------------------------------- errors, device */

cudaError_t cudaGetLastError(void) {
    cudaError_t e = G.last_error;
    G.last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return G.last_error; }

static const struct { cudaError_t e; const char *name, *text; } error_names[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};
const char *cudaGetErrorName(cudaError_t e) {
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++)
        if (error_names[i].e == e) return error_names[i].name;
    return "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t e) {
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++)
        if (error_names[i].e == e) return error_names[i].text;
    return "unrecognized error code";
}
static void count(long long dt_emu_counters::*field, long long by);

/* DT_EMU_TRACE=1: every counted event (cudaMalloc, cudaFree, a host<->device copy, a host wait)
   printed on stderr with the call site the fake header recorded and the program's frames above
   it (addr2line of the return addresses), so a counter that a step should keep at 0 names where
   it comes from:
       dt_emu trace 12: cudaMemcpy device to host 64 bytes at dt_tensor.h:1196
           <- dt_cuda_read_loss (dt_tensor.h:1196) <- dt_tp_xent_fwd (dt_parallel.h:2598) <- ...
   Slow (one addr2line per event): for finding, not for the tests' runs. */
static bool trace_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DT_EMU_TRACE");
        on = e && *e && strcmp(e, "0") != 0;
    }
    return on == 1;
}
static void trace(const char *what, size_t bytes, const char *file, int line) {
    static long long n;
    void *frames[32];
    char head[512], cmd[4096], fn[512], at[1024];
    int k, i, shown = 0;
    size_t len;
    if (!trace_on()) return;
    k = backtrace(frames, 32);
    snprintf(head, sizeof head, "dt_emu trace %lld: %s", ++n, what);
    if (bytes) snprintf(head + strlen(head), sizeof head - strlen(head), " %zu bytes", bytes);
    if (file) snprintf(head + strlen(head), sizeof head - strlen(head), " at %s:%d", file, line);
    std::string out = std::string(head) + "\n   ";
    /* frames 0 and 1 are this function and the emulator's entry point; the return addresses,
       less one, are inside the calls (PIE objects: addr2line wants offsets into the file) */
    for (i = 2; i < k && shown < 12; i++) {
        Dl_info info;
        if (!dladdr(frames[i], &info) || !info.dli_fname || strstr(info.dli_fname, "libc.so")) continue;
        snprintf(cmd, sizeof cmd, "addr2line -f -s -C -e '%s' %#lx 2>/dev/null", info.dli_fname,
                 (unsigned long)((uintptr_t)frames[i] - 1 - (uintptr_t)info.dli_fbase));
        FILE *p = popen(cmd, "r");
        if (!p) continue;
        if (fgets(fn, sizeof fn, p) && fgets(at, sizeof at, p) && at[0] != '?') {
            len = strlen(fn); if (len && fn[len - 1] == '\n') fn[len - 1] = 0;
            len = strlen(at); if (len && at[len - 1] == '\n') at[len - 1] = 0;
            out += std::string(" <- ") + fn + " (" + at + ")";
            shown++;
        }
        pclose(p);
    }
    fprintf(stderr, "%s\n", out.c_str());
}

cudaError_t cudaDeviceSynchronize(void) {
    count(&dt_emu_counters::syncs, 1);
    trace("cudaDeviceSynchronize", 0, NULL, 0);
    drain_all(false);
    return cudaSuccess;
}
/* DT_EMU_DEVICES=N: the process sees N devices (default 1), all in host memory; their PCI bus
   ids differ, so ranks of one host that pick different devices are on different "GPUs" (what
   NCCL and dt_comm.h check), and ranks that pick the same one share it. N = 0 is a machine
   without a GPU: cudaGetDeviceCount fails as CUDA's does there (cudaErrorNoDevice, count 0). */
static int current_device = 0;
static int device_count(void) {
    const char *e = getenv("DT_EMU_DEVICES");
    int n = e && *e ? atoi(e) : 1;
    return n >= 0 && n <= 64 ? n : 1;
}
cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return fail(cudaErrorInvalidValue);
    *count = device_count();
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int *device) {
    if (!device) return fail(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    if (!pciBusId || len <= 0) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", device + 1);
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (!value) return fail(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 8; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}

/* ---------------------------------------------------------------- memory and its registry */

/* The allocation holding p: its base and size; false for host memory. */
static bool find_alloc(const void *p, uintptr_t *base, size_t *size) {
    uintptr_t u = (uintptr_t)p;
    std::map<uintptr_t, size_t>::iterator it = G.allocs.upper_bound(u);
    if (it == G.allocs.begin()) return false;
    --it;
    if (u >= it->first + (it->second ? it->second : 1)) return false;
    *base = it->first, *size = it->second;
    return true;
}

/* p .. p+bytes lies in one allocation; else writes why into why. */
static bool in_alloc(const void *p, size_t bytes, std::string *why) {
    uintptr_t base;
    size_t size;
    char buf[256];
    if (!find_alloc(p, &base, &size)) { *why = "is not device memory (no cudaMalloc allocation holds it)"; return false; }
    size_t off = (uintptr_t)p - base;
    if (bytes > size - off) {
        snprintf(buf, sizeof buf, "+ %zu bytes runs %zu bytes past the end of its %zu-byte allocation (it starts "
                 "%zu bytes in)", bytes, bytes - (size - off), size, off);
        *why = buf;
        return false;
    }
    return true;
}

int dt_emu_device_range(const void *p, size_t bytes, char *why, size_t why_len) {
    std::string w;
    if (in_alloc(p, bytes, &w)) return 1;
    if (why && why_len) snprintf(why, why_len, "%s", w.c_str());
    return 0;
}

static dt_emu_counters counts; /* under G.lock */
static void count(long long dt_emu_counters::*field, long long by) {
    emu_lock(&G.lock);
    counts.*field += by;
    emu_unlock(&G.lock);
}
void dt_emu_get_counters(dt_emu_counters *c) {
    emu_lock(&G.lock);
    *c = counts;
    emu_unlock(&G.lock);
}

/* Out of memory on purpose (dt_emu_fail_alloc, DT_EMU_FAIL_ALLOC=N): the fail_at-th allocation
   (cudaMalloc or pinned host memory, of one byte or more) fails with cudaErrorMemoryAllocation, as
   a full GPU's does. Under G.lock. */
static long long oom_made, oom_fail_at = -1; /* -1: DT_EMU_FAIL_ALLOC not read yet */
static bool oom_said;                         /* DT_EMU_FAIL_ALLOC set it: say where it hits */
static bool injected_oom(const char *what, size_t bytes, const char *file, int line) {
    emu_lock(&G.lock);
    if (oom_fail_at < 0) {
        const char *e = getenv("DT_EMU_FAIL_ALLOC");
        oom_fail_at = e && *e ? strtoll(e, NULL, 10) : 0;
        oom_said = oom_fail_at > 0;
    }
    bool hit = ++oom_made == oom_fail_at;
    emu_unlock(&G.lock);
    if (hit && (oom_said || trace_on())) fprintf(stderr, "dt_emu: %s(%zu bytes) at %s:%d fails (out of memory on purpose)\n", what, bytes, file, line);
    return hit;
}
void dt_emu_fail_alloc(long long n) {
    emu_lock(&G.lock);
    oom_fail_at = n > 0 ? oom_made + n : 0;
    oom_said = false;
    emu_unlock(&G.lock);
}
long long dt_emu_allocations(void) {
    emu_lock(&G.lock);
    long long n = oom_made;
    emu_unlock(&G.lock);
    return n;
}
long long dt_emu_live_allocations(void) {
    emu_lock(&G.lock);
    long long n = (long long)(G.allocs.size() + G.pinned.size());
    emu_unlock(&G.lock);
    return n;
}

cudaError_t dt_emu_malloc(const char *file, int line, void **ptr, size_t bytes) {
    if (!ptr) { report("cudaMalloc at %s:%d: ptr is NULL", file, line); return fail(cudaErrorInvalidValue); }
    *ptr = NULL;
    count(&dt_emu_counters::allocs, 1);
    trace("cudaMalloc", bytes, file, line);
    if (bytes == 0) return cudaSuccess;
    /* 256-byte aligned, as cudaMalloc's: a vector path's alignment test sees what a GPU gives */
    void *p = bytes > SIZE_MAX - 255 || injected_oom("cudaMalloc", bytes, file, line)
                  ? NULL : aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!p) return fail(cudaErrorMemoryAllocation);
    memset(p, 0xff, bytes); /* cudaMalloc memory is not zeroed: reading it before writing shows */
    emu_lock(&G.lock);
    G.allocs[(uintptr_t)p] = bytes;
    emu_unlock(&G.lock);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    const char *e = getenv("DT_EMU_DEVICE_BYTES");
    double t = e && *e ? strtod(e, NULL) : 16.0 * (1u << 30);
    size_t total = t >= 1 && t < 1e18 ? (size_t)t : (size_t)16 << 30, held = 0;
    if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
    emu_lock(&G.lock);
    for (std::map<uintptr_t, size_t>::iterator it = G.allocs.begin(); it != G.allocs.end(); ++it) held += it->second;
    emu_unlock(&G.lock);
    *total_bytes = total;
    *free_bytes = held < total ? total - held : 0;
    return cudaSuccess;
}

cudaError_t dt_emu_free(const char *file, int line, void *ptr) {
    if (!ptr) return cudaSuccess;
    count(&dt_emu_counters::frees, 1);
    trace("cudaFree", 0, file, line);
    emu_lock(&G.lock);
    bool known = G.allocs.erase((uintptr_t)ptr) == 1;
    emu_unlock(&G.lock);
    if (!known) {
        report("cudaFree(%p) at %s:%d: not a pointer cudaMalloc returned (or freed already)", ptr, file, line);
        return fail(cudaErrorInvalidValue);
    }
    free(ptr);
    return cudaSuccess;
}

/* Pinned host memory (cudaHostAlloc, cudaMallocHost): host memory, as on a GPU machine, also
   reachable from kernels (mapped: the device pointer is the host pointer, as under unified
   addressing). Not device memory: a cudaMemcpy's device side must still be a cudaMalloc
   allocation. Zeroed here (a GPU's is whatever the OS gives, and the OS zeroes it). Counted as
   an allocation; cudaFreeHost of anything else is a report. */
cudaError_t dt_emu_host_alloc(const char *file, int line, void **ptr, size_t bytes, unsigned int flags) {
    (void)flags;
    if (!ptr) { report("cudaHostAlloc at %s:%d: ptr is NULL", file, line); return fail(cudaErrorInvalidValue); }
    *ptr = NULL;
    count(&dt_emu_counters::allocs, 1);
    trace("cudaHostAlloc", bytes, file, line);
    if (bytes == 0) return cudaSuccess;
    void *p = bytes > SIZE_MAX - 4095 || injected_oom("cudaHostAlloc", bytes, file, line)
                  ? NULL : aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    if (!p) return fail(cudaErrorMemoryAllocation);
    memset(p, 0, bytes);
    emu_lock(&G.lock);
    G.pinned[(uintptr_t)p] = bytes;
    emu_unlock(&G.lock);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t dt_emu_free_host(const char *file, int line, void *ptr) {
    if (!ptr) return cudaSuccess;
    count(&dt_emu_counters::frees, 1);
    trace("cudaFreeHost", 0, file, line);
    emu_lock(&G.lock);
    bool known = G.pinned.erase((uintptr_t)ptr) == 1;
    emu_unlock(&G.lock);
    if (!known) {
        report("cudaFreeHost(%p) at %s:%d: not a pointer cudaHostAlloc returned (or freed already)", ptr, file, line);
        return fail(cudaErrorInvalidValue);
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
    uintptr_t u = (uintptr_t)host;
    bool known;
    (void)flags;
    if (!dev) return fail(cudaErrorInvalidValue);
    emu_lock(&G.lock);
    std::map<uintptr_t, size_t>::iterator it = G.pinned.upper_bound(u);
    known = it != G.pinned.begin() && (--it, u < it->first + it->second);
    emu_unlock(&G.lock);
    if (!known) {
        report("cudaHostGetDevicePointer(%p): not inside a cudaHostAlloc allocation", host);
        return fail(cudaErrorInvalidValue);
    }
    *dev = host;
    return cudaSuccess;
}

/* [p, p + bytes) lies inside one cudaHostAlloc / cudaMallocHost allocation. */
static bool host_pinned(const void *p, size_t bytes) {
    uintptr_t u = (uintptr_t)p;
    bool in;
    emu_lock(&G.lock);
    std::map<uintptr_t, size_t>::iterator it = G.pinned.upper_bound(u);
    in = it != G.pinned.begin() && (--it, u + bytes <= it->first + it->second);
    emu_unlock(&G.lock);
    return in;
}

static const char *kind_name(int k) {
    static const char *const names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                        "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
    return k >= 0 && k <= 4 ? names[k] : "an invalid cudaMemcpyKind";
}

cudaError_t dt_emu_memcpy(const char *file, int line, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                          cudaStream_t stream) {
    uintptr_t base;
    size_t size;
    std::string why;
    if (!valid_stream(stream)) {
        report("cudaMemcpyAsync at %s:%d on stream %p, which cudaStreamCreate did not make", file, line, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if ((int)kind < 0 || (int)kind > 4) {
        report("cudaMemcpy at %s:%d: kind = %d is not a cudaMemcpyKind", file, line, (int)kind);
        return fail(cudaErrorInvalidMemcpyDirection);
    }
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) {
        report("cudaMemcpy at %s:%d (%s, %zu bytes): %s is NULL", file, line, kind_name(kind), bytes, dst ? "src" : "dst");
        return fail(cudaErrorInvalidValue);
    }
    bool dev_dst = find_alloc(dst, &base, &size), dev_src = find_alloc(src, &base, &size);
    bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) want_dst = dev_dst, want_src = dev_src;
    const char *bad = NULL;
    if (want_dst != dev_dst) bad = "dst", why = dev_dst ? "is device memory" : "is host memory";
    else if (want_src != dev_src) bad = "src", why = dev_src ? "is device memory" : "is host memory";
    if (bad) {
        report("cudaMemcpy at %s:%d (%s, %zu bytes): %s %s: the wrong direction", file, line, kind_name(kind), bytes,
               bad, why.c_str());
        return fail(cudaErrorInvalidValue);
    }
    if ((want_dst && !in_alloc(dst, bytes, &why) && (bad = "dst")) || (want_src && !in_alloc(src, bytes, &why) && (bad = "src"))) {
        report("cudaMemcpy at %s:%d (%s, %zu bytes): %s %p %s", file, line, kind_name(kind), bytes, bad,
               bad[0] == 'd' ? dst : src, why.c_str());
        return fail(cudaErrorInvalidValue);
    }
    if (want_dst && !want_src) count(&dt_emu_counters::h2d_bytes, (long long)bytes), count(&dt_emu_counters::h2d_calls, 1);
    if (want_src && !want_dst) count(&dt_emu_counters::d2h_bytes, (long long)bytes), count(&dt_emu_counters::d2h_calls, 1);
    if (want_dst != want_src) trace(want_dst ? "cudaMemcpy host to device" : "cudaMemcpy device to host", bytes, file, line);
    if (want_dst && !want_src && host_pinned(src, bytes)) {
        /* from pinned memory (cudaMallocHost / cudaHostAlloc) the DMA reads the bytes when the copy
           runs, in stream order: a copy queued after another that fills the buffer (a device to
           host copy on the same stream) sends what that one wrote */
        return dt_emu_enqueue(stream, "cudaMemcpyAsync", [=](bool *done) {
            *done = true;
            memcpy(dst, src, bytes);
            return cudaSuccess;
        });
    }
    if (want_dst && !want_src) {
        /* from pageable host memory CUDA stages the bytes before the call returns: the caller may
           reuse its buffer at once, even when the copy itself runs later (deferred streams) */
        std::shared_ptr<std::vector<unsigned char>> staged =
            std::make_shared<std::vector<unsigned char>>((const unsigned char *)src, (const unsigned char *)src + bytes);
        return dt_emu_enqueue(stream, "cudaMemcpyAsync", [=](bool *done) {
            *done = true;
            memcpy(dst, staged->data(), bytes);
            return cudaSuccess;
        });
    }
    return dt_emu_enqueue(stream, "cudaMemcpyAsync", [=](bool *done) {
        *done = true;
        memmove(dst, src, bytes);
        return cudaSuccess;
    });
}

cudaError_t dt_emu_memcpy_blocking(const char *file, int line, void *dst, const void *src, size_t bytes,
                                   cudaMemcpyKind kind) {
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost) {
        count(&dt_emu_counters::syncs, 1);
        trace("cudaMemcpy (blocking: a host wait)", 0, file, line);
    }
    return dt_emu_memcpy(file, line, dst, src, bytes, kind, 0);
}

cudaError_t dt_emu_memset(const char *file, int line, void *dst, int value, size_t bytes, cudaStream_t stream) {
    std::string why;
    if (!valid_stream(stream)) {
        report("cudaMemsetAsync at %s:%d on stream %p, which cudaStreamCreate did not make", file, line, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (bytes == 0) return cudaSuccess;
    if (!in_alloc(dst, bytes, &why)) {
        report("cudaMemset at %s:%d (%zu bytes): dst %p %s", file, line, bytes, dst, why.c_str());
        return fail(cudaErrorInvalidValue);
    }
    return dt_emu_enqueue(stream, "cudaMemsetAsync", [=](bool *done) {
        *done = true;
        memset(dst, value, bytes);
        return cudaSuccess;
    });
}

/* ---------------------------------------------------------------- streams and events

   A stream is a queue of work (kernels, async copies and memsets, event records and waits, the
   fake NCCL's operations). Each piece of work is a step function that says whether it is done:
   a kernel or a copy is done after one step; an NCCL operation may need several (it waits for
   its peers). The legacy default stream (0) runs its work at once, after the work queued on
   every blocking stream (cudaStreamNonBlocking streams excepted), as CUDA's legacy stream does.

   DT_EMU_STREAMS (environment):
     immediate  (default) work runs as soon as it is queued and the stream is free: with no NCCL
                operation waiting for its peers, every call is synchronous, as before.
     deferred   work on a created stream is queued and runs only when something waits for it:
                cudaStreamSynchronize, cudaEventSynchronize / cudaEventQuery of an event recorded
                after it, a cudaStreamWaitEvent on another stream when that stream runs, work on
                the legacy stream (blocking streams only), cudaDeviceSynchronize. So a consumer
                that forgets to wait (a collective posted on the communication stream without
                cudaStreamWaitEvent on the compute stream's event) reads what was there before
                the producer ran, and the test that checks its values fails. */

struct emu_work {
    std::function<cudaError_t(bool *)> step;
    const char *what;
};
struct dt_emu_stream {
    std::deque<emu_work> q;
    unsigned long long posted, finished; /* work queued / done since creation */
    unsigned int flags;
    cudaError_t err;                     /* of work that failed since the last synchronisation */
    bool busy, dead;                     /* running a step; destroyed (kept: events may name it) */
};
struct dt_emu_event {
    double ms;
    bool recorded, timed;                /* recorded at least once; its record has run (ms set) */
    dt_emu_stream *s;                    /* where it was last recorded (NULL: legacy, complete) */
    unsigned long long at;               /* complete when s->finished reaches this */
};

static int streams_mode = -1; /* 0 immediate, 1 deferred */
static bool deferred(void) {
    if (streams_mode < 0) {
        const char *m = getenv("DT_EMU_STREAMS");
        streams_mode = m && !strcmp(m, "deferred");
        if (m && *m && strcmp(m, "deferred") && strcmp(m, "immediate"))
            report("DT_EMU_STREAMS = \"%s\"; expected immediate or deferred (running immediate)", m);
    }
    return streams_mode == 1;
}
const char *dt_emu_streams_mode(void) { return deferred() ? "deferred" : "immediate"; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int probing; /* > 0: drive() runs for progress_others, where a busy stream is no cycle */
static void progress_others(dt_emu_stream *self);

/* Runs s's work until `target` pieces are finished. block: wait for work that is not done yet
   (an NCCL operation whose peers have not come), meanwhile running what the other streams can
   run (a GPU runs them all at once: under deferred streams, a pipeline's receive waits for a peer
   whose matching send sits on that peer's own link stream, which only runs when something there
   waits for it, and that peer waits for this one's send the same way); else return with *reached
   = false. A failed piece counts as finished; its error is kept in s->err. */
static void drive(dt_emu_stream *s, unsigned long long target, bool block, bool *reached) {
    *reached = s->finished >= target;
    if (*reached) return; /* already run: a wait on it is no cycle, even from inside s's own work */
    if (s->busy && probing) return; /* it is running further up: progress_others skips it */
    if (s->busy) { /* a wait on itself, through events: it can never complete */
        report("stream %p waits for its own later work (a cycle of cudaStreamWaitEvent)", (void *)s);
        s->err = cudaErrorLaunchFailure;
        return;
    }
    s->busy = true;
    while (s->finished < target && !s->q.empty()) {
        bool done = false;
        cudaError_t e = s->q.front().step(&done);
        if (e != cudaSuccess) s->err = e, G.last_error = e, done = true;
        if (!done) {
            if (!block) break;
            progress_others(s);
            sched_yield();
            continue;
        }
        s->q.pop_front();
        s->finished++;
    }
    s->busy = false;
    *reached = s->finished >= target;
}

/* What every other created stream can run now, without waiting (see drive). */
static void progress_others(dt_emu_stream *self) {
    std::vector<void *> all(G.streams.begin(), G.streams.end());
    bool reached;
    probing++;
    for (size_t i = 0; i < all.size(); i++) {
        dt_emu_stream *s = (dt_emu_stream *)all[i];
        if (s != self && !s->busy && s->finished < s->posted) drive(s, s->posted, false, &reached);
    }
    probing--;
}

/* Finishes the work of every created stream (blocking_only: of those without cudaStreamNonBlocking). */
static void drain_all(bool blocking_only) {
    std::vector<void *> all(G.streams.begin(), G.streams.end());
    bool reached;
    for (size_t i = 0; i < all.size(); i++) {
        dt_emu_stream *s = (dt_emu_stream *)all[i];
        if (!blocking_only || !(s->flags & cudaStreamNonBlocking)) drive(s, s->posted, true, &reached);
    }
}

/* The error of the work that failed on s since the last synchronisation (then clears it). */
static cudaError_t take_err(dt_emu_stream *s) {
    cudaError_t e = s->err;
    s->err = cudaSuccess;
    return e;
}

cudaError_t dt_emu_enqueue(cudaStream_t stream, const char *what, const std::function<cudaError_t(bool *)> &step) {
    bool reached, done = false;
    if (!valid_stream(stream)) {
        report("%s on stream %p, which cudaStreamCreate did not make (or it was destroyed)", what, (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    if (!stream) { /* the legacy stream: after the blocking streams' work, then at once */
        drain_all(true);
        cudaError_t e;
        while ((e = step(&done)) == cudaSuccess && !done) {
            progress_others(NULL); /* as drive() does while it waits */
            sched_yield();
        }
        return fail(e);
    }
    dt_emu_stream *s = stream;
    emu_work w = {step, what};
    s->q.push_back(w);
    s->posted++;
    if (deferred()) return cudaSuccess;
    cudaError_t before = take_err(s);
    drive(s, s->posted, false, &reached);
    if (!reached) { /* waits behind an NCCL operation: runs later, its errors then */
        s->err = before;
        return cudaSuccess;
    }
    cudaError_t e = take_err(s);
    s->err = before;
    return fail(e);
}

int dt_emu_valid_stream(cudaStream_t s) { return valid_stream(s); }

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    if (!stream || flags > 1) return fail(cudaErrorInvalidValue);
    *stream = new dt_emu_stream();
    (*stream)->posted = (*stream)->finished = 0;
    (*stream)->flags = flags;
    (*stream)->err = cudaSuccess;
    (*stream)->busy = (*stream)->dead = false;
    G.streams.insert((void *)*stream);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    bool reached;
    if (!stream || !G.streams.count((void *)stream)) {
        report("cudaStreamDestroy(%p): not a stream cudaStreamCreate made (or destroyed already)", (void *)stream);
        return fail(cudaErrorInvalidResourceHandle);
    }
    drive(stream, stream->posted, true, &reached); /* CUDA lets queued work finish first */
    G.streams.erase((void *)stream);
    stream->dead = true; /* not freed: an event recorded on it still names it */
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    bool reached;
    if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    count(&dt_emu_counters::syncs, 1);
    trace("cudaStreamSynchronize", 0, NULL, 0);
    if (!stream) {
        drain_all(true);
        return cudaSuccess;
    }
    drive(stream, stream->posted, true, &reached);
    return fail(take_err(stream));
}
static bool valid_event(cudaEvent_t e) { return e && G.events.count((void *)e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!valid_stream(stream) || !valid_event(event)) return fail(cudaErrorInvalidResourceHandle);
    if (flags) return fail(cudaErrorInvalidValue);
    dt_emu_stream *es = event->s;
    unsigned long long at = event->at; /* the event's record as of now, not a later one */
    if (!event->recorded || !es || es == stream) return cudaSuccess; /* nothing to wait for */
    return dt_emu_enqueue(stream, "cudaStreamWaitEvent", [=](bool *done) {
        drive(es, at, false, done);
        return cudaSuccess;
    });
}
cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (!event || (flags & ~3u)) return fail(cudaErrorInvalidValue);
    *event = new dt_emu_event();
    (*event)->recorded = (*event)->timed = false;
    (*event)->s = NULL;
    (*event)->at = 0;
    G.events.insert((void *)*event);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!valid_event(event) || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
    event->recorded = true;
    event->timed = false;
    event->s = stream;
    event->at = stream ? stream->posted + 1 : 0;
    return dt_emu_enqueue(stream, "cudaEventRecord", [=](bool *done) {
        *done = true;
        if (G.events.count((void *)event)) event->ms = now_ms(), event->timed = true;
        return cudaSuccess;
    });
}
/* Complete: its stream has run the record (or it was never recorded). */
static cudaError_t event_wait(cudaEvent_t event, bool block) {
    bool reached = true;
    if (!valid_event(event)) return fail(cudaErrorInvalidResourceHandle);
    if (!event->recorded || !event->s) return cudaSuccess;
    drive(event->s, event->at, block, &reached);
    cudaError_t e = take_err(event->s);
    if (e) return fail(e);
    return reached ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    count(&dt_emu_counters::syncs, 1);
    trace("cudaEventSynchronize", 0, NULL, 0);
    return event_wait(event, true);
}
cudaError_t cudaEventQuery(cudaEvent_t event) { return event_wait(event, false); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!valid_event(start) || !valid_event(end) || !start->recorded || !end->recorded)
        return fail(cudaErrorInvalidResourceHandle);
    if (!start->timed || !end->timed) return cudaErrorNotReady;
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event || !G.events.erase((void *)event)) return fail(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- cuBLAS through CBLAS */

struct dt_emu_cublas {
    cudaStream_t stream;
    void *workspace; /* NULL: cuBLAS's own pool */
    size_t workspace_bytes;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new dt_emu_cublas();
    (*handle)->stream = 0;
    (*handle)->workspace = NULL;
    (*handle)->workspace_bytes = 0;
    G.handles.insert((void *)*handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle || !G.handles.erase((void *)handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle || !G.handles.count((void *)handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    handle->workspace = NULL; /* as cuBLAS: setting the stream resets the workspace to its own pool */
    handle->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream) {
    if (!handle || !G.handles.count((void *)handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
    std::string why;
    if (!handle || !G.handles.count((void *)handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (workspaceSizeInBytes && (!workspace || !in_alloc(workspace, workspaceSizeInBytes, &why))) {
        report("cublasSetWorkspace: workspace %p (%zu bytes) %s", workspace, workspaceSizeInBytes,
               workspace ? why.c_str() : "is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->workspace = workspaceSizeInBytes ? workspace : NULL;
    handle->workspace_bytes = workspaceSizeInBytes;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t dt_emu_cublas_workspace(cublasHandle_t handle, void **workspace, size_t *bytes) {
    if (!handle || !G.handles.count((void *)handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (workspace) *workspace = handle->workspace;
    if (bytes) *bytes = handle->workspace_bytes;
    return CUBLAS_STATUS_SUCCESS;
}

/* A column-major rows x cols matrix with leading dimension ld, of elem-byte elements, lies in
   one allocation. */
static bool matrix_ok(const char *fn, const char *name, const void *p, size_t elem, int rows, int cols, int ld) {
    std::string why;
    if (ld < (rows > 1 ? rows : 1)) {
        report("%s: ld%s = %d; expected >= %d (its rows)", fn, name, ld, rows > 1 ? rows : 1);
        return false;
    }
    if (rows == 0 || cols == 0) return true;
    size_t bytes = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * elem;
    if (!in_alloc(p, bytes, &why)) {
        report("%s: %s %p (%d x %d, ld %d) %s", fn, name, p, rows, cols, ld, why.c_str());
        return false;
    }
    return true;
}

static size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_64F ? 8 : 2; }

static float to_f32(const void *p, cudaDataType t, size_t i) {
    uint16_t h;
    uint32_t u;
    float f;
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    h = ((const uint16_t *)p)[i];
    if (t == CUDA_R_16BF) u = (uint32_t)h << 16;
    else { /* f16 */
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 0) { f = (float)m * (1.0f / 16777216.0f); return sign ? -f : f; }
        u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

static void from_f32(void *p, cudaDataType t, size_t i, float f) {
    uint32_t u;
    if (t == CUDA_R_32F) { ((float *)p)[i] = f; return; }
    memcpy(&u, &f, 4);
    if (t == CUDA_R_16BF) {
        if ((u & 0x7fffffffu) > 0x7f800000u) { ((uint16_t *)p)[i] = (uint16_t)((u >> 16) | 0x40); return; }
        u += 0x7fffu + ((u >> 16) & 1u);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        return;
    }
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint16_t h;
    if (a > 0x7f800000u) h = (uint16_t)(sign | 0x7e00u);
    else if (a >= 0x477ff000u) h = (uint16_t)(sign | 0x7c00u);
    else if (a < 0x38800000u) {
        float af, scaled, rem;
        memcpy(&af, &a, 4);
        scaled = af * 16777216.0f;
        uint32_t q = (uint32_t)scaled;
        rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        h = (uint16_t)(sign | q);
    } else h = (uint16_t)(sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - ((127u - 15u) << 10)));
    ((uint16_t *)p)[i] = h;
}

/* TF32 keeps 10 mantissa bits: round to nearest even (finite values). */
static float round_tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&f, &u, 4);
    return f;
}

static cublasStatus_t gemm(const char *fn, cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const void *A, cudaDataType at, int lda, const void *B,
                           cudaDataType bt, int ldb, const float *beta, void *C, cudaDataType ct, int ldc, bool tf32) {
    if (!handle || !G.handles.count((void *)handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || ta > CUBLAS_OP_C || tb > CUBLAS_OP_C || !alpha || !beta) {
        report("%s: m = %d, n = %d, k = %d, transa = %d, transb = %d, alpha %p, beta %p: expected sizes >= 0, "
               "ops N/T/C, host scalars", fn, m, n, k, (int)ta, (int)tb, (const void *)alpha, (const void *)beta);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (!matrix_ok(fn, "A", A, type_size(at), ar, ac, lda) || !matrix_ok(fn, "B", B, type_size(bt), br, bc, ldb) ||
        !matrix_ok(fn, "C", C, type_size(ct), m, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    size_t na = k && ar ? (size_t)(ac - 1) * lda + ar : 0, nb = k ? (size_t)(bc - 1) * ldb + br : 0;
    size_t nc = (size_t)(n - 1) * ldc + m;
    std::vector<float> a(na), b(nb), c(nc);
    for (size_t i = 0; i < na; i++) a[i] = tf32 ? round_tf32(to_f32(A, at, i)) : to_f32(A, at, i);
    for (size_t i = 0; i < nb; i++) b[i] = tf32 ? round_tf32(to_f32(B, bt, i)) : to_f32(B, bt, i);
    for (size_t i = 0; i < nc; i++) c[i] = to_f32(C, ct, i);
    if (k == 0) { /* C = beta C; beta = 0 overwrites (NaN included), as BLAS does */
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) c[(size_t)j * ldc + i] = *beta == 0.0f ? 0.0f : *beta * c[(size_t)j * ldc + i];
    } else {
        cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, *alpha, a.data(), lda, b.data(), ldb,
                    *beta, c.data(), ldc);
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) from_f32(C, ct, (size_t)j * ldc + i, c[(size_t)j * ldc + i]);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    return gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta,
                C, CUDA_R_32F, ldc, false);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batchCount) {
    if (batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < batchCount; i++) {
        cublasStatus_t st = gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A + i * strideA,
                                 CUDA_R_32F, lda, B + i * strideB, CUDA_R_32F, ldb, beta, C + i * strideC, CUDA_R_32F,
                                 ldc, false);
        if (st) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Each problem as cublasSgemm, in order; the pointer arrays must be device memory (as cuBLAS reads
   them on the device), the rest host arrays. */
cublasStatus_t cublasSgemmGroupedBatched(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                         const cublasOperation_t transb_array[], const int m_array[],
                                         const int n_array[], const int k_array[], const float alpha_array[],
                                         const float *const Aarray[], const int lda_array[],
                                         const float *const Barray[], const int ldb_array[],
                                         const float beta_array[], float *const Carray[], const int ldc_array[],
                                         int group_count, const int group_size[]) {
    std::string why;
    int p = 0, total = 0;
    if (group_count < 0 || (group_count && !group_size)) return CUBLAS_STATUS_INVALID_VALUE;
    for (int g = 0; g < group_count; g++) {
        if (group_size[g] < 0) return CUBLAS_STATUS_INVALID_VALUE;
        total += group_size[g];
    }
    if (total && (!in_alloc(Aarray, (size_t)total * sizeof(void *), &why) ||
                  !in_alloc(Barray, (size_t)total * sizeof(void *), &why) ||
                  !in_alloc(Carray, (size_t)total * sizeof(void *), &why))) {
        report("cublasSgemmGroupedBatched: a pointer array of %d problems %s (they are read on the device)", total,
               why.c_str());
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int g = 0; g < group_count; g++)
        for (int i = 0; i < group_size[g]; i++, p++) {
            cublasStatus_t st = gemm("cublasSgemmGroupedBatched", handle, transa_array[g], transb_array[g], m_array[g],
                                     n_array[g], k_array[g], &alpha_array[g], Aarray[p], CUDA_R_32F, lda_array[g],
                                     Barray[p], CUDA_R_32F, ldb_array[g], &beta_array[g], Carray[p], CUDA_R_32F,
                                     ldc_array[g], false);
            if (st) return st;
        }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    bool types_ok = true;
    const cudaDataType t3[3] = {Atype, Btype, Ctype};
    for (int i = 0; i < 3; i++)
        if (t3[i] != CUDA_R_32F && t3[i] != CUDA_R_16BF && t3[i] != CUDA_R_16F) types_ok = false;
    if (!types_ok || (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32)) {
        report("cublasGemmEx: types A %d, B %d, C %d, compute %d: the emulator does CUDA_R_32F/16BF/16F with "
               "CUBLAS_COMPUTE_32F or _32F_FAST_TF32", (int)Atype, (int)Btype, (int)Ctype, (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, (const float *)alpha, A, Atype, lda, B, Btype, ldb,
                (const float *)beta, C, Ctype, ldc, computeType == CUBLAS_COMPUTE_32F_FAST_TF32);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    if (batchCount < 0) {
        report("cublasGemmStridedBatchedEx: batchCount = %d; expected >= 0", batchCount);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int i = 0; i < batchCount; i++) {
        cublasStatus_t st = cublasGemmEx(handle, transa, transb, m, n, k, alpha,
                                         (const char *)A + (size_t)(i * strideA) * type_size(Atype), Atype, lda,
                                         (const char *)B + (size_t)(i * strideB) * type_size(Btype), Btype, ldb, beta,
                                         (char *)C + (size_t)(i * strideC) * type_size(Ctype), Ctype, ldc, computeType,
                                         algo);
        if (st) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- cuBLASLt (include/cublasLt.h) */

struct dt_emu_lt {
    int unused;
};
struct dt_emu_lt_desc {
    cublasComputeType_t compute;
    int32_t transa, transb, bias_type, aux_type;
    uint32_t epilogue;
    void *bias, *aux;
    int64_t aux_ld;
};
struct dt_emu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
struct dt_emu_lt_pref {
    uint64_t max_workspace;
    uint32_t align[4]; /* A, B, C, D */
};
static std::set<void *> g_lt_objects; /* every live handle and descriptor (a stale one is reported) */
static long g_lt_count[7];
static unsigned g_lt_refuse; /* dt_emu_lt_refuse's mask over lt_index */

long dt_emu_lt_count(int index) { return index >= 0 && index < 7 ? g_lt_count[index] : 0; }
void dt_emu_lt_refuse(unsigned mask) { g_lt_refuse = mask; }
static int lt_index(uint32_t e) { /* dt_emu_lt_count's index of an epilogue */
    return e == CUBLASLT_EPILOGUE_DEFAULT ? 0 : e == CUBLASLT_EPILOGUE_BIAS ? 1 : e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? 2
           : e == CUBLASLT_EPILOGUE_GELU_AUX ? 3 : e == CUBLASLT_EPILOGUE_BGRADB ? 4 : 5;
}

template <typename T> static cublasStatus_t lt_make(T **out, const char *fn) {
    if (!out) {
        report("%s: the output pointer is NULL", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *out = new T();
    g_lt_objects.insert((void *)*out);
    return CUBLAS_STATUS_SUCCESS;
}
template <typename T> static cublasStatus_t lt_free(T *p, const char *fn) {
    if (!p || !g_lt_objects.erase((void *)p)) {
        report("%s: %p was not made by its Create (or was destroyed already)", fn, (const void *)p);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
static bool lt_live(const void *p, const char *fn, const char *what) {
    if (p && g_lt_objects.count((void *)p)) return true;
    report("%s: %s %p is not a live cuBLASLt object", fn, what, p);
    return false;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { return lt_make(h, "cublasLtCreate"); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return lt_free(h, "cublasLtDestroy"); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    cublasStatus_t st;
    if (scale != CUDA_R_32F || (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32)) {
        report("cublasLtMatmulDescCreate: compute %d, scale %d: the emulator does CUBLAS_COMPUTE_32F(_FAST_TF32) "
               "with CUDA_R_32F scales", (int)compute, (int)scale);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((st = lt_make(d, "cublasLtMatmulDescCreate"))) return st;
    (*d)->compute = compute;
    (*d)->transa = (*d)->transb = CUBLAS_OP_N;
    (*d)->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    (*d)->bias_type = (*d)->aux_type = -1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return lt_free(d, "cublasLtMatmulDescDestroy"); }

/* Each attribute's size is checked as cuBLASLt does (a wrong one is CUBLAS_STATUS_INVALID_VALUE). */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    const char *fn = "cublasLtMatmulDescSetAttribute";
    size_t want;
    void *dst;
    if (!lt_live(d, fn, "the descriptor")) return CUBLAS_STATUS_NOT_INITIALIZED;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: dst = &d->transa; want = 4; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: dst = &d->transb; want = 4; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: dst = &d->epilogue; want = 4; break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: dst = &d->bias; want = sizeof(void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: dst = &d->aux; want = sizeof(void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: dst = &d->aux_ld; want = 8; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: dst = &d->aux_type; want = 4; break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: dst = &d->bias_type; want = 4; break;
    default: report("%s: attribute %d is not one the emulator knows", fn, (int)attr); return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!buf || size != want) {
        report("%s: attribute %d: buf %p, %zu bytes; expected %zu bytes", fn, (int)attr, buf, size, want);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(dst, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    cublasStatus_t st;
    if (type != CUDA_R_32F && type != CUDA_R_16BF && type != CUDA_R_16F) {
        report("cublasLtMatrixLayoutCreate: type %d: the emulator does CUDA_R_32F/16BF/16F", (int)type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (rows > 2147483647u || cols > 2147483647u || ld < (int64_t)(rows > 1 ? rows : 1)) {
        report("cublasLtMatrixLayoutCreate: %llu x %llu, ld %lld: expected sizes < 2^31 and ld >= rows",
               (unsigned long long)rows, (unsigned long long)cols, (long long)ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((st = lt_make(l, "cublasLtMatrixLayoutCreate"))) return st;
    (*l)->type = type;
    (*l)->rows = rows;
    (*l)->cols = cols;
    (*l)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return lt_free(l, "cublasLtMatrixLayoutDestroy"); }

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    cublasStatus_t st = lt_make(p, "cublasLtMatmulPreferenceCreate");
    if (!st) for (int i = 0; i < 4; i++) (*p)->align[i] = 256;
    return st;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    return lt_free(p, "cublasLtMatmulPreferenceDestroy");
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    const char *fn = "cublasLtMatmulPreferenceSetAttribute";
    if (!lt_live(p, fn, "the preference")) return CUBLAS_STATUS_NOT_INITIALIZED;
    size_t want = attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? 8 : 4;
    if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES &&
        (attr < CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES || attr > CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)) {
        report("%s: attribute %d is not one the emulator knows", fn, (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!buf || size != want) {
        report("%s: attribute %d: buf %p, %zu bytes; expected %zu bytes", fn, (int)attr, buf, size, want);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) memcpy(&p->max_workspace, buf, 8);
    else memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
    return CUBLAS_STATUS_SUCCESS;
}

static bool lt_epilogue_known(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU ||
           e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_BGRADB;
}

/* The shapes agree (D = op(A) op(B), C as D) and the epilogue is one the emulator runs: "" or why
   not; *st the status to answer (shapes that disagree: INVALID_VALUE, the rest NOT_SUPPORTED). */
static std::string lt_shape_error(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                  cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, cublasStatus_t *st) {
    char buf[256];
    *st = CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m = D->rows, n = D->cols, ka = d->transa ? A->rows : A->cols, kb = d->transb ? B->cols : B->rows;
    uint64_t am = d->transa ? A->cols : A->rows, bn = d->transb ? B->rows : B->cols;
    if (am != m || bn != n || ka != kb || C->rows != m || C->cols != n) {
        snprintf(buf, sizeof buf, "shapes op(A) %llu x %llu, op(B) %llu x %llu, C %llu x %llu, D %llu x %llu disagree",
                 (unsigned long long)am, (unsigned long long)ka, (unsigned long long)kb, (unsigned long long)bn,
                 (unsigned long long)C->rows, (unsigned long long)C->cols, (unsigned long long)m, (unsigned long long)n);
        return buf;
    }
    *st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (A->type != B->type || (D->type != CUDA_R_32F && D->type != A->type) || C->type != D->type) {
        snprintf(buf, sizeof buf, "types A %d, B %d, C %d, D %d: expected A = B, C = D, D f32 or A's", (int)A->type,
                 (int)B->type, (int)C->type, (int)D->type);
        return buf;
    }
    if (d->transa > CUBLAS_OP_T || d->transb > CUBLAS_OP_T || !lt_epilogue_known(d->epilogue)) {
        snprintf(buf, sizeof buf, "transa %d, transb %d, epilogue %u: the emulator does N/T and DEFAULT, BIAS, "
                 "GELU(_AUX)(_BIAS), BGRADB", (int)d->transa, (int)d->transb, d->epilogue);
        return buf;
    }
    if ((d->bias_type != -1 && d->bias_type != (int32_t)D->type) || (d->aux_type != -1 && d->aux_type != (int32_t)D->type)) {
        snprintf(buf, sizeof buf, "bias type %d, aux type %d: the emulator does D's type (-1)", (int)d->bias_type,
                 (int)d->aux_type);
        return buf;
    }
    return "";
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (!lt_live(h, fn, "the handle") || !lt_live(d, fn, "the descriptor") || !lt_live(A, fn, "Adesc") ||
        !lt_live(B, fn, "Bdesc") || !lt_live(C, fn, "Cdesc") || !lt_live(D, fn, "Ddesc") || !lt_live(p, fn, "the preference"))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested < 1 || !results || !returned) {
        report("%s: requestedAlgoCount %d, results %p, returnAlgoCount %p", fn, requested, (void *)results,
               (void *)returned);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *returned = 0;
    cublasStatus_t bad;
    std::string why = lt_shape_error(d, A, B, C, D, &bad);
    if (!why.empty()) {
        report("%s: %s", fn, why.c_str());
        return bad;
    }
    if (g_lt_refuse & (1u << lt_index(d->epilogue))) { /* a test's "this GPU has none" */
        g_lt_count[6]++;
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    /* cuBLASLt: the GELU input matrix's leading dimension "must be divisible by 8 and be no less than
       the number of rows in the output matrix": no algorithm otherwise (not an error: a caller falls back) */
    if ((d->epilogue & 128) && (d->aux_ld % 8 || d->aux_ld < (int64_t)D->rows)) {
        g_lt_count[6]++;
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 0x64746c74u; /* "dtlt": what cublasLtMatmul expects back */
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    memcpy(&results[0].algo.data[1], p->align, sizeof p->align); /* the alignment it was chosen for */
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float lt_gelu(float v) { /* GELU's tanh form: cuBLASLt's header does not say which form or how exact */
    return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    std::string why;
    if (!lt_live(h, fn, "the handle") || !lt_live(d, fn, "the descriptor") || !lt_live(Al, fn, "Adesc") ||
        !lt_live(Bl, fn, "Bdesc") || !lt_live(Cl, fn, "Cdesc") || !lt_live(Dl, fn, "Ddesc"))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || !algo || algo->data[0] != 0x64746c74u) {
        report("%s: alpha %p, beta %p, algo %p: expected host scalars and an algorithm from the heuristic", fn, alpha,
               beta, (const void *)algo);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t bad;
    why = lt_shape_error(d, Al, Bl, Cl, Dl, &bad);
    if (!why.empty()) {
        report("%s: %s", fn, why.c_str());
        return bad;
    }
    int m = (int)Dl->rows, n = (int)Dl->cols, k = (int)(d->transa ? Al->rows : Al->cols);
    const void *ptr[4] = {A, B, C, D};
    cublasLtMatrixLayout_t lay[4] = {Al, Bl, Cl, Dl};
    uint32_t align[4];
    memcpy(align, &algo->data[1], sizeof align);
    for (int i = 0; i < 4; i++) {
        char name[2] = {"ABCD"[i], 0};
        if (!matrix_ok(fn, name, ptr[i], type_size(lay[i]->type), (int)lay[i]->rows, (int)lay[i]->cols, (int)lay[i]->ld))
            return CUBLAS_STATUS_INVALID_VALUE;
        if ((uintptr_t)ptr[i] % align[i]) {
            report("%s: %s %p is not %u-byte aligned, as the preference told the heuristic (a GPU's algorithm "
                   "would read it misaligned)", fn, name, ptr[i], align[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    if (workspace_bytes && !in_alloc(workspace, workspace_bytes, &why)) {
        report("%s: workspace %p (%zu bytes) %s", fn, workspace, workspace_bytes, why.c_str());
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    uint32_t e = d->epilogue;
    bool bias_in = e & CUBLASLT_EPILOGUE_BIAS, gelu = e & CUBLASLT_EPILOGUE_GELU, aux = e & 128,
         bgrad = e == CUBLASLT_EPILOGUE_BGRADB;
    size_t dsz = type_size(Dl->type);
    if ((bias_in && (!d->bias || !in_alloc(d->bias, (size_t)m * dsz, &why))) ||
        (bgrad && (!d->bias || !in_alloc(d->bias, (size_t)n * dsz, &why)))) {
        report("%s: the bias pointer %p (%d values) %s", fn, d->bias, bgrad ? n : m, d->bias ? why.c_str() : "is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (aux && (!d->aux || d->aux_ld % 8 || d->aux_ld < m ||
                (n && !in_alloc(d->aux, ((size_t)(n - 1) * (size_t)d->aux_ld + (size_t)m) * dsz, &why)))) {
        report("%s: the aux pointer %p (ld %lld, %d x %d) %s", fn, d->aux, (long long)d->aux_ld, m, n,
               !d->aux ? "is NULL" : d->aux_ld % 8 || d->aux_ld < m ? "has ld not a multiple of 8 >= rows" : why.c_str());
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    g_lt_count[lt_index(e)]++;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    bool tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    int ar = (int)Al->rows, ac = (int)Al->cols, br = (int)Bl->rows, bc = (int)Bl->cols;
    size_t na = k ? (size_t)(ac - 1) * Al->ld + ar : 0, nb = k ? (size_t)(bc - 1) * Bl->ld + br : 0;
    std::vector<float> a(na), b(nb), c((size_t)n * m);
    for (size_t i = 0; i < na; i++) a[i] = tf32 ? round_tf32(to_f32(A, Al->type, i)) : to_f32(A, Al->type, i);
    for (size_t i = 0; i < nb; i++) b[i] = tf32 ? round_tf32(to_f32(B, Bl->type, i)) : to_f32(B, Bl->type, i);
    float al = *(const float *)alpha, be = *(const float *)beta;
    for (int j = 0; j < n; j++) /* C read densely (ld m); beta = 0 ignores it, NaN included, as BLAS */
        for (int i = 0; i < m; i++) c[(size_t)j * m + i] = be == 0.0f ? 0.0f : to_f32(C, Cl->type, (size_t)j * Cl->ld + i);
    if (k)
        cblas_sgemm(CblasColMajor, d->transa ? CblasTrans : CblasNoTrans, d->transb ? CblasTrans : CblasNoTrans, m, n, k,
                    al, a.data(), (int)Al->ld, b.data(), (int)Bl->ld, be, c.data(), m);
    else
        for (float &v : c) v *= be;
    if (bgrad) /* the sums of op(B)'s columns over k, from the values the GEMM read */
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int kk = 0; kk < k; kk++) s += d->transb ? b[(size_t)kk * Bl->ld + j] : b[(size_t)j * Bl->ld + kk];
            from_f32(d->bias, Dl->type, (size_t)j, s);
        }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float v = c[(size_t)j * m + i];
            if (bias_in) v += to_f32(d->bias, Dl->type, (size_t)i);
            if (aux) from_f32(d->aux, Dl->type, (size_t)j * d->aux_ld + i, v);
            if (gelu) v = lt_gelu(v);
            from_f32(D, Dl->type, (size_t)j * Dl->ld + i, v);
        }
    return CUBLAS_STATUS_SUCCESS;
}
