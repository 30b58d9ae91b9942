/* tests/cuda_emu/nccl_emu.cpp - a fake NCCL for the CUDA emulator: the NCCL calls dt_comm.h makes,
   carried by MPI over the emulator's device memory (host memory), so that dt_comm.h's NCCL path
   runs in CI without a GPU. Test-only; built by tests/run.sh (group cuda_emu_comm) with mpicxx
   and linked with tests/cuda_emu/cuda_emu.cpp.

   NCCL's semantics, as far as a test can see them:
     - An operation is queued on its stream (dt_emu_enqueue) and runs in stream order, reading its
       inputs when the stream gets to it, not when it was called: under DT_EMU_STREAMS=deferred a
       collective whose stream was not made to wait for the producer reads stale data.
     - Running, it posts non-blocking MPI operations on the communicator's own MPI communicator
       and is done when they complete; until then the stream waits behind it (cudaEventQuery says
       cudaErrorNotReady), so a host that polls (dt_comm.h) keeps its own timeout.
     - ncclGroupStart/End: the operations of a group become one piece of work whose MPI
       operations are all posted before any is waited for, so a group's sends and receives do
       not deadlock (an all-to-all as n sends and n receives). A group runs on one stream here.
     - Sums run in rank order, 16-bit floats in f32 rounded once: exact on small integers,
       like the MPI path of dt_comm.h (real NCCL agrees within reassociation).
     - Arguments are checked as NCCL checks them, returning ncclInvalidArgument (and a message
       for ncclGetLastError): a NULL or unknown communicator, datatype or op out of range, root
       or peer out of range, a buffer that is not device memory or is too small for the count,
       and the in-place rules: all-reduce and broadcast in place only with sendbuff == recvbuff,
       all-gather only with sendbuff == recvbuff + rank * sendcount, reduce-scatter only with
       sendbuff + rank * recvcount == recvbuff; any other overlap is refused (NCCL leaves it
       undefined). A stream the emulator does not know is ncclInvalidArgument too.
     - ncclCommInitRank fails with ncclInvalidUsage when two ranks of the communicator are on the
       same device of the same host ("Duplicate GPU detected"), as NCCL does; devices come from
       the emulator (DT_EMU_DEVICES, cudaSetDevice).

   Creating a communicator from a unique id. Only the members call ncclCommInitRank, and the id
   is all they share, so the id carries a random 64-bit key and the members meet in a directory
   named after it, $TMPDIR/dt_nccl_emu.<key> (TMPDIR unset: /tmp): each writes a file named
   after its NCCL rank holding its MPI world rank, the size it was given, its device and host
   name (written to a temporary name, then renamed, so a reader never sees half of it), and
   polls until all nranks files are there (120 s, then ncclSystemError). Each then knows every
   member's world rank in NCCL rank order, builds that MPI group and calls
   MPI_Comm_create_group(MPI_COMM_WORLD, group, tag), which is collective over the members only
   (the tag, from the key, keeps concurrent creations apart). When it returns every member has
   read every file, so each removes its own and tries to remove the directory (the last one
   succeeds). This needs the members to share a file system (one host: what the emulator is
   for) and MPI initialised (dt_comm.h initialises it); it is sound for any subset of the world
   and for creations running at the same time on overlapping subsets.

   Not done: operations of more than 2^31-1 bytes per MPI call (ncclInvalidArgument), ncclProd
   on 16-bit floats rounds once like the sum, fp8 types (ncclInvalidArgument), a group spread
   over several streams (ncclInvalidUsage), ncclCommSplit, configs, non-blocking communicators.
                                                        MIT licence (see dt_tensor.h) */
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nccl.h" /* after the C++ headers: the fake cuda_runtime.h defines __noinline__ */

/* ---------------------------------------------------------------- state, messages */

struct ncclComm {
    MPI_Comm mc;
    int rank, nranks, device;
    ncclResult_t async_err;
    bool aborted, destroyed;
    std::string last;
};

static struct {
    std::map<std::string, ncclResult_t> fail_next;
    ncclResult_t fail_async;
    std::map<std::string, int> calls;
    std::string last; /* the last error of a call without a valid communicator */
    std::vector<ncclComm *> comms;
} F;

static const char *magic = "dt_nccl_emu";

static ncclResult_t err(ncclComm_t comm, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ncclResult_t err(ncclComm_t comm, ncclResult_t r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    F.last = buf;
    if (comm) comm->last = buf;
    fprintf(stderr, "nccl_emu: %s\n", buf);
    return r;
}

static bool known(ncclComm_t c) {
    for (size_t i = 0; i < F.comms.size(); i++)
        if (F.comms[i] == c) return true;
    return false;
}

/* Counts the call; an injected failure for it is returned (once). */
static ncclResult_t enter(const char *call, ncclComm_t comm) {
    F.calls[call]++;
    std::map<std::string, ncclResult_t>::iterator it = F.fail_next.find(call);
    if (it == F.fail_next.end()) return ncclSuccess;
    ncclResult_t r = it->second;
    F.fail_next.erase(it);
    return err(comm && known(comm) ? comm : NULL, r, "%s: failure injected by the test (dt_emu_nccl_fail_next)", call);
}

void dt_emu_nccl_fail_next(const char *call, ncclResult_t result) { F.fail_next[call] = result; }
void dt_emu_nccl_fail_async(ncclResult_t result) { F.fail_async = result; }
int dt_emu_nccl_calls(const char *call) { return F.calls.count(call) ? F.calls[call] : 0; }

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return err(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    return comm && known(comm) && !comm->last.empty() ? comm->last.c_str() : F.last.c_str();
}

/* ---------------------------------------------------------------- communicators */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    ncclResult_t r = enter("ncclGetUniqueId", NULL);
    if (r) return r;
    if (!id) return err(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    uint64_t key = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&key, sizeof key, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        key = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_sec;
    }
    if (f) fclose(f);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, magic, strlen(magic));
    memcpy(id->internal + 16, &key, sizeof key);
    return ncclSuccess;
}

static std::string meet_dir(uint64_t key) {
    const char *t = getenv("TMPDIR");
    char buf[64];
    snprintf(buf, sizeof buf, "/dt_nccl_emu.%016llx", (unsigned long long)key);
    return std::string(t && *t ? t : "/tmp") + buf;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    const char *fn = "ncclCommInitRank";
    ncclResult_t r = enter(fn, NULL);
    int inited = 0, wrank = 0, dev = 0;
    uint64_t key;
    char host[256] = {0}, path[512], tmp[560];
    if (r) return r;
    if (!comm) return err(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
    *comm = NULL;
    if (nranks < 1) return err(NULL, ncclInvalidArgument, "%s: nranks = %d; expected >= 1", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return err(NULL, ncclInvalidArgument, "%s: rank = %d; expected 0 <= rank < nranks = %d", fn, rank, nranks);
    if (memcmp(id.internal, magic, strlen(magic)))
        return err(NULL, ncclInvalidArgument, "%s: the unique id does not come from ncclGetUniqueId", fn);
    MPI_Initialized(&inited);
    if (!inited) return err(NULL, ncclInvalidUsage, "%s: the fake NCCL needs MPI initialised", fn);
    memcpy(&key, id.internal + 16, sizeof key);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    cudaGetDevice(&dev);
    gethostname(host, sizeof host - 1);
    for (char *p = host; *p; p++)
        if (*p == ' ' || *p == '\n') *p = '_';

    std::string dir = meet_dir(key);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
        return err(NULL, ncclSystemError, "%s: mkdir %s: %s", fn, dir.c_str(), strerror(errno));
    snprintf(path, sizeof path, "%s/rank%d", dir.c_str(), rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return err(NULL, ncclSystemError, "%s: cannot write %s: %s", fn, tmp, strerror(errno));
    fprintf(f, "%d %d %d %s\n", wrank, nranks, dev, host);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        return err(NULL, ncclSystemError, "%s: cannot write %s: %s", fn, path, strerror(errno));

    std::vector<int> worlds(nranks, -1), devs(nranks, -1);
    std::vector<std::string> hosts(nranks);
    time_t give_up = time(NULL) + 120;
    for (int found = 0; found < nranks;) {
        found = 0;
        for (int k = 0; k < nranks; k++) {
            if (worlds[k] >= 0) { found++; continue; }
            char p[512], h[256];
            int w, n, d;
            snprintf(p, sizeof p, "%s/rank%d", dir.c_str(), k);
            FILE *g = fopen(p, "r");
            if (!g) continue;
            int got = fscanf(g, "%d %d %d %255s", &w, &n, &d, h);
            fclose(g);
            if (got != 4) continue;
            if (n != nranks) {
                unlink(path);
                return err(NULL, ncclInvalidUsage, "%s: rank %d was given nranks = %d, rank %d nranks = %d", fn, k, n,
                           rank, nranks);
            }
            worlds[k] = w, devs[k] = d, hosts[k] = h;
            found++;
        }
        if (found < nranks) {
            if (time(NULL) > give_up) {
                unlink(path);
                return err(NULL, ncclSystemError, "%s: only %d of %d ranks arrived in %s within 120 s", fn, found,
                           nranks, dir.c_str());
            }
            usleep(1000);
        }
    }
    MPI_Group world, grp;
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, nranks, worlds.data(), &grp);
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, grp, (int)(key % 30000) + 1000, &mc);
    MPI_Group_free(&grp);
    MPI_Group_free(&world);
    unlink(path);
    rmdir(dir.c_str()); /* the last member's succeeds */
    if (rc != MPI_SUCCESS || mc == MPI_COMM_NULL)
        return err(NULL, ncclSystemError, "%s: MPI_Comm_create_group failed (%d)", fn, rc);
    /* checked only now: a member that gave up earlier would remove its file before the others read it */
    for (int a = 0; a < nranks; a++)
        for (int b = 0; b < a; b++)
            if (devs[a] == devs[b] && hosts[a] == hosts[b]) {
                MPI_Comm_free(&mc);
                return err(NULL, ncclInvalidUsage, "%s: Duplicate GPU detected: rank %d and rank %d both on CUDA device "
                           "%d of host %s", fn, b, a, devs[a], hosts[a].c_str());
            }
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    ncclComm *c = new ncclComm();
    c->mc = mc, c->rank = rank, c->nranks = nranks, c->device = dev;
    c->async_err = ncclSuccess, c->aborted = c->destroyed = false;
    F.comms.push_back(c);
    *comm = c;
    return ncclSuccess;
}

static ncclResult_t check_comm(const char *fn, ncclComm_t comm) {
    if (!comm) return err(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
    if (!known(comm)) return err(NULL, ncclInvalidArgument, "%s: comm %p is not a communicator", fn, (void *)comm);
    if (comm->destroyed || comm->aborted)
        return err(comm, ncclInvalidUsage, "%s: the communicator was %s", fn, comm->aborted ? "aborted" : "destroyed");
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    ncclResult_t r = enter("ncclCommDestroy", comm);
    if (r) return r;
    if ((r = check_comm("ncclCommDestroy", comm))) return r;
    comm->destroyed = true; /* kept: work still queued may name it */
    MPI_Comm_free(&comm->mc);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    enter("ncclCommAbort", comm);
    if (!comm) return ncclSuccess;
    if (!known(comm)) return err(NULL, ncclInvalidArgument, "ncclCommAbort: comm %p is not a communicator", (void *)comm);
    comm->aborted = true; /* its MPI communicator stays: requests in flight may still use it */
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError) return err(comm, ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    if (!comm || !known(comm)) return err(NULL, ncclInvalidArgument, "ncclCommGetAsyncError: comm is not a communicator");
    *asyncError = comm->async_err;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    ncclResult_t r = check_comm("ncclCommCount", comm);
    if (r) return r;
    if (!count) return err(comm, ncclInvalidArgument, "ncclCommCount: count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    ncclResult_t r = check_comm("ncclCommCuDevice", comm);
    if (r) return r;
    if (!device) return err(comm, ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->device;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    ncclResult_t r = check_comm("ncclCommUserRank", comm);
    if (r) return r;
    if (!rank) return err(comm, ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

/* ---------------------------------------------------------------- element types, reductions */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static float h2f(uint16_t h, bool bf) {
    uint32_t u;
    float f;
    if (bf) u = (uint32_t)h << 16;
    else {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 0) { f = (float)m * (1.0f / 16777216.0f); return sign ? -f : f; }
        u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f2h(float f, bool bf) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (bf) {
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        float af, scaled, rem;
        memcpy(&af, &a, 4);
        scaled = af * 16777216.0f;
        uint32_t q = (uint32_t)scaled;
        rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    return (uint16_t)(sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - ((127u - 15u) << 10)));
}

template <typename T> static T combine(T a, T b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return (T)(a + b);
    }
}

/* Unsigned arithmetic for the sums and products of signed integers: they wrap, as on a GPU. */
template <typename T, typename U> static void reduce_int(void *dst, const std::vector<const char *> &rows, size_t n,
                                                         ncclRedOp_t op) {
    for (size_t i = 0; i < n; i++) {
        T acc;
        memcpy(&acc, rows[0] + i * sizeof(T), sizeof(T));
        for (size_t r = 1; r < rows.size(); r++) {
            T v;
            memcpy(&v, rows[r] + i * sizeof(T), sizeof(T));
            if (op == ncclMax || op == ncclMin) acc = combine(acc, v, op);
            else acc = (T)combine((U)acc, (U)v, op == ncclAvg ? ncclSum : op);
        }
        if (op == ncclAvg) acc = (T)(acc / (T)rows.size());
        memcpy((char *)dst + i * sizeof(T), &acc, sizeof(T));
    }
}

template <typename T> static void reduce_float(void *dst, const std::vector<const char *> &rows, size_t n, ncclRedOp_t op) {
    for (size_t i = 0; i < n; i++) {
        T acc;
        memcpy(&acc, rows[0] + i * sizeof(T), sizeof(T));
        for (size_t r = 1; r < rows.size(); r++) {
            T v;
            memcpy(&v, rows[r] + i * sizeof(T), sizeof(T));
            acc = combine(acc, v, op == ncclAvg ? ncclSum : op);
        }
        if (op == ncclAvg) acc = acc / (T)rows.size();
        memcpy((char *)dst + i * sizeof(T), &acc, sizeof(T));
    }
}

static void reduce_half(void *dst, const std::vector<const char *> &rows, size_t n, ncclRedOp_t op, bool bf) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, rows[0] + i * 2, 2);
        float acc = h2f(h, bf);
        for (size_t r = 1; r < rows.size(); r++) {
            memcpy(&h, rows[r] + i * 2, 2);
            acc = combine(acc, h2f(h, bf), op == ncclAvg ? ncclSum : op);
        }
        if (op == ncclAvg) acc = acc / (float)rows.size();
        h = f2h(acc, bf);
        memcpy((char *)dst + i * 2, &h, 2);
    }
}

/* dst[i] = op over rows (in row order) of row[i], n elements. */
static void reduce(void *dst, const std::vector<const char *> &rows, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    switch (t) {
    case ncclInt8: reduce_int<int8_t, uint8_t>(dst, rows, n, op); break;
    case ncclUint8: reduce_int<uint8_t, uint8_t>(dst, rows, n, op); break;
    case ncclInt32: reduce_int<int32_t, uint32_t>(dst, rows, n, op); break;
    case ncclUint32: reduce_int<uint32_t, uint32_t>(dst, rows, n, op); break;
    case ncclInt64: reduce_int<int64_t, uint64_t>(dst, rows, n, op); break;
    case ncclUint64: reduce_int<uint64_t, uint64_t>(dst, rows, n, op); break;
    case ncclFloat16: reduce_half(dst, rows, n, op, false); break;
    case ncclBfloat16: reduce_half(dst, rows, n, op, true); break;
    case ncclFloat32: reduce_float<float>(dst, rows, n, op); break;
    default: reduce_float<double>(dst, rows, n, op); break;
    }
}

/* ---------------------------------------------------------------- operations */

enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_SEND, OP_RECV };

struct op {
    int kind;
    const char *fn;
    const void *send;
    void *recv;
    size_t count; /* elements: per rank for all-gather and reduce-scatter */
    int t, rop;   /* ncclDataType_t, ncclRedOp_t: ints until checked (a caller may pass any value) */
    int peer; /* root, or the peer */
    ncclComm_t comm;
    cudaStream_t stream;
    std::vector<char> scratch;
};

/* A piece of stream work: the operations of one call or one group. */
struct work {
    std::vector<op> ops;
    std::vector<MPI_Request> reqs;
    bool posted;
};

static int group_depth = 0;
static std::vector<op> group_ops;
static ncclResult_t group_err = ncclSuccess; /* a call of the open group failed: it is dropped, as NCCL does */

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *pa = (const char *)a, *pb = (const char *)b;
    return na && nb && pa < pb + nb && pb < pa + na;
}

static ncclResult_t check_buf(const op &o, const char *name, const void *p, size_t bytes) {
    char why[256];
    if (!bytes) return ncclSuccess;
    if (!p) return err(o.comm, ncclInvalidArgument, "%s: %s is NULL (count %zu)", o.fn, name, o.count);
    if (!dt_emu_device_range(p, bytes, why, sizeof why))
        return err(o.comm, ncclInvalidArgument, "%s: %s %p + %zu bytes: %s", o.fn, name, p, bytes, why);
    return ncclSuccess;
}

/* NCCL's argument checks, and the fake's in-place rules (see the top). */
static ncclResult_t check_op(const op &o) {
    ncclResult_t r = check_comm(o.fn, o.comm);
    if (r) return r;
    ncclComm_t c = o.comm;
    if (o.t < 0 || o.t >= ncclNumTypes)
        return err(c, ncclInvalidArgument, "%s: datatype = %d; expected 0 .. %d", o.fn, (int)o.t, ncclNumTypes - 1);
    if (o.t == ncclFloat8e4m3 || o.t == ncclFloat8e5m2)
        return err(c, ncclInvalidArgument, "%s: fp8 datatype %d: not in the fake", o.fn, (int)o.t);
    if ((o.kind == OP_ALLREDUCE || o.kind == OP_REDUCE_SCATTER) && (o.rop < 0 || o.rop >= ncclNumOps))
        return err(c, ncclInvalidArgument, "%s: op = %d; expected 0 .. %d", o.fn, (int)o.rop, ncclNumOps - 1);
    if ((o.kind == OP_BROADCAST || o.kind == OP_SEND || o.kind == OP_RECV) && (o.peer < 0 || o.peer >= c->nranks))
        return err(c, ncclInvalidArgument, "%s: %s = %d; expected 0 <= %s < nranks = %d", o.fn,
                   o.kind == OP_BROADCAST ? "root" : "peer", o.peer, o.kind == OP_BROADCAST ? "root" : "peer", c->nranks);
    if (!dt_emu_valid_stream(o.stream))
        return err(c, ncclInvalidArgument, "%s: stream %p is not a stream", o.fn, (void *)o.stream);
    size_t es = type_size((ncclDataType_t)o.t), n = (size_t)c->nranks, b = o.count * es;
    if (o.count > ((size_t)1 << 40) || b * n > 2147483647u)
        return err(c, ncclInvalidArgument, "%s: count %zu x %zu bytes x %zu ranks: the fake moves at most 2^31-1 "
                   "bytes per MPI call", o.fn, o.count, es, n);
    size_t sb = b, rb = b; /* bytes read from send, written to recv */
    if (o.kind == OP_REDUCE_SCATTER) sb = b * n;
    if (o.kind == OP_ALLGATHER) rb = b * n;
    bool reads = o.kind != OP_RECV && !(o.kind == OP_BROADCAST && c->rank != o.peer);
    bool writes = o.kind != OP_SEND;
    if (reads && (r = check_buf(o, "sendbuff", o.send, sb))) return r;
    if (writes && (r = check_buf(o, "recvbuff", o.recv, rb))) return r;
    if (reads && writes && overlap(o.send, sb, o.recv, rb)) {
        const char *s = (const char *)o.send, *d = (const char *)o.recv;
        bool ok = (o.kind == OP_ALLREDUCE || o.kind == OP_BROADCAST) ? s == d
                  : o.kind == OP_ALLGATHER                           ? s == d + (size_t)c->rank * b
                                                                     : s + (size_t)c->rank * b == d;
        if (!ok)
            return err(c, ncclInvalidArgument, "%s: sendbuff %p and recvbuff %p overlap, but not as the in-place form "
                       "(%s)", o.fn, o.send, o.recv,
                       o.kind == OP_ALLGATHER ? "sendbuff == recvbuff + rank * sendcount"
                       : o.kind == OP_REDUCE_SCATTER ? "sendbuff + rank * recvcount == recvbuff"
                                                     : "sendbuff == recvbuff");
    }
    return ncclSuccess;
}

/* Posts the MPI operations of o (when its stream gets to it: it reads its inputs now). */
static int post(op &o, std::vector<MPI_Request> &reqs) {
    ncclComm_t c = o.comm;
    int n = c->nranks, rc = MPI_SUCCESS;
    int b = (int)(o.count * type_size((ncclDataType_t)o.t));
    MPI_Request q = MPI_REQUEST_NULL;
    switch (o.kind) {
    case OP_ALLREDUCE: /* every contribution to every rank, summed in rank order at the end */
        o.scratch.resize((size_t)b * n + 1);
        rc = MPI_Iallgather(o.send, b, MPI_BYTE, o.scratch.data(), b, MPI_BYTE, c->mc, &q);
        break;
    case OP_REDUCE_SCATTER: /* block r of every rank to rank r */
        o.scratch.resize((size_t)b * n + 1);
        rc = MPI_Ialltoall(o.send, b, MPI_BYTE, o.scratch.data(), b, MPI_BYTE, c->mc, &q);
        break;
    case OP_ALLGATHER: /* from a copy: MPI does not allow sendbuff inside recvbuff */
        o.scratch.assign((const char *)o.send, (const char *)o.send + b);
        o.scratch.push_back(0);
        rc = MPI_Iallgather(o.scratch.data(), b, MPI_BYTE, o.recv, b, MPI_BYTE, c->mc, &q);
        break;
    case OP_BROADCAST:
        if (c->rank == o.peer && o.send != o.recv && b) memcpy(o.recv, o.send, (size_t)b);
        rc = MPI_Ibcast(o.recv, b, MPI_BYTE, o.peer, c->mc, &q);
        break;
    case OP_SEND: rc = MPI_Isend(o.send, b, MPI_BYTE, o.peer, 0, c->mc, &q); break;
    case OP_RECV: rc = MPI_Irecv(o.recv, b, MPI_BYTE, o.peer, 0, c->mc, &q); break;
    }
    reqs.push_back(q);
    return rc;
}

static void finish(op &o) {
    ncclComm_t c = o.comm;
    size_t n = (size_t)c->nranks, b = o.count * type_size((ncclDataType_t)o.t);
    std::vector<const char *> rows(n);
    if (o.kind != OP_ALLREDUCE && o.kind != OP_REDUCE_SCATTER) return;
    for (size_t r = 0; r < n; r++) rows[r] = o.scratch.data() + r * b;
    reduce(o.recv, rows, o.count, (ncclDataType_t)o.t, (ncclRedOp_t)o.rop);
}

/* One step of a piece of work (see dt_emu_enqueue). */
static cudaError_t step(std::shared_ptr<work> w, bool *done) {
    ncclComm_t c = w->ops[0].comm;
    *done = false;
    for (size_t i = 0; i < w->ops.size(); i++)
        if (w->ops[i].comm->aborted) { /* ncclCommAbort releases what waits */
            *done = true;
            return cudaSuccess;
        }
    if (c->async_err) return cudaSuccess; /* stuck, as a kernel whose peer is gone */
    if (!w->posted) {
        w->posted = true;
        if (F.fail_async) {
            c->async_err = F.fail_async;
            F.fail_async = ncclSuccess;
            err(c, c->async_err, "%s: asynchronous failure injected by the test (dt_emu_nccl_fail_async)",
                w->ops[0].fn);
            return cudaSuccess;
        }
        for (size_t i = 0; i < w->ops.size(); i++) {
            int rc = post(w->ops[i], w->reqs);
            if (rc != MPI_SUCCESS) {
                c->async_err = ncclSystemError;
                err(c, ncclSystemError, "%s: MPI error %d posting the transfer", w->ops[i].fn, rc);
                return cudaSuccess;
            }
        }
    }
    int flag = 0;
    int rc = MPI_Testall((int)w->reqs.size(), w->reqs.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        c->async_err = ncclSystemError;
        err(c, ncclSystemError, "%s: MPI error %d in the transfer (a receive of the wrong size?)", w->ops[0].fn, rc);
        return cudaSuccess;
    }
    if (!flag) return cudaSuccess;
    for (size_t i = 0; i < w->ops.size(); i++) finish(w->ops[i]);
    *done = true;
    return cudaSuccess;
}

static ncclResult_t launch(std::vector<op> &ops) {
    std::shared_ptr<work> w(new work());
    w->ops.swap(ops);
    w->posted = false;
    cudaStream_t s = w->ops[0].stream;
    for (size_t i = 1; i < w->ops.size(); i++)
        if (w->ops[i].stream != s)
            return err(w->ops[i].comm, ncclInvalidUsage, "%s: a group on more than one stream: not in the fake",
                       w->ops[i].fn);
    cudaError_t e = dt_emu_enqueue(s, w->ops[0].fn, [w](bool *done) { return step(w, done); });
    if (e != cudaSuccess)
        return err(w->ops[0].comm, ncclUnhandledCudaError, "%s: queueing on stream %p: %s", w->ops[0].fn, (void *)s,
                   cudaGetErrorString(e));
    return ncclSuccess;
}

/* Checks o, then runs it (alone) or keeps it for ncclGroupEnd. */
static ncclResult_t submit(op o) {
    ncclResult_t r = enter(o.fn, o.comm);
    if (!r) r = check_op(o);
    if (r) {
        if (group_depth > 0 && !group_err) group_err = r;
        return r;
    }
    if (group_depth > 0) {
        group_ops.push_back(o);
        return ncclSuccess;
    }
    std::vector<op> one(1, o);
    return launch(one);
}

static op make(int kind, const char *fn, const void *send, void *recv, size_t count, int t, int rop, int peer,
               ncclComm_t comm, cudaStream_t s) {
    op o;
    o.kind = kind, o.fn = fn, o.send = send, o.recv = recv, o.count = count, o.t = t, o.rop = rop, o.peer = peer;
    o.comm = comm, o.stream = s;
    return o;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(make(OP_ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0, comm, stream));
}
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit(make(OP_REDUCE_SCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, 0, comm,
                       stream));
}
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(make(OP_ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream));
}
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(make(OP_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream));
}
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit(make(OP_SEND, "ncclSend", sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream));
}
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit(make(OP_RECV, "ncclRecv", NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream));
}

ncclResult_t ncclGroupStart(void) {
    ncclResult_t r = enter("ncclGroupStart", NULL);
    if (r) return r;
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    ncclResult_t r = enter("ncclGroupEnd", NULL);
    if (!r && group_depth == 0) return err(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (group_depth > 0 && --group_depth > 0) return r;
    if (!r) r = group_err;
    group_err = ncclSuccess;
    if (r || group_ops.empty()) {
        group_ops.clear();
        return r;
    }
    std::vector<op> ops;
    ops.swap(group_ops);
    return launch(ops);
}
