/* dt_comm.h - communicators and collectives for the dt toolkit: MPI carries host memory, NCCL
   carries device memory; groups, async forms, a DDP gradient bucketer, hang and mismatch
   reports, statistics.                                                v0.2, MIT licence

   The lesson. An all-reduce is a reduce-scatter followed by an all-gather. Cut each rank's
   buffer into n blocks; rank k collects block k from everyone and sums it, then every rank
   collects every sum. Each rank sends and receives 2(n-1)/n of the buffer (a ring all-reduce's
   traffic), and dt adds the contributions itself, always in rank order, so every rank, every
   message size and every bucketing gets bitwise the same result:
                       block 0     block 1     block 2
        rank 0 holds   a0          a1          a2
        rank 1 holds   b0          b1          b2        reduce-scatter: s1 = (a1 + b1) + c1
        rank 2 holds   c0          c1          c2        on rank 1, and so on
        after          s0 (r0)     s1 (r1)     s2 (r2)   all-gather: s0 s1 s2 on every rank
   DDP on top (the bucketer): gradients become ready last layer first during the backward. They
   are packed into buckets in that order (25 MB; the first, 1 MB, leaves early), and a bucket's
   all-reduce is posted the moment its last gradient is ready, so the network works while the
   backward goes on:
        compute   | bwd L3 | bwd L2 | bwd L1 | bwd L0 |
        network                     |== all-reduce A ==|== all-reduce B ==| finish: average
                    bucket A = grads of L3 + L2 (ready after bwd L2), B = L1 + L0

   Contents. Each marker finds this line, its section in the declarations and the same section
   in the implementation (grep -n '>>coll\b' dt_comm.h finds three lines):
       >>types      reduce ops, collective kinds, handles, dt_comm_desc
       >>comm       communicators: the world, rank, size, local rank, timeout, checking mode
       >>coll       collectives: all-reduce to all-to-allv, send / recv, async forms, test / wait
       >>split      groups: dt_comm_split
       >>bucketer   the gradient bucketer (DDP)
       >>stats      statistics (calls, bytes, algbw, busbw) and the observer
     and in the implementation only, which starts at >>implementation:
       >>sumorder   the reduction in rank order of every host all-reduce     (after types)
       >>hang       hang reports: the ranks that did not arrive              (after comm)
       >>engine     operations: header exchange, data stages, requests
       >>nccl       the NCCL path of device tensors                          (before coll)

   API in one breath, in the order a program calls it:
       dt_comm_create_world       every process of the run; dt_comm_rank, _size, _local_rank
                                  (the GPU to use), _world_rank, _seq, _hosts,
                                  _ranks_per_host (see "Across hosts"), dt_comm_cpus and
                                  dt_comm_cpu_note (more ranks than CPUs: bound or not)
       dt_comm_split              sub-groups (dt_parallel.h makes the dp / tp / pp groups)
       dt_comm_allreduce (sum, avg, max, min; in place), dt_comm_allreduce_f64 (host scalars),
       dt_comm_reduce_scatter, _allgather, _broadcast, _alltoall, _alltoallv (counts exchanged
                                  for you), dt_comm_send / _recv, dt_comm_barrier
       dt_comm_iallreduce, _ireduce_scatter, _iallgather, _ibroadcast, _isend, _irecv
                                  -> dt_comm_req; dt_comm_test, dt_comm_wait (one wait each)
       dt_bucketer_create         then per step: dt_bucketer_mark_ready for each gradient as the
                                  backward produces it, dt_bucketer_finish before the optimizer
                                  (dt_bucketer_set_sync(0) for accumulation micro-steps)
       dt_comm_stats / _format / _print: calls, bytes, seconds, algbw and busbw (nccl-tests)
       dt_comm_set_observer       a callback per completed operation (dt_parallel.h's timeline)
       dt_comm_check_same         every rank passed the same desc (a digest; names the field)
       dt_comm_set_name / _set_timeout / _set_check / _set_hier; dt_bucketer_free; dt_comm_free, groups
                                  before the world
       dt_comm_abort              end every rank on an error that only some ranks see

   Do this:
       #define DT_COMM_IMPLEMENTATION        (or DT_IMPLEMENTATION for every dt header)
   before you include this file in *one* C or C++ file to create the implementation. It needs
   dt_tensor.h, which it includes itself when you have not included it before.

   Compile-time options. In every file that includes dt (they change declarations):
       DT_STATIC, DT_API       as in dt_tensor.h.
     In the implementation file only:
       DT_MPI      processes talk through MPI (build with mpicc, run with mpirun). Without it the
                   world has one rank and every call works: a collective of one rank copies or
                   does nothing, a send to oneself is queued until the matching receive.
       DT_NCCL     device tensors (DT_CUDA_DEVICE) go through NCCL on a communication stream
                   (needs DT_CUDA; link -lnccl -lcudart). Without it they are staged through host
                   memory and MPI.
       DT_CUDA                 as in dt_tensor.h.
       DT_COMM_GATHER_MAX_BYTES  all-reduce path switch, see "Sum order" (default 64 KiB).
       DT_COMM_A2A_HIER_MAX_BYTES, DT_COMM_A2A_HIER_RANKS  all-to-all in two levels up to this
                   mean block, or from this many ranks a host, see "Across hosts" (16 KiB, 4).

   Tensors: f32, bf16, f16, i32, i64 (and u8 for everything but avg). Sizes are element counts of
   the tensors, any shape. A device tensor goes through NCCL when the communicator has it, else
   through a host staging copy (dt_tensor_copy) and MPI.

   Sum order (why results are bitwise reproducible). On the host/MPI path dt does not let MPI
   reduce: it moves the data with MPI collectives and adds the contributions itself, element by
   element in rank order, ((x0 + x1) + x2) + ... + x(n-1), then divides by n for avg. Small
   messages (all contributions together up to DT_COMM_GATHER_MAX_BYTES) take one all-gather and
   a local sum; larger ones an all-to-all (each rank receives its slice from the others and sums
   it with its own, which never leaves its buffer) and an all-gather of the sums: the traffic of
   a ring all-reduce, 2(n-1)/n of the message per rank. The arithmetic is the same on both
   paths, so:
     - the result does not depend on the message size, on where an element sits in a buffer or
       on MPI's choice of algorithm: a bucket of gradients gives bitwise what one call per
       tensor gives, and reduce_scatter followed by allgather gives bitwise what allreduce gives;
     - every rank holds bitwise the same result.
   bf16 and f16: MPI has no such types. They are moved as 16-bit words, summed in f32 and
   rounded once at the end. (A user MPI_Op would round to 16 bits at every hop of MPI's tree or
   ring, so the answer would depend on the number of ranks and the algorithm; converting to f32
   before MPI would double the bytes on the wire.) Integers wrap on overflow (two's complement);
   avg is defined for floating types only.
   NCCL reduces in its own order (ring or tree, in its own precision): results agree with the MPI
   path within floating-point reassociation, not bitwise.

   Across hosts. A flat all-reduce sends 2(n-1)/n of the message from every rank, most of it to
   other hosts, over the slowest link. When a group spans H hosts with the same number L > 1 of
   its ranks on each (dt_comm_hosts, dt_comm_ranks_per_host; hosts by host name, or modelled
   with desc.host_size), a large all-reduce goes in two levels instead:
        host A: r0 r1   reduce-scatter in the host  ->  r0 holds A's sum of half 0, r1 of half 1
        host B: r2 r3   (same)                      ->  r2: B's half 0, r3: B's half 1
        across: r0 <-> r2 all-reduce half 0, r1 <-> r3 half 1 (each its own slice, in parallel)
        host A, host B: all-gather in the host      ->  every rank holds the whole sum
   Bytes that cross hosts: 2(H-1) x the message in all, against 2(H-1)L x for the flat one
   (1/L: half with 2 ranks per host). Order: each host's ranks in rank order, then the hosts'
   partial sums in host order (hosts numbered by their first rank in the group):
   ((x0 + x1) + (x2 + x3)) where the flat one adds ((x0 + x1) + x2) + x3; avg divides the total
   once. On such a group every f32 and f64 sum takes this order whatever path carries it (inline,
   all-gather, two levels, chunks), so all the bitwise promises above hold there too, and the
   result equals the flat one within fp32 reassociation. Integers, max and min have no order
   (equal bitwise); bf16 and f16 stay flat (two levels would round to 16 bits in between).
   desc.hier (dt_comm_set_hier): 0 = auto (two levels above the all-gather path's size, i.e.
   where the flat one would take its all-to-all), 1 = for every all-reduce not carried in its
   header, -1 = never (flat transport and rank order). Reduce-scatter and all-gather stay flat
   (a reduce-scatter adds in the group's order); NCCL does its own topology.
   The all-to-all (alltoall, alltoallv: the embedding's and the experts' exchanges) goes in two
   levels on the same groups:
        host A: r0 r1   in the host: r0 gets the blocks for place 0 of every host, r1 for place 1
        host B: r2 r3   (same)
        across: r0 <-> r2 exchange what their host has for each other, r1 <-> r3 the same
   No third step: the first already sorted the blocks by the place they go to. Every block
   crosses hosts once, as in the flat one, but in H - 1 messages a rank instead of (H - 1) L,
   and the result is the flat one's bitwise (blocks are moved, never combined). An alltoallv
   first exchanges its counts the same way (in the host, then across), then agrees as the flat
   one does, so a rank whose out is too small still fails alone. hier 0 (auto) takes it for
   blocks averaging up to DT_COMM_A2A_HIER_MAX_BYTES (16 KiB: the number of messages, not
   their bytes, sets the time) and at every size from DT_COMM_A2A_HIER_RANKS (4) ranks a host
   (the flat one's L x L flows through a host's link lose packets; measured at 1 gbit/s: 0.21-
   0.24x the flat one's time at 256 KiB blocks on 2 hosts x 4 ranks, up to 1.47x at 2 x 2,
   which auto therefore leaves flat). The scratch it needs (what a rank sends, passes on and
   receives) is taken after the header exchange; where a rank has no room, every rank goes flat.
   dt_comm_stat.hier_calls counts the calls that went in two levels.

   Hangs and mismatches. Every communicator numbers its collectives (seq 1, 2, ...). A call that
   does not complete within desc.timeout_s (default 300 s) returns DT_ERR_TIMEOUT with a message
   naming the collective, the group, its size, the seq and the ranks that did not arrive:
       dt_comm_allreduce: allreduce(sum) of 1024 x f32 at seq 42 on group world (size 4) did not
       complete within 300 s; did not arrive: rank 3 (no answer: ...)
   How: the rank that gives up sends a small "gave up at seq N" notice to every rank on a
   separate control communicator. Ranks still waiting in dt see it within milliseconds, give up
   too and answer with their own position; after a short grace period each rank names the ranks
   it heard nothing from (a rank that skipped the collective is busy elsewhere and cannot answer)
   and those that are behind, at an earlier seq. This costs one MPI_Iprobe per call and every
   few milliseconds of waiting; nothing is exchanged for it unless something goes wrong.
   Ranks that disagree. No rank ever sends or receives the data of a collective that the ranks
   called differently (size, dtype, op, root or collective): every collective on more than one
   rank starts with a header, one small MPI all-gather of the same size whatever the call, in
   which each rank shows (seq, collective, dtype, count, op or root); the data moves only once
   every rank has seen every header agree. When they disagree, every rank returns DT_ERR_COMM
   listing who called what, nothing was sent, and the communicator stays usable:
       dt_comm_allreduce: ranks disagree at seq 7 on group world (size 2): rank 0 called
       allreduce(sum) of 1000 x f32; rank 1 called allreduce(sum) of 500 x f32; this is rank 0; ...
   A rank that cannot take part (out of memory for its scratch, a failed staging copy) says so
   in its header: it returns its own error, the others DT_ERR_COMM naming it. Messages of up to
   a few hundred bytes (512 on up to 8 ranks, 80 from 52 ranks on) ride in the header itself, so
   a small all-reduce still takes one exchange; a larger one takes one small exchange more than
   its data (a few microseconds, which matter only for small messages), in checking mode and
   without it.
   Checking mode (desc.check_mismatch = 1, or dt_comm_set_check) adds, before each collective,
   a blocking exchange of the same record: a rank whose own arguments were invalid then returns
   its own error and the others DT_ERR_COMM naming it, instead of waiting for it (without
   checking mode such a rank returns at once and the others time out naming it), and each async
   post waits until every rank has posted. It costs one small all-gather per call.
   After a timeout the communicator is unusable: the abandoned collective still holds its
   buffers (MPI cannot cancel a collective, a late rank could still complete it), so every later
   call on it returns DT_ERR_STATE at once instead of hanging. Report, then end the run.
   Send and recv time out too; their request is cancelled and the communicator stays usable.
   A recv looks at the incoming message before it receives (MPI_Improbe): one of another size
   than t is DT_ERR_COMM naming both sizes, t is left as it was, and the message is taken off the
   wire so that it cannot match a later recv. (The sender cannot tell: its send succeeded.
   NCCL has no probe: between device tensors over NCCL, send and recv sizes must match.)
   A rank that fails in the middle of a collective (an MPI error) leaves the others to post stages
   it will not; the communicator is then unusable too (DT_ERR_STATE), rather than letting a later
   collective be matched against the wrong one.

   Memory: requests, headers (a block of up to size x 560 bytes per call), staging and scratch
   buffers come from the ctx allocator; each communicator keeps a small pool of scratch buffers
   so repeated calls do not allocate (an all-reduce or reduce-scatter borrows about (size-1)/size
   of its message). Everything a collective needs is taken before its header goes out. Sizes:
   a tensor has at most 2147483647 elements (MPI counts are int; DT_ERR_UNSUPPORTED beyond),
   every size computed from it fits, and an all-to-allv that would bring one rank more than that
   in all is an error on every rank before anything is allocated or sent. A communicator that
   timed out keeps the buffers of the abandoned collective until the process ends. Wait for
   every request of a communicator before freeing it.

   Threads: a dt_comm (and its requests and bucketer) belongs to one thread at a time. MPI is
   initialised with MPI_THREAD_FUNNELED when dt initialises it (MPI_THREAD_MULTIPLE with a
   progress thread, below).

   Progress while the rank computes. An MPI library moves a posted operation only inside MPI
   calls (Open MPI has no progress thread of its own on TCP or shared memory), so a DDP bucket
   posted during the backward mostly moves at the next dt call. desc.progress_us > 0 starts one
   thread per world that calls into MPI's progress engine (an MPI_Iprobe on MPI_COMM_SELF, which
   touches no dt state) every progress_us microseconds, so transfers go on while the rank
   computes; dt's own stages (the next stage of an all-reduce) still advance at dt calls, which
   the layers make between ops (dt_bucketer_mark_ready polls). It needs MPI_THREAD_MULTIPLE:
   dt asks for it when it initialises MPI, and a world over an MPI that gives less is
   DT_ERR_STATE. The thread sleeps between looks, yet it costs CPU time that ranks sharing a
   core would otherwise compute with; measure (gpt --progress-us, --trace).

   MPI and several copies of dt. A program may hold two copies of dt (DT_STATIC, or two
   libraries that each vendor it); MPI is one per process. Each copy asks MPI whether it is
   initialised (MPI_Initialized / MPI_Finalized) before initialising it, so the first world of
   any copy initialises MPI and the others use it. No copy finalizes MPI while the program runs:
   one copy cannot see another's worlds (MPI has no shared name for a count: an attribute keyval
   is private to the copy that made it), and finalizing under a live world breaks it. The copy
   that initialised MPI finalizes it at exit (atexit), provided the program freed that copy's
   worlds; a program that exits with one alive has failed, and mpirun says so, as without dt.
   A caller that initialised MPI itself finalizes it itself, after freeing dt's worlds.

   NCCL: the NCCL communicator is created on the first device collective, on the device that is
   current then (create the ctx with cuda_device = dt_comm_local_rank(world), or call
   cudaSetDevice, before it). Collectives run on a communication stream that first waits for
   the ctx stream; send/recv pairs match in call order (NCCL has no tags). A blocking call
   returns once its collective is queued, not when the GPU has run it: the ctx stream waits for
   it (cudaStreamWaitEvent), so what the caller queues next, and any copy to the host, sees the
   result, while the host goes on without waiting for the device (a tensor-parallel layer makes
   several such calls). dt_comm_wait on an NCCL request does the same. The call's statistics
   and observer follow at a later call on the group (dt_comm_stats, a barrier and dt_comm_free
   wait for them: a host wait, counted in ctx->counters.syncs); its timeout still runs from its
   start, checked at each later call. Making the NCCL communicator is collective, a send is
   not: a device send/recv before the group's first device collective is DT_ERR_STATE.
   Ranks sharing a GPU: the exchange that carries the NCCL id also carries each rank's host and
   PCI bus id. NCCL refuses a group with two ranks on one GPU, so dt does not create one: with
   use_nccl 0 the group stages its device tensors through host memory and MPI from then on (every
   rank switches at the same call), with use_nccl 1 that call is DT_ERR_UNSUPPORTED naming the
   ranks. Errors: a failing NCCL call is DT_ERR_COMM naming it and NCCL's reason
       dt_comm_allreduce: ncclAllReduce (allreduce on group world, size 2): invalid argument ...
   and a failing CUDA call DT_ERR_CUDA naming it; an asynchronous NCCL error (seen through
   ncclCommGetAsyncError while waiting, or for a blocking call that returned, at the next call
   on the group, which returns it: "an earlier blocking call on group tp failed after it
   returned: ... allreduce(sum) of 1024 x f32 at seq 9 failed in NCCL ...") aborts the NCCL
   communicator and makes the group unusable (DT_ERR_STATE afterwards). Until then the ctx
   stream waits behind the failed collective: a copy to the host before the next dt_comm call
   waits as long as NCCL does. Checked without a GPU: tests/gpu_comm.c runs on the CUDA
   emulator with a fake NCCL over MPI (tests/cuda_emu/nccl_emu.cpp), also in its deferred-streams
   mode, where a collective that does not wait for the ctx stream reads stale data.

   The licence (MIT) is at the end of this file.
*/
#ifndef DT_COMM_H
#define DT_COMM_H

/* the all-to-all's auto choice (see "Across hosts"; public: the tests read them) */
#ifndef DT_COMM_A2A_HIER_MAX_BYTES
#define DT_COMM_A2A_HIER_MAX_BYTES (16 * 1024)
#endif
#ifndef DT_COMM_A2A_HIER_RANKS
#define DT_COMM_A2A_HIER_RANKS 4
#endif

#ifndef DT_TENSOR_H
#include "dt_tensor.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>types: reduce ops, collective kinds, handles, the desc ================================ */

typedef enum dt_reduce_op {
    DT_REDUCE_DEFAULT = 0, /* = DT_REDUCE_SUM */
    DT_REDUCE_SUM,
    DT_REDUCE_AVG,         /* sum / size; floating dtypes only */
    DT_REDUCE_MAX,
    DT_REDUCE_MIN,
    DT_REDUCE_OP_COUNT
} dt_reduce_op;

/* The kinds of communication, for statistics and messages. */
typedef enum dt_coll {
    DT_COLL_ALLREDUCE = 0,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_ALLGATHER,
    DT_COLL_BROADCAST,
    DT_COLL_ALLTOALL,
    DT_COLL_ALLTOALLV,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_BARRIER,
    DT_COLL_COUNT
} dt_coll;

typedef struct dt_comm dt_comm;         /* a group of ranks; opaque */
typedef struct dt_comm_req dt_comm_req; /* an operation in flight; opaque */
typedef struct dt_bucketer dt_bucketer; /* gradient buckets of a parameter set; opaque */

typedef struct dt_comm_desc {
    double timeout_s;   /* a collective not complete after this long fails; 0 = 300 s, < 0 = never */
    int check_mismatch; /* 1: checking mode (exchange (seq, collective, dtype, count) before each
                           collective, see above); 0 = off. Other values are DT_ERR_ARG. */
    int use_nccl;       /* 0 = NCCL for device tensors when built with DT_NCCL (staged when ranks
                           share a GPU); 1 = the same, and an error when built without it or when
                           ranks share a GPU; -1 = never (stage through host memory) */
    const char *name;   /* the group's name in messages; NULL = "world" */
    int hier;           /* host-aware all-reduce and all-to-all (see "Across hosts"): 0 = auto,
                           1 = for every all-reduce that does not ride in its header and every
                           all-to-all (but an alltoallv of more than INT_MAX elements over all
                           ranks, or one with no room for its scratch), -1 = never (flat). The
                           same on every rank of a group: the headers compare it */
    int progress_us;    /* > 0: a thread drives MPI's progress every progress_us microseconds
                           while the rank computes (see "Progress while the rank computes");
                           0 = none. World only; at most 1000000. */
    int host_size;      /* 0 = hosts are host names (MPI_Get_processor_name); k > 0: every k
                           consecutive world ranks count as one host for the collectives (a
                           cluster modelled on one machine; local ranks stay by host name) */
} dt_comm_desc;

/* ==== >>comm: communicators: the world, rank, size, settings ================================== */

/* The world: every process of the run. Initialises MPI (MPI_THREAD_FUNNELED) unless the caller
   (or another copy of dt) did; without DT_MPI a world of one rank. A program may create several
   worlds. The comm keeps ctx for errors and memory. Built without DT_MPI but started by a
   launcher for several processes (mpirun, srun: OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE
   above 1, or PMIX_RANK above 0 in the environment), it is DT_ERR_STATE naming -DDT_MPI, as
   each process would otherwise train alone in a world of one. */
DT_API dt_status dt_comm_create_world(dt_ctx *ctx, dt_comm **world, const dt_comm_desc *desc);
/* Ends every rank of c's world at once with exit status `code` (use a non-zero one): flushes
   stdout and stderr, then MPI_Abort(MPI_COMM_WORLD, code) under DT_MPI (mpirun then stops the
   other ranks and exits with code), exit(code) without MPI or before MPI is initialised. c may
   be NULL (the same). Does not return.
   When to use it: an error that every rank sees alike (a bad flag, a collective's error, which
   dt returns on every rank) ends cleanly by freeing what was made (dt_comm_free last) and
   returning non-zero from main; an error only some ranks see (a file one rank cannot open, a
   NaN in one rank's loss) cannot: the others would wait in their next collective until its
   timeout. Call dt_comm_abort there.
   After a timeout (DT_ERR_TIMEOUT from any call of this copy of dt), it first waits until
   DT__CM_ABORT_GRACE (3 s) after that timeout: the other ranks still waiting each write their
   own report once they give up too (see "Hangs"), and MPI_Abort would end them before. */
DT_API void dt_comm_abort(dt_comm *c, int code)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((noreturn)) /* the caller's compiler knows what follows is not reached */
#endif
    ;
/* Frees a communicator (free the groups split from the world before the world). MPI stays up:
   when dt initialised it, dt finalizes it at exit (see "MPI and several copies of dt"). NULL is a
   no-op. Not collective for dt, but MPI may synchronise: call it on every rank. */
DT_API void dt_comm_free(dt_comm *c);
DT_API int dt_comm_rank(const dt_comm *c);
DT_API int dt_comm_size(const dt_comm *c);
/* Rank among the group's processes on the same host (grouped by host name), and their number:
   the GPU a rank should use is its local rank. */
DT_API int dt_comm_local_rank(const dt_comm *c);
DT_API int dt_comm_local_size(const dt_comm *c);
/* World rank of the group's rank `rank` (-1 when out of range). */
DT_API int dt_comm_world_rank(const dt_comm *c, int rank);
/* Hosts the group spans (desc.host_size's hosts where set), and its ranks on each when that is
   the same on every host (0 when it differs): a group with hosts > 1 and ranks per host > 1 can
   take the host-aware all-reduce. */
DT_API int dt_comm_hosts(const dt_comm *c);
DT_API int dt_comm_ranks_per_host(const dt_comm *c);
/* The CPUs of this host (Linux's /sys/devices/system/cpu/online, else /proc/stat's where /sys is
   not mounted) and those this process may run on (its affinity: /proc/self/status); 0 each where
   the OS does not say. */
DT_API void dt_comm_cpus(int *online, int *allowed);
/* Collective over c: a line into out (n bytes; "" when there is nothing to say) when a host runs
   more of c's ranks than it has CPUs: how many such ranks are not bound to a CPU (the OS moves
   those between CPUs: slower, unsteady steps) and the mpirun options that bind them, or that they
   are bound. The examples print it at start. A rank passing no buffer gets DT_ERR_ARG after taking
   part (the others get the note). */
DT_API dt_status dt_comm_cpu_note(dt_comm *c, char *out, size_t n);
/* The all-reduce's and the all-to-all's choice on c (as desc.hier: 0 auto, 1 on, -1 never);
   every rank must set the same at the same point (on a group that spans hosts, a collective
   called with different settings fails on every rank naming them, nothing sent). Groups split
   from c later inherit it. */
DT_API dt_status dt_comm_set_hier(dt_comm *c, int mode);
DT_API int dt_comm_hier(const dt_comm *c);
DT_API const char *dt_comm_name(const dt_comm *c);
DT_API dt_ctx *dt_comm_ctx(const dt_comm *c);
/* Number of collectives this rank has entered on c (the seq of the last one). */
DT_API int64_t dt_comm_seq(const dt_comm *c);
/* Whether c still works (0 after a timeout). */
DT_API int dt_comm_ok(const dt_comm *c);
DT_API dt_status dt_comm_set_name(dt_comm *c, const char *name);
/* Local: each rank may set its own timeout (seconds; 0 = 300 s, < 0 = never; NaN is DT_ERR_ARG). */
DT_API dt_status dt_comm_set_timeout(dt_comm *c, double seconds);
DT_API double dt_comm_timeout(const dt_comm *c);
/* A deadline for a whole step, not one call: from now + seconds, every wait on c's world and on
   every group split from it (before or after) fails as a timeout does, naming the collective,
   its group and the ranks that did not arrive, and saying "deadline". A timeout bounds each
   call; a link too slow to finish a step, whose every call still makes progress, is caught only
   by this. Local (each rank sets its own); seconds 0 clears it; negative or NaN is DT_ERR_ARG.
   Set it at the start of a step, clear it at the end (examples/gpt --timeout does). */
DT_API dt_status dt_comm_set_deadline(dt_comm *c, double seconds);
/* Seconds this rank has spent blocked in c's waits (a blocking call, dt_comm_wait) since c was
   made: the time it waited for the others (unlike dt_comm_stats' seconds, which run from post to
   completion and so include the compute an async operation overlapped). */
DT_API double dt_comm_wait_seconds(const dt_comm *c);
/* Checking mode on (1) or off (0); other values are DT_ERR_ARG and change nothing. Every rank
   must switch it at the same point. */
DT_API dt_status dt_comm_set_check(dt_comm *c, int on);

/* ==== >>coll: collectives: blocking, point to point, asynchronous ================================
   Each is collective over c: every rank calls it, in the same order, with the same dtype and
   the sizes described. Blocking forms return when this rank's part is complete. */

/* t = op over ranks of t, in place. */
DT_API dt_status dt_comm_allreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op);
/* The same on n host doubles (norms, overflow flags, counters), summed in rank order. */
DT_API dt_status dt_comm_allreduce_f64(dt_comm *c, double *vals, int n, dt_reduce_op op);
/* Collective over c: whether every rank passes the same n values v (a desc's fields: integers
   cast, doubles' bits, texts hashed), for a constructor that must refuse a desc which differs
   between ranks rather than build objects that diverge. st is this rank's own status for the
   desc (non-zero when its local checks failed: the others are told, not left waiting). One
   all-reduce of a digest; on a difference two more find the first field that differs (ranks
   passing different n compare their first min(n) values; then field = -1) and the first rank
   whose value differs from rank 0's, into *diff (may be NULL) for the caller's message.
   Returns alike on every rank: DT_OK when all agree and every st is DT_OK; st on a rank that
   passed an error and DT_ERR_ARG on the others (diff->failed = 1); DT_ERR_ARG on a difference
   (a generic message: the caller names the field); DT_ERR_COMM when a collective fails. */
typedef struct dt_comm_same_diff {
    int failed;              /* 1: some rank passed an error status (nothing compared) */
    int field;               /* the first index whose values differ; -1: only n differs */
    int rank;                /* the first rank whose value (or n) differs from rank 0's */
    uint64_t value0, value;  /* rank 0's and that rank's value of the field (or their n) */
} dt_comm_same_diff;
DT_API dt_status dt_comm_check_same(dt_comm *c, const uint64_t *v, int n, dt_status st, dt_comm_same_diff *diff);
/* in holds size blocks of out->numel elements; out = op over ranks of block `rank`. out may lie
   inside in. */
DT_API dt_status dt_comm_reduce_scatter(dt_comm *c, dt_tensor *out, const dt_tensor *in, dt_reduce_op op);
/* out = the in of every rank, in rank order: out->numel = size * in->numel. in may be out's own
   block (in place). */
DT_API dt_status dt_comm_allgather(dt_comm *c, dt_tensor *out, const dt_tensor *in);
/* t = root's t. */
DT_API dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root);
/* Equal blocks: in and out have size * b elements; block j of in goes to rank j, block i of out
   came from rank i. in and out must not overlap. */
DT_API dt_status dt_comm_alltoall(dt_comm *c, dt_tensor *out, const dt_tensor *in);
/* Uneven blocks, counts in elements. send_counts[j] elements go to rank j, taken from in in rank
   order (packed); what arrives is packed into out in rank order. recv_counts: what each rank
   sends here; NULL = not known (the ranks exchange counts first in any case, and a recv_counts
   that disagrees with the sender is DT_ERR_SHAPE naming both). out may be larger than needed; too
   small is DT_ERR_SHAPE giving the size needed (this rank still takes part, the others succeed).
   A send count above in->numel, or counts adding up past it, are DT_ERR_SHAPE on this rank;
   more than 2147483647 elements arriving at a rank in all (MPI counts and displacements are
   int) is an error on every rank (DT_ERR_UNSUPPORTED there, DT_ERR_COMM naming it elsewhere),
   before anything is allocated or sent. The counts that arrived are then in dt_comm_recv_counts(c). */
DT_API dt_status dt_comm_alltoallv(dt_comm *c, dt_tensor *out, const int64_t *recv_counts,
                                   const dt_tensor *in, const int64_t *send_counts);
/* The counts of the last alltoallv on this rank (size entries), or NULL before one. */
DT_API const int64_t *dt_comm_recv_counts(const dt_comm *c);
DT_API dt_status dt_comm_barrier(dt_comm *c);

/* Point to point, tag 0..32767. recv needs a message of exactly t->numel elements of t's size:
   another size is DT_ERR_COMM, t untouched, the message consumed (see "Hangs and mismatches"). */
DT_API dt_status dt_comm_send(dt_comm *c, const dt_tensor *t, int dst, int tag);
DT_API dt_status dt_comm_recv(dt_comm *c, dt_tensor *t, int src, int tag);

/* ---------------------------------------------------------------- asynchronous forms
   Each posts the operation and returns a request (on error *req is NULL and nothing was
   posted). The tensors must stay alive and untouched until the request completes. Every
   request is finished by exactly one dt_comm_wait, which frees it; dt_comm_test only asks. */

DT_API dt_status dt_comm_iallreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op, dt_comm_req **req);
DT_API dt_status dt_comm_ireduce_scatter(dt_comm *c, dt_tensor *out, const dt_tensor *in, dt_reduce_op op,
                                         dt_comm_req **req);
DT_API dt_status dt_comm_iallgather(dt_comm *c, dt_tensor *out, const dt_tensor *in, dt_comm_req **req);
DT_API dt_status dt_comm_ibroadcast(dt_comm *c, dt_tensor *t, int root, dt_comm_req **req);
DT_API dt_status dt_comm_isend(dt_comm *c, const dt_tensor *t, int dst, int tag, dt_comm_req **req);
DT_API dt_status dt_comm_irecv(dt_comm *c, dt_tensor *t, int src, int tag, dt_comm_req **req);
/* Makes progress; *done = 1 when req is complete. Returns the request's error if it failed. */
DT_API dt_status dt_comm_test(dt_comm_req *req, int *done);
/* Waits (up to the comm's timeout, counted from this call), frees req, returns its status. A
   request on NCCL (device tensors) completes in stream order, as a blocking call does (see
   "NCCL" at the top): the ctx stream waits for it and the host does not; its error, if NCCL
   fails later, is returned by the next call on the group. */
DT_API dt_status dt_comm_wait(dt_comm_req *req);

/* ==== >>split: groups: dt_comm_split ========================================================== */

/* Collective over parent: ranks with the same color form a group, ordered by key (ties by
   parent rank). color < 0: this rank joins no group and *out is NULL. The group inherits the
   parent's timeout, checking mode and NCCL choice; its name is "<parent>.<color>". */
DT_API dt_status dt_comm_split(dt_comm *parent, dt_comm **out, int color, int key);

/* ==== >>bucketer: the gradient bucketer (DDP) ================================================= */

typedef struct dt_bucketer_desc {
    int64_t bucket_bytes;       /* 0 = 25 MB (PyTorch DDP's bucket_cap_mb) */
    int64_t first_bucket_bytes; /* 0 = 1 MB: the last layers' grads, ready first, go out early */
    int average;                /* 0 = default = average over ranks; -1 = sum only */
    int grad_views;             /* 1: each p->grad becomes a view into its bucket (DDP's
                                   gradient_as_bucket_view): no copies at sync time. The grads
                                   get their own memory back in dt_bucketer_free, which must then
                                   come before dt_params_free. 0 = grads are copied in and out.
                                   Other values are DT_ERR_ARG. */
    const dt_tensor *flat;      /* the grads already lie back to back, in registration order, in
                                   this f32 tensor (dt_parallel.h's arena): each bucket is a view of
                                   its range, so nothing is copied and no grad moves (grad_views is
                                   then ignored). NULL = the buckets have memory of their own. */
} dt_bucketer_desc;

/* Packs the f32 grads of ps (all on one device) into flat buckets, parameters in reverse
   registration order (the order backward produces them), a parameter never split. ps must not
   gain parameters while the bucketer lives. */
DT_API dt_status dt_bucketer_create(dt_comm *c, dt_bucketer **out, dt_params *ps, const dt_bucketer_desc *desc);
/* p's grad is final for this step: copies it into its bucket (unless the grads already live
   there: grad_views, flat); when every grad of a bucket is ready, launches its
   async all-reduce (buckets go out in order, so every rank launches the same sequence). */
DT_API dt_status dt_bucketer_mark_ready(dt_bucketer *b, dt_param *p);
/* Treats unmarked params as ready, launches what is left, waits for every bucket and writes the
   averaged (or summed) grads back into each p->grad. Ends the step. */
DT_API dt_status dt_bucketer_finish(dt_bucketer *b);
/* sync = 0 for gradient-accumulation micro-steps: mark_ready and finish do nothing and the
   grads keep accumulating locally; sync = 1 (the default) again for the last micro-step. Other
   values are DT_ERR_ARG and change nothing. */
DT_API dt_status dt_bucketer_set_sync(dt_bucketer *b, int sync);
DT_API int dt_bucketer_count(const dt_bucketer *b); /* number of buckets */
DT_API void dt_bucketer_free(dt_bucketer *b);

/* ==== >>stats: statistics and the observer ==================================================== */

/* Per kind of collective on one communicator. bytes follow nccl-tests: the buffer for
   all-reduce and broadcast, the whole (size x block) buffer for reduce-scatter, all-gather and
   all-to-all, the bytes sent for all-to-allv, the message for send/recv. seconds run from post
   to completion (as dt saw it: a blocking NCCL call, which returns once queued, at a later call
   on c). algbw = bytes / seconds, busbw = algbw * dt_coll_bus_factor (GB/s, 1e9). Reading them
   (dt_comm_stats, _format, _reset) first waits for such calls still on the device, so each call
   is counted exactly once, by then. */
typedef struct dt_comm_stat {
    int64_t calls;
    double bytes;
    double seconds;
    double algbw;
    double busbw;
    int64_t nccl_calls; /* of calls, those whose data went through NCCL (device tensors, DT_NCCL);
                           dt_comm_stats_format marks their rows "(device, NCCL: n)" */
    int64_t hier_calls; /* of calls, those that went in two levels across hosts (all-reduce,
                           all-to-all: "Across hosts"; rows marked "(two levels: n)") */
} dt_comm_stat;

DT_API dt_status dt_comm_stats(const dt_comm *c, dt_comm_stat *out, dt_coll kind);
DT_API void dt_comm_stats_reset(dt_comm *c);
DT_API const char *dt_coll_name(dt_coll kind); /* "allreduce", ... */
/* nccl-tests bus bandwidth factor: all-reduce 2(n-1)/n; reduce-scatter, all-gather, all-to-all(v)
   (n-1)/n; broadcast, send, recv 1; barrier 0. */
DT_API double dt_coll_bus_factor(dt_coll kind, int size);
/* A table of every kind used, one line each, into buf; returns the length it needed. */
DT_API size_t dt_comm_stats_format(const dt_comm *c, char *buf, size_t n);
DT_API void dt_comm_stats_print(const dt_comm *c); /* the table on stdout */

/* ---------------------------------------------------------------- observer (timelines) */

/* Called on this rank when an operation of c completes, blocking or async, successful or not:
   kind and bytes as in the statistics, t_post when it was posted and t_done when dt saw it
   complete (dt_comm_now seconds; for an async operation that is the dt_comm_test or
   dt_comm_wait that found it done, for a blocking call on NCCL a later call on c, so a span
   can end later than the wire went quiet).
   Internal pieces of an operation (the chunks of a large all-reduce, header exchanges) are
   not reported, only the operation the caller asked for. The callback runs inside the dt call
   and must not call c. */
typedef void (*dt_comm_observer_fn)(const dt_comm *c, dt_coll kind, double bytes, double t_post, double t_done,
                                    void *user);
/* One observer per communicator (fn NULL removes it); local, not inherited by dt_comm_split. */
DT_API dt_status dt_comm_set_observer(dt_comm *c, dt_comm_observer_fn fn, void *user);
/* Seconds on the clock of the statistics and timeouts (CLOCK_MONOTONIC where there is one):
   comparable within a process, not across hosts. */
DT_API double dt_comm_now(void);

/* Under DT_STATIC a program uses a few of an implementation's functions; the rest must not warn.
   dt_comm.h's and dt_embed.h's implementations sit between these two. */
#if defined(DT_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define DT__STATIC_QUIET_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wunused-function\"")
#define DT__STATIC_QUIET_END _Pragma("GCC diagnostic pop")
#else
#define DT__STATIC_QUIET_BEGIN
#define DT__STATIC_QUIET_END
#endif

#ifdef __cplusplus
}
#endif
#endif /* DT_COMM_H */

/* ============================================================================================
   Implementation                                                              >>implementation
   ============================================================================================ */
#if defined(DT_IMPLEMENTATION) && !defined(DT_COMM_IMPLEMENTATION)
#define DT_COMM_IMPLEMENTATION
#endif
#ifdef DT_COMM_IMPLEMENTATION
#ifndef DT_COMM_IMPLEMENTATION_DONE
#define DT_COMM_IMPLEMENTATION_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <time.h>
#include <errno.h>
/* Timeouts and statistics run on CLOCK_MONOTONIC: a step of the wall clock (NTP, an admin)
   must not fire a timeout. Strict -std=c99 hides clock_gettime and struct timespec unless
   _POSIX_C_SOURCE came before the first system include, which dt_tensor.h made long before
   this point; on Linux they are declared here instead, with a struct of the same layout (as
   dt_tensor.h does for fsync). CLOCK_MONOTONIC is 1 on Linux. */
#if defined(CLOCK_MONOTONIC)
#define DT__CM_CLOCK 1
#include <sched.h> /* sched_yield: POSIX is on, as for clock_gettime */
#elif defined(__linux__) && !defined(__cplusplus)
#define DT__CM_CLOCK 2
struct dt__cm_timespec {
    long tv_sec;
    long tv_nsec;
};
extern int clock_gettime(int clock_id, struct dt__cm_timespec *ts);
extern int nanosleep(const struct dt__cm_timespec *req, struct dt__cm_timespec *rem);
extern int sched_yield(void);
#else
#include <sys/time.h> /* elsewhere without POSIX clocks: the wall clock */
#endif
#if defined(DT_MPI) && defined(DT__CM_CLOCK)
#include <pthread.h> /* the progress thread (desc.progress_us) */
#define DT__CM_THREADS 1
#endif
#ifdef DT_MPI
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1 /* the deprecated MPI C++ bindings: not used, and noisy under -Wextra */
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif
#ifdef DT_NCCL
#ifndef DT_CUDA
#error "dt_comm.h: DT_NCCL needs DT_CUDA"
#endif
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#ifndef DT_COMM_GATHER_MAX_BYTES
#define DT_COMM_GATHER_MAX_BYTES (64 * 1024)
#endif

DT__STATIC_QUIET_BEGIN

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>types: internal types ================================================================= */

#define DT__CM_F64 100               /* element type of dt_comm_allreduce_f64 (not a dt_dtype) */
#define DT__CM_SPLIT (DT_COLL_COUNT + 1)
#define DT__CM_POOL 16               /* scratch buffers kept per communicator */
#define DT__CM_HIST 16               /* recent collectives remembered for hang reports */
#define DT__CM_REC 6                 /* a collective record: seq, kind, et, count, arg, flags */
#define DT__CM_STAGES 3              /* data stages of one operation at most (see the engine) */
#define DT__CM_INLINE_MAX 512        /* bytes of data that may ride in a header (see the engine) */
/* flags (record word 5) */
#define DT__CM_BAD_ARGS 1            /* the rank's arguments were invalid (checking mode) */
#define DT__CM_NO_PART 2             /* the rank cannot take part; bits 8..15: its status */
#define DT__CM_ON_NCCL 4             /* the rank's data goes through NCCL */
#define DT__CM_A2A_FLAT 8            /* an alltoall with no room for two levels: all go flat (not compared) */
#define DT__CM_HIER_SHIFT 16         /* bits 16..17: the group's hier setting + 2, where it spans hosts */
#define DT__CM_NOTE 10               /* a notice: type, seq, entered, record[6], sender */
#define DT__CM_TAG 0x7d7             /* tag of notices on the control communicator */
#define DT__CM_GAVE_UP 1
#define DT__CM_REPLY 2
#define DT__CM_SERVE_S 0.002         /* how often a waiting rank looks for notices */
#define DT__CM_BLOCK 1024            /* elements reduced per block (stack accumulators) */
#define DT__CM_CHUNKS 4              /* a large host all-reduce runs as up to this many chunks... */
#define DT__CM_CHUNK_MIN (256 << 10) /* ...of at least this many bytes, so that they pipeline */

/* paths: one rank; all-gather + local sum; all-to-all + sums + all-gather; the data in the
   header exchange (inline); a plain MPI collective; NCCL */
enum { DT__CM_LOCAL = 0, DT__CM_GATHER, DT__CM_A2A, DT__CM_INL, DT__CM_MPI, DT__CM_NCCL, DT__CM_HIER };

typedef struct dt__cm_buf {
    void *p;
    size_t cap;
    int busy;                        /* 1 lent to an op; 2 lost to an abandoned op (never reused) */
} dt__cm_buf;

typedef struct dt__cm_msg {          /* a send to oneself without MPI, queued until its recv */
    struct dt__cm_msg *next;
    int tag, et;
    int64_t count;
    void *data;
} dt__cm_msg;

struct dt_comm {
    dt_ctx *ctx;
    char name[64];
    int rank, size, local_rank, local_size;
    int *world_ranks;                /* group rank -> world rank */
    int *host_of;                    /* group rank -> host (world's numbering) */
    int hosts, per_host;             /* hosts the group spans; ranks on each (0: not the same) */
    int host_index, host_local;      /* this rank's host among them (by first rank); rank on it */
    int hier;                        /* desc.hier */
    int *by_host;                    /* hosts x per_host: the group ranks on each host, in order */
    void *hier_tmp;                  /* the host-order sum's partials (dt__cm_reduce_group) */
    int is_world;
    int check, nccl_mode;
    double timeout;
    double *deadline;                /* the world's: [0] the time waits fail after (0: none), [1] the
                                        seconds it was set for (dt_comm_set_deadline) */
    double wait_s;                   /* dt_comm_wait_seconds */
    int broken;
    char broken_msg[300];
    int64_t seq;                     /* collectives entered */
    int64_t hist[DT__CM_HIST][DT__CM_REC];
    int64_t failed_seq;              /* lowest seq another rank gave up at (0 = none) */
    int failed_rank;
    int sent_gave_up;
    int64_t *notes;                  /* size x DT__CM_NOTE: the last notice from each rank */
    int64_t *recv_counts;            /* counts of the last alltoallv */
    double stat_calls[DT_COLL_COUNT], stat_bytes[DT_COLL_COUNT], stat_secs[DT_COLL_COUNT];
    double stat_nccl[DT_COLL_COUNT]; /* calls carried by NCCL */
    double stat_hier[DT_COLL_COUNT]; /* calls carried in two levels (a chunked call counts once) */
    dt_comm_observer_fn observer;    /* dt_comm_set_observer */
    void *observer_user;
    dt__cm_buf pool[DT__CM_POOL];
    dt_comm_req *fifo;               /* operations in flight, in posting order */
    dt_comm_req *late;               /* blocking NCCL calls that returned before the device ran them */
    dt_status late_st;               /* the first of them to fail, reported by the next call */
    char late_msg[DT_ERROR_MAX];
    dt__cm_msg *selfq;
#ifdef DT_MPI
    MPI_Comm mc[DT__CM_STAGES];      /* data: stage s of every operation runs on mc[s] */
    MPI_Comm hc;                     /* header exchanges (see the engine) */
    MPI_Comm ctl;                    /* checks, splits, notices */
    MPI_Comm hh[2], hx;              /* host-aware all-reduce: this host's ranks (stage 0, stage
                                        3), the ranks at this rank's place on every host (1, 2) */
    int tag_ub;
#ifdef DT__CM_THREADS
    pthread_t progress;              /* the world's progress thread (desc.progress_us) */
    pthread_mutex_t progress_mu;     /* guards progress_stop */
    int progress_on, progress_stop, progress_us;
#endif
    int64_t *note_out;               /* size x DT__CM_NOTE send buffers, one per destination */
    MPI_Request *note_req;
#endif
#ifdef DT_NCCL
    ncclComm_t nccl;
    cudaStream_t stream;
#endif
};

struct dt_comm_req {
    dt_comm *c;
    int kind;                        /* dt_coll, or DT__CM_SPLIT */
    const char *fn;                  /* public function, for messages */
    int64_t seq;                     /* collective seq; 0 for send/recv */
    int et;                          /* element type: dt_dtype or DT__CM_F64 */
    dt_reduce_op op;
    int arg;                         /* root, or the peer of send/recv */
    int tag;
    int64_t count;                   /* elements, as the messages describe the call */
    double stat_bytes, t0;
    int path, stage, last_stage;     /* stage -1: nothing posted yet */
    int pending;                     /* an MPI request / NCCL event is in flight */
    int probing;                     /* a recv looking for its message (MPI_Improbe) */
    int done, bad_here;
    int agreed;                      /* it failed on every rank at the same point (not midway) */
    dt_comm_req *gate;               /* the header exchange it waits for (NULL: none) */
    int own_gate;                    /* this request frees gate */
    int is_gate;                     /* this request is a header exchange */
    int lost;                        /* a gate abandoned in flight: its memory stays lent to MPI */
    int64_t *hdr;                    /* a gate: its block, then the blocks of every rank */
    char *msg;                       /* a gate: the message of a failed verdict */
    int *cls;                        /* a gate: size ints for grouping records in the message */
    const void **rows;               /* n > 64: the row pointers of a reduction */
    dt_status status;
    dt_tensor tin, tout;             /* the caller's tensors (by value) */
    void *hin, *hout;                /* host memory the MPI stages read and write */
    int slot_in, slot_out, slot_scratch; /* pool slots (-1 plain allocation, -2 none) */
    void *scratch;
    int *cnt;                        /* 4 x size: send counts, send displs, recv counts, recv displs */
    int64_t *c64;                    /* alltoallv: send counts, received counts (size each), this
                                        rank's verdict (2), every rank's verdict (2 x size) */
    const int64_t *want_recv;        /* alltoallv: the caller's recv_counts (may be NULL) */
    const int64_t *want_send;        /* alltoallv: the caller's send_counts */
    int64_t out_cap;                 /* alltoallv: out->numel */
    dt_tensor dscratch;              /* NCCL alltoallv into a too-small out: receives here instead */
    dt_comm_req **kids;              /* a large all-reduce runs as chunks, each its own operation */
    int nkids, internal;             /* internal: a chunk (counted in its parent's statistics) */
    int64_t part_off, part_len;      /* a chunk of an all-to-all: this slice of every block */
    int64_t a2av_sum;                /* a gate of an alltoallv: every rank's total, summed */
    int64_t hier_x;                  /* the two-level all-to-all: elements in scratch's first part */
    int hier_flat;                   /* ... which had no room for its scratch on some rank: flat */
    int detached;                    /* a blocking NCCL call that returned: on the heap, in c->late */
    dt_comm_req *late_next;
    dt_comm_req *next;
#ifdef DT_MPI
    MPI_Request mreq;
#endif
#ifdef DT_NCCL
    cudaEvent_t ev;
#endif
};

/* MPI is one per process; copies of dt are not (DT_STATIC, or two libraries that each vendor
   dt), and these two belong to this copy alone: the worlds it created and not yet freed, and
   whether it initialised MPI. See "MPI and several copies of dt" at the top. */
static int dt__cm_worlds_alive = 0;
/* When a call of this copy last timed out (dt__cm_now; 0: never): dt_comm_abort's grace. */
static double dt__cm_timed_out_at = 0;
#define DT__CM_ABORT_GRACE 3.0
static void dt__cm_backoff(unsigned *looks, double waited);
#ifdef DT_MPI
static int dt__cm_we_inited_mpi = 0;
#endif

/* ---------------------------------------------------------------- small helpers */

/* Seconds on the monotonic clock (see the includes). */
static double dt__cm_now(void) {
#if defined(DT__CM_CLOCK) && DT__CM_CLOCK == 1
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#elif defined(DT__CM_CLOCK)
    struct dt__cm_timespec ts;
    clock_gettime(1, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#else
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
#endif
}

/* Appends printf-style text to the NUL-terminated buf of n bytes (truncating). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static void dt__cm_cat(char *buf, size_t n, const char *fmt, ...) {
    size_t len = strlen(buf);
    va_list ap;
    if (len + 1 >= n) return;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

static int dt__cm_et(dt_dtype d) { return d == DT_DTYPE_DEFAULT ? DT_F32 : (int)d; }
static size_t dt__cm_esize(int et) { return et == DT__CM_F64 ? 8 : dt_dtype_size((dt_dtype)et); }
static const char *dt__cm_ename(int et) { return et == DT__CM_F64 ? "f64" : dt_dtype_name((dt_dtype)et); }
static int dt__cm_is_float(int et) { return et == DT_F32 || et == DT_BF16 || et == DT_F16 || et == DT__CM_F64; }

static const char *dt__cm_op_name(dt_reduce_op op) {
    switch (op) {
    case DT_REDUCE_DEFAULT: case DT_REDUCE_SUM: return "sum";
    case DT_REDUCE_AVG: return "avg";
    case DT_REDUCE_MAX: return "max";
    case DT_REDUCE_MIN: return "min";
    default: return "invalid-op";
    }
}

DT_API const char *dt_coll_name(dt_coll kind) {
    static const char *names[DT_COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                               "alltoall", "alltoallv", "send", "recv", "barrier"};
    if ((int)kind == DT__CM_SPLIT) return "split";
    return ((int)kind >= 0 && kind < DT_COLL_COUNT) ? names[kind] : "invalid-collective";
}

DT_API double dt_coll_bus_factor(dt_coll kind, int size) {
    double n = size > 0 ? (double)size : 1.0;
    switch (kind) {
    case DT_COLL_ALLREDUCE: return 2.0 * (n - 1.0) / n;
    case DT_COLL_REDUCE_SCATTER: case DT_COLL_ALLGATHER: case DT_COLL_ALLTOALL: case DT_COLL_ALLTOALLV:
        return (n - 1.0) / n;
    case DT_COLL_BROADCAST: case DT_COLL_SEND: case DT_COLL_RECV: return 1.0;
    default: return 0.0;
    }
}

/* "allreduce(sum) of 1024 x f32" from a record {seq, kind, et, count, arg, flags}. */
static const char *dt__cm_describe(const int64_t *rec, char *buf, size_t n) {
    int kind = (int)rec[1], et = (int)rec[2];
    long long count = (long long)rec[3];
    if (rec[5] & DT__CM_BAD_ARGS) {
        snprintf(buf, n, "%s with invalid arguments", dt_coll_name((dt_coll)kind));
        return buf;
    }
    switch (kind) {
    case DT_COLL_ALLREDUCE: case DT_COLL_REDUCE_SCATTER:
        snprintf(buf, n, "%s(%s) of %lld x %s", dt_coll_name((dt_coll)kind),
                 dt__cm_op_name((dt_reduce_op)rec[4]), count, dt__cm_ename(et));
        break;
    case DT_COLL_BROADCAST:
        snprintf(buf, n, "broadcast(root %d) of %lld x %s", (int)rec[4], count, dt__cm_ename(et));
        break;
    case DT_COLL_ALLTOALLV: snprintf(buf, n, "alltoallv of %s", dt__cm_ename(et)); break;
    case DT_COLL_BARRIER: snprintf(buf, n, "barrier"); break;
    case DT__CM_SPLIT: snprintf(buf, n, "split"); break;
    default: snprintf(buf, n, "%s of %lld x %s", dt_coll_name((dt_coll)kind), count, dt__cm_ename(et)); break;
    }
    if (rec[5] & DT__CM_ON_NCCL) dt__cm_cat(buf, n, " (device, NCCL)");
    if ((rec[5] >> DT__CM_HIER_SHIFT) & 3)
        dt__cm_cat(buf, n, " with hier %d", (int)((rec[5] >> DT__CM_HIER_SHIFT) & 3) - 2);
    if (rec[5] & DT__CM_NO_PART)
        dt__cm_cat(buf, n, " but could not take part (%s)", dt_status_name((dt_status)((rec[5] >> 8) & 0xff)));
    return buf;
}

#ifdef DT_MPI
/* Appends "rank 3" / "ranks 1, 3" (with world ranks for a sub-group) for the ranks r with
   sel[r] == want; returns how many. */
static int dt__cm_ranks(const dt_comm *c, char *buf, size_t n, const int *sel, int want) {
    int r, k = 0, total = 0;
    size_t len = strlen(buf);
    for (r = 0; r < c->size; r++) total += sel[r] == want;
    for (r = 0; r < c->size && len < n; r++) {
        if (sel[r] != want) continue;
        if (k == 16) {
            len += (size_t)snprintf(buf + len, n - len, ", ... (%d more)", total - k);
            break;
        }
        len += (size_t)snprintf(buf + len, n - len, "%s%d", k ? ", " : (total > 1 ? "ranks " : "rank "), r);
        if (len < n && !c->is_world && c->world_ranks[r] != r)
            len += (size_t)snprintf(buf + len, n - len, " (world %d)", c->world_ranks[r]);
        k++;
    }
    return total;
}
#endif

static void dt__cm_host_view(dt_tensor *v, void *data, int et, int64_t numel) {
    memset(v, 0, sizeof *v);
    v->data = data;
    v->dtype = (dt_dtype)et;
    v->device = DT_CPU;
    v->ndim = 1;
    v->shape[0] = numel;
    v->numel = numel;
}

static int dt__cm_on_device(const dt_tensor *t) { return t && t->device == DT_CUDA_DEVICE; }

/* ---------------------------------------------------------------- scratch pool */

static void *dt__cm_take(dt_comm *c, size_t bytes, int *slot) {
    int i, best = -1, spare = -1;
    void *p;
    if (bytes == 0) bytes = 1;
    for (i = 0; i < DT__CM_POOL; i++) {
        dt__cm_buf *b = &c->pool[i];
        if (b->busy) continue;
        if (b->cap >= bytes && (best < 0 || b->cap < c->pool[best].cap)) best = i;
        if (spare < 0 || b->cap > c->pool[spare].cap) spare = i;
    }
    if (best >= 0) {
        c->pool[best].busy = 1;
        *slot = best;
        return c->pool[best].p;
    }
    if (spare >= 0) { /* grow the largest free buffer, with some room for the next call */
        size_t cap = bytes + bytes / 8;
        dt_release(c->ctx, c->pool[spare].p);
        c->pool[spare].p = NULL;
        c->pool[spare].cap = 0;
        p = dt_alloc(c->ctx, cap);
        if (!p) return NULL;
        c->pool[spare].p = p;
        c->pool[spare].cap = cap;
        c->pool[spare].busy = 1;
        *slot = spare;
        return p;
    }
    *slot = -1;
    return dt_alloc(c->ctx, bytes);
}

static void dt__cm_give(dt_comm *c, int slot, void *p, int lost) {
    if (slot == -2 || !p) return;
    if (slot >= 0) c->pool[slot].busy = lost ? 2 : 0;
    else if (!lost) dt_release(c->ctx, p);
}

/* ==== >>sumorder: reduction in rank order (implementation only) =============================== */

/* f32 / bf16 / f16 <-> the f32 the sums are taken in: dt_convert, which cannot fail on these
   pairs (no ctx: nothing to report) */
static void dt__cm_load(float *dst, const void *src, int et, int64_t k) {
    (void)dt_convert(NULL, dst, DT_F32, src, (dt_dtype)et, k);
}

static void dt__cm_store(void *dst, const float *src, int et, int64_t k) {
    (void)dt_convert(NULL, dst, (dt_dtype)et, src, DT_F32, k);
}

/* max/min that keep a NaN (the NaN of the lowest rank wins). */
#define DT__CM_MAX(a, x) ((a) != (a) ? (a) : ((x) != (x) || (x) > (a)) ? (x) : (a))
#define DT__CM_MIN(a, x) ((a) != (a) ? (a) : ((x) != (x) || (x) < (a)) ? (x) : (a))

/* Integers: sums wrap (computed unsigned, so no undefined overflow). */
#define DT__CM_REDUCE_INT(T, UT)                                                                   \
    do {                                                                                           \
        T *d_ = (T *)dst;                                                                          \
        for (i = 0; i < count; i++) {                                                              \
            T a_ = ((const T *)rows[0])[i];                                                        \
            for (r = 1; r < n; r++) {                                                              \
                T v_ = ((const T *)rows[r])[i];                                                    \
                if (op == DT_REDUCE_MAX) a_ = v_ > a_ ? v_ : a_;                                   \
                else if (op == DT_REDUCE_MIN) a_ = v_ < a_ ? v_ : a_;                              \
                else a_ = (T)((UT)a_ + (UT)v_);                                                    \
            }                                                                                      \
            d_[i] = a_;                                                                            \
        }                                                                                          \
    } while (0)

/* A loop over one block of k elements. Full blocks get a constant trip count, which is what
   lets gcc -O2 (its "very cheap" vectorizer cost model) use SIMD; the results are the same
   IEEE operations element by element either way. */
#define DT__CM_LOOP(k, body)                                                                       \
    do {                                                                                           \
        if ((k) == DT__CM_BLOCK) { for (j = 0; j < DT__CM_BLOCK; j++) { body; } }                  \
        else { for (j = 0; j < (k); j++) { body; } }                                               \
    } while (0)

#if defined(__cplusplus) || !defined(__STDC_VERSION__) || __STDC_VERSION__ < 199901L
#define DT__CM_RESTRICT __restrict
#else
#define DT__CM_RESTRICT restrict
#endif

/* acc[j] = acc[j] op x[j] for one block (acc and x never overlap: acc is a stack buffer). */
static void dt__cm_combine(float *DT__CM_RESTRICT acc, const float *DT__CM_RESTRICT x, int64_t k, dt_reduce_op op) {
    int64_t j;
    if (op == DT_REDUCE_MAX) DT__CM_LOOP(k, acc[j] = DT__CM_MAX(acc[j], x[j]));
    else if (op == DT_REDUCE_MIN) DT__CM_LOOP(k, acc[j] = DT__CM_MIN(acc[j], x[j]));
    else DT__CM_LOOP(k, acc[j] = acc[j] + x[j]);
}

/* dst[i] = rows[0][i] op rows[1][i] op ... op rows[n-1][i], left to right (rank order).
   f32/bf16/f16 accumulate in f32 and round once; avg divides the sum by n. dst may be one of
   the rows (each block is read whole before it is written). This one function is the whole
   arithmetic of every host all-reduce and reduce-scatter, which is what makes their results
   independent of message size and layout. */
static void dt__cm_reduce(void *dst, const void *const *rows, int n, int64_t count, int et, dt_reduce_op op);

/* The sum order of c (see "Across hosts"): rows[r] is group rank r's contribution. On a group
   that takes the host-aware all-reduce, f32 and f64 sums go host by host: each host's ranks in
   rank order, then the hosts' partial sums in host order, whatever path carried the data, so
   that the result never depends on the message's size; otherwise (and for max, min, integers,
   whose result has no order, and bf16 / f16) rank order. */
static int dt__cm_host_order(const dt_comm *c, int et, dt_reduce_op op) {
    return c->by_host && c->hier >= 0 && (et == DT_F32 || et == DT__CM_F64) && op != DT_REDUCE_MAX &&
           op != DT_REDUCE_MIN;
}

static void dt__cm_reduce_group(const dt_comm *c, void *dst, const void *const *rows, int64_t count, int et,
                                dt_reduce_op op) {
    int H = c->hosts, L = c->per_host, k, i;
    size_t es = et == DT_F32 ? sizeof(float) : sizeof(double);
    char *part = (char *)c->hier_tmp;
    const void **prow = (const void **)(void *)(part + (size_t)H * DT__CM_BLOCK * sizeof(double)), **hrow = prow + H;
    int64_t b, j;
    if (!dt__cm_host_order(c, et, op)) {
        dt__cm_reduce(dst, rows, c->size, count, et, op);
        return;
    }
    for (k = 0; k < H; k++) prow[k] = part + (size_t)k * DT__CM_BLOCK * sizeof(double);
    for (b = 0; b < count; b += DT__CM_BLOCK) {
        int64_t len = count - b < DT__CM_BLOCK ? count - b : DT__CM_BLOCK;
        char *d = (char *)dst + (size_t)b * es;
        for (k = 0; k < H; k++) {
            for (i = 0; i < L; i++) hrow[i] = (const char *)rows[c->by_host[k * L + i]] + (size_t)b * es;
            dt__cm_reduce((void *)(uintptr_t)prow[k], hrow, L, len, et, DT_REDUCE_SUM);
        }
        dt__cm_reduce(d, prow, H, len, et, DT_REDUCE_SUM);
        if (op != DT_REDUCE_AVG) continue;
        if (et == DT_F32) {
            float fn = (float)c->size, *x = (float *)(void *)d;
            for (j = 0; j < len; j++) x[j] = x[j] / fn;
        } else {
            double *x = (double *)(void *)d;
            for (j = 0; j < len; j++) x[j] = x[j] / (double)c->size;
        }
    }
}

static void dt__cm_reduce(void *dst, const void *const *rows, int n, int64_t count, int et, dt_reduce_op op) {
    int64_t i, j;
    int r;
    if (op == DT_REDUCE_DEFAULT) op = DT_REDUCE_SUM;
    if (et == DT_F32 || et == DT_BF16 || et == DT_F16) {
        size_t es = dt__cm_esize(et);
        float acc[DT__CM_BLOCK], x[DT__CM_BLOCK];
        float fn = (float)n;
        for (i = 0; i < count; i += DT__CM_BLOCK) {
            int64_t k = count - i < DT__CM_BLOCK ? count - i : DT__CM_BLOCK;
            if (et == DT_F32) { /* straight from the rows: no conversion to do */
                const float *r0 = (const float *)rows[0] + i;
                if (n > 1 && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN) {
                    const float *r1 = (const float *)rows[1] + i;
                    DT__CM_LOOP(k, acc[j] = r0[j] + r1[j]);
                    r = 2;
                } else {
                    memcpy(acc, r0, (size_t)k * sizeof(float));
                    r = 1;
                }
                for (; r < n; r++) dt__cm_combine(acc, (const float *)rows[r] + i, k, op);
            } else {
                dt__cm_load(acc, (const char *)rows[0] + (size_t)i * es, et, k);
                for (r = 1; r < n; r++) {
                    dt__cm_load(x, (const char *)rows[r] + (size_t)i * es, et, k);
                    dt__cm_combine(acc, x, k, op);
                }
            }
            if (op == DT_REDUCE_AVG) DT__CM_LOOP(k, acc[j] = acc[j] / fn);
            dt__cm_store((char *)dst + (size_t)i * es, acc, et, k);
        }
    } else if (et == DT__CM_F64) {
        double *d = (double *)dst;
        for (i = 0; i < count; i++) {
            double a = ((const double *)rows[0])[i];
            for (r = 1; r < n; r++) {
                double v = ((const double *)rows[r])[i];
                if (op == DT_REDUCE_MAX) a = DT__CM_MAX(a, v);
                else if (op == DT_REDUCE_MIN) a = DT__CM_MIN(a, v);
                else a = a + v;
            }
            d[i] = op == DT_REDUCE_AVG ? a / (double)n : a;
        }
    } else if (et == DT_I32) {
        DT__CM_REDUCE_INT(int32_t, uint32_t);
    } else if (et == DT_I64) {
        DT__CM_REDUCE_INT(int64_t, uint64_t);
    } else if (et == DT_U8) {
        DT__CM_REDUCE_INT(uint8_t, uint8_t);
    }
}

/* ---------------------------------------------------------------- MPI glue */

#ifdef DT_MPI
static MPI_Datatype dt__cm_mpi_type(int et) {
    switch (et) {
    case DT_F32: return MPI_FLOAT;
    case DT_BF16: case DT_F16: return MPI_UINT16_T; /* moved as words, summed by dt in f32 */
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    case DT_U8: return MPI_UINT8_T;
    default: return MPI_DOUBLE;
    }
}

static dt_status dt__cm_mpi_error(dt_comm *c, int rc, const char *fn, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    s[0] = 0;
    MPI_Error_string(rc, s, &len);
    return dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: %s failed on group %s (size %d): %s", fn, what, c->name,
                            c->size, s);
}

static int dt__cm_mpi_live(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}
#endif

/* ==== >>comm: communicators: lifetime, settings =============================================== */

static dt_comm *dt__cm_new(dt_ctx *ctx) {
    dt_comm *c = (dt_comm *)dt_alloc_zeroed(ctx, sizeof(dt_comm));
    if (!c) return NULL;
    c->ctx = ctx;
    c->timeout = 300.0;
#ifdef DT_MPI
    {
        int s;
        for (s = 0; s < DT__CM_STAGES; s++) c->mc[s] = MPI_COMM_NULL;
        c->hc = c->ctl = c->hh[0] = c->hh[1] = c->hx = MPI_COMM_NULL;
    }
#endif
    return c;
}

static void dt__cm_set_name(dt_comm *c, const char *name) {
    size_t n = strlen(name);
    if (n >= sizeof c->name) n = sizeof c->name - 1;
    memcpy(c->name, name, n);
    c->name[n] = 0;
}

#ifdef DT_MPI
/* Duplicates the data, header and control communicators of a new group from `base`, errors
   returned: every MPI failure on them is a status, never an MPI abort. */
static dt_status dt__cm_mpi_setup(dt_comm *c, MPI_Comm base, const char *fn) {
    int rc, s, flag = 0;
    int *ub = NULL;
    MPI_Comm *all[DT__CM_STAGES + 2];
    for (s = 0; s < DT__CM_STAGES; s++) all[s] = &c->mc[s];
    all[DT__CM_STAGES] = &c->hc;
    all[DT__CM_STAGES + 1] = &c->ctl;
    for (s = 0; s < DT__CM_STAGES + 2; s++) *all[s] = MPI_COMM_NULL;
    for (s = 0; s < DT__CM_STAGES + 2; s++) {
        rc = MPI_Comm_dup(base, all[s]);
        if (rc != MPI_SUCCESS) return dt__cm_mpi_error(c, rc, fn, "MPI_Comm_dup");
        MPI_Comm_set_errhandler(*all[s], MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(c->mc[0], &c->rank);
    MPI_Comm_size(c->mc[0], &c->size);
    MPI_Comm_get_attr(c->mc[0], MPI_TAG_UB, &ub, &flag);
    c->tag_ub = flag && ub ? *ub : 32767;
    return DT_OK;
}

/* Local rank: the ranks of this group on the same host, by host name. For the world, also each
   rank's host (host_size > 0: world rank / host_size; else hosts numbered by first rank). */
static dt_status dt__cm_mpi_local(dt_comm *c, int host_size, const char *fn) {
    char me[MPI_MAX_PROCESSOR_NAME + 1];
    char *all;
    int len = 0, r, rc;
    memset(me, 0, sizeof me);
    MPI_Get_processor_name(me, &len);
    all = (char *)dt_alloc(c->ctx, (size_t)c->size * sizeof me);
    if (!all) return DT_ERR_OOM;
    rc = MPI_Allgather(me, (int)sizeof me, MPI_CHAR, all, (int)sizeof me, MPI_CHAR, c->ctl);
    if (rc != MPI_SUCCESS) {
        dt_release(c->ctx, all);
        return dt__cm_mpi_error(c, rc, fn, "MPI_Allgather of host names");
    }
    c->local_rank = 0;
    c->local_size = 0;
    for (r = 0; r < c->size; r++) {
        if (strcmp(all + (size_t)r * sizeof me, me) != 0) continue;
        c->local_size++;
        if (r < c->rank) c->local_rank++;
    }
    if (c->is_world) {
        c->host_of = (int *)dt_alloc(c->ctx, (size_t)c->size * sizeof(int));
        if (!c->host_of) {
            dt_release(c->ctx, all);
            return DT_ERR_OOM;
        }
        for (r = 0; r < c->size; r++) {
            int k = 0;
            if (host_size > 0) {
                c->host_of[r] = r / host_size;
                continue;
            }
            while (k < r && strcmp(all + (size_t)k * sizeof me, all + (size_t)r * sizeof me) != 0) k++;
            c->host_of[r] = k < r ? c->host_of[k] : r; /* a host's number: its first world rank */
        }
    }
    dt_release(c->ctx, all);
    return DT_OK;
}

/* The group's hosts from host_of; when it spans several with the same number of ranks (more
   than one) on each, the communicators of the host-aware all-reduce: this host's ranks in rank
   order (two: stage 0 and stage 3) and the ranks at this rank's place on each host, in host
   order (stages 1 and 2; hosts ordered by their first rank in the group). */
static dt_status dt__cm_mpi_hosts(dt_comm *c, const char *fn) {
    int r, k, rc, mine = c->host_of[c->rank];
    int *first = (int *)dt_alloc(c->ctx, (size_t)c->size * 2 * sizeof(int)), *count;
    if (!first) return DT_ERR_OOM;
    count = first + c->size;
    c->hosts = 0;
    for (r = 0; r < c->size; r++) { /* first[k]: the k-th host's first group rank */
        for (k = 0; k < c->hosts && c->host_of[first[k]] != c->host_of[r]; k++) {}
        if (k == c->hosts) {
            first[c->hosts] = r;
            count[c->hosts++] = 0;
        }
        count[k]++;
        if (c->host_of[r] == mine) {
            c->host_index = k;
            if (r < c->rank) c->host_local++;
        }
    }
    c->per_host = count[0];
    for (k = 1; k < c->hosts; k++)
        if (count[k] != count[0]) c->per_host = 0;
    if (c->hosts < 2 || c->per_host < 2) {
        dt_release(c->ctx, first);
        return DT_OK;
    }
    c->by_host = (int *)dt_alloc(c->ctx, (size_t)c->size * sizeof(int));
    c->hier_tmp = dt_alloc(c->ctx, (size_t)c->hosts * (DT__CM_BLOCK * sizeof(double) + sizeof(void *)) +
                                       (size_t)c->per_host * sizeof(void *));
    if (!c->by_host || !c->hier_tmp) {
        dt_release(c->ctx, first);
        return DT_ERR_OOM;
    }
    for (k = 0; k < c->hosts; k++) { /* host k's ranks, in rank order */
        int i = 0;
        for (r = first[k]; r < c->size; r++)
            if (c->host_of[r] == c->host_of[first[k]]) c->by_host[k * c->per_host + i++] = r;
    }
    dt_release(c->ctx, first);
    for (k = 0; k < 2; k++) {
        rc = MPI_Comm_split(c->ctl, c->host_index, c->rank, &c->hh[k]);
        if (rc != MPI_SUCCESS) return dt__cm_mpi_error(c, rc, fn, "MPI_Comm_split by host");
        MPI_Comm_set_errhandler(c->hh[k], MPI_ERRORS_RETURN);
    }
    rc = MPI_Comm_split(c->ctl, c->host_local, c->host_index, &c->hx);
    if (rc != MPI_SUCCESS) return dt__cm_mpi_error(c, rc, fn, "MPI_Comm_split across hosts");
    MPI_Comm_set_errhandler(c->hx, MPI_ERRORS_RETURN);
    return DT_OK;
}
#endif

static void dt__cm_release_all(dt_comm *c) {
    int i;
    dt__cm_msg *m, *next;
    dt_ctx *ctx = c->ctx;
    int lost_notes = 0;
#ifdef DT__CM_THREADS
    if (c->progress_on) {
        pthread_mutex_lock(&c->progress_mu);
        c->progress_stop = 1;
        pthread_mutex_unlock(&c->progress_mu);
        pthread_join(c->progress, NULL);
        pthread_mutex_destroy(&c->progress_mu);
        c->progress_on = 0;
    }
#endif
#ifdef DT_MPI
    if (dt__cm_mpi_live()) {
        int s;
        if (c->note_req) { /* notices are small and sent eagerly; one still pending keeps its buffer */
            for (i = 0; i < c->size; i++) {
                int done = 1;
                if (c->note_req[i] == MPI_REQUEST_NULL) continue;
                MPI_Test(&c->note_req[i], &done, MPI_STATUS_IGNORE);
                if (!done) { MPI_Request_free(&c->note_req[i]); lost_notes = 1; }
            }
        }
        for (s = 0; s < DT__CM_STAGES; s++)
            if (c->mc[s] != MPI_COMM_NULL) MPI_Comm_free(&c->mc[s]);
        if (c->hc != MPI_COMM_NULL) MPI_Comm_free(&c->hc);
        if (c->ctl != MPI_COMM_NULL) MPI_Comm_free(&c->ctl);
        for (s = 0; s < 2; s++)
            if (c->hh[s] != MPI_COMM_NULL) MPI_Comm_free(&c->hh[s]);
        if (c->hx != MPI_COMM_NULL) MPI_Comm_free(&c->hx);
    }
    if (!lost_notes) dt_release(ctx, c->note_out);
    dt_release(ctx, c->note_req);
#endif
#ifdef DT_NCCL
    if (c->nccl) {
        if (c->broken) ncclCommAbort(c->nccl);
        else ncclCommDestroy(c->nccl);
    }
    if (c->stream) cudaStreamDestroy(c->stream);
#endif
    (void)lost_notes;
    for (i = 0; i < DT__CM_POOL; i++)
        if (c->pool[i].busy != 2) dt_release(ctx, c->pool[i].p); /* busy 2: MPI may still write it */
    for (m = c->selfq; m; m = next) {
        next = m->next;
        dt_release(ctx, m);
    }
    if (c->is_world) dt_release(ctx, c->deadline);
    dt_release(ctx, c->world_ranks);
    dt_release(ctx, c->host_of);
    dt_release(ctx, c->by_host);
    dt_release(ctx, c->hier_tmp);
    dt_release(ctx, c->notes);
    dt_release(ctx, c->recv_counts);
    dt_release(ctx, c);
}

#ifdef DT_MPI
/* Registered by the copy of dt that initialised MPI: finalizes it at exit, when the program has
   freed that copy's worlds (one that exits with a world still alive has failed, and mpirun says
   so, as it would without dt). */
static void dt__cm_finalize_at_exit(void) {
    if (dt__cm_worlds_alive == 0 && dt__cm_mpi_live()) MPI_Finalize();
}
#endif

#ifndef DT_MPI
/* Without MPI, a launcher that started several processes (its variables say how many; a value
   that is not a whole number is not a launcher's: ignored) is an error: each process would
   train alone in a world of one. */
static dt_status dt__cm_not_launched(dt_ctx *ctx, const char *fn) {
    static const char *const names[4] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "PMIX_RANK"};
    const char *var = NULL;
    long most = 1;
    int i;
    for (i = 0; i < 4; i++) {
        const char *s = getenv(names[i]);
        char *end = NULL;
        long v;
        if (!s || !*s) continue;
        errno = 0;
        v = strtol(s, &end, 10);
        if (errno || end == s || *end || v < 0) continue;
        if (i == 3) v = v > 0 ? v + 1 : 1; /* a rank above 0: at least rank + 1 processes */
        if (v > most) { most = v; var = names[i]; }
    }
    if (most == 1) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: a launcher started %s%ld processes (%s = %s), but dt was built "
                            "without MPI, so each would train alone in a world of one; rebuild with mpicc -DDT_MPI (or "
                            "run one process without the launcher)", fn, strcmp(var, "PMIX_RANK") ? "" : "at least ",
                            most, var, getenv(var));
}
#endif

DT_API void dt_comm_abort(dt_comm *c, int code) {
    (void)c; /* every rank of the job goes: MPI_Abort on any of its comms ends them all */
    fflush(stdout);
    fflush(stderr);
    if (dt__cm_timed_out_at > 0) { /* the others' reports first (see above) */
        unsigned looks = 64;
        while (dt__cm_now() < dt__cm_timed_out_at + DT__CM_ABORT_GRACE) dt__cm_backoff(&looks, 1.0);
    }
#ifdef DT_MPI
    {
        int init = 0, fin = 0;
        MPI_Initialized(&init);
        MPI_Finalized(&fin);
        if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
    }
#endif
    exit(code);
}

#ifdef DT__CM_THREADS
/* The progress thread: MPI_Iprobe on MPI_COMM_SELF (no message ever matches; the call runs the
   progress engine of every transport), then a sleep. */
static void *dt__cm_progress_main(void *arg) {
    dt_comm *c = (dt_comm *)arg;
    int flag = 0;
#if DT__CM_CLOCK == 1
    struct timespec ts;
#else
    struct dt__cm_timespec ts;
#endif
    ts.tv_sec = c->progress_us / 1000000;
    ts.tv_nsec = (long)(c->progress_us % 1000000) * 1000;
    for (;;) {
        int stop;
        pthread_mutex_lock(&c->progress_mu);
        stop = c->progress_stop;
        pthread_mutex_unlock(&c->progress_mu);
        if (stop) break;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
        nanosleep(&ts, NULL);
    }
    return NULL;
}
#endif

DT_API dt_status dt_comm_create_world(dt_ctx *ctx, dt_comm **world, const dt_comm_desc *desc) {
    const char *fn = "dt_comm_create_world";
    dt_comm_desc d;
    dt_comm *c;
    int r;
    if (world) *world = NULL;
    if (!ctx) return DT_ERR_ARG;
    if (!world) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: world is NULL", fn);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.timeout_s != d.timeout_s)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.timeout_s is NaN; expected seconds (0 = 300 s, "
                                "< 0 = never)", fn);
    if (d.check_mismatch != 0 && d.check_mismatch != 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.check_mismatch = %d; expected 0 (off) or 1 (checking mode)",
                                fn, d.check_mismatch);
    if (d.use_nccl < -1 || d.use_nccl > 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.use_nccl = %d; expected -1 (never), 0 (default) "
                                "or 1 (required)", fn, d.use_nccl);
    if (d.hier < -1 || d.hier > 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.hier = %d; expected -1 (never), 0 (auto) or 1 (on)",
                                fn, d.hier);
    if (d.host_size < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.host_size = %d; expected 0 (hosts by name) or the "
                                "world ranks per modelled host (> 0)", fn, d.host_size);
    if (d.progress_us < 0 || d.progress_us > 1000000)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.progress_us = %d; expected 0 (no progress thread) or "
                                "1..1000000 microseconds", fn, d.progress_us);
#ifndef DT_NCCL
    if (d.use_nccl == 1)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: desc.use_nccl = 1, but dt was built without "
                                "DT_NCCL; rebuild with -DDT_CUDA -DDT_NCCL or leave use_nccl 0", fn);
#endif
#ifndef DT_MPI
    if (dt__cm_not_launched(ctx, fn)) return DT_ERR_STATE;
#endif
    c = dt__cm_new(ctx);
    if (!c) return DT_ERR_OOM;
    c->is_world = 1;
    c->timeout = d.timeout_s == 0 ? 300.0 : d.timeout_s;
    c->check = d.check_mismatch;
    c->nccl_mode = d.use_nccl < 0 ? 0 : d.use_nccl == 1 ? 2 : 1; /* never, when built with it, required */
    c->hier = d.hier;
    dt__cm_set_name(c, d.name && d.name[0] ? d.name : "world");
    c->size = 1;
    c->local_size = 1;
    c->hosts = c->per_host = 1;
#ifdef DT_MPI
    {
        int init = 0, fin = 0, provided = 0, rc;
        dt_status st;
        MPI_Initialized(&init);
        MPI_Finalized(&fin);
        if (fin) {
            dt_release(ctx, c);
            return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: MPI is already finalized; MPI can be "
                                    "initialised only once per process", fn);
        }
        if (!init) {
            rc = MPI_Init_thread(NULL, NULL, d.progress_us > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                                 &provided);
            if (rc != MPI_SUCCESS) {
                dt_release(ctx, c);
                return dt_ctx_set_error(ctx, DT_ERR_COMM, "%s: MPI_Init_thread failed (error %d)", fn, rc);
            }
            if (!dt__cm_we_inited_mpi) atexit(dt__cm_finalize_at_exit);
            dt__cm_we_inited_mpi = 1;
        }
        st = dt__cm_mpi_setup(c, MPI_COMM_WORLD, fn);
        if (!st) st = dt__cm_mpi_local(c, d.host_size, fn);
        if (!st) st = dt__cm_mpi_hosts(c, fn);
        if (!st && d.progress_us > 0) {
#ifdef DT__CM_THREADS
            MPI_Query_thread(&provided);
            if (provided < MPI_THREAD_MULTIPLE)
                st = dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: desc.progress_us = %d needs MPI_THREAD_MULTIPLE (level "
                                      "%d), but MPI gives level %d (%s); leave progress_us 0, or make the first "
                                      "world with it, or initialise MPI with MPI_THREAD_MULTIPLE", fn, d.progress_us,
                                      MPI_THREAD_MULTIPLE, provided,
                                      init ? "MPI was initialised before this world" : "asked for by dt");
            else {
                c->progress_us = d.progress_us;
                if (pthread_mutex_init(&c->progress_mu, NULL) != 0)
                    st = dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: desc.progress_us: pthread_mutex_init failed", fn);
                else if (pthread_create(&c->progress, NULL, dt__cm_progress_main, c) != 0) {
                    pthread_mutex_destroy(&c->progress_mu);
                    st = dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: desc.progress_us: pthread_create failed", fn);
                } else
                    c->progress_on = 1;
            }
#else
            st = dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: desc.progress_us = %d needs POSIX threads and "
                                  "clocks, which this build does not have", fn, d.progress_us);
#endif
        }
        if (st) {
            dt__cm_release_all(c);
            return st;
        }
    }
#endif
    c->world_ranks = (int *)dt_alloc(ctx, (size_t)c->size * sizeof(int));
    c->deadline = (double *)dt_alloc_zeroed(ctx, 2 * sizeof(double));
    if (!c->world_ranks || !c->deadline) {
        dt__cm_release_all(c);
        return DT_ERR_OOM;
    }
    for (r = 0; r < c->size; r++) c->world_ranks[r] = r;
    dt__cm_worlds_alive++;
    *world = c;
    return DT_OK;
}

static void dt__cm_reap(dt_comm *c, int mode);

DT_API void dt_comm_free(dt_comm *c) {
    if (!c) return;
    dt__cm_reap(c, 2); /* blocking NCCL calls still running on the device */
    if (c->is_world) dt__cm_worlds_alive--;
    dt__cm_release_all(c); /* MPI stays up: another copy of dt may still use it (see the top) */
}

DT_API int dt_comm_rank(const dt_comm *c) { return c ? c->rank : 0; }
DT_API int dt_comm_size(const dt_comm *c) { return c ? c->size : 0; }
DT_API int dt_comm_local_rank(const dt_comm *c) { return c ? c->local_rank : 0; }
DT_API int dt_comm_local_size(const dt_comm *c) { return c ? c->local_size : 0; }
DT_API int dt_comm_hosts(const dt_comm *c) { return c ? c->hosts : 0; }
DT_API int dt_comm_ranks_per_host(const dt_comm *c) { return c ? c->per_host : 0; }

/* The number of CPUs in a Linux CPU list ("0-3,8,10-11"): the first line of path that starts with
   key (NULL: the first line); 0 where the file cannot be read (another OS) or holds no list. */
static int dt__cm_cpu_count(const char *path, const char *key) {
    char line[4096];
    const char *s = NULL;
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f) return 0;
    while (!s && fgets(line, sizeof line, f))
        if (!key || !strncmp(line, key, strlen(key))) s = line + (key ? strlen(key) : 0);
    fclose(f);
    while (s && *s) {
        long a, b;
        char *e;
        while (*s == ' ' || *s == '\t' || *s == ',') s++;
        if (*s < '0' || *s > '9') break;
        a = b = strtol(s, &e, 10);
        s = e;
        if (*s == '-') {
            b = strtol(s + 1, &e, 10);
            s = e;
        }
        if (a < 0 || b < a || b - a >= (1L << 20) || n > (1 << 20)) return 0; /* not a list this reads */
        n += (int)(b - a + 1);
    }
    return n;
}

/* /proc/stat's "cpuN" lines, one per online CPU: where /sys is not mounted (a chroot, some
   containers), as glibc's sysconf(_SC_NPROCESSORS_ONLN) falls back to */
static int dt__cm_proc_stat_cpus(void) {
    char line[512];
    int n = 0, at_start = 1;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        if (at_start && !strncmp(line, "cpu", 3) && line[3] >= '0' && line[3] <= '9') n++;
        at_start = strchr(line, '\n') != NULL; /* else the next read is the rest of a long line ("intr") */
    }
    fclose(f);
    return n;
}

DT_API void dt_comm_cpus(int *online, int *allowed) {
    if (online) {
        *online = dt__cm_cpu_count("/sys/devices/system/cpu/online", NULL);
        if (*online == 0) *online = dt__cm_proc_stat_cpus();
    }
    if (allowed) *allowed = dt__cm_cpu_count("/proc/self/status", "Cpus_allowed_list:");
}

DT_API dt_status dt_comm_cpu_note(dt_comm *c, char *out, size_t n) {
    int online, allowed, bad = !out || n == 0;
    /* summed: ranks on hosts with more ranks than CPUs, and of them those not bound; then the most
       ranks a CPU on any host, and that host's CPUs */
    double v[4];
    dt_status st;
    if (!c) return DT_ERR_ARG;
    if (!bad) out[0] = 0;
    dt_comm_cpus(&online, &allowed); /* a rank with bad arguments still takes part: no rank is left waiting */
    v[0] = online > 0 && allowed > 0 && c->local_size > online; /* allowed 0: the OS does not say */
    v[1] = v[0] && allowed >= online && online > 1;
    if ((st = dt_comm_allreduce_f64(c, v, 2, DT_REDUCE_SUM))) return st;
    v[2] = online > 0 ? (double)c->local_size / online : 0;
    if ((st = dt_comm_allreduce_f64(c, v + 2, 1, DT_REDUCE_MAX))) return st;
    v[3] = online > 0 && (double)c->local_size / online == v[2] ? online : 0;
    if ((st = dt_comm_allreduce_f64(c, v + 3, 1, DT_REDUCE_MAX))) return st;
    if (bad) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_cpu_note: out is %s and n = %zu; expected a buffer "
                                     "of n > 0 bytes", out ? "set" : "NULL", n);
    if (v[0] == 0) return DT_OK;
    if (v[1] > 0)
        snprintf(out, n, "note: %.0f of the %.0f ranks on hosts with more ranks than CPUs (up to %.0f on %.0f CPUs) are "
                 "not bound to a CPU: the OS moves them between CPUs, and steps run slower and unsteady (examples/gpt "
                 "at dp 4 on 2 cores ran 18%% slower unbound, its runs spread over 19%% against 3%% bound); Open MPI "
                 "binds them: mpirun --map-by core --bind-to core:overload-allowed", v[1], v[0], v[2] * v[3], v[3]);
    else
        snprintf(out, n, "note: %.0f ranks on hosts with more ranks than CPUs (up to %.0f on %.0f CPUs), each bound to "
                 "one", v[0], v[2] * v[3], v[3]);
    return DT_OK;
}
DT_API int dt_comm_hier(const dt_comm *c) { return c ? c->hier : 0; }
DT_API dt_status dt_comm_set_hier(dt_comm *c, int mode) {
    if (!c) return DT_ERR_ARG;
    if (mode < -1 || mode > 1)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_set_hier: mode = %d; expected -1 (never), 0 (auto) or "
                                "1 (on)", mode);
    c->hier = mode;
    return DT_OK;
}
DT_API int dt_comm_world_rank(const dt_comm *c, int rank) {
    return c && rank >= 0 && rank < c->size ? c->world_ranks[rank] : -1;
}
DT_API const char *dt_comm_name(const dt_comm *c) { return c ? c->name : "(null)"; }
DT_API dt_ctx *dt_comm_ctx(const dt_comm *c) { return c ? c->ctx : NULL; }
DT_API int64_t dt_comm_seq(const dt_comm *c) { return c ? c->seq : 0; }
DT_API int dt_comm_ok(const dt_comm *c) { return c && !c->broken; }
DT_API double dt_comm_timeout(const dt_comm *c) { return c ? c->timeout : 0.0; }
DT_API dt_status dt_comm_set_deadline(dt_comm *c, double seconds) {
    if (!c) return DT_ERR_ARG;
    if (!(seconds >= 0) || seconds > 1e9)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_set_deadline: seconds = %g; expected 0 (none) or "
                                "seconds from now (up to 1e9)", seconds);
    c->deadline[0] = seconds > 0 ? dt__cm_now() + seconds : 0.0;
    c->deadline[1] = seconds;
    return DT_OK;
}
DT_API double dt_comm_wait_seconds(const dt_comm *c) { return c ? c->wait_s : 0.0; }
DT_API dt_status dt_comm_set_timeout(dt_comm *c, double seconds) {
    if (!c) return DT_ERR_ARG;
    if (seconds != seconds)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_set_timeout: seconds is NaN; expected seconds (0 = 300 s, "
                                "< 0 = never)");
    c->timeout = seconds == 0 ? 300.0 : seconds;
    return DT_OK;
}
DT_API dt_status dt_comm_set_check(dt_comm *c, int on) {
    if (!c) return DT_ERR_ARG;
    if (on != 0 && on != 1)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_set_check: on = %d; expected 0 (off) or 1 (checking mode)",
                                on);
    c->check = on;
    return DT_OK;
}
DT_API dt_status dt_comm_set_name(dt_comm *c, const char *name) {
    if (!c) return DT_ERR_ARG;
    if (!name || !name[0])
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_set_name: name is %s; expected a non-empty string",
                                name ? "empty" : "NULL");
    dt__cm_set_name(c, name);
    return DT_OK;
}

DT_API const int64_t *dt_comm_recv_counts(const dt_comm *c) { return c ? c->recv_counts : NULL; }

/* ==== >>hang: hang reports (implementation only) ============================================== */

static void dt__cm_record(const dt_comm_req *q, int64_t *rec) {
    rec[0] = q->seq;
    rec[1] = q->kind;
    rec[2] = q->et;
    rec[3] = q->count;
    rec[4] = q->kind == DT_COLL_BROADCAST ? q->arg : (q->kind == DT_COLL_ALLREDUCE || q->kind == DT_COLL_REDUCE_SCATTER)
                                                         ? (int64_t)(q->op == DT_REDUCE_DEFAULT ? DT_REDUCE_SUM : q->op)
                                                         : 0;
    rec[5] = q->bad_here ? 1 : 0;
}

#ifdef DT_MPI
/* Sends one notice to rank `to` unless the previous one to it is still in flight. */
static void dt__cm_notify(dt_comm *c, int to, const int64_t *note) {
    int i, done = 1;
    if (!c->note_out) {
        c->note_out = (int64_t *)dt_alloc(c->ctx, (size_t)c->size * DT__CM_NOTE * sizeof(int64_t));
        c->note_req = (MPI_Request *)dt_alloc(c->ctx, (size_t)c->size * sizeof(MPI_Request));
        if (!c->note_out || !c->note_req) return;
        for (i = 0; i < c->size; i++) c->note_req[i] = MPI_REQUEST_NULL;
    }
    if (c->note_req[to] != MPI_REQUEST_NULL) MPI_Test(&c->note_req[to], &done, MPI_STATUS_IGNORE);
    if (!done) return;
    memcpy(c->note_out + (size_t)to * DT__CM_NOTE, note, DT__CM_NOTE * sizeof(int64_t));
    MPI_Isend(c->note_out + (size_t)to * DT__CM_NOTE, DT__CM_NOTE, MPI_INT64_T, to, DT__CM_TAG, c->ctl,
              &c->note_req[to]);
}

/* This rank's answer about seq s: how many collectives it entered, and what it called at s (or
   the last thing it called when it has not reached s). */
static void dt__cm_position(const dt_comm *c, int64_t s, int64_t *note) {
    int64_t at = s <= c->seq && s > c->seq - DT__CM_HIST && s > 0 ? s : c->seq;
    note[2] = c->seq;
    if (at > 0) memcpy(note + 3, c->hist[at % DT__CM_HIST], DT__CM_REC * sizeof(int64_t));
    else memset(note + 3, 0, DT__CM_REC * sizeof(int64_t));
    note[9] = c->rank;
}
#endif

/* Reads the notices other ranks sent: a "gave up at seq s" makes every later collective of
   this rank at seq >= s fail fast, and gets an answer with this rank's position. */
static void dt__cm_serve(dt_comm *c) {
#ifdef DT_MPI
    int flag = 0;
    MPI_Status st;
    int64_t m[DT__CM_NOTE];
    if (c->size == 1) return;
    for (;;) {
        if (MPI_Iprobe(MPI_ANY_SOURCE, DT__CM_TAG, c->ctl, &flag, &st) != MPI_SUCCESS || !flag) return;
        if (MPI_Recv(m, DT__CM_NOTE, MPI_INT64_T, st.MPI_SOURCE, DT__CM_TAG, c->ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        if (!c->notes) {
            c->notes = (int64_t *)dt_alloc(c->ctx, (size_t)c->size * DT__CM_NOTE * sizeof(int64_t));
            if (!c->notes) return;
            memset(c->notes, 0, (size_t)c->size * DT__CM_NOTE * sizeof(int64_t));
        }
        /* a "gave up" is news that a later reply must not hide */
        if (m[0] == DT__CM_GAVE_UP || c->notes[(size_t)st.MPI_SOURCE * DT__CM_NOTE] != DT__CM_GAVE_UP)
            memcpy(c->notes + (size_t)st.MPI_SOURCE * DT__CM_NOTE, m, sizeof m);
        if (m[0] == DT__CM_GAVE_UP) {
            if (c->failed_seq == 0 || m[1] < c->failed_seq) {
                c->failed_seq = m[1];
                c->failed_rank = st.MPI_SOURCE;
            }
            if (!c->sent_gave_up) {
                int64_t note[DT__CM_NOTE];
                note[0] = DT__CM_REPLY;
                note[1] = m[1];
                dt__cm_position(c, m[1], note);
                dt__cm_notify(c, st.MPI_SOURCE, note);
            }
        }
    }
#else
    (void)c;
#endif
}

static void dt__cm_fifo_unlink(dt_comm *c, dt_comm_req *q) {
    dt_comm_req **pp;
    for (pp = &c->fifo; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            q->next = NULL;
            return;
        }
}

static void dt__cm_release_req_bufs(dt_comm_req *q);

/* The buffers of an abandoned operation stay lent to MPI / NCCL for good (an operation that
   posted nothing yet gives them back). */
static void dt__cm_lose_bufs(dt_comm_req *q) {
    if (q->is_gate) q->lost = 1; /* its block is in its own allocation, kept by its owner */
    if (q->stage < 0 && !q->is_gate) {
        dt__cm_release_req_bufs(q);
        return;
    }
    dt__cm_give(q->c, q->slot_scratch, q->scratch, 1);
    dt__cm_give(q->c, q->slot_in, q->hin, 1);
    dt__cm_give(q->c, q->slot_out, q->hout, 1);
    q->slot_scratch = q->slot_in = q->slot_out = -2;
    q->scratch = NULL;
    memset(&q->dscratch, 0, sizeof q->dscratch);
    q->cnt = NULL; /* MPI may still read the counts of an abandoned all-to-allv */
    q->c64 = NULL;
}

#ifdef DT_MPI
/* What rank j told us about seq s: 0 nothing, 1 it entered s (or passed it), 2 it is behind. */
static int dt__cm_state_of(const dt_comm *c, int j, int64_t s) {
    const int64_t *m = c->notes ? c->notes + (size_t)j * DT__CM_NOTE : NULL;
    if (j == c->rank) return 1;
    if (!m || m[0] == 0) return 0;
    if (m[0] == DT__CM_GAVE_UP) return m[1] >= s ? 1 : 2;
    if (m[1] != s) return 0; /* a reply about another seq */
    return m[2] >= s ? 1 : 2;
}

/* Tells every rank that this one gives up at q's seq, listens for a grace period and appends
   to msg who did not arrive, who is behind, and whether the ranks that arrived disagree. */
static void dt__cm_report(dt_comm_req *q, const int64_t *rec, char *msg, size_t size) {
    dt_comm *c = q->c;
    int n = c->size, j, heard, missing = 0, arrived = 0, differ = 0, *state;
    int64_t note[DT__CM_NOTE];
    double grace = c->timeout / 4 < 0.2 ? 0.2 : c->timeout / 4 > 5.0 ? 5.0 : c->timeout / 4, end;
    char d[96];
    state = (int *)dt_alloc(c->ctx, (size_t)n * sizeof(int));
    if (!state) return;
    note[0] = DT__CM_GAVE_UP;
    note[1] = q->seq;
    dt__cm_position(c, q->seq, note);
    memcpy(note + 3, rec, DT__CM_REC * sizeof(int64_t));
    c->sent_gave_up = 1;
    for (j = 0; j < n; j++)
        if (j != c->rank) dt__cm_notify(c, j, note);
    end = dt__cm_now() + grace;
    do {
        dt__cm_serve(c);
        for (heard = 0, j = 0; j < n; j++) {
            state[j] = dt__cm_state_of(c, j, q->seq);
            if (j != c->rank && state[j]) heard++;
        }
    } while (heard < n - 1 && dt__cm_now() < end);
    for (j = 0; j < n; j++) {
        const int64_t *m = c->notes ? c->notes + (size_t)j * DT__CM_NOTE : NULL;
        missing += state[j] == 0;
        arrived += state[j] == 1;
        if (j != c->rank && state[j] == 1 && m && m[3] == q->seq && memcmp(m + 3, rec, DT__CM_REC * sizeof(int64_t)))
            differ++;
    }
    if (missing) {
        dt__cm_cat(msg, size, "; did not arrive: ");
        dt__cm_ranks(c, msg, size, state, 0);
        dt__cm_cat(msg, size, " (no answer: busy outside dt, in another collective, or gone)");
    }
    for (j = 0; j < n; j++) {
        const int64_t *m = state[j] == 2 ? c->notes + (size_t)j * DT__CM_NOTE : NULL; /* 2: it sent a notice */
        if (m)
            dt__cm_cat(msg, size, "; rank %d is behind: it has entered %lld collectives, the last %s", j,
                       (long long)m[2], dt__cm_describe(m + 3, d, sizeof d));
    }
    if (differ) {
        dt__cm_cat(msg, size, "; ranks disagree: rank %d called %s", c->rank, dt__cm_describe(rec, d, sizeof d));
        for (j = 0; j < n; j++) {
            const int64_t *m = c->notes ? c->notes + (size_t)j * DT__CM_NOTE : NULL;
            if (j != c->rank && state[j] == 1 && m && m[3] == q->seq)
                dt__cm_cat(msg, size, "; rank %d called %s", j, dt__cm_describe(m + 3, d, sizeof d));
        }
    } else if (arrived == n)
        dt__cm_cat(msg, size, "; every rank arrived (a slow transfer, or a timeout too short for this size)");
    dt_release(c->ctx, state);
}
#endif

/* Whether a wait that began at `start` has run out at t: 1 its timeout, 2 the step's deadline. */
static int dt__cm_expired(const dt_comm *c, double start, double t) {
    if (c->deadline && c->deadline[0] > 0 && t > c->deadline[0]) return 2;
    return c->timeout > 0 && t - start > c->timeout;
}

/* Abandons q (and everything else in flight on c) after a timeout (because -1) or the deadline
   (-2), or because rank `because` gave up on it first, and writes the report. */
static dt_status dt__cm_abandon(dt_comm_req *q, int because) {
    dt_comm *c = q->c;
    char msg[DT_ERROR_MAX], what[96];
    int64_t rec[DT__CM_REC];
    dt_comm_req *p;
    dt__cm_record(q, rec);
    dt__cm_describe(rec, what, sizeof what);
    msg[0] = 0;
    if (because >= 0)
        dt__cm_cat(msg, sizeof msg, "%s: %s at seq %lld on group %s (size %d) was abandoned: rank %d timed out on it",
                   q->fn, what, (long long)q->seq, c->name, c->size, because);
    else if (because == -2)
        dt__cm_cat(msg, sizeof msg, "%s: %s at seq %lld on group %s (size %d) did not complete by the deadline set "
                   "%.3g s before (dt_comm_set_deadline: the step ran out of time)", q->fn, what, (long long)q->seq,
                   c->name, c->size, c->deadline[1]);
    else
        dt__cm_cat(msg, sizeof msg, "%s: %s at seq %lld on group %s (size %d) did not complete within %.3g s", q->fn,
                   what, (long long)q->seq, c->name, c->size, c->timeout);
#ifdef DT_MPI
    if (c->size > 1) dt__cm_report(q, rec, msg, sizeof msg);
#endif
    dt__cm_cat(msg, sizeof msg, "; the communicator is unusable now");
#ifdef DT_NCCL
    if (c->nccl) {
        ncclCommAbort(c->nccl);
        c->nccl = NULL;
    }
#endif
    c->broken = 1;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s at seq %lld timed out", what, (long long)q->seq);
    /* Everything in flight is abandoned with it: its buffers stay lent to MPI. */
    while (c->fifo) {
        p = c->fifo;
        dt__cm_fifo_unlink(c, p);
        dt__cm_lose_bufs(p);
        if (p != q && !p->done) {
            p->done = 1;
            p->status = DT_ERR_STATE;
        }
    }
    dt__cm_lose_bufs(q);
    q->done = 1;
    q->status = DT_ERR_TIMEOUT;
    dt__cm_timed_out_at = dt__cm_now();
    return dt_ctx_set_error(c->ctx, DT_ERR_TIMEOUT, "%s", msg);
}

/* ==== >>engine: operations: the engine (implementation only) =====================================

   Gates. Every collective on a group of more than one rank starts with a header exchange: one
   MPI_Iallgather, on a communicator of its own (hc), of a block per rank holding the call's
   record (seq, collective, dtype, count, op or root, flags) and, when the data is small enough
   (dt__cm_inline_bytes: 512 bytes on up to 8 ranks, down to 80 from 52 ranks on, so that a
   header stays a few KB), the data itself. The block has the same size whatever
   the call, so the exchange is safe between ranks that disagree, and no rank posts the data of a
   call before its gate has shown that every rank made the same call: a mismatch (size, dtype,
   collective, op, root) is DT_ERR_COMM on every rank, nothing was sent, and the communicator
   stays usable. The gate never waits: it is posted with the call, and progress moves on when
   it arrives, so async calls overlap as before. Small messages ride in the header (one exchange,
   as before); larger ones pay one small exchange more (see "Ranks that disagree" at the top).
   Everything an operation needs (chunks, scratch, staging copies) is taken before its header
   goes out, and a rank that could not take part says so in its header, so running out of memory
   is a named error on every rank as well, not a hang.

   Stages. An operation then runs in stages; stage s of every operation uses the data
   communicator mc[s]. Stage 0 is posted only when every earlier operation in flight has posted
   its stage 0, and a later stage only when every earlier operation in flight has posted all of
   its stages, so each mc[s] sees the operations in the same order on every rank (MPI matches
   collectives by order), whatever order the caller waits in. A rank that fails in the middle of
   an operation (an MPI error) cannot post the rest while the other ranks will: the ranks are
   out of step, so the communicator is marked unusable and no later operation is matched against
   the wrong one. */

static void dt__cm_req_init(dt_comm_req *q, dt_comm *c, int kind, const char *fn) {
    memset(q, 0, sizeof *q);
    q->c = c;
    q->kind = kind;
    q->fn = fn;
    q->slot_in = q->slot_out = q->slot_scratch = -2;
    q->et = DT_F32;
    q->stage = -1;
}

static void dt__cm_release_req_bufs(dt_comm_req *q) {
    dt_comm *c = q->c;
    dt__cm_give(c, q->slot_scratch, q->scratch, 0);
    dt__cm_give(c, q->slot_in, q->hin, 0);
    dt__cm_give(c, q->slot_out, q->hout, 0);
    q->slot_scratch = q->slot_in = q->slot_out = -2;
    q->scratch = NULL;
    if (q->dscratch.data) dt_tensor_free(c->ctx, &q->dscratch);
    dt_release(c->ctx, q->cnt);
    dt_release(c->ctx, q->c64);
    dt_release(c->ctx, (void *)q->rows);
    q->cnt = NULL;
    q->c64 = NULL;
    q->rows = NULL;
}

/* Frees q's gate when q owns it. A gate MPI may still write (abandoned) is kept for good. */
static void dt__cm_drop_gate(dt_comm_req *q) {
    dt_comm_req *g = q->gate;
    int own = q->own_gate;
    q->gate = NULL;
    q->own_gate = 0;
    if (!g || !own) return;
    if (!g->done) g->lost = 1; /* not reached: an owner ends after its gate */
    if (!g->lost) dt_release(q->c->ctx, g);
}

/* q ends with status st. Before its first stage or after its last, or where every rank stops
   together (agreed), no rank is out of step; in between this rank leaves stages unposted that
   the others will post, so the communicator becomes unusable (see above). */
static void dt__cm_fail(dt_comm_req *q, dt_status st) {
    dt_comm *c = q->c;
    if (q->done) return;
    if (q->stage >= 0 && q->stage < q->last_stage && !q->agreed && !c->broken) {
        char what[96];
        int64_t rec[DT__CM_REC];
        dt__cm_record(q, rec);
        c->broken = 1;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s at seq %lld failed midway on this rank (%s), so the ranks "
                 "are out of step", dt__cm_describe(rec, what, sizeof what), (long long)q->seq, dt_status_name(st));
    }
    q->status = st;
    q->done = 1;
    q->pending = 0;
    q->probing = 0;
#ifdef DT_NCCL
    if (q->ev) {
        cudaEventDestroy(q->ev);
        q->ev = NULL;
    }
#endif
    dt__cm_fifo_unlink(c, q);
    dt__cm_release_req_bufs(q);
}

/* The operation is complete: copy staged results back, return buffers, count it. */
static void dt__cm_complete(dt_comm_req *q) {
    dt_comm *c = q->c;
    dt_status st = DT_OK;
    if (q->slot_out != -2 && q->tout.data && dt__cm_on_device(&q->tout) && q->path != DT__CM_NCCL) {
        dt_tensor hv;
        dt__cm_host_view(&hv, q->hout, q->et, q->tout.numel);
        st = dt_tensor_copy(c->ctx, &q->tout, &hv);
    }
#ifdef DT_NCCL
    if (q->ev) { /* (a detached call's ctx stream waits on it already) */
        if (c->ctx->cuda_stream && !q->detached) cudaStreamWaitEvent((cudaStream_t)c->ctx->cuda_stream, q->ev, 0);
        cudaEventDestroy(q->ev);
        q->ev = NULL;
    }
#endif
    if (q->kind >= 0 && q->kind < DT_COLL_COUNT && !q->internal) {
        double now = dt__cm_now();
        c->stat_calls[q->kind] += 1;
        if (q->path == DT__CM_NCCL) c->stat_nccl[q->kind] += 1;
        if (q->path == DT__CM_HIER && !q->hier_flat) c->stat_hier[q->kind] += 1;
        c->stat_bytes[q->kind] += q->stat_bytes;
        c->stat_secs[q->kind] += now - q->t0;
        if (c->observer) c->observer(c, (dt_coll)q->kind, q->stat_bytes, q->t0, now, c->observer_user);
    }
    dt__cm_fifo_unlink(c, q);
    dt__cm_release_req_bufs(q);
    q->pending = 0;
    q->status = st;
    q->done = 1;
}

/* A detached call (see "Blocking calls on NCCL" in the engine) failed after it returned: keep its
   error for the next call on c, the first one only (what follows from it adds nothing). */
static void dt__cm_late(dt_comm_req *q, dt_status st) {
    dt_comm *c = q->c;
    if (!q->detached || !st || c->late_st) return;
    c->late_st = st;
    memcpy(c->late_msg, c->ctx->last_error, sizeof c->late_msg);
    c->late_msg[sizeof c->late_msg - 1] = 0;
}

/* The status a request ends with; when its gate failed, the gate's message is the error (set
   now: the verdict may have arrived while the caller waited for something else). */
static dt_status dt__cm_said(dt_comm_req *q, dt_status st) {
    const dt_comm_req *g = q->gate;
    if (st && g && g->done && g->status == st && g->msg && g->msg[0])
        dt_ctx_set_error(q->c->ctx, st, "%s", g->msg);
    return st;
}

#ifdef DT_MPI
static dt_status dt__cm_mpi_post(dt_comm_req *q);
#endif
static dt_status dt__cm_stage(dt_comm_req *q, int need_in, int need_out);
#ifdef DT_NCCL
static dt_status dt__cm_nccl_post(dt_comm_req *q);
static dt_status dt__cm_nccl_init(dt_comm_req *q);
static const char *dt__cm_nccl_why(ncclComm_t comm);
#endif

/* Posts stage q->stage: NCCL carries the data of an NCCL operation, MPI everything else
   (headers, and the counts and verdict of an NCCL all-to-allv). */
static dt_status dt__cm_post(dt_comm_req *q) {
#ifdef DT_NCCL
    if (q->path == DT__CM_NCCL && !(q->kind == DT_COLL_ALLTOALLV && q->stage < 2)) return dt__cm_nccl_post(q);
#endif
#ifdef DT_MPI
    return dt__cm_mpi_post(q);
#else
    return dt_ctx_set_error(q->c->ctx, DT_ERR_DEVICE, "%s: group %s has %d ranks but dt was built without "
                            "DT_MPI", q->fn, q->c->name, q->c->size);
#endif
}

/* Bytes of data a header block carries on c (the same on every rank: a function of the size),
   and the block's length in words. */
static size_t dt__cm_inline_bytes(const dt_comm *c) {
    int b = 4096 / (c->size > 0 ? c->size : 1);
    b = b > DT__CM_INLINE_MAX ? DT__CM_INLINE_MAX : b < 80 ? 80 : b;
    return (size_t)(b / 8 * 8);
}
static int dt__cm_hdr_words(const dt_comm *c) { return DT__CM_REC + (int)(dt__cm_inline_bytes(c) / 8); }

/* Row pointers for a reduction over n ranks: the stack for up to 64, else q->rows (taken
   before the header went out, see dt__cm_prepare). */
#define DT__CM_ROWS(q, stack_rows) ((q)->c->size <= 64 ? (stack_rows) : (q)->rows)

#ifdef DT_MPI
/* Appends "rank 0 called X; ranks 1, 2 called Y" for the records all[r * stride], grouped by
   equality (cls: size ints of scratch). */
static void dt__cm_callers(const dt_comm *c, const int64_t *all, int stride, int64_t seq, int *cls, char *msg,
                           size_t size) {
    int r, j, n = c->size;
    char d[128];
    for (r = 0; r < n; r++) {
        cls[r] = r;
        for (j = 0; j < r; j++)
            if (memcmp(all + (size_t)r * stride, all + (size_t)j * stride, DT__CM_REC * sizeof(int64_t)) == 0) {
                cls[r] = j;
                break;
            }
    }
    for (r = 0; r < n; r++) {
        const int64_t *a = all + (size_t)r * stride;
        if (cls[r] != r) continue;
        dt__cm_cat(msg, size, "%s", r ? "; " : " ");
        dt__cm_ranks(c, msg, size, cls, r);
        dt__cm_cat(msg, size, " called %s", dt__cm_describe(a, d, sizeof d));
        if (a[0] != seq) dt__cm_cat(msg, size, " as its seq %lld", (long long)a[0]);
    }
}

/* The verdict of a gate: OK when every rank made the same call and can take part; else
   DT_ERR_COMM on every rank (they all see the same blocks), the message kept in g->msg. */
static dt_status dt__cm_verdict(dt_comm_req *g) {
    dt_comm *c = g->c;
    int n = c->size, r, differ = 0, out = 0, hw = dt__cm_hdr_words(c);
    int64_t *all = g->hdr + hw;
    const int64_t no_part = DT__CM_NO_PART | (int64_t)0xff00 | DT__CM_A2A_FLAT;
    for (r = 0; r < n; r++) {
        int64_t *a = all + (size_t)r * hw;
        if (a[1] == DT_COLL_ALLTOALLV) { /* the per-rank total of an all-to-allv may differ */
            if (a[3] > 0) g->a2av_sum += a[3]; /* (each at most INT_MAX: no overflow) */
            a[3] = 0;
        }
        if (a[5] & DT__CM_NO_PART) out = 1;
        if (memcmp(a, all, 5 * sizeof(int64_t)) != 0 || (a[5] & ~no_part) != (all[5] & ~no_part)) differ = 1;
    }
    if (!differ && !out) return DT_OK;
    g->msg[0] = 0;
    if (differ) {
        dt__cm_cat(g->msg, DT_ERROR_MAX, "%s: ranks disagree at seq %lld on group %s (size %d):", g->fn,
                   (long long)g->seq, c->name, c->size);
        dt__cm_callers(c, all, hw, g->seq, g->cls, g->msg, DT_ERROR_MAX);
    } else {
        int64_t rec[DT__CM_REC];
        char d[128];
        memcpy(rec, all, sizeof rec);
        rec[5] &= ~no_part;
        for (r = 0; r < n; r++) g->cls[r] = (all[(size_t)r * hw + 5] & DT__CM_NO_PART) != 0;
        dt__cm_cat(g->msg, DT_ERROR_MAX, "%s: %s at seq %lld on group %s (size %d) did not run: ", g->fn,
                   dt__cm_describe(rec, d, sizeof d), (long long)g->seq, c->name, c->size);
        dt__cm_ranks(c, g->msg, DT_ERROR_MAX, g->cls, 1);
        for (r = 0; r < n && !g->cls[r]; r++) {}
        dt__cm_cat(g->msg, DT_ERROR_MAX, " could not take part (%s)",
                   dt_status_name((dt_status)((all[(size_t)r * hw + 5] >> 8) & 0xff)));
    }
    dt__cm_cat(g->msg, DT_ERROR_MAX, "; this is rank %d; nothing was sent, the communicator stays usable", c->rank);
    return DT_ERR_COMM;
}

/* A new gate for q: the request, its blocks, its message and grouping scratch in one block. */
static dt_comm_req *dt__cm_gate_new(dt_comm_req *q) {
    dt_comm *c = q->c;
    size_t n = (size_t)c->size, words = (n + 1) * (size_t)dt__cm_hdr_words(c);
    size_t bytes = sizeof(dt_comm_req) + words * sizeof(int64_t) + DT_ERROR_MAX + n * sizeof(int);
    dt_comm_req *g = (dt_comm_req *)dt_alloc(c->ctx, bytes);
    if (!g) return NULL;
    dt__cm_req_init(g, c, q->kind, q->fn);
    g->is_gate = 1;
    g->internal = 1;
    g->seq = q->seq;
    g->et = q->et;
    g->op = q->op;
    g->arg = q->arg;
    g->count = q->count;
    g->hdr = (int64_t *)(void *)((char *)g + sizeof(dt_comm_req)); /* sizeof is a multiple of 8 */
    g->msg = (char *)(g->hdr + words);
    g->cls = (int *)(void *)(g->msg + DT_ERROR_MAX);
    g->msg[0] = 0;
    return g;
}
#endif

/* Local work of an operation whose data rode in its gate (path INL): every rank's block holds
   its contribution, rank order is the block order. */
static dt_status dt__cm_inline(dt_comm_req *q) {
    const dt_comm_req *g = q->gate;
    dt_comm *c = q->c;
    int n = c->size, r, hw = dt__cm_hdr_words(c);
    size_t es = dt__cm_esize(q->et);
    const void *stack_rows[64];
    const void **rows = DT__CM_ROWS(q, stack_rows);
#define DT__CM_PAYLOAD(r) ((const char *)(g->hdr + (size_t)((r) + 1) * hw + DT__CM_REC))
    switch (q->kind) {
    case DT_COLL_ALLREDUCE:
        for (r = 0; r < n; r++) rows[r] = DT__CM_PAYLOAD(r);
        dt__cm_reduce_group(c, q->hout, rows, q->count, q->et, q->op);
        break;
    case DT_COLL_REDUCE_SCATTER: {
        int64_t m = q->tout.numel;
        for (r = 0; r < n; r++) rows[r] = DT__CM_PAYLOAD(r) + (size_t)c->rank * (size_t)m * es;
        dt__cm_reduce_group(c, q->hout, rows, m, q->et, q->op);
        break;
    }
    case DT_COLL_ALLGATHER: {
        size_t b = (size_t)q->tin.numel * es;
        for (r = 0; r < n; r++)
            if (b) memcpy((char *)q->hout + (size_t)r * b, DT__CM_PAYLOAD(r), b);
        break;
    }
    case DT_COLL_BROADCAST:
        if (c->rank != q->arg && q->count) memcpy(q->hout, DT__CM_PAYLOAD(q->arg), (size_t)q->count * es);
        break;
    default: break; /* barrier: the exchange was all of it */
    }
#undef DT__CM_PAYLOAD
    return DT_OK;
}

/* An all-to-allv's counts are in (stage 0): check them against the caller's, size out, and
   give this rank's verdict for stage 1, which shows every rank every verdict, so that all stop
   together when one cannot receive: {0, total} it can; {1, total} more elements than MPI's int
   counts and displacements carry; {2 | status << 8, total} it could not take part (memory, a
   staging copy); {3, peer} a peer sent an impossible count; {4, total} (two levels) no room for
   the scratch: every rank goes flat instead. A rank whose out is too small (or
   whose recv_counts disagree) fails alone, as documented, but still receives, into scratch. */
static void dt__cm_a2av_counts(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, r;
    int64_t *rc = q->c64 + n, *v = q->c64 + 2 * n, total = 0;
    size_t es = dt__cm_esize(q->et);
    dt_status st;
    v[0] = v[1] = 0;
    for (r = 0; r < n; r++) {
        if (rc[r] < 0 || rc[r] > 2147483647) { /* a dt peer checked its counts: cannot happen */
            v[0] = 3;
            v[1] = r;
            return;
        }
        total += rc[r]; /* at most size x INT_MAX: no overflow */
    }
    v[1] = total;
    if (!c->recv_counts) c->recv_counts = (int64_t *)dt_alloc(c->ctx, (size_t)n * sizeof(int64_t));
    if (c->recv_counts) memcpy(c->recv_counts, rc, (size_t)n * sizeof(int64_t));
    for (r = 0; r < n && !q->status; r++)
        if (q->want_recv && q->want_recv[r] != rc[r])
            q->status = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: recv_counts[%d] = %lld, but rank %d sends %lld "
                                         "elements here (group %s)", q->fn, r, (long long)q->want_recv[r], r,
                                         (long long)rc[r], c->name);
    if (total > 2147483647) {
        v[0] = 1;
        return;
    }
    if (!q->status && total > q->out_cap)
        q->status = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: out has %lld elements, but %lld arrive (group %s); out "
                                     "needs at least %lld", q->fn, (long long)q->out_cap, (long long)total, c->name,
                                     (long long)total);
    if (q->status) { /* take part all the same, receiving into scratch, so that the others complete */
        q->tout.data = NULL; /* nothing to copy back */
#ifdef DT_NCCL
        if (q->path == DT__CM_NCCL) {
            dt_tensor_desc td;
            memset(&td, 0, sizeof td);
            td.dtype = (dt_dtype)q->et;
            td.device = DT_CUDA_DEVICE;
            td.shape[0] = total > 0 ? total : 1;
            st = dt_tensor_create(c->ctx, &q->dscratch, &td);
            if (st) v[0] = 2 | (int64_t)st << 8;
            q->tout.data = q->dscratch.data;
            return;
        }
#endif
        /* total * es fits a 64-bit size_t (total <= INT_MAX); a 32-bit one may not hold it */
        q->hout = (uint64_t)total * es <= (uint64_t)(size_t)-1 ? dt__cm_take(c, (size_t)total * es, &q->slot_out) : NULL;
        if (!q->hout) v[0] = 2 | (int64_t)DT_ERR_OOM << 8;
    } else if ((q->path == DT__CM_MPI || q->path == DT__CM_HIER) && (st = dt__cm_stage(q, 0, 1)) != DT_OK)
        v[0] = 2 | (int64_t)st << 8;
}

/* Every rank's verdict is in (stage 1): all go on to the data, or all stop here (agreed, so
   the communicator stays usable). */
static dt_status dt__cm_a2av_verdict(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, r;
    const int64_t *all = q->c64 + 2 * n + 2, *rc = q->c64 + n;
    int64_t off = 0;
    for (r = 0; r < n; r++) {
        int64_t code = all[2 * r] & 0xff, val = all[2 * r + 1];
        dt_status mine = (dt_status)((all[2 * r] >> 8) & 0xff);
        if (!code || code == 4) continue; /* 4: no room for two levels (dt__cm_a2a_hier_after) */
        q->agreed = 1;
        if (code == 1)
            return dt_ctx_set_error(c->ctx, r == c->rank ? DT_ERR_UNSUPPORTED : DT_ERR_COMM, "%s: rank %d would "
                                    "receive %lld elements in all on group %s (size %d); MPI counts and displacements "
                                    "are int, at most 2147483647 per call: split the exchange; nothing was sent",
                                    q->fn, r, (long long)val, c->name, c->size);
        if (code == 2)
            return dt_ctx_set_error(c->ctx, r == c->rank ? mine : DT_ERR_COMM, "%s: rank %d could not take part in "
                                    "the alltoallv on group %s (size %d): %s while making room for the %lld elements "
                                    "it receives; nothing was sent", q->fn, r, c->name, c->size, dt_status_name(mine),
                                    (long long)val);
        return dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: rank %d received an invalid count from rank %lld on group %s "
                                "(size %d); nothing was sent", q->fn, r, (long long)val, c->name, c->size);
    }
    for (r = 0; r < n; r++) { /* every total fits an int: so does every displacement */
        q->cnt[2 * n + r] = (int)rc[r];
        q->cnt[3 * n + r] = (int)off;
        off += rc[r];
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- the two-level all-to-all */

/* See "Across hosts". On a group of H hosts with L > 1 ranks on each (c->by_host: group rank
   of place l on host h at [h * L + l]), an all-to-all may go in two levels: in the host, each
   rank hands the host's rank at place l the blocks for place l of every host; across hosts,
   the ranks at place l exchange what their host has for each other. Every block that crosses
   hosts crosses once, as in the flat one, but in H - 1 messages a rank instead of (H - 1) L;
   blocks are moved, never combined, so the result is the flat one's bitwise. q->scratch holds
   X (q->hier_x elements) then Y:
     in -> X by (destination place, destination host); in the host X -> Y, which arrives by
     (source place, destination host); Y -> X by (destination host, source place); across
     hosts X -> Y, which arrives by (source host, source place); Y -> out by group rank.
   alltoall: two stages (the blocks are m each). alltoallv: stage 0 the counts in the host,
   1 the counts across hosts (every rank now knows what each sends it), 2 the verdicts (as the
   flat one's), 3 and 4 the data. q->c64 past the flat one's 4n + 2 words: sc0 (what this rank
   sends to each place, by place then host), rc0 (what each place of this host sends to this
   rank's place on each host), sc1 (by host then place), rc1 (what each rank sends here, by
   host then place), then n words of offsets. */

/* Whether q (an alltoall of `block_bytes` per rank, or an alltoallv whose blocks average it)
   takes two levels: c->hier 1 always; 0 (auto) for blocks up to DT_COMM_A2A_HIER_MAX_BYTES,
   where the number of messages, not their bytes, sets the time, and at every size from
   DT_COMM_A2A_HIER_RANKS ranks a host, where the flat one's L x L flows through a host's link
   lose packets and wait for TCP's retransmissions (bench/RESULTS.md, "the all-to-all in two
   levels": 0.21-0.24x the flat one's time at 256 KiB blocks on 2 hosts x 4 ranks, up to 1.47x
   at 2 x 2). */
static int dt__cm_a2a_hier_pays(const dt_comm_req *q, double block_bytes) {
#ifdef DT_MPI
    const dt_comm *c = q->c;
    if (!c->by_host || c->hx == MPI_COMM_NULL || c->hier < 0) return 0;
    return c->hier == 1 || c->per_host >= DT_COMM_A2A_HIER_RANKS || block_bytes <= (double)DT_COMM_A2A_HIER_MAX_BYTES;
#else
    (void)q;
    (void)block_bytes;
    return 0;
#endif
}

/* An alltoall in two levels: scratch for X and Y, in packed into X (the call's data is there).
   No room for the scratch: this rank stays flat and says so in its header, and all go flat
   (dt__cm_advance), as they would have without two levels. */
static dt_status dt__cm_a2a_hier_prepare(dt_comm_req *q) {
    dt_comm *c = q->c;
    int L = c->per_host, H = c->hosts, l, h;
    size_t es = dt__cm_esize(q->et), b = (size_t)(q->tin.numel / c->size) * es;
    char *x;
    q->hier_x = q->tin.numel;
    if ((uint64_t)q->tin.numel * es <= (uint64_t)((size_t)-1) / 2) /* (a 32-bit size_t may not hold it) */
        q->scratch = dt__cm_take(c, 2 * (size_t)q->tin.numel * es, &q->slot_scratch);
    if (!q->scratch && q->tin.numel) {
        q->hier_flat = 1;
        return DT_OK;
    }
    q->path = DT__CM_HIER;
    q->last_stage = 1;
    if (!q->scratch) return DT_OK;
    x = (char *)q->scratch;
    for (l = 0; l < L && b; l++)
        for (h = 0; h < H; h++)
            memcpy(x + (size_t)(l * H + h) * b, (const char *)q->hin + (size_t)c->by_host[h * L + l] * b, b);
    return DT_OK;
}

/* An alltoall in two levels whose header exchange is done: when a rank had no room for its
   scratch (its header says so), every rank goes flat. */
static void dt__cm_a2a_hier_room(dt_comm_req *q) {
    dt_comm *c = q->c;
    int r, hw = dt__cm_hdr_words(c);
    for (r = 0; r < c->size && !(q->gate->hdr[(size_t)(r + 1) * hw + 5] & DT__CM_A2A_FLAT); r++) {}
    if (r == c->size) return;
    dt__cm_give(c, q->slot_scratch, q->scratch, 0);
    q->slot_scratch = -2;
    q->scratch = NULL;
    q->path = DT__CM_MPI;
    q->last_stage = 0;
}

/* An alltoallv whose header exchange is done: two levels when its blocks average small (every
   rank saw every total in the headers, so all choose alike) and every relay fits an int (what a
   rank passes on is at most all the totals together). Fills sc0 from the send counts. */
static void dt__cm_a2av_hier_choose(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, L = c->per_host, H = c->hosts, l, h;
    int64_t sum = q->gate->a2av_sum, *sc0;
    double mean = (double)sum * (double)dt__cm_esize(q->et) / ((double)n * (double)n);
    if (!c->by_host || sum > 2147483647 || !dt__cm_a2a_hier_pays(q, mean)) return;
    q->path = DT__CM_HIER;
    q->last_stage = 4;
    sc0 = q->c64 + 4 * n + 2;
    for (l = 0; l < L; l++)
        for (h = 0; h < H; h++) sc0[l * H + h] = q->c64[c->by_host[h * L + l]];
}

/* The local work after each stage of the two-level path (see above). */
static dt_status dt__cm_a2a_hier_after(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, L = c->per_host, H = c->hosts, l, h, r;
    size_t es = dt__cm_esize(q->et);
    char *x = (char *)q->scratch, *y = x ? x + (size_t)q->hier_x * es : NULL;
    int64_t *sc0, *rc0, *sc1, *rc1, *off, *rcv = q->c64 ? q->c64 + n : NULL, pos;
    if (q->kind == DT_COLL_ALLTOALL) {
        size_t b = (size_t)(q->tin.numel / n) * es;
        if (!b) return DT_OK;
        if (q->stage == 0) /* Y by (source place, destination host) -> X by (host, place) */
            for (l = 0; l < L; l++)
                for (h = 0; h < H; h++) memcpy(x + (size_t)(h * L + l) * b, y + (size_t)(l * H + h) * b, b);
        else /* Y by (source host, place) -> out by group rank */
            for (h = 0; h < H; h++)
                for (l = 0; l < L; l++) memcpy((char *)q->hout + (size_t)c->by_host[h * L + l] * b, y + (size_t)(h * L + l) * b, b);
        return DT_OK;
    }
    sc0 = q->c64 + 4 * n + 2;
    rc0 = sc0 + n;
    sc1 = rc0 + n;
    rc1 = sc1 + n;
    off = rc1 + n;
    switch (q->stage) {
    case 0: /* what this host's places send to this place on each host, to that host's same place */
        for (l = 0; l < L; l++)
            for (h = 0; h < H; h++) sc1[h * L + l] = rc0[l * H + h];
        return DT_OK;
    case 1: { /* every rank's count to this one is known: the flat path's checks, then scratch */
        int64_t relay = 0, total = 0, xs, ys, *v = q->c64 + 2 * n;
        for (h = 0; h < H; h++)
            for (l = 0; l < L; l++) rcv[c->by_host[h * L + l]] = rc1[h * L + l];
        dt__cm_a2av_counts(q);
        if (v[0]) return DT_OK;
        for (r = 0; r < n; r++) {
            relay += rc0[r]; /* each at most INT_MAX, and n of them: no overflow */
            total += rcv[r];
        }
        /* X at least one element: where X is empty (this rank sends and relays nothing) Y would
           start where it does, and Open MPI's nonblocking all-to-allv reads a send buffer equal to
           the receive buffer as MPI_IN_PLACE (then it sends its receive counts: the ranks' messages
           no longer pair, and past the eager size the exchange hangs) */
        xs = q->count > relay ? q->count : relay > 0 ? relay : 1;
        ys = relay > total ? relay : total;
        q->hier_x = xs;
        if ((uint64_t)(xs + ys) * es <= (uint64_t)(size_t)-1) /* (<= 2^32 x 8 bytes: a 32-bit size_t may not hold it) */
            q->scratch = dt__cm_take(c, (size_t)(xs + ys) * es, &q->slot_scratch);
        if (!q->scratch && xs + ys) v[0] = 4; /* no room for two levels: all go flat (stage 2) */
        return DT_OK;
    }
    case 2: { /* the verdicts: then the data stages' counts (every sum fits an int: see choose) */
        int *a = q->cnt, *b = q->cnt + 4 * L;
        const int64_t *all = q->c64 + 2 * n + 2;
        dt_status st = dt__cm_a2av_verdict(q);
        if (st) return st;
        for (r = 0; r < n && (all[2 * r] & 0xff) != 4; r++) {}
        if (r < n) { /* a rank had no room for the scratch: the flat exchange as stage 3, the last */
            q->hier_flat = 1;
            q->last_stage = 3;
            return DT_OK;
        }
        for (pos = 0, r = 0; r < n; r++) { /* where each destination's block starts in in */
            off[r] = pos;
            pos += q->c64[r];
        }
        for (pos = 0, l = 0; l < L; l++) { /* in -> X by (destination place, host) */
            a[L + l] = (int)pos;
            for (h = 0; h < H; h++) {
                int g = c->by_host[h * L + l];
                if (q->c64[g]) memcpy(x + (size_t)pos * es, (const char *)q->hin + (size_t)off[g] * es, (size_t)q->c64[g] * es);
                pos += q->c64[g];
            }
            a[l] = (int)(pos - a[L + l]);
        }
        for (pos = 0, l = 0; l < L; l++) { /* from place l: its blocks for this place, by host */
            a[3 * L + l] = (int)pos;
            for (h = 0; h < H; h++) pos += rc0[l * H + h];
            a[2 * L + l] = (int)(pos - a[3 * L + l]);
        }
        for (pos = 0, h = 0; h < H; h++) { /* to host h: each place's block for it */
            b[H + h] = (int)pos;
            for (l = 0; l < L; l++) pos += rc0[l * H + h];
            b[h] = (int)(pos - b[H + h]);
        }
        for (pos = 0, h = 0; h < H; h++) { /* from host h: its places' blocks for this rank */
            b[3 * H + h] = (int)pos;
            for (l = 0; l < L; l++) pos += rc1[h * L + l];
            b[2 * H + h] = (int)(pos - b[3 * H + h]);
        }
        return DT_OK;
    }
    case 3: { /* Y by (source place, destination host) -> X by (host, place) */
        int *b = q->cnt + 4 * L;
        if (q->hier_flat) return DT_OK;
        for (h = 0; h < H; h++) off[h] = b[H + h];
        for (pos = 0, l = 0; l < L; l++)
            for (h = 0; h < H; h++) {
                int64_t k = rc0[l * H + h];
                if (k) memcpy(x + (size_t)off[h] * es, y + (size_t)pos * es, (size_t)k * es);
                off[h] += k;
                pos += k;
            }
        return DT_OK;
    }
    default: /* Y by (source host, place) -> out by group rank */
        for (pos = 0, r = 0; r < n; r++) {
            off[r] = pos;
            pos += rcv[r];
        }
        for (pos = 0, h = 0; h < H; h++)
            for (l = 0; l < L; l++) {
                int64_t k = rc1[h * L + l];
                if (k) memcpy((char *)q->hout + (size_t)off[c->by_host[h * L + l]] * es, y + (size_t)pos * es, (size_t)k * es);
                pos += k;
            }
        return DT_OK;
    }
}

#ifdef DT_MPI
/* Posts stage q->stage of the two-level path (see above). */
static dt_status dt__cm_a2a_hier_post(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, L = c->per_host, H = c->hosts, rc;
    MPI_Datatype T = dt__cm_mpi_type(q->et);
    char *x = (char *)q->scratch, *y = x ? x + (size_t)q->hier_x * dt__cm_esize(q->et) : NULL;
    const char *what;
    if (q->kind == DT_COLL_ALLTOALL) {
        int m = (int)(q->tin.numel / n);
        if (q->stage == 0) {
            what = "MPI_Ialltoall in the host";
            rc = MPI_Ialltoall(x, H * m, T, y, H * m, T, c->hh[0], &q->mreq);
        } else {
            what = "MPI_Ialltoall across hosts";
            rc = MPI_Ialltoall(x, L * m, T, y, L * m, T, c->hx, &q->mreq);
        }
    } else {
        int64_t *k = q->c64 + 4 * n + 2;
        int *a = q->cnt, *b = q->cnt + 4 * L;
        switch (q->stage) {
        case 0:
            what = "MPI_Ialltoall of the counts in the host";
            rc = MPI_Ialltoall(k, H, MPI_INT64_T, k + n, H, MPI_INT64_T, c->hh[0], &q->mreq);
            break;
        case 1:
            what = "MPI_Ialltoall of the counts across hosts";
            rc = MPI_Ialltoall(k + 2 * n, L, MPI_INT64_T, k + 3 * n, L, MPI_INT64_T, c->hx, &q->mreq);
            break;
        case 2:
            what = "MPI_Iallgather of the verdicts";
            rc = MPI_Iallgather(q->c64 + 2 * n, 2, MPI_INT64_T, q->c64 + 2 * n + 2, 2, MPI_INT64_T, c->mc[1], &q->mreq);
            break;
        case 3:
            if (q->hier_flat) { /* (as the flat path's stage 2, on its communicator) */
                what = "MPI_Ialltoallv";
                rc = MPI_Ialltoallv(q->hin, q->cnt, q->cnt + n, T, q->hout, q->cnt + 2 * n, q->cnt + 3 * n, T, c->mc[2],
                                    &q->mreq);
                break;
            }
            what = "MPI_Ialltoallv in the host";
            rc = MPI_Ialltoallv(x, a, a + L, T, y, a + 2 * L, a + 3 * L, T, c->hh[1], &q->mreq);
            break;
        default:
            what = "MPI_Ialltoallv across hosts";
            rc = MPI_Ialltoallv(x, b, b + H, T, y, b + 2 * H, b + 3 * H, T, c->hx, &q->mreq);
            break;
        }
    }
    if (rc != MPI_SUCCESS) return dt__cm_mpi_error(c, rc, q->fn, what);
    q->pending = 1;
    return DT_OK;
}
#endif

/* Work between stages, and after the last one. */
static dt_status dt__cm_after_stage(dt_comm_req *q) {
    dt_comm *c = q->c;
    size_t es = dt__cm_esize(q->et);
    int n = c->size;
#ifdef DT_MPI
    if (q->is_gate) return dt__cm_verdict(q);
#endif
    if ((q->kind == DT_COLL_ALLREDUCE && (q->path == DT__CM_GATHER || (q->path == DT__CM_A2A && q->stage == 0))) ||
        (q->kind == DT_COLL_REDUCE_SCATTER && q->path == DT__CM_MPI)) {
        /* rank r's contribution: its row of scratch; this rank's own never left its buffer */
        const void *stack_rows[64];
        const void **rows = DT__CM_ROWS(q, stack_rows);
        int r, *rd = q->cnt ? q->cnt + 3 * n : NULL;
        char *mine, *dst;
        int64_t m;
        if (q->path == DT__CM_GATHER) {
            m = q->count;
            mine = (char *)q->hout;
            dst = mine;
        } else if (q->kind == DT_COLL_ALLREDUCE) {
            m = q->count / n + (c->rank < q->count % n);
            mine = (char *)q->hout + (size_t)q->cnt[n + c->rank] * es;
            dst = mine;
        } else {
            m = q->tout.numel;
            mine = (char *)q->hin + (size_t)c->rank * (size_t)m * es;
            dst = (char *)q->hout;
        }
        for (r = 0; r < n; r++)
            rows[r] = r == c->rank ? (const void *)mine
                                   : (const void *)((const char *)q->scratch + (size_t)(rd ? rd[r] : (int64_t)r * m) * es);
        dt__cm_reduce_group(c, dst, rows, m, q->et, q->op);
    } else if (q->path == DT__CM_HIER && q->kind != DT_COLL_ALLREDUCE) {
        return dt__cm_a2a_hier_after(q);
    } else if (q->path == DT__CM_HIER && q->stage <= 1) {
        /* stage 0: the host's ranks' slices, in rank order; stage 1: the hosts' partial sums of
           the sub-slice, in host order, then avg's division by the group's size */
        const void *stack_rows[64];
        const void **rows = DT__CM_ROWS(q, stack_rows);
        int k, m = q->stage == 0 ? c->per_host : c->hosts, me = q->stage == 0 ? c->host_local : c->host_index;
        int *w = q->stage == 0 ? q->cnt : q->cnt + 4 * c->per_host;
        int64_t len = q->stage == 0 ? q->count / m + (me < q->count % m) : 0;
        char *mine = (char *)q->hout + (size_t)w[m + me] * es;
        if (q->stage == 1) {
            int64_t m0 = q->count / c->per_host + (c->host_local < q->count % c->per_host);
            len = m0 / m + (me < m0 % m);
        }
        for (k = 0; k < m; k++)
            rows[k] = k == me ? (const void *)mine : (const void *)((const char *)q->scratch + (size_t)w[3 * m + k] * es);
        dt__cm_reduce(mine, rows, m, len, q->et, q->op == DT_REDUCE_AVG ? DT_REDUCE_SUM : q->op);
        if (q->stage == 1 && q->op == DT_REDUCE_AVG) {
            int64_t i;
            if (q->et == DT_F32) {
                float fn = (float)n, *x = (float *)mine;
                for (i = 0; i < len; i++) x[i] = x[i] / fn;
            } else {
                double *x = (double *)mine;
                for (i = 0; i < len; i++) x[i] = x[i] / (double)n;
            }
        }
    } else if (q->kind == DT_COLL_ALLTOALLV && q->stage == 0) {
        dt__cm_a2av_counts(q);
    } else if (q->kind == DT_COLL_ALLTOALLV && q->stage == 1) {
        return dt__cm_a2av_verdict(q);
    }
    return DT_OK;
}

#ifdef DT_MPI
/* A recv's message has been found: receive it when it has exactly t's size; otherwise take it
   off the wire (so that it cannot match a later recv), write nothing to t and fail. Probing
   first is what keeps a longer message out of t: MPI's single-copy path (CMA) writes a
   truncated message past the end of the buffer. */
static void dt__cm_recv_found(dt_comm_req *q, MPI_Message *msg, MPI_Status *ms) {
    dt_comm *c = q->c;
    size_t es = dt__cm_esize(q->et), want = (size_t)q->count * es;
    int bytes = 0, rc;
    MPI_Get_count(ms, MPI_BYTE, &bytes);
    if (bytes >= 0 && (size_t)bytes == want) {
        rc = MPI_Imrecv(q->hout, (int)q->count, dt__cm_mpi_type(q->et), msg, &q->mreq);
        if (rc != MPI_SUCCESS) dt__cm_fail(q, dt__cm_mpi_error(c, rc, q->fn, "MPI_Imrecv"));
        return;
    }
    {
        void *sink = bytes > 0 ? dt_alloc(c->ctx, (size_t)bytes) : NULL;
        char got[64];
        if (bytes > 0 && !sink) { /* cannot take it off the wire: it would match the next recv */
            c->broken = 1;
            snprintf(c->broken_msg, sizeof c->broken_msg, "a message of the wrong size from rank %d (tag %d) could "
                     "not be received (out of memory)", q->arg, q->tag);
            dt__cm_fail(q, DT_ERR_OOM);
            return;
        }
        MPI_Mrecv(sink, bytes > 0 ? bytes : 0, MPI_BYTE, msg, MPI_STATUS_IGNORE);
        dt_release(c->ctx, sink);
        if (bytes >= 0 && (size_t)bytes % es == 0)
            snprintf(got, sizeof got, "%lld x %s", (long long)((size_t)bytes / es), dt__cm_ename(q->et));
        else
            snprintf(got, sizeof got, "%d bytes", bytes);
        dt__cm_fail(q, dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: the message from rank %d (tag %d) on group %s has "
                                        "%s; t has %lld x %s: the sizes must match, nothing was written to t",
                                        q->fn, q->arg, q->tag, c->name, got, (long long)q->count,
                                        dt__cm_ename(q->et)));
    }
}
#endif

/* One step of q: test what is in flight; when it is done, do the local work and post the next
   stage (only when allowed, see above) or complete. */
static void dt__cm_advance(dt_comm_req *q, int may_post0, int may_post) {
    dt_comm *c = q->c;
    dt_status st;
    if (q->done) return;
    if (q->stage < 0) { /* nothing posted yet: waits for its gate, then for its turn */
        if (q->gate) {
            if (!q->gate->done) return;
            if (q->gate->status) {
                dt__cm_fail(q, q->gate->status);
                return;
            }
        }
        if (q->path == DT__CM_INL) {
            st = dt__cm_inline(q);
            if (st) dt__cm_fail(q, st);
            else dt__cm_complete(q);
            return;
        }
        if (!may_post0) return;
        if (c->broken) {
            dt__cm_fail(q, DT_ERR_STATE);
            return;
        }
        if (q->kind == DT_COLL_ALLTOALLV && q->path == DT__CM_MPI && q->gate) dt__cm_a2av_hier_choose(q);
        if (q->kind == DT_COLL_ALLTOALL && q->path == DT__CM_HIER && q->gate) dt__cm_a2a_hier_room(q);
        q->stage = 0;
        st = dt__cm_post(q);
        if (st) dt__cm_fail(q, st);
        return;
    }
    if (q->pending) {
#ifdef DT_NCCL
        if (q->path == DT__CM_NCCL && q->ev) {
            cudaError_t e = cudaEventQuery(q->ev);
            if (e == cudaErrorNotReady) {
                ncclResult_t ar = ncclSuccess;
                if (c->nccl) ncclCommGetAsyncError(c->nccl, &ar);
                if (ar == ncclSuccess || ar == ncclInProgress) return;
                {   /* NCCL's operations never complete now: abort them; the group is unusable */
                    char what[96];
                    int64_t rec[DT__CM_REC];
                    dt_status st2;
                    dt__cm_record(q, rec);
                    dt__cm_describe(rec, what, sizeof what);
                    st2 = dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: %s at seq %lld failed in NCCL on group %s (size "
                                           "%d): ncclCommGetAsyncError: %s %s; the communicator is unusable now", q->fn,
                                           what, (long long)q->seq, c->name, c->size, ncclGetErrorString(ar),
                                           dt__cm_nccl_why(c->nccl));
                    ncclCommAbort(c->nccl);
                    c->nccl = NULL;
                    c->broken = 1;
                    snprintf(c->broken_msg, sizeof c->broken_msg, "%s at seq %lld failed in NCCL (%s)", what,
                             (long long)q->seq, ncclGetErrorString(ar));
                    dt__cm_fail(q, st2);
                    dt__cm_late(q, st2);
                }
                return;
            }
            if (e != cudaSuccess) {
                dt_status st2 = dt_ctx_set_error(c->ctx, DT_ERR_CUDA, "%s: waiting for NCCL (%s) on group %s: %s", q->fn,
                                                 dt_coll_name((dt_coll)q->kind), c->name, cudaGetErrorString(e));
                dt__cm_fail(q, st2);
                dt__cm_late(q, st2);
                return;
            }
            q->pending = 0;
        }
#endif
#ifdef DT_MPI
        if (q->pending && q->probing) {
            int flag = 0, rc;
            MPI_Message msg;
            MPI_Status ms;
            rc = MPI_Improbe(q->arg, q->tag, c->mc[0], &flag, &msg, &ms);
            if (rc != MPI_SUCCESS) {
                dt__cm_fail(q, dt__cm_mpi_error(c, rc, q->fn, "MPI_Improbe"));
                return;
            }
            if (!flag) return;
            q->probing = 0;
            dt__cm_recv_found(q, &msg, &ms);
            if (q->done) return;
        }
        if (q->pending) {
            int flag = 0, rc;
            rc = MPI_Test(&q->mreq, &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) {
                dt__cm_fail(q, dt__cm_mpi_error(c, rc, q->fn, "MPI_Test"));
                return;
            }
            if (!flag) return;
            q->pending = 0;
        }
#endif
    }
    if (q->stage < q->last_stage && !may_post) return;
    st = dt__cm_after_stage(q);
    if (st) {
        dt__cm_fail(q, st);
        return;
    }
    if (q->stage == q->last_stage) {
        dt_status keep = q->status;
        dt__cm_complete(q);
        if (keep && !q->status) q->status = keep;
        return;
    }
    if (c->broken) {
        dt__cm_fail(q, DT_ERR_STATE);
        return;
    }
    q->stage++;
    st = dt__cm_post(q);
    if (st) dt__cm_fail(q, st);
}

/* Advances everything in flight on c, in posting order. */
static void dt__cm_progress(dt_comm *c) {
    dt_comm_req *q = c->fifo, *next;
    int may_post0 = 1, may_post = 1;
    while (q) {
        next = q->next;
        dt__cm_advance(q, may_post0, may_post);
        if (!q->done) {
            if (q->stage < 0 && q->path != DT__CM_INL) may_post0 = 0;
            if (q->stage < q->last_stage) may_post = 0;
        }
        q = next;
    }
}

static dt_status dt__cm_p2p_timeout(dt_comm_req *q, int why) {
    dt_comm *c = q->c;
    const char *fn = q->fn;
    int to = q->kind == DT_COLL_SEND;
#ifdef DT_MPI
    if (q->pending && !q->probing) { /* cancel: a cancelled request leaves the communicator clean */
        int done = 0, cancelled = 0;
        double end = dt__cm_now() + (c->broken ? 0.0 : 0.5); /* once broken, a clean cancel saves nothing */
        MPI_Status ms;
        MPI_Cancel(&q->mreq);
        while (!done && dt__cm_now() < end) MPI_Test(&q->mreq, &done, &ms);
        if (done) MPI_Test_cancelled(&ms, &cancelled);
        q->pending = 0;
        if (!done) { /* MPI still owns the buffer: nothing can be trusted on this communicator */
            c->broken = 1;
            snprintf(c->broken_msg, sizeof c->broken_msg, "a %s that timed out could not be cancelled", dt_coll_name((dt_coll)q->kind));
            dt__cm_give(c, q->slot_in, q->hin, 1);
            dt__cm_give(c, q->slot_out, q->hout, 1);
            q->slot_in = q->slot_out = -2;
        }
    }
#endif
    dt__cm_fail(q, DT_ERR_TIMEOUT);
    dt__cm_timed_out_at = dt__cm_now();
    return dt_ctx_set_error(c->ctx, DT_ERR_TIMEOUT, "%s: %s of %lld x %s %s rank %d (tag %d) on group %s (size %d) "
                            "did not complete %s %.3g s%s (no matching %s on rank %d)", fn,
                            dt_coll_name((dt_coll)q->kind), (long long)q->count, dt__cm_ename(q->et),
                            to ? "to" : "from", q->arg, q->tag, c->name, c->size,
                            why == 2 ? "by the deadline set" : "within", why == 2 ? c->deadline[1] : c->timeout,
                            why == 2 ? " before (dt_comm_set_deadline)" : "", to ? "dt_comm_recv" : "dt_comm_send", q->arg);
}

/* Whether q is complete; a chunked operation is when all its chunks are (it then takes the
   first error among them and counts itself in the statistics). */
static int dt__cm_done(dt_comm_req *q) {
    int k;
    if (q->done || !q->nkids) return q->done;
    for (k = 0; k < q->nkids; k++)
        if (!q->kids[k]->done) return 0;
    for (k = 0; k < q->nkids && !q->status; k++) q->status = q->kids[k]->status;
    q->done = 1;
    if (!q->status) {
        double now = dt__cm_now();
        q->c->stat_calls[q->kind] += 1;
        q->c->stat_bytes[q->kind] += q->stat_bytes;
        q->c->stat_secs[q->kind] += now - q->t0;
        if (q->kids[0]->path == DT__CM_HIER) q->c->stat_hier[q->kind] += 1;
        if (q->c->observer) q->c->observer(q->c, (dt_coll)q->kind, q->stat_bytes, q->t0, now, q->c->observer_user);
    }
    return 1;
}

static void dt__cm_free_kids(dt_comm_req *q) {
    int k;
    for (k = 0; k < q->nkids; k++) {
        dt__cm_fifo_unlink(q->c, q->kids[k]);
        dt__cm_release_req_bufs(q->kids[k]);
        dt_release(q->c->ctx, q->kids[k]);
    }
    dt_release(q->c->ctx, q->kids);
    q->kids = NULL;
    q->nkids = 0;
}

/* Whether q may return to a blocking caller before it completes: an NCCL operation whose last
   stage is queued on the communication stream, without an error of its own to return. */
static int dt__cm_deferrable(const dt_comm_req *q) {
#ifdef DT_NCCL
    return q->path == DT__CM_NCCL && !q->done && !q->nkids && !q->status && q->ev && q->pending &&
           q->stage == q->last_stage;
#else
    (void)q;
    return 0;
#endif
}

/* A wait loop's pause after a look that found its operation not done: none for the first 64
   looks (a small collective completes in microseconds), then the core is given away, by
   sched_yield until the wait is 1 ms old, then 50 us sleeps. MPI (Open MPI's TCP and shared
   memory) moves data only inside MPI calls, so the loop must keep looking; but a rank that
   spins keeps the core from the rank it waits for when ranks share cores (oversubscribed), and
   from the OS's TCP work. The pause adds at most ~50 us to a wait already 1 ms old. */
static void dt__cm_backoff(unsigned *looks, double waited) {
    if (++*looks <= 64) return;
#if defined(DT__CM_CLOCK) && DT__CM_CLOCK == 1
    if (waited < 1e-3) sched_yield();
    else {
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = 50000;
        nanosleep(&ts, NULL);
    }
#elif defined(DT__CM_CLOCK) && DT__CM_CLOCK == 2
    if (waited < 1e-3) sched_yield();
    else {
        struct dt__cm_timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = 50000;
        nanosleep(&ts, NULL);
    }
#else
    (void)waited; /* no POSIX clocks: keep looking */
#endif
}

/* Waits for q with the comm's timeout, reading notices every few milliseconds; until_queued: only
   until q is deferrable (the host waits for MPI's part, the header and counts, not the device). */
static dt_status dt__cm_wait_loop(dt_comm_req *q, int until_queued);
static dt_status dt__cm_wait_until(dt_comm_req *q, int until_queued) {
    dt_comm *c = q->c;
    double t0 = dt__cm_now();
    dt_status st = dt__cm_wait_loop(q, until_queued);
    c->wait_s += dt__cm_now() - t0;
    return st;
}
static dt_status dt__cm_wait_loop(dt_comm_req *q, int until_queued) {
    dt_comm *c = q->c;
    double start = dt__cm_now(), next_serve = start + DT__CM_SERVE_S;
    unsigned looks = 0;
    int why;
#ifdef DT_NCCL
    /* the host polls until the device has run the collective: a wait like dt_ctx_sync's */
    if (!until_queued && q->path == DT__CM_NCCL && !dt__cm_done(q)) c->ctx->counters.syncs++;
#endif
    for (;;) {
        double t;
        if (until_queued && dt__cm_deferrable(q)) break; /* (before progress looks at its event) */
        dt__cm_progress(c);
        if (dt__cm_done(q) || (until_queued && dt__cm_deferrable(q))) break;
        t = dt__cm_now();
        if (t >= next_serve) {
            next_serve = t + DT__CM_SERVE_S;
            dt__cm_serve(c);
            if (q->seq > 0 && c->failed_seq > 0 && q->seq >= c->failed_seq) return dt__cm_abandon(q, c->failed_rank);
        }
        if ((why = dt__cm_expired(c, start, t)) != 0)
            return q->seq > 0 ? dt__cm_abandon(q, -why) : dt__cm_p2p_timeout(q, why);
        dt__cm_backoff(&looks, t - start);
    }
    return q->status;
}
static dt_status dt__cm_wait(dt_comm_req *q) { return dt__cm_wait_until(q, 0); }

/* Blocking calls on NCCL. A blocking call whose data goes through NCCL returns once its work is
   queued: the ctx stream waits for its event (cudaStreamWaitEvent), so everything the caller
   queues next sees the result, and the host does not wait for the device. The request then
   lives on the heap, in c->late, until the device has run it: progress completes it as for an
   async one (statistics, observer, event), its timeout still counts from its start, an NCCL
   error is kept and returned by the next call on c (dt__cm_usable), and dt__cm_reap frees it.
   dt_comm_wait does the same with an async request (on_heap: it is there already). */
static int dt__cm_detach(dt_comm_req *q, int on_heap) {
#ifdef DT_NCCL
    dt_comm *c = q->c;
    dt_comm_req *h = q, **pp;
    if (!dt__cm_deferrable(q)) return 0;
    if (!on_heap && (h = (dt_comm_req *)dt_alloc(c->ctx, sizeof *h)) == NULL) return 0; /* the host waits instead */
    if (cudaStreamWaitEvent((cudaStream_t)c->ctx->cuda_stream, q->ev, 0) != cudaSuccess) {
        if (!on_heap) dt_release(c->ctx, h);
        return 0;
    }
    if (!on_heap) {
        *h = *q;
        for (pp = &c->fifo; *pp; pp = &(*pp)->next)
            if (*pp == q) {
                *pp = h;
                break;
            }
    }
    h->detached = 1;
    h->late_next = NULL;
    dt__cm_drop_gate(h); /* its verdict is in: the data was posted */
    for (pp = &c->late; *pp; pp = &(*pp)->late_next) {}
    *pp = h;
    return 1;
#else
    (void)q;
    (void)on_heap;
    return 0;
#endif
}

/* Finishes c's detached calls that are complete and frees them. mode 0: only looks (a call
   past its timeout, or one another rank gave up on, is abandoned as a waiting call would be);
   1: the host waits for each (a counted sync when it is still running); 2: waits, or on a
   broken communicator gives them up (dt_comm_free). A failure is kept in c->late_st. */
static void dt__cm_reap(dt_comm *c, int mode) {
    dt_comm_req *q, **pp;
    double t;
    if (!c->late) return;
    dt__cm_progress(c);
    t = dt__cm_now();
    if (!mode) dt__cm_serve(c);
    for (q = c->late; q; q = q->late_next) {
        dt_status st = DT_OK;
        if (q->done) continue;
        if (c->broken) {
            if (mode < 2) continue;
            dt__cm_fifo_unlink(c, q);
            q->done = 1;
            q->status = DT_ERR_STATE;
            continue;
        }
        if (mode) st = dt__cm_wait(q);
        else {
            if (q->seq > 0 && c->failed_seq > 0 && q->seq >= c->failed_seq) st = dt__cm_abandon(q, c->failed_rank);
            else if (dt__cm_expired(c, q->t0, t)) {
                int why = dt__cm_expired(c, q->t0, t);
                st = q->seq > 0 ? dt__cm_abandon(q, -why) : dt__cm_p2p_timeout(q, why);
            }
        }
        dt__cm_late(q, st);
    }
    pp = &c->late;
    while ((q = *pp) != NULL) {
        if (!q->done) {
            pp = &q->late_next;
            continue;
        }
        *pp = q->late_next;
        dt__cm_fifo_unlink(c, q);
#ifdef DT_NCCL
        if (q->ev) cudaEventDestroy(q->ev);
#endif
        dt__cm_release_req_bufs(q);
        dt_release(c->ctx, q);
    }
}

#ifdef DT_MPI
/* Waits for one MPI request outside the stage machine (checks, splits, NCCL ids), with the
   same timeout and reports, blamed on q. */
static dt_status dt__cm_wait_ctl_loop(dt_comm_req *q, MPI_Request *r, const char *what);
static dt_status dt__cm_wait_ctl(dt_comm_req *q, MPI_Request *r, const char *what) {
    dt_comm *c = q->c;
    double t0 = dt__cm_now();
    dt_status st = dt__cm_wait_ctl_loop(q, r, what);
    c->wait_s += dt__cm_now() - t0;
    return st;
}
static dt_status dt__cm_wait_ctl_loop(dt_comm_req *q, MPI_Request *r, const char *what) {
    dt_comm *c = q->c;
    double start = dt__cm_now(), next_serve = start + DT__CM_SERVE_S;
    unsigned looks = 0;
    for (;;) {
        int flag = 0, rc;
        double t;
        rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return dt__cm_mpi_error(c, rc, q->fn, what);
        if (flag) return DT_OK;
        dt__cm_progress(c);
        t = dt__cm_now();
        if (t >= next_serve) {
            next_serve = t + DT__CM_SERVE_S;
            dt__cm_serve(c);
            if (c->failed_seq > 0 && q->seq >= c->failed_seq) return dt__cm_abandon(q, c->failed_rank);
        }
        if (dt__cm_expired(c, start, t)) return dt__cm_abandon(q, -dt__cm_expired(c, start, t));
        dt__cm_backoff(&looks, t - start);
    }
}

/* Checking mode: every rank shows its record; any difference fails every rank, nothing sent. */
static dt_status dt__cm_check(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, r, rc, *cls, differ = 0;
    int64_t mine[DT__CM_REC], *all;
    MPI_Request mr;
    dt_status st;
    char msg[DT_ERROR_MAX];
    if (n == 1) return DT_OK;
    dt__cm_record(q, mine);
    all = (int64_t *)dt_alloc(c->ctx, (size_t)n * (DT__CM_REC * sizeof(int64_t) + sizeof(int)));
    if (!all) return DT_ERR_OOM;
    cls = (int *)(all + (size_t)n * DT__CM_REC);
    rc = MPI_Iallgather(mine, DT__CM_REC, MPI_INT64_T, all, DT__CM_REC, MPI_INT64_T, c->ctl, &mr);
    if (rc != MPI_SUCCESS) {
        dt_release(c->ctx, all);
        return dt__cm_mpi_error(c, rc, q->fn, "MPI_Iallgather (checking mode)");
    }
    st = dt__cm_wait_ctl(q, &mr, "MPI_Iallgather (checking mode)");
    if (st) {
        dt_release(c->ctx, all);
        return st;
    }
    for (r = 0; r < n; r++) {
        int64_t *a = all + (size_t)r * DT__CM_REC;
        if (a[1] == DT_COLL_ALLTOALLV) a[3] = 0; /* per-rank counts legitimately differ */
        if ((a[5] & DT__CM_BAD_ARGS) || memcmp(a, all, sizeof mine) != 0) differ = 1;
    }
    if (!differ) {
        dt_release(c->ctx, all);
        return DT_OK;
    }
    msg[0] = 0;
    dt__cm_cat(msg, sizeof msg, "%s: ranks disagree at seq %lld on group %s (size %d):", q->fn, (long long)q->seq,
               c->name, c->size);
    dt__cm_callers(c, all, DT__CM_REC, q->seq, cls, msg, sizeof msg);
    dt_release(c->ctx, all);
    return dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s (checking mode: nothing was sent)", msg);
}
#endif

/* Enters a collective: serves notices, numbers it, runs the check. local_st is this rank's own
   verdict on its arguments (in checking mode the rank still joins the check, so the others
   learn of it instead of waiting). */
static dt_status dt__cm_enter(dt_comm_req *q, dt_status local_st) {
    dt_comm *c = q->c;
    dt_status st;
    char saved[DT_ERROR_MAX];
    if (local_st && !c->check) return local_st;
    dt__cm_serve(c);
    if (c->failed_seq > 0 && c->seq + 1 >= c->failed_seq) {
        c->broken = 1;
        snprintf(c->broken_msg, sizeof c->broken_msg, "rank %d timed out at seq %lld", c->failed_rank,
                 (long long)c->failed_seq);
        return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: group %s (size %d) is unusable: rank %d timed out at seq "
                                "%lld, so this collective (seq %lld) cannot complete", q->fn, c->name, c->size,
                                c->failed_rank, (long long)c->failed_seq, (long long)(c->seq + 1));
    }
    q->seq = ++c->seq;
    q->bad_here = local_st != 0;
    dt__cm_record(q, c->hist[q->seq % DT__CM_HIST]);
    if (!c->check) return DT_OK;
    memcpy(saved, c->ctx->last_error, sizeof saved);
#ifdef DT_MPI
    st = dt__cm_check(q);
#else
    st = DT_OK;
#endif
    if (local_st) { /* this rank's own error is the one to report here */
        memcpy(c->ctx->last_error, saved, sizeof saved);
        c->ctx->last_status = local_st;
        return local_st;
    }
    return st;
}

static dt_status dt__cm_usable(dt_comm *c, const char *fn) {
    if (!c) return DT_ERR_ARG;
    dt__cm_reap(c, 0);
    if (c->late_st) {
        dt_status st = c->late_st;
        c->late_st = DT_OK;
        return dt_ctx_set_error(c->ctx, st, "%s: an earlier blocking call on group %s failed after it returned (a "
                                "device collective completes in stream order): %s", fn, c->name, c->late_msg);
    }
    if (c->broken)
        return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: group %s (size %d) is unusable: %s", fn, c->name, c->size,
                                c->broken_msg);
    return DT_OK;
}

static dt_status dt__cm_tensor_ok(dt_comm *c, const dt_tensor *t, const char *fn, const char *arg) {
    int et;
    if (!t) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: %s is NULL", fn, arg);
    if (!t->data && t->numel > 0)
        return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: %s has no data (freed or never created)", fn, arg);
    if (t->numel < 0) return dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: %s.numel = %lld; expected >= 0", fn, arg,
                                              (long long)t->numel);
    et = dt__cm_et(t->dtype);
    if (et != DT_F32 && et != DT_BF16 && et != DT_F16 && et != DT_I32 && et != DT_I64 && et != DT_U8)
        return dt_ctx_set_error(c->ctx, DT_ERR_DTYPE, "%s: %s has dtype %d; expected f32, bf16, f16, i32, i64 or u8", fn,
                                arg, (int)t->dtype);
    if (t->device == DT_CUDA_DEVICE) {
#ifndef DT_CUDA
        return dt_ctx_set_error(c->ctx, DT_ERR_DEVICE, "%s: %s is on cuda, but dt was built without DT_CUDA", fn, arg);
#endif
    } else if (t->device != DT_CPU && t->device != DT_DEVICE_DEFAULT)
        return dt_ctx_set_error(c->ctx, DT_ERR_DEVICE, "%s: %s.device = %d is not a dt_device", fn, arg, (int)t->device);
    if (t->numel > 2147483647)
        return dt_ctx_set_error(c->ctx, DT_ERR_UNSUPPORTED, "%s: %s has %lld elements; MPI counts are int, at most "
                                "2147483647 per call: split the tensor", fn, arg, (long long)t->numel);
    return DT_OK;
}

static dt_status dt__cm_op_ok(dt_comm *c, dt_reduce_op op, int et, const char *fn) {
    if ((int)op < 0 || op >= DT_REDUCE_OP_COUNT)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: op = %d is not a dt_reduce_op (sum, avg, max, min)", fn, (int)op);
    if (op == DT_REDUCE_AVG && !dt__cm_is_float(et))
        return dt_ctx_set_error(c->ctx, DT_ERR_DTYPE, "%s: op avg on %s; avg is defined for f32, bf16 and f16 (use sum "
                                "and divide)", fn, dt__cm_ename(et));
    return DT_OK;
}

static dt_status dt__cm_same_dtype(dt_comm *c, const dt_tensor *out, const dt_tensor *in, const char *fn) {
    if (dt__cm_et(out->dtype) != dt__cm_et(in->dtype))
        return dt_ctx_set_error(c->ctx, DT_ERR_DTYPE, "%s: out has dtype %s, in has %s; expected the same dtype", fn,
                                dt_dtype_name(out->dtype), dt_dtype_name(in->dtype));
    return DT_OK;
}

static int dt__cm_overlap(const dt_tensor *a, const dt_tensor *b) {
    const char *pa = (const char *)a->data, *pb = (const char *)b->data;
    size_t na = dt_tensor_bytes(a), nb = dt_tensor_bytes(b);
    if (!pa || !pb || na == 0 || nb == 0 || a->device != b->device) return 0;
    return pa < pb + nb && pb < pa + na;
}

/* Host memory the MPI path reads (in) and writes (out): the tensor's own, or a staging copy of a
   device tensor. */
static dt_status dt__cm_stage(dt_comm_req *q, int need_in, int need_out) {
    dt_comm *c = q->c;
    size_t es = dt__cm_esize(q->et);
    if (need_in) {
        if (dt__cm_on_device(&q->tin)) {
            dt_tensor hv;
            dt_status st;
            q->hin = dt__cm_take(c, (size_t)q->tin.numel * es, &q->slot_in);
            if (!q->hin) return DT_ERR_OOM;
            dt__cm_host_view(&hv, q->hin, q->et, q->tin.numel);
            st = dt_tensor_copy(c->ctx, &hv, &q->tin);
            if (st) return st;
        } else q->hin = q->tin.data;
    }
    if (need_out) {
        if (dt__cm_on_device(&q->tout)) {
            /* in place with equal sizes (all-reduce, broadcast): one staging buffer. An all-gather
               whose in is its own block of out starts at the same address but is smaller: it
               gets a buffer of out's size, else the result would overrun in's. */
            if (need_in && q->tout.data == q->tin.data && q->tout.numel == q->tin.numel) {
                q->hout = q->hin;
                q->slot_out = q->slot_in;
                q->slot_in = -2;
            } else {
                q->hout = dt__cm_take(c, (size_t)q->tout.numel * es, &q->slot_out);
                if (!q->hout) return DT_ERR_OOM;
            }
        } else q->hout = q->tout.data;
    }
    return DT_OK;
}

/* Local work of a one-rank group (any build): copies where the collective moves data. */
static dt_status dt__cm_run_local(dt_comm_req *q) {
    dt_comm *c = q->c;
    dt_status st = DT_OK;
    switch (q->kind) {
    case DT_COLL_REDUCE_SCATTER: case DT_COLL_ALLGATHER: case DT_COLL_ALLTOALL:
        st = dt_tensor_copy(c->ctx, &q->tout, &q->tin);
        break;
    case DT_COLL_ALLTOALLV: {
        dt_tensor a, b;
        int64_t k = q->want_send[0];
        if (!c->recv_counts) c->recv_counts = (int64_t *)dt_alloc(c->ctx, sizeof(int64_t));
        if (c->recv_counts) c->recv_counts[0] = k;
        if (q->want_recv && q->want_recv[0] != k)
            return dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: recv_counts[0] = %lld, but rank 0 sends %lld elements "
                                    "here (group %s)", q->fn, (long long)q->want_recv[0], (long long)k, c->name);
        if (k > q->tout.numel)
            return dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: out has %lld elements, but %lld arrive (group %s); out "
                                    "needs at least %lld", q->fn, (long long)q->tout.numel, (long long)k, c->name,
                                    (long long)k);
        if (k == 0) break;
        st = dt_tensor_view(c->ctx, &a, &q->tout, 0, 1, &k);
        if (!st) st = dt_tensor_view(c->ctx, &b, &q->tin, 0, 1, &k);
        if (!st) st = dt_tensor_copy(c->ctx, &a, &b);
        break;
    }
    default: break; /* allreduce, broadcast, barrier of one rank: nothing moves (x / 1 = x) */
    }
    return st;
}


/* The path of q: one rank, NCCL for device tensors when the comm has it, else MPI (refined to
   INL, GATHER or A2A by dt__cm_prepare). */
static int dt__cm_path(const dt_comm_req *q) {
    const dt_comm *c = q->c;
    int devs = (q->tin.data || q->tin.numel ? dt__cm_on_device(&q->tin) : 1) &&
               (q->tout.data || q->tout.numel ? dt__cm_on_device(&q->tout) : 1) &&
               (dt__cm_on_device(&q->tin) || dt__cm_on_device(&q->tout));
#ifdef DT_NCCL
    if (c->nccl_mode && devs && q->kind != DT_COLL_BARRIER && q->et != DT__CM_F64)
        return c->size == 1 && q->kind == DT_COLL_ALLTOALLV ? DT__CM_LOCAL : DT__CM_NCCL;
#endif
    (void)devs;
    return c->size == 1 ? DT__CM_LOCAL : DT__CM_MPI;
}

/* The host-aware all-reduce (see "Across hosts"): on a group that spans hosts with the same
   number of ranks on each (dt__cm_mpi_hosts made its communicators), for f32, f64 and integers
   (bf16 and f16 would be rounded between the levels), when c->hier asks for it: always (1), or
   where a flat all-reduce would take its all-to-all path (0, auto). */
static int dt__cm_hier_pays(const dt_comm_req *q) {
    const dt_comm *c = q->c;
#ifdef DT_MPI
    if (c->hx == MPI_COMM_NULL || c->hier < 0 || q->et == DT_BF16 || q->et == DT_F16) return 0;
    return c->hier == 1 ||
           (double)q->count * (double)dt__cm_esize(q->et) * c->size > (double)DT_COMM_GATHER_MAX_BYTES;
#else
    (void)c;
    return 0;
#endif
}

/* Its counts (q->cnt: 4 x per_host for the host stages, then 4 x hosts for the stages across):
   the buffer is cut into per_host slices, slice j to the host's rank j; rank j's slice is cut
   into hosts sub-slices, sub-slice k to host k. Counts and offsets are in elements of the whole
   buffer; the rank's own part never leaves it (count 0), as in the flat all-to-all. */
static dt_status dt__cm_hier_prepare(dt_comm_req *q) {
    dt_comm *c = q->c;
    int L = c->per_host, H = c->hosts, j = c->host_local, h = c->host_index, i, *a, *b;
    int64_t n = q->count, off = 0, m0, m1, need;
    size_t es = dt__cm_esize(q->et);
    q->path = DT__CM_HIER;
    q->last_stage = 3;
    q->cnt = (int *)dt_alloc(c->ctx, (size_t)4 * (size_t)(L + H) * sizeof(int));
    if (!q->cnt) return DT_ERR_OOM;
    a = q->cnt;
    b = q->cnt + 4 * L;
    for (i = 0; i < L; i++) {
        a[i] = (int)(n / L + (i < n % L));
        a[L + i] = (int)off;
        off += a[i];
    }
    m0 = a[j];
    off = a[L + j];
    for (i = 0; i < L; i++) {
        a[2 * L + i] = i == j ? 0 : (int)m0;
        a[3 * L + i] = (int)((i < j ? i : i - 1) * m0);
    }
    a[j] = 0;
    for (i = 0; i < H; i++) {
        b[i] = (int)(m0 / H + (i < m0 % H));
        b[H + i] = (int)off;
        off += b[i];
    }
    m1 = b[h];
    for (i = 0; i < H; i++) {
        b[2 * H + i] = i == h ? 0 : (int)m1;
        b[3 * H + i] = (int)((i < h ? i : i - 1) * m1);
    }
    b[h] = 0;
    need = (L - 1) * m0 > (H - 1) * m1 ? (L - 1) * m0 : (H - 1) * m1;
    q->scratch = dt__cm_take(c, (size_t)need * es, &q->slot_scratch);
    return q->scratch || !need ? DT_OK : DT_ERR_OOM;
}

/* Takes everything q will need before its header goes out (a failure here is announced in the
   header instead of leaving the others waiting): host staging copies, the path, scratch, the
   MPI counts. All sizes are bounded: every tensor has at most INT_MAX elements
   (dt__cm_tensor_ok), and what is multiplied here never exceeds a tensor's size. */
static dt_status dt__cm_prepare(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, r, reduce = 0;
    size_t es = dt__cm_esize(q->et);
    dt_status st = DT_OK;
    q->last_stage = 0;
    if (q->path == DT__CM_NCCL && q->kind != DT_COLL_ALLTOALLV) return DT_OK; /* NCCL reads the tensors */
    switch (q->kind) {
    case DT_COLL_ALLREDUCE: case DT_COLL_BROADCAST:
        q->tin = q->tout; /* in place */
        if ((st = dt__cm_stage(q, 1, 1)) != DT_OK) return st;
        if ((size_t)q->count * es <= dt__cm_inline_bytes(c)) {
            q->path = DT__CM_INL;
            reduce = q->kind == DT_COLL_ALLREDUCE;
        } else if (q->kind == DT_COLL_BROADCAST) {
        } else if (dt__cm_hier_pays(q)) {
            reduce = 1;
            st = dt__cm_hier_prepare(q);
            if (st) return st;
        } else if ((double)q->count * (double)es * n <= (double)DT_COMM_GATHER_MAX_BYTES) {
            q->path = DT__CM_GATHER;
            reduce = 1;
            q->scratch = dt__cm_take(c, (size_t)n * (size_t)q->count * es, &q->slot_scratch);
            if (!q->scratch) return DT_ERR_OOM;
        } else {
            int64_t off = 0, mine;
            q->path = DT__CM_A2A;
            q->last_stage = 1;
            reduce = 1;
            q->cnt = (int *)dt_alloc(c->ctx, (size_t)4 * n * sizeof(int));
            if (!q->cnt) return DT_ERR_OOM;
            for (r = 0; r < n; r++) { /* slice r: count/n elements, the first count%n one more */
                q->cnt[r] = (int)(q->count / n + (r < q->count % n));
                q->cnt[n + r] = (int)off;
                off += q->cnt[r];
            }
            /* this rank's slice of every other rank; its own stays where it is */
            mine = q->cnt[c->rank];
            q->cnt[c->rank] = 0;
            for (r = 0; r < n; r++) {
                q->cnt[2 * n + r] = r == c->rank ? 0 : (int)mine;
                q->cnt[3 * n + r] = (int)((r < c->rank ? r : r - 1) * mine);
            }
            q->scratch = dt__cm_take(c, (size_t)(n - 1) * (size_t)mine * es, &q->slot_scratch);
            if (!q->scratch) return DT_ERR_OOM;
        }
        break;
    case DT_COLL_REDUCE_SCATTER: { /* block r of in to rank r; this rank's own block stays in in */
        int m = (int)q->tout.numel;
        if ((st = dt__cm_stage(q, 1, 1)) != DT_OK) return st;
        reduce = 1;
        if ((size_t)q->tin.numel * es <= dt__cm_inline_bytes(c)) {
            q->path = DT__CM_INL;
            break;
        }
        q->cnt = (int *)dt_alloc(c->ctx, (size_t)4 * n * sizeof(int));
        if (!q->cnt) return DT_ERR_OOM;
        for (r = 0; r < n; r++) {
            q->cnt[r] = q->cnt[2 * n + r] = r == c->rank ? 0 : m;
            q->cnt[n + r] = r * m;
            q->cnt[3 * n + r] = (r < c->rank ? r : r - 1) * m;
        }
        q->scratch = dt__cm_take(c, (size_t)(n - 1) * (size_t)m * es, &q->slot_scratch);
        if (!q->scratch) return DT_ERR_OOM;
        break;
    }
    case DT_COLL_ALLGATHER:
        if ((st = dt__cm_stage(q, 1, 1)) != DT_OK) return st;
        if ((size_t)q->tin.numel * es <= dt__cm_inline_bytes(c)) q->path = DT__CM_INL;
        break;
    case DT_COLL_ALLTOALL:
        if ((st = dt__cm_stage(q, 1, 1)) != DT_OK) return st;
        if (q->path == DT__CM_MPI && !q->part_len && dt__cm_a2a_hier_pays(q, (double)(q->tin.numel / n) * (double)es))
            return dt__cm_a2a_hier_prepare(q);
        if (q->part_len) { /* a chunk: the same slice of every block */
            int64_t m = q->tin.numel / n;
            q->cnt = (int *)dt_alloc(c->ctx, (size_t)2 * n * sizeof(int));
            if (!q->cnt) return DT_ERR_OOM;
            for (r = 0; r < n; r++) {
                q->cnt[r] = (int)q->part_len;
                q->cnt[n + r] = (int)(r * m + q->part_off);
            }
        }
        break;
    case DT_COLL_ALLTOALLV: { /* out is staged once the counts are known (dt__cm_a2av_counts) */
        int64_t off = 0;
        q->last_stage = 2;
        q->cnt = (int *)dt_alloc(c->ctx, (size_t)4 * n * sizeof(int));
        /* (and the two-level path's counts, 6 x size more, where it may be chosen) */
        q->c64 = (int64_t *)dt_alloc(c->ctx, ((size_t)(c->by_host ? 10 : 4) * n + 2) * sizeof(int64_t));
        if (!q->cnt || !q->c64) return DT_ERR_OOM;
        for (r = 0; r < n; r++) { /* checked by dt_comm_alltoallv: every count and offset fits an int */
            q->c64[r] = q->want_send[r];
            q->cnt[r] = (int)q->want_send[r];
            q->cnt[n + r] = (int)off;
            off += q->want_send[r];
        }
        if (q->path == DT__CM_MPI && (st = dt__cm_stage(q, 1, 0)) != DT_OK) return st;
        break;
    }
    case DT_COLL_BARRIER:
        q->path = DT__CM_INL;
        break;
    default: return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: internal: unknown operation %d", q->fn, q->kind);
    }
    if (q->path == DT__CM_INL) q->last_stage = -1; /* no stage of its own */
    if (reduce && n > 64) {
        q->rows = (const void **)dt_alloc(c->ctx, (size_t)n * sizeof(void *));
        if (!q->rows) return DT_ERR_OOM;
    }
    return DT_OK;
}

#ifdef DT_MPI
/* How many chunks q goes in (1: none). Host (or staged) all-reduces and broadcasts of 512 KB
   and more go as 2..4 chunks of 256 KB or more; an all-to-all only from host memory, and by the
   size of one peer's block: its chunks are strided, and small pieces per peer make it slower
   than one MPI_Alltoall. */
static int dt__cm_chunks(const dt_comm_req *q) {
    const dt_comm *c = q->c;
    int k = (int)(q->stat_bytes / DT__CM_CHUNK_MIN);
    if (q->path != DT__CM_MPI || c->size == 1) return 1;
    if (q->kind == DT_COLL_ALLTOALL) {
        if (dt__cm_on_device(&q->tin) || dt__cm_on_device(&q->tout)) return 1;
        if (dt__cm_a2a_hier_pays(q, q->stat_bytes / c->size)) return 1;
        k = (int)(q->stat_bytes / c->size / DT__CM_CHUNK_MIN);
    }
    k = k > DT__CM_CHUNKS ? DT__CM_CHUNKS : k;
    return k > 1 && q->stat_bytes * c->size > DT_COMM_GATHER_MAX_BYTES ? k : 1;
}

/* A large host all-reduce, broadcast or all-to-all as k chunks, each a whole operation on a
   slice, behind q's one gate and posted in order: the all-to-all of one chunk overlaps the sums
   and the all-gather of the one before, and the chunks of a broadcast follow each other down
   MPI's tree. The sum of each element does not depend on the chunk it falls in, so the result
   is the same bitwise. Every chunk is made and prepared here, before the header goes out. */
static dt_status dt__cm_make_chunks(dt_comm_req *q, int k) {
    dt_comm *c = q->c;
    int a2a = q->kind == DT_COLL_ALLTOALL, i;
    int64_t whole = a2a ? q->tin.numel / c->size : q->count, per = whole / k, off = 0;
    dt_status st = DT_OK;
    q->kids = (dt_comm_req **)dt_alloc(c->ctx, (size_t)k * sizeof(dt_comm_req *));
    if (!q->kids) return DT_ERR_OOM;
    for (i = 0; i < k && !st; i++) {
        int64_t len = i == k - 1 ? whole - off : per;
        dt_comm_req *kid = (dt_comm_req *)dt_alloc(c->ctx, sizeof(dt_comm_req));
        if (!kid) return DT_ERR_OOM;
        dt__cm_req_init(kid, c, q->kind, q->fn);
        q->kids[q->nkids++] = kid;
        kid->internal = 1;
        kid->seq = q->seq;
        kid->et = q->et;
        kid->op = q->op;
        kid->arg = q->arg;
        kid->count = len;
        kid->path = q->path;
        kid->gate = q->gate;
        kid->t0 = q->t0;
        if (a2a) { /* elements [off, off + len) of every block */
            kid->tin = q->tin;
            kid->tout = q->tout;
            kid->part_off = off;
            kid->part_len = len;
        } else
            st = dt_tensor_view(c->ctx, &kid->tout, &q->tout, off, 1, &len);
        if (!st) st = dt__cm_prepare(kid);
        off += len;
    }
    return st;
}
#endif

static void dt__cm_fifo_append(dt_comm *c, dt_comm_req *q) {
    dt_comm_req **pp = &c->fifo;
    while (*pp) pp = &(*pp)->next;
    q->next = NULL;
    *pp = q;
}

/* A prepared q (no agreement needed: one rank, or point to point) queued and its first stage
   posted; a failed post fails q. */
static dt_status dt__cm_queue_post(dt_comm *c, dt_comm_req *q) {
    dt_status st;
    dt__cm_fifo_append(c, q);
    q->stage = 0;
    st = dt__cm_post(q);
    if (st) dt__cm_fail(q, st);
    return st;
}

/* Starts collective q after validation and dt__cm_enter (may_chunk: all-reduce, broadcast,
   all-to-all). One rank: runs it here. NCCL on one rank: posts it. Otherwise: prepares q (or
   its chunks), sends the header and queues q behind it; progress does the rest. When this rank
   could not prepare, its header says so and the call waits for the header exchange, so that
   every rank returns an error and the communicator stays usable. */
static dt_status dt__cm_start(dt_comm_req *q, int may_chunk) {
    dt_comm *c = q->c;
    dt_status st = DT_OK;
    q->t0 = dt__cm_now();
    q->path = dt__cm_path(q);
    if (q->path == DT__CM_LOCAL) {
        st = dt__cm_run_local(q);
        if (!st) dt__cm_complete(q);
        else {
            q->done = 1;
            q->status = st;
            dt__cm_release_req_bufs(q);
        }
        return st;
    }
#ifdef DT_NCCL
    if (q->path == DT__CM_NCCL && (st = dt__cm_nccl_init(q)) != DT_OK && c->size == 1) return st;
    if (!st && q->path == DT__CM_NCCL && !c->nccl_mode) q->path = dt__cm_path(q); /* ranks share a GPU */
#endif
    if (c->size == 1) { /* NCCL on one rank: nothing to agree on */
        if (!st) st = dt__cm_prepare(q);
        return st ? st : dt__cm_queue_post(c, q);
    }
#ifdef DT_MPI
    {
        dt_comm_req *g = dt__cm_gate_new(q);
        int64_t *h;
        int i, rc, k = 1, hw = dt__cm_hdr_words(c);
        char saved[DT_ERROR_MAX];
        if (!g) return DT_ERR_OOM; /* nothing sent: the other ranks time out naming this one */
        q->gate = g;
        q->own_gate = 1;
        if (!st && may_chunk) k = dt__cm_chunks(q);
        if (!st) st = k > 1 ? dt__cm_make_chunks(q, k) : dt__cm_prepare(q);
        h = g->hdr;
        memset(h, 0, (size_t)hw * sizeof(int64_t));
        dt__cm_record(q, h);
        if (q->path == DT__CM_NCCL) h[5] |= DT__CM_ON_NCCL;
        /* the paths across hosts depend on it: ranks set differently would post different stages */
        if (c->by_host) h[5] |= (int64_t)(c->hier + 2) << DT__CM_HIER_SHIFT;
        if (q->hier_flat) h[5] |= DT__CM_A2A_FLAT;
        if (st) h[5] |= DT__CM_NO_PART | (int64_t)st << 8;
        else if (q->path == DT__CM_INL) { /* the data rides in the header */
            const void *src = q->kind == DT_COLL_ALLREDUCE || q->kind == DT_COLL_BROADCAST ? q->hout : q->hin;
            size_t b = q->kind == DT_COLL_ALLREDUCE || q->kind == DT_COLL_BROADCAST ? (size_t)q->count
                                                                                   : (size_t)q->tin.numel;
            b *= dt__cm_esize(q->et);
            if (q->kind != DT_COLL_BARRIER && b) memcpy(h + DT__CM_REC, src, b);
        }
        rc = MPI_Iallgather(h, hw, MPI_INT64_T, h + hw, hw, MPI_INT64_T, c->hc, &g->mreq);
        if (rc != MPI_SUCCESS) { /* nothing sent: the caller frees what was prepared */
            if (!st) st = dt__cm_mpi_error(c, rc, q->fn, "MPI_Iallgather of the header");
            g->done = 1;
            g->status = st;
            return st;
        }
        g->stage = 0;
        g->pending = 1;
        g->path = DT__CM_MPI;
        dt__cm_fifo_append(c, g);
        if (st) { /* this rank is out: the others learn it from the header; wait for it */
            memcpy(saved, c->ctx->last_error, sizeof saved);
            dt__cm_wait(g);
            memcpy(c->ctx->last_error, saved, sizeof saved);
            c->ctx->last_status = st;
            return st;
        }
        if (q->nkids)
            for (i = 0; i < q->nkids; i++) dt__cm_fifo_append(c, q->kids[i]);
        else
            dt__cm_fifo_append(c, q);
        return DT_OK;
    }
#else
    (void)may_chunk;
    return dt_ctx_set_error(c->ctx, DT_ERR_DEVICE, "%s: group %s has %d ranks but dt was built without DT_MPI",
                            q->fn, c->name, c->size);
#endif
}

#ifdef DT_MPI
/* Starts a send or recv (MPI, to oneself included, or NCCL between devices). */
static dt_status dt__cm_start_p2p(dt_comm_req *q) {
    dt_comm *c = q->c;
    dt_status st = DT_OK;
    q->t0 = dt__cm_now();
    q->path = dt__cm_path(q);
    /* MPI on one rank, and to oneself (NCCL would wait for the recv) */
    if (q->path == DT__CM_LOCAL || q->arg == c->rank) q->path = DT__CM_MPI;
#ifdef DT_NCCL
    /* making the NCCL communicator is collective over the group, which a send is not */
    if (q->path == DT__CM_NCCL && !c->nccl)
        return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: a device tensor to or from rank %d of group %s goes through "
                                "NCCL, whose communicator is made by the group's first collective on device tensors; "
                                "none has run yet (run one first, e.g. a dt_comm_broadcast of a device tensor)",
                                q->fn, q->arg, c->name);
#endif
    if (!st && q->path == DT__CM_MPI) st = dt__cm_stage(q, q->kind == DT_COLL_SEND, q->kind == DT_COLL_RECV);
    return st ? st : dt__cm_queue_post(c, q);
}

/* Posts stage q->stage of an operation's MPI part on mc[stage]; everything was prepared. */
static dt_status dt__cm_mpi_post(dt_comm_req *q) {
    dt_comm *c = q->c;
    int n = c->size, rc = MPI_SUCCESS;
    size_t es = dt__cm_esize(q->et);
    MPI_Datatype T = dt__cm_mpi_type(q->et);
    MPI_Comm mc = q->stage < DT__CM_STAGES ? c->mc[q->stage] : MPI_COMM_NULL; /* (the two-level path's own) */
    const char *what = "MPI";
    switch (q->kind) {
    case DT_COLL_ALLREDUCE:
        if (q->path == DT__CM_HIER) { /* host: all-to-all, across: all-to-all, all-gather; host: all-gather */
            int L = c->per_host, H = c->hosts, *a = q->cnt, *b = q->cnt + 4 * L;
            int64_t m0 = q->count / L + (c->host_local < q->count % L);
            if (q->stage == 0) {
                what = "MPI_Ialltoallv in the host";
                rc = MPI_Ialltoallv(q->hout, a, a + L, T, q->scratch, a + 2 * L, a + 3 * L, T, c->hh[0], &q->mreq);
            } else if (q->stage == 1) {
                what = "MPI_Ialltoallv across hosts";
                rc = MPI_Ialltoallv(q->hout, b, b + H, T, q->scratch, b + 2 * H, b + 3 * H, T, c->hx, &q->mreq);
            } else if (q->stage == 2) {
                b[c->host_index] = (int)(m0 / H + (c->host_index < m0 % H));
                what = "MPI_Iallgatherv across hosts";
                rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, T, q->hout, b, b + H, T, c->hx, &q->mreq);
            } else {
                a[c->host_local] = (int)m0;
                what = "MPI_Iallgatherv in the host";
                rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, T, q->hout, a, a + L, T, c->hh[1], &q->mreq);
            }
        } else if (q->path == DT__CM_GATHER) {
            what = "MPI_Iallgather";
            rc = MPI_Iallgather(q->hout, (int)q->count, T, q->scratch, (int)q->count, T, mc, &q->mreq);
        } else if (q->stage == 0) {
            what = "MPI_Ialltoallv";
            rc = MPI_Ialltoallv(q->hout, q->cnt, q->cnt + n, T, q->scratch, q->cnt + 2 * n, q->cnt + 3 * n, T, mc,
                                &q->mreq);
        } else {
            q->cnt[c->rank] = (int)(q->count / n + (c->rank < q->count % n)); /* zeroed for the all-to-all */
            what = "MPI_Iallgatherv";
            rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, T, q->hout, q->cnt, q->cnt + n, T, mc, &q->mreq);
        }
        break;
    case DT_COLL_REDUCE_SCATTER:
        what = "MPI_Ialltoallv";
        rc = MPI_Ialltoallv(q->hin, q->cnt, q->cnt + n, T, q->scratch, q->cnt + 2 * n, q->cnt + 3 * n, T, mc, &q->mreq);
        break;
    case DT_COLL_ALLGATHER: {
        int m = (int)q->tin.numel;
        int in_place = !dt__cm_on_device(&q->tin) && !dt__cm_on_device(&q->tout) &&
                       (char *)q->tin.data == (char *)q->tout.data + (size_t)c->rank * (size_t)m * es;
        what = "MPI_Iallgather";
        rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : q->hin, m, T, q->hout, m, T, mc, &q->mreq);
        break;
    }
    case DT_COLL_BROADCAST:
        what = "MPI_Ibcast";
        rc = MPI_Ibcast(q->hout, (int)q->count, T, q->arg, mc, &q->mreq);
        break;
    case DT_COLL_ALLTOALL: case DT_COLL_ALLTOALLV:
        if (q->path == DT__CM_HIER) return dt__cm_a2a_hier_post(q);
        if (q->kind == DT_COLL_ALLTOALLV) {
            if (q->stage == 0) {
                what = "MPI_Ialltoall of the counts";
                rc = MPI_Ialltoall(q->c64, 1, MPI_INT64_T, q->c64 + n, 1, MPI_INT64_T, mc, &q->mreq);
            } else if (q->stage == 1) {
                what = "MPI_Iallgather of the verdicts";
                rc = MPI_Iallgather(q->c64 + 2 * n, 2, MPI_INT64_T, q->c64 + 2 * n + 2, 2, MPI_INT64_T, mc, &q->mreq);
            } else {
                what = "MPI_Ialltoallv";
                rc = MPI_Ialltoallv(q->hin, q->cnt, q->cnt + n, T, q->hout, q->cnt + 2 * n, q->cnt + 3 * n, T, mc,
                                    &q->mreq);
            }
        } else if (q->part_len) {
            what = "MPI_Ialltoallv";
            rc = MPI_Ialltoallv(q->hin, q->cnt, q->cnt + n, T, q->hout, q->cnt, q->cnt + n, T, mc, &q->mreq);
        } else {
            int m = (int)(q->tin.numel / n);
            what = "MPI_Ialltoall";
            rc = MPI_Ialltoall(q->hin, m, T, q->hout, m, T, mc, &q->mreq);
        }
        break;
    case DT_COLL_SEND:
        what = "MPI_Isend";
        rc = MPI_Isend(q->hin, (int)q->count, T, q->arg, q->tag, mc, &q->mreq);
        break;
    case DT_COLL_RECV: /* looks for the message first: see dt__cm_recv_found */
        q->probing = 1;
        break;
    default: return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: internal: unknown operation %d", q->fn, q->kind);
    }
    if (rc != MPI_SUCCESS) return dt__cm_mpi_error(c, rc, q->fn, what);
    q->pending = 1;
    return DT_OK;
}
#endif

/* ==== >>nccl: NCCL (implementation only) ====================================================== */

#ifdef DT_NCCL
static ncclDataType_t dt__cm_nccl_type(int et) {
    switch (et) {
    case DT_BF16: return ncclBfloat16;
    case DT_F16: return ncclFloat16;
    case DT_I32: return ncclInt32;
    case DT_I64: return ncclInt64;
    case DT_U8: return ncclUint8;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t dt__cm_nccl_op(dt_reduce_op op) {
    switch (op) {
    case DT_REDUCE_AVG: return ncclAvg;
    case DT_REDUCE_MAX: return ncclMax;
    case DT_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* NCCL's own words after one of its calls failed (NCCL 2.13 and later keep them). */
static const char *dt__cm_nccl_why(ncclComm_t comm) {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21300
    const char *w = ncclGetLastError(comm);
    return w ? w : "";
#else
    (void)comm;
    return "";
#endif
}

/* Where a rank's GPU is: its host and the PCI bus id of its current device. */
typedef struct dt__cm_gpu {
    int ok;                           /* rank 0: the NCCL id below is valid */
    char host[128], bus[32];
    ncclUniqueId id;                  /* rank 0's */
} dt__cm_gpu;

static void dt__cm_gpu_where(dt__cm_gpu *g) {
    int dev = 0, len = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    if (dev < 0 || cudaDeviceGetPCIBusId(g->bus, (int)sizeof g->bus, dev) != cudaSuccess)
        snprintf(g->bus, sizeof g->bus, "device %d", dev);
#ifdef DT_MPI
    {
        char name[MPI_MAX_PROCESSOR_NAME];
        if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS) { /* (truncated past 127 bytes) */
            size_t l = strlen(name) < sizeof g->host ? strlen(name) : sizeof g->host - 1;
            memcpy(g->host, name, l);
            g->host[l] = 0;
        }
    }
#endif
    (void)len;
}

/* Creates the NCCL communicator on first use. Rank 0 makes the id; one MPI all-gather carries
   it with every rank's host and GPU (PCI bus id), so every rank sees the same answer to "do two
   ranks share a GPU?". NCCL refuses such a group (ncclInvalidUsage, "Duplicate GPU detected"),
   so dt does not create it: with use_nccl 0 the group stages its device tensors through host
   memory and MPI from now on (all ranks switch together), with use_nccl 1 the call fails
   naming the ranks. */
static dt_status dt__cm_nccl_init(dt_comm_req *q) {
    dt_comm *c = q->c;
    dt__cm_gpu mine, *all = &mine;
    ncclResult_t nr;
    cudaError_t e;
    int a, b;
    if (c->nccl) return DT_OK;
    memset(&mine, 0, sizeof mine);
    mine.ok = 1;
    if (c->rank == 0 && (nr = ncclGetUniqueId(&mine.id)) != ncclSuccess) mine.ok = 0;
    dt__cm_gpu_where(&mine);
#ifdef DT_MPI
    if (c->size > 1) {
        MPI_Request r;
        dt_status st;
        int rc;
        all = (dt__cm_gpu *)dt_alloc(c->ctx, (size_t)c->size * sizeof(dt__cm_gpu));
        if (!all) return DT_ERR_OOM; /* the others time out naming this rank */
        rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, c->ctl, &r);
        if (rc != MPI_SUCCESS) {
            dt_release(c->ctx, all);
            return dt__cm_mpi_error(c, rc, q->fn, "MPI_Iallgather of the NCCL id");
        }
        st = dt__cm_wait_ctl(q, &r, "MPI_Iallgather of the NCCL id");
        if (st) return st; /* abandoned: all stays lent to MPI */
    }
#endif
    for (a = 0; a < c->size; a++)
        for (b = a + 1; b < c->size; b++) {
            if (strcmp(all[a].host, all[b].host) || strcmp(all[a].bus, all[b].bus)) continue;
            if (c->nccl_mode == 2) {
                dt_status st = dt_ctx_set_error(c->ctx, DT_ERR_UNSUPPORTED, "%s: ranks %d and %d of group %s share the "
                                                "GPU %s of host %s; NCCL needs one GPU per rank (desc.use_nccl = 1); "
                                                "use_nccl 0 stages such a group through host memory", q->fn, a, b,
                                                c->name, all[a].bus, all[a].host);
                if (all != &mine) dt_release(c->ctx, all);
                return st;
            }
            c->nccl_mode = 0; /* every rank decides the same: staged from now on */
            if (all != &mine) dt_release(c->ctx, all);
            return DT_OK;
        }
    mine.ok = all[0].ok;
    memcpy(&mine.id, &all[0].id, sizeof mine.id);
    if (all != &mine) dt_release(c->ctx, all);
    if (!mine.ok)
        return dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: rank 0 of group %s could not create an NCCL id "
                                "(ncclGetUniqueId)", q->fn, c->name);
    if (!c->stream && (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return dt_ctx_set_error(c->ctx, DT_ERR_CUDA, "%s: cudaStreamCreateWithFlags: %s", q->fn, cudaGetErrorString(e));
    nr = ncclCommInitRank(&c->nccl, c->size, mine.id, c->rank);
    if (nr != ncclSuccess) {
        c->nccl = NULL;
        return dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: ncclCommInitRank (rank %d of %d, group %s): %s %s", q->fn,
                                c->rank, c->size, c->name, ncclGetErrorString(nr), dt__cm_nccl_why(NULL));
    }
    return DT_OK;
}

/* Posts q on the communication stream, after the work already queued on the ctx stream. */
static dt_status dt__cm_nccl_post(dt_comm_req *q) {
    dt_comm *c = q->c;
    cudaStream_t s, cs = (cudaStream_t)c->ctx->cuda_stream;
    cudaEvent_t ready = NULL;
    cudaError_t e;
    ncclResult_t nr = ncclSuccess;
    ncclDataType_t T = dt__cm_nccl_type(q->et);
    size_t es = dt__cm_esize(q->et);
    int n = c->size, r;
    const char *what;
    if (!c->nccl)
        return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: group %s has no NCCL communicator", q->fn, c->name);
    s = c->stream;
    /* the ctx stream's work so far (what produced the inputs) comes first */
    what = "cudaEventCreateWithFlags";
    e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (e == cudaSuccess) what = "cudaEventRecord", e = cudaEventRecord(ready, cs);
    if (e == cudaSuccess) what = "cudaStreamWaitEvent", e = cudaStreamWaitEvent(s, ready, 0);
    if (ready) cudaEventDestroy(ready);
    if (e != cudaSuccess)
        return dt_ctx_set_error(c->ctx, DT_ERR_CUDA, "%s: %s (ordering the NCCL stream after the ctx stream): %s", q->fn,
                                what, cudaGetErrorString(e));
    switch (q->kind) {
    case DT_COLL_ALLREDUCE:
        what = "ncclAllReduce";
        nr = ncclAllReduce(q->tout.data, q->tout.data, (size_t)q->count, T, dt__cm_nccl_op(q->op), c->nccl, s);
        break;
    case DT_COLL_REDUCE_SCATTER:
        what = "ncclReduceScatter";
        nr = ncclReduceScatter(q->tin.data, q->tout.data, (size_t)q->tout.numel, T, dt__cm_nccl_op(q->op), c->nccl, s);
        break;
    case DT_COLL_ALLGATHER:
        what = "ncclAllGather";
        nr = ncclAllGather(q->tin.data, q->tout.data, (size_t)q->tin.numel, T, c->nccl, s);
        break;
    case DT_COLL_BROADCAST:
        what = "ncclBroadcast";
        nr = ncclBroadcast(q->tout.data, q->tout.data, (size_t)q->count, T, q->arg, c->nccl, s);
        break;
    case DT_COLL_ALLTOALL: case DT_COLL_ALLTOALLV: {
        int64_t m = q->tin.numel / n;
        what = "ncclGroupStart";
        nr = ncclGroupStart();
        for (r = 0; r < n && nr == ncclSuccess; r++) {
            size_t so = q->kind == DT_COLL_ALLTOALL ? (size_t)(r * m) : (size_t)q->cnt[n + r];
            size_t sn = q->kind == DT_COLL_ALLTOALL ? (size_t)m : (size_t)q->cnt[r];
            size_t ro = q->kind == DT_COLL_ALLTOALL ? (size_t)(r * m) : (size_t)q->cnt[3 * n + r];
            size_t rn = q->kind == DT_COLL_ALLTOALL ? (size_t)m : (size_t)q->cnt[2 * n + r];
            if (sn) what = "ncclSend", nr = ncclSend((const char *)q->tin.data + so * es, sn, T, r, c->nccl, s);
            if (rn && nr == ncclSuccess)
                what = "ncclRecv", nr = ncclRecv((char *)q->tout.data + ro * es, rn, T, r, c->nccl, s);
        }
        if (nr == ncclSuccess) what = "ncclGroupEnd";
        {
            ncclResult_t ge = ncclGroupEnd(); /* also after a failure: closes the group */
            if (nr == ncclSuccess) nr = ge;
        }
        break;
    }
    case DT_COLL_SEND:
        what = "ncclSend";
        nr = ncclSend(q->tin.data, (size_t)q->count, T, q->arg, c->nccl, s);
        break;
    case DT_COLL_RECV:
        what = "ncclRecv";
        nr = ncclRecv(q->tout.data, (size_t)q->count, T, q->arg, c->nccl, s);
        break;
    default: return dt_ctx_set_error(c->ctx, DT_ERR_STATE, "%s: internal: no NCCL form of %d", q->fn, q->kind);
    }
    if (nr != ncclSuccess)
        return dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: %s (%s on group %s, size %d): %s %s", q->fn, what,
                                dt_coll_name((dt_coll)q->kind), c->name, c->size, ncclGetErrorString(nr),
                                dt__cm_nccl_why(c->nccl));
    what = "cudaEventCreateWithFlags";
    e = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) what = "cudaEventRecord", e = cudaEventRecord(q->ev, s);
    if (e != cudaSuccess)
        return dt_ctx_set_error(c->ctx, DT_ERR_CUDA, "%s: %s after %s: %s", q->fn, what,
                                dt_coll_name((dt_coll)q->kind), cudaGetErrorString(e));
    q->pending = 1;
    return DT_OK;
}
#endif

/* ==== >>coll: collectives ===================================================================== */

/* Runs a prepared request: blocking (out == NULL: waits on the stack request, or for NCCL hands
   it to the ctx stream, see dt__cm_detach) or async. */
static dt_status dt__cm_finish_call(dt_comm_req *q, dt_status st, dt_comm_req **out) {
    if (out) {
        if (st) {
            dt__cm_free_kids(q);
            dt__cm_release_req_bufs(q);
            dt__cm_drop_gate(q);
            dt_release(q->c->ctx, q);
            return st;
        }
        *out = q;
        return DT_OK;
    }
    /* NCCL: the host waits for the header (and an all-to-allv's counts), not for the device */
    if (!st && q->path == DT__CM_NCCL && !dt__cm_done(q) && !dt__cm_wait_until(q, 1) && !dt__cm_done(q) &&
        dt__cm_detach(q, 0))
        return DT_OK;
    if (!st) st = dt__cm_said(q, dt__cm_done(q) ? q->status : dt__cm_wait(q));
    dt__cm_free_kids(q);
    dt__cm_release_req_bufs(q);
    dt__cm_drop_gate(q);
    return st;
}

/* A request: on the caller's stack for blocking calls, from the ctx for async ones. */
static dt_comm_req *dt__cm_req(dt_comm *c, dt_comm_req *stack_q, dt_comm_req **out, int kind, const char *fn) {
    dt_comm_req *q = stack_q;
    if (out) {
        *out = NULL;
        q = (dt_comm_req *)dt_alloc(c->ctx, sizeof(dt_comm_req));
        if (!q) return NULL;
    }
    dt__cm_req_init(q, c, kind, fn);
    return q;
}

/* The start of every public collective: an async call's req (out) given, c usable, *out cleared,
   *q made (stack_q for a blocking call, allocated for an async one). */
static dt_status dt__cm_open(dt_comm *c, dt_comm_req *stack_q, dt_comm_req **out, int async, int kind,
                             const char *fn, dt_comm_req **q) {
    dt_status st;
    if (!c) return DT_ERR_ARG;
    if (async && !out) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: req is NULL", fn);
    if (out) *out = NULL;
    if ((st = dt__cm_usable(c, fn)) != DT_OK) return st;
    *q = dt__cm_req(c, stack_q, out, kind, fn);
    return *q ? DT_OK : DT_ERR_OOM;
}

/* The end of every public collective: the ranks agree on st (a local error still enters, so no
   rank waits for this one), then q runs, blocking or not. */
static dt_status dt__cm_run(dt_comm_req *q, dt_status st, int may_chunk, dt_comm_req **out) {
    st = dt__cm_enter(q, st);
    if (!st) st = dt__cm_start(q, may_chunk);
    return dt__cm_finish_call(q, st, out);
}

/* out and in of a collective that moves in into out: both valid, one dtype. */
static dt_status dt__cm_pair_ok(dt_comm *c, const dt_tensor *outt, const dt_tensor *in, const char *fn) {
    dt_status st = dt__cm_tensor_ok(c, outt, fn, "out");
    if (!st) st = dt__cm_tensor_ok(c, in, fn, "in");
    if (!st) st = dt__cm_same_dtype(c, outt, in, fn);
    return st;
}

/* q works on t in place (all-reduce, broadcast). */
static void dt__cm_set_inplace(dt_comm_req *q, const dt_tensor *t) {
    q->et = dt__cm_et(t->dtype);
    q->tout = *t;
    q->count = t->numel;
    q->stat_bytes = (double)dt_tensor_bytes(t);
}

/* q moves count elements of in into out. */
static void dt__cm_set_io(dt_comm_req *q, const dt_tensor *in, dt_tensor *outt, int64_t count) {
    q->et = dt__cm_et(in->dtype);
    q->tin = *in;
    q->tout = *outt;
    q->count = count;
}

static dt_status dt__cm_allreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op, dt_comm_req **out, int async,
                                  const char *fn) {
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, out, async, DT_COLL_ALLREDUCE, fn, &q);
    if (st) return st;
    st = dt__cm_tensor_ok(c, t, fn, "t");
    if (!st) {
        dt__cm_set_inplace(q, t);
        st = dt__cm_op_ok(c, op, q->et, fn);
        q->op = op == DT_REDUCE_DEFAULT ? DT_REDUCE_SUM : op;
    }
    return dt__cm_run(q, st, 1, out);
}

DT_API dt_status dt_comm_allreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op) {
    return dt__cm_allreduce(c, t, op, NULL, 0, "dt_comm_allreduce");
}
DT_API dt_status dt_comm_iallreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op, dt_comm_req **req) {
    return dt__cm_allreduce(c, t, op, req, 1, "dt_comm_iallreduce");
}

DT_API dt_status dt_comm_allreduce_f64(dt_comm *c, double *vals, int n, dt_reduce_op op) {
    const char *fn = "dt_comm_allreduce_f64";
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, NULL, 0, DT_COLL_ALLREDUCE, fn, &q);
    if (st) return st;
    q->et = DT__CM_F64;
    if (n < 0) st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: n = %d; expected >= 0", fn, n);
    else if (!vals && n > 0) st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: vals is NULL with n = %d", fn, n);
    else st = dt__cm_op_ok(c, op, DT__CM_F64, fn);
    dt__cm_host_view(&q->tout, vals, DT_F32, n); /* described as host memory; et says f64 */
    q->count = n;
    q->op = op == DT_REDUCE_DEFAULT ? DT_REDUCE_SUM : op;
    q->stat_bytes = 8.0 * n;
    return dt__cm_run(q, st, 0, NULL);
}

/* splitmix64's finalizer: every bit of x moves about half of the result's. */
static uint64_t dt__cm_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* u as two exact doubles (32 bits each) at a[0], a[1]; with the negations at a[2], a[3] when
   neg, so one MAX all-reduce gives the largest and the smallest value over the ranks. */
static void dt__cm_u64_put(double *a, uint64_t u, int neg) {
    a[0] = (double)(u >> 32);
    a[1] = (double)(u & 0xffffffffu);
    if (neg) { a[2] = -a[0]; a[3] = -a[1]; }
}
static uint64_t dt__cm_u64_get(const double *a) { return ((uint64_t)a[0] << 32) | (uint64_t)a[1]; }

DT_API dt_status dt_comm_check_same(dt_comm *c, const uint64_t *v, int n, dt_status st, dt_comm_same_diff *diff) {
    const char *fn = "dt_comm_check_same";
    dt_comm_same_diff dd;
    double h[9], *a = NULL;
    uint64_t dig = 0x243f6a8885a308d3ull, v0, vr;
    int k, r, m, W, me;
    if (!diff) diff = &dd;
    memset(diff, 0, sizeof *diff);
    diff->field = -1;
    if (!c) return DT_ERR_ARG;
    W = c->size;
    me = c->rank;
    if (!st && (n < 0 || n > INT32_MAX / 4 || (n > 0 && !v)))
        st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: n = %d with v %s; expected 0 <= n <= %d values", fn, n,
                              v ? "set" : "NULL", INT32_MAX / 4);
    /* the buffer of the later rounds first: a rank that cannot make it says so in this round */
    if (!st && !(a = (double *)dt_alloc(c->ctx, sizeof(double) * (size_t)(4 * n > 2 * W ? 4 * n : 2 * W))))
        st = DT_ERR_OOM;
    for (k = 0; !st && k < n; k++) dig = dt__cm_mix64(dig ^ v[k]) + (uint64_t)k;
    h[0] = st ? 1 : 0;
    dt__cm_u64_put(h + 1, st ? 0 : (uint64_t)n, 1);
    dt__cm_u64_put(h + 5, dig, 1);
    if (dt_comm_allreduce_f64(c, h, 9, DT_REDUCE_MAX)) { dt_release(c->ctx, a); return st ? st : DT_ERR_COMM; }
    if (h[0] > 0 || st) {
        dt_release(c->ctx, a);
        diff->failed = 1;
        return st ? st : dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: another rank's arguments failed its checks; see "
                                          "its message", fn);
    }
    if (h[1] == -h[3] && h[2] == -h[4] && h[5] == -h[7] && h[6] == -h[8]) { dt_release(c->ctx, a); return DT_OK; }
    /* something differs: the first field (among the first m, which every rank has), then the rank */
    m = (int)-h[4]; /* the smallest n (below 2^31: its high half is 0) */
    for (k = 0; k < m; k++) dt__cm_u64_put(a + 4 * k, v[k], 1);
    st = m > 0 ? dt_comm_allreduce_f64(c, a, 4 * m, DT_REDUCE_MAX) : DT_OK;
    for (k = 0; !st && k < m; k++)
        if (a[4 * k] != -a[4 * k + 2] || a[4 * k + 1] != -a[4 * k + 3]) break;
    if (!st) {
        diff->field = k < m ? k : -1;
        memset(a, 0, sizeof(double) * (size_t)(2 * W));
        dt__cm_u64_put(a + 2 * me, k < m ? v[k] : (uint64_t)n, 0);
        st = dt_comm_allreduce_f64(c, a, 2 * W, DT_REDUCE_SUM);
    }
    if (st) { dt_release(c->ctx, a); return st; }
    v0 = vr = dt__cm_u64_get(a);
    for (r = 1; r < W; r++)
        if ((vr = dt__cm_u64_get(a + 2 * r)) != v0) break;
    diff->rank = r < W ? r : W - 1;
    diff->value0 = v0;
    diff->value = vr;
    dt_release(c->ctx, a);
    if (diff->field < 0)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: %llu values on rank 0 but %llu on rank %d; expected the same "
                                "on every rank", fn, (unsigned long long)v0, (unsigned long long)vr, diff->rank);
    return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: value %d = %llu on rank 0 but %llu on rank %d; expected the same "
                            "on every rank", fn, diff->field, (unsigned long long)v0, (unsigned long long)vr, diff->rank);
}

static dt_status dt__cm_reduce_scatter(dt_comm *c, dt_tensor *outt, const dt_tensor *in, dt_reduce_op op,
                                       dt_comm_req **out, int async, const char *fn) {
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, out, async, DT_COLL_REDUCE_SCATTER, fn, &q);
    if (st) return st;
    st = dt__cm_pair_ok(c, outt, in, fn);
    if (!st) st = dt__cm_op_ok(c, op, dt__cm_et(in->dtype), fn);
    if (!st && in->numel != (int64_t)c->size * outt->numel)
        st = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: in has %lld elements; expected size (%d) x out (%lld) = %lld "
                              "on group %s", fn, (long long)in->numel, c->size, (long long)outt->numel,
                              (long long)((int64_t)c->size * outt->numel), c->name);
    if (!st) {
        dt__cm_set_io(q, in, outt, in->numel);
        q->op = op == DT_REDUCE_DEFAULT ? DT_REDUCE_SUM : op;
        q->stat_bytes = (double)dt_tensor_bytes(in);
    }
    return dt__cm_run(q, st, 0, out);
}

DT_API dt_status dt_comm_reduce_scatter(dt_comm *c, dt_tensor *out, const dt_tensor *in, dt_reduce_op op) {
    return dt__cm_reduce_scatter(c, out, in, op, NULL, 0, "dt_comm_reduce_scatter");
}
DT_API dt_status dt_comm_ireduce_scatter(dt_comm *c, dt_tensor *out, const dt_tensor *in, dt_reduce_op op,
                                         dt_comm_req **req) {
    return dt__cm_reduce_scatter(c, out, in, op, req, 1, "dt_comm_ireduce_scatter");
}

static dt_status dt__cm_allgather(dt_comm *c, dt_tensor *outt, const dt_tensor *in, dt_comm_req **out, int async,
                                  const char *fn) {
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, out, async, DT_COLL_ALLGATHER, fn, &q);
    if (st) return st;
    st = dt__cm_pair_ok(c, outt, in, fn);
    if (!st && outt->numel != (int64_t)c->size * in->numel)
        st = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: out has %lld elements; expected size (%d) x in (%lld) = %lld "
                              "on group %s", fn, (long long)outt->numel, c->size, (long long)in->numel,
                              (long long)((int64_t)c->size * in->numel), c->name);
    if (!st && dt__cm_overlap(outt, in) &&
        (char *)in->data != (char *)outt->data + (size_t)c->rank * dt_tensor_bytes(in))
        st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: in overlaps out but is not out's block %d (in place means in = "
                              "block rank of out)", fn, c->rank);
    if (!st) {
        dt__cm_set_io(q, in, outt, in->numel);
        q->stat_bytes = (double)dt_tensor_bytes(outt);
    }
    return dt__cm_run(q, st, 0, out);
}

DT_API dt_status dt_comm_allgather(dt_comm *c, dt_tensor *out, const dt_tensor *in) {
    return dt__cm_allgather(c, out, in, NULL, 0, "dt_comm_allgather");
}
DT_API dt_status dt_comm_iallgather(dt_comm *c, dt_tensor *out, const dt_tensor *in, dt_comm_req **req) {
    return dt__cm_allgather(c, out, in, req, 1, "dt_comm_iallgather");
}

static dt_status dt__cm_root_ok(dt_comm *c, int r, const char *fn, const char *arg) {
    if (r < 0 || r >= c->size)
        return dt_ctx_set_error(c->ctx, DT_ERR_RANGE, "%s: %s = %d is outside group %s, which has ranks 0..%d", fn, arg,
                                r, c->name, c->size - 1);
    return DT_OK;
}

static dt_status dt__cm_broadcast(dt_comm *c, dt_tensor *t, int root, dt_comm_req **out, int async, const char *fn) {
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, out, async, DT_COLL_BROADCAST, fn, &q);
    if (st) return st;
    st = dt__cm_tensor_ok(c, t, fn, "t");
    if (!st) st = dt__cm_root_ok(c, root, fn, "root");
    q->arg = root;
    if (!st) dt__cm_set_inplace(q, t);
    return dt__cm_run(q, st, 1, out);
}

DT_API dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root) {
    return dt__cm_broadcast(c, t, root, NULL, 0, "dt_comm_broadcast");
}
DT_API dt_status dt_comm_ibroadcast(dt_comm *c, dt_tensor *t, int root, dt_comm_req **req) {
    return dt__cm_broadcast(c, t, root, req, 1, "dt_comm_ibroadcast");
}

DT_API dt_status dt_comm_alltoall(dt_comm *c, dt_tensor *outt, const dt_tensor *in) {
    const char *fn = "dt_comm_alltoall";
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, NULL, 0, DT_COLL_ALLTOALL, fn, &q);
    if (st) return st;
    st = dt__cm_pair_ok(c, outt, in, fn);
    if (!st && in->numel % c->size != 0)
        st = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: in has %lld elements, not a multiple of the group size %d "
                              "(group %s); use dt_comm_alltoallv for uneven blocks", fn, (long long)in->numel, c->size,
                              c->name);
    if (!st && outt->numel != in->numel)
        st = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: out has %lld elements; expected in's %lld", fn,
                              (long long)outt->numel, (long long)in->numel);
    if (!st && dt__cm_overlap(outt, in))
        st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: in and out overlap; all-to-all needs distinct buffers", fn);
    if (!st) {
        dt__cm_set_io(q, in, outt, in->numel);
        q->stat_bytes = (double)dt_tensor_bytes(in);
    }
    return dt__cm_run(q, st, 1, NULL);
}

DT_API dt_status dt_comm_alltoallv(dt_comm *c, dt_tensor *outt, const int64_t *recv_counts, const dt_tensor *in,
                                   const int64_t *send_counts) {
    const char *fn = "dt_comm_alltoallv";
    dt_comm_req sq, *q;
    dt_status st = dt__cm_open(c, &sq, NULL, 0, DT_COLL_ALLTOALLV, fn, &q);
    int n, r;
    int64_t total = 0;
    if (st) return st;
    n = c->size;
    st = dt__cm_pair_ok(c, outt, in, fn);
    if (!st && !send_counts) st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: send_counts is NULL", fn);
    /* each count at most in->numel (<= INT_MAX): the sum cannot overflow, and every count and
       displacement MPI gets fits an int */
    for (r = 0; !st && r < n; r++) {
        if (send_counts[r] < 0 || (recv_counts && recv_counts[r] < 0))
            st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: %s[%d] = %lld; expected >= 0", fn,
                                  send_counts[r] < 0 ? "send_counts" : "recv_counts", r,
                                  (long long)(send_counts[r] < 0 ? send_counts[r] : recv_counts[r]));
        else if (send_counts[r] > in->numel)
            st = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: send_counts[%d] = %lld; in has only %lld elements", fn, r,
                                  (long long)send_counts[r], (long long)in->numel);
        else if ((total += send_counts[r]) > in->numel)
            st = dt_ctx_set_error(c->ctx, DT_ERR_SHAPE, "%s: send_counts[0..%d] add up to %lld elements already; in "
                                  "has only %lld", fn, r, (long long)total, (long long)in->numel);
    }
    if (!st && dt__cm_overlap(outt, in))
        st = dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: in and out overlap; all-to-all needs distinct buffers", fn);
    if (!st) {
        dt__cm_set_io(q, in, outt, total);
        q->out_cap = outt->numel;
        q->want_recv = recv_counts;
        q->want_send = send_counts;
        q->stat_bytes = (double)total * (double)dt__cm_esize(q->et);
    }
    return dt__cm_run(q, st, 0, NULL);
}

DT_API dt_status dt_comm_barrier(dt_comm *c) {
    const char *fn = "dt_comm_barrier";
    dt_comm_req sq, *q;
    dt_status st;
    if (c) dt__cm_reap(c, 1); /* past a barrier, every earlier call of this rank has completed */
    st = dt__cm_open(c, &sq, NULL, 0, DT_COLL_BARRIER, fn, &q);
    return st ? st : dt__cm_run(q, DT_OK, 0, NULL);
}

/* Send and recv are not collectives: no seq, no check; a timeout cancels only themselves. */
static dt_status dt__cm_p2p(dt_comm *c, dt_tensor *t, int peer, int tag, int send, dt_comm_req **out, int async,
                            const char *fn) {
    dt_comm_req sq, *q;
    dt_status st;
    if (!c) return DT_ERR_ARG;
    if (async && !out) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: req is NULL", fn);
    if (out) *out = NULL;
    if ((st = dt__cm_usable(c, fn)) != DT_OK) return st;
    st = dt__cm_tensor_ok(c, t, fn, "t");
    if (!st) st = dt__cm_root_ok(c, peer, fn, send ? "dst" : "src");
#ifdef DT_MPI
    if (!st && (tag < 0 || tag > c->tag_ub))
        st = dt_ctx_set_error(c->ctx, DT_ERR_RANGE, "%s: tag = %d; expected 0..%d", fn, tag, c->tag_ub);
#else
    if (!st && (tag < 0 || tag > 32767))
        st = dt_ctx_set_error(c->ctx, DT_ERR_RANGE, "%s: tag = %d; expected 0..32767", fn, tag);
#endif
    if (st) return st;
    q = dt__cm_req(c, &sq, out, send ? DT_COLL_SEND : DT_COLL_RECV, fn);
    if (!q) return DT_ERR_OOM;
    q->et = dt__cm_et(t->dtype);
    q->arg = peer;
    q->tag = tag;
    q->count = t->numel;
    q->stat_bytes = (double)dt_tensor_bytes(t);
    if (send) q->tin = *t;
    else q->tout = *t;
#ifndef DT_MPI
    {   /* one rank: a send is queued, a recv takes the first queued message with its tag */
        dt__cm_msg *m, **pp;
        dt_tensor hv;
        size_t bytes = dt_tensor_bytes(t);
        q->t0 = dt__cm_now();
        if (send) {
            m = (dt__cm_msg *)dt_alloc(c->ctx, sizeof *m + (bytes ? bytes : 1));
            if (!m) st = DT_ERR_OOM;
            else {
                memset(m, 0, sizeof *m);
                m->tag = tag;
                m->et = q->et;
                m->count = t->numel;
                m->data = (char *)(m + 1);
                dt__cm_host_view(&hv, m->data, q->et, t->numel);
                st = dt_tensor_copy(c->ctx, &hv, t);
                if (st) dt_release(c->ctx, m);
                else {
                    for (pp = &c->selfq; *pp; pp = &(*pp)->next) {}
                    *pp = m;
                }
            }
        } else {
            for (pp = &c->selfq; *pp && (*pp)->tag != tag; pp = &(*pp)->next) {}
            m = *pp;
            if (!m)
                st = dt_ctx_set_error(c->ctx, DT_ERR_TIMEOUT, "%s: no message from rank 0 with tag %d on group %s (size "
                                      "1): nothing was sent, and in a world of one rank nothing else can send it", fn,
                                      tag, c->name);
            else if (m->et != q->et || m->count != t->numel) { /* consumed, as with MPI */
                st = dt_ctx_set_error(c->ctx, DT_ERR_COMM, "%s: the message from rank 0 (tag %d) has %lld x %s; t has "
                                      "%lld x %s: the sizes must match, nothing was written to t", fn, tag,
                                      (long long)m->count, dt__cm_ename(m->et), (long long)t->numel,
                                      dt__cm_ename(q->et));
                *pp = m->next;
                dt_release(c->ctx, m);
            } else {
                dt__cm_host_view(&hv, m->data, q->et, t->numel);
                st = dt_tensor_copy(c->ctx, t, &hv);
                *pp = m->next;
                dt_release(c->ctx, m);
            }
        }
        if (!st) dt__cm_complete(q);
        else {
            q->done = 1;
            q->status = st;
        }
        return dt__cm_finish_call(q, st, out);
    }
#else
    st = dt__cm_start_p2p(q);
    return dt__cm_finish_call(q, st, out);
#endif
}

DT_API dt_status dt_comm_send(dt_comm *c, const dt_tensor *t, int dst, int tag) {
    return dt__cm_p2p(c, (dt_tensor *)t, dst, tag, 1, NULL, 0, "dt_comm_send");
}
DT_API dt_status dt_comm_recv(dt_comm *c, dt_tensor *t, int src, int tag) {
    return dt__cm_p2p(c, t, src, tag, 0, NULL, 0, "dt_comm_recv");
}
DT_API dt_status dt_comm_isend(dt_comm *c, const dt_tensor *t, int dst, int tag, dt_comm_req **req) {
    return dt__cm_p2p(c, (dt_tensor *)t, dst, tag, 1, req, 1, "dt_comm_isend");
}
DT_API dt_status dt_comm_irecv(dt_comm *c, dt_tensor *t, int src, int tag, dt_comm_req **req) {
    return dt__cm_p2p(c, t, src, tag, 0, req, 1, "dt_comm_irecv");
}

DT_API dt_status dt_comm_test(dt_comm_req *req, int *done) {
    if (done) *done = 0;
    if (!req) return DT_ERR_ARG;
    if (!done) return dt_ctx_set_error(req->c->ctx, DT_ERR_ARG, "dt_comm_test: done is NULL");
    if (!dt__cm_done(req)) {
        dt__cm_progress(req->c);
        dt__cm_serve(req->c);
        if (!dt__cm_done(req) && req->seq > 0 && req->c->failed_seq > 0 && req->seq >= req->c->failed_seq) {
            dt_comm *c = req->c;
            dt_status st = dt__cm_abandon(req, c->failed_rank);
            *done = 1;
            return st;
        }
    }
    *done = req->done;
    return req->done ? dt__cm_said(req, req->status) : DT_OK;
}

DT_API dt_status dt_comm_wait(dt_comm_req *req) {
    dt_status st;
    dt_ctx *ctx;
    if (!req) return DT_ERR_ARG;
    ctx = req->c->ctx;
    /* NCCL: complete for the caller in stream order, as a blocking call (dt__cm_detach) */
    if (req->path == DT__CM_NCCL && !dt__cm_done(req) && !dt__cm_wait_until(req, 1) && !dt__cm_done(req) &&
        dt__cm_detach(req, 1))
        return DT_OK;
    st = dt__cm_said(req, dt__cm_done(req) ? req->status : dt__cm_wait(req));
    if (st == DT_ERR_STATE && req->c->broken && ctx->last_status != DT_ERR_STATE)
        dt_ctx_set_error(ctx, DT_ERR_STATE, "dt_comm_wait: %s was abandoned: group %s is unusable: %s",
                         dt_coll_name((dt_coll)req->kind), req->c->name, req->c->broken_msg);
    dt__cm_free_kids(req);
    dt__cm_fifo_unlink(req->c, req);
    dt__cm_release_req_bufs(req);
    dt__cm_drop_gate(req);
    dt_release(ctx, req);
    return st;
}

/* ==== >>split: groups: dt_comm_split ========================================================== */

#ifdef DT_MPI
/* This rank's MPI group of the ranks of parent that passed its color (*out stays NULL for a
   negative color), with each member's world rank. */
static dt_status dt__cm_split_mpi(dt_comm *parent, dt_comm_req *q, int color, int key, dt_comm **out, const char *fn) {
    dt_comm *c;
    dt_status st;
    MPI_Comm nc = MPI_COMM_NULL;
    MPI_Group pg, cg;
    int64_t mine[2], *all;
    MPI_Request r;
    int rc, i, *idx;
    *out = NULL;
    /* everyone arrives first (with a timeout): MPI_Comm_split itself cannot time out */
    all = (int64_t *)dt_alloc(parent->ctx, (size_t)parent->size * 2 * sizeof(int64_t));
    if (!all) return DT_ERR_OOM;
    mine[0] = color;
    mine[1] = key;
    rc = MPI_Iallgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, parent->ctl, &r);
    st = rc != MPI_SUCCESS ? dt__cm_mpi_error(parent, rc, fn, "MPI_Iallgather") : dt__cm_wait_ctl(q, &r, "MPI_Iallgather");
    dt_release(parent->ctx, all);
    if (st) return st;
    rc = MPI_Comm_split(parent->ctl, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS) return dt__cm_mpi_error(parent, rc, fn, "MPI_Comm_split");
    if (nc == MPI_COMM_NULL) return DT_OK;
    c = dt__cm_new(parent->ctx);
    if (!c) {
        MPI_Comm_free(&nc);
        return DT_ERR_OOM;
    }
    st = dt__cm_mpi_setup(c, nc, fn);
    if (!st) st = dt__cm_mpi_local(c, 0, fn);
    if (!st) {
        c->world_ranks = (int *)dt_alloc(parent->ctx, (size_t)c->size * 2 * sizeof(int));
        c->host_of = (int *)dt_alloc(parent->ctx, (size_t)c->size * sizeof(int));
        if (!c->world_ranks || !c->host_of) st = DT_ERR_OOM;
    }
    if (!st) { /* group rank -> parent rank -> world rank */
        idx = c->world_ranks + c->size;
        for (i = 0; i < c->size; i++) idx[i] = i;
        MPI_Comm_group(nc, &cg);
        MPI_Comm_group(parent->ctl, &pg);
        MPI_Group_translate_ranks(cg, c->size, idx, pg, c->world_ranks);
        MPI_Group_free(&cg);
        MPI_Group_free(&pg);
        for (i = 0; i < c->size; i++) {
            c->host_of[i] = parent->host_of[c->world_ranks[i]];
            c->world_ranks[i] = parent->world_ranks[c->world_ranks[i]];
        }
        st = dt__cm_mpi_hosts(c, fn);
    }
    MPI_Comm_free(&nc);
    if (st) {
        dt__cm_release_all(c);
        return st;
    }
    *out = c;
    return DT_OK;
}
#else
/* Without MPI each group is this one rank (*out stays NULL for a negative color). */
static dt_status dt__cm_split_self(dt_comm *parent, int color, dt_comm **out) {
    dt_comm *c;
    *out = NULL;
    if (color < 0) return DT_OK;
    c = dt__cm_new(parent->ctx);
    if (!c) return DT_ERR_OOM;
    c->size = 1;
    c->local_size = 1;
    c->hosts = c->per_host = 1;
    c->world_ranks = (int *)dt_alloc(parent->ctx, sizeof(int));
    if (!c->world_ranks) {
        dt__cm_release_all(c);
        return DT_ERR_OOM;
    }
    c->world_ranks[0] = parent->world_ranks[0];
    *out = c;
    return DT_OK;
}
#endif

DT_API dt_status dt_comm_split(dt_comm *parent, dt_comm **out, int color, int key) {
    const char *fn = "dt_comm_split";
    dt_comm_req q;
    dt_comm *c = NULL;
    dt_status st;
    char name[96];
    if (out) *out = NULL;
    if (!parent) return DT_ERR_ARG;
    if ((st = dt__cm_usable(parent, fn)) != DT_OK) return st;
    if (!out) return dt_ctx_set_error(parent->ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    dt__cm_req_init(&q, parent, DT__CM_SPLIT, fn);
    q.count = 0;
    DT__TRY(dt__cm_enter(&q, DT_OK));
#ifdef DT_MPI
    DT__TRY(dt__cm_split_mpi(parent, &q, color, key, &c, fn));
#else
    (void)key;
    DT__TRY(dt__cm_split_self(parent, color, &c));
#endif
    if (!c) return DT_OK; /* a negative color: in no group */
    c->timeout = parent->timeout;
    c->deadline = parent->deadline;
    c->check = parent->check;
    c->nccl_mode = parent->nccl_mode;
    c->hier = parent->hier;
    snprintf(name, sizeof name, "%s.%d", parent->name, color);
    dt__cm_set_name(c, name);
    *out = c;
    return DT_OK;
}

/* ==== >>bucketer: the gradient bucketer (DDP) ================================================= */

typedef struct dt__cm_slot {
    dt_param *p;
    int bucket;
    int64_t offset; /* in the bucket, elements */
    int ready;
} dt__cm_slot;

typedef struct dt__cm_bucket {
    dt_tensor flat;   /* f32, on the grads' device */
    int first, count; /* its slots: slots[first .. first + count) */
    int unready;
    dt_comm_req *req;
} dt__cm_bucket;

struct dt_bucketer {
    dt_comm *c;
    dt_params *ps;
    int n_params, n_buckets, next_launch, sync;
    int views;             /* 0: grads copied in and out; 1: grads moved into the buckets; 2: desc.flat */
    dt_reduce_op op;
    dt__cm_slot *slots;    /* bucket order: reverse registration order */
    dt__cm_bucket *buckets;
    dt__cm_slot **by_ptr;  /* slots sorted by param address, for mark_ready */
};

static int dt__cm_slot_cmp(const void *a, const void *b) {
    const dt_param *pa = (*(dt__cm_slot *const *)a)->p, *pb = (*(dt__cm_slot *const *)b)->p;
    return pa < pb ? -1 : pa > pb ? 1 : 0;
}

DT_API void dt_bucketer_free(dt_bucketer *b) {
    int i;
    dt_ctx *ctx;
    if (!b) return;
    ctx = b->c->ctx;
    for (i = 0; i < b->n_buckets; i++)
        if (b->buckets[i].req) dt_comm_wait(b->buckets[i].req);
    for (i = 0; b->views == 1 && i < b->n_params; i++) { /* each grad that is a view gets its own memory back */
        dt_param *p = b->slots[i].p;
        dt_tensor own, view = p->grad;
        if (view.owns || view.numel == 0) continue;
        if (dt_tensor_create_like(ctx, &own, &view, DT_F32, DT_DEVICE_DEFAULT) != DT_OK ||
            dt_tensor_copy(ctx, &own, &view) != DT_OK) {
            dt_tensor_free(ctx, &own);
            b->buckets[b->slots[i].bucket].unready = -1; /* out of memory: the bucket stays, the view valid */
            continue;
        }
        p->grad = own;
    }
    for (i = 0; i < b->n_buckets; i++)
        if (b->buckets[i].unready != -1) dt_tensor_free(ctx, &b->buckets[i].flat);
    dt_release(ctx, b->slots);
    dt_release(ctx, b->buckets);
    dt_release(ctx, b->by_ptr);
    dt_release(ctx, b);
}

/* Element of flat where p's grad starts, or -1 when it does not lie inside flat. */
static int64_t dt__cm_flat_at(const dt_tensor *flat, const dt_param *p) {
    uintptr_t at = (uintptr_t)p->grad.data, base = (uintptr_t)flat->data;
    if (!flat->data || at < base || (at - base) % 4 || (int64_t)((at - base) / 4) > flat->numel - p->grad.numel)
        return -1;
    return (int64_t)((at - base) / 4);
}

/* desc.flat: the grads lie back to back inside it, in registration order. */
static dt_status dt__cm_flat_check(dt_comm *c, const dt_params *ps, const dt_tensor *flat, const char *fn) {
    int64_t want = 0;
    int i;
    if (flat->dtype != DT_F32 || (ps->count && flat->device != ps->items[0]->grad.device))
        return dt_ctx_set_error(c->ctx, DT_ERR_DTYPE, "%s: desc.flat is %s on %s; expected f32 on the grads' device",
                                fn, dt_dtype_name(flat->dtype), dt_device_name(flat->device));
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        int64_t at = dt__cm_flat_at(flat, p);
        if (i == 0 && at >= 0) want = at;
        if (at < 0 || at != want)
            return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: param \"%s\"'s grad is %s of desc.flat; expected the "
                                    "grads back to back in registration order inside it (as dt_arena lays them)",
                                    fn, p->name, at < 0 ? "not inside" : "not next after the one before it in");
        want = at + p->grad.numel;
    }
    return DT_OK;
}

/* Bucket i as a view of its range of flat (the lowest-registered param of the bucket first), and
   each slot's offset in it. */
static dt_status dt__cm_bucket_in_flat(dt_bucketer *b, int i, const dt_tensor *flat) {
    dt__cm_bucket *bk = &b->buckets[i];
    int64_t from = dt__cm_flat_at(flat, b->slots[bk->first + bk->count - 1].p);
    int64_t len = dt__cm_flat_at(flat, b->slots[bk->first].p) + b->slots[bk->first].p->grad.numel - from;
    int k;
    for (k = bk->first; k < bk->first + bk->count; k++) b->slots[k].offset = dt__cm_flat_at(flat, b->slots[k].p) - from;
    return dt_tensor_view(b->c->ctx, &bk->flat, flat, from, 1, &len);
}

/* dt_bucketer_create in three steps: check the desc and the grads (nothing changes on a failure),
   resolve the desc's defaults, build the buckets. No step is collective: each rank builds its own. */
static dt_status dt__cm_bucketer_check(dt_comm *c, const dt_params *ps, const dt_bucketer_desc *d, const char *fn) {
    int i;
    if (d->bucket_bytes < 0 || d->first_bucket_bytes < 0)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: desc.%s = %lld; expected >= 0 (0 = default)", fn,
                                d->bucket_bytes < 0 ? "bucket_bytes" : "first_bucket_bytes",
                                (long long)(d->bucket_bytes < 0 ? d->bucket_bytes : d->first_bucket_bytes));
    if (d->average < -1 || d->average > 1)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: desc.average = %d; expected 0 (default: average), 1 or -1 "
                                "(sum)", fn, d->average);
    if (d->grad_views != 0 && d->grad_views != 1)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: desc.grad_views = %d; expected 0 (grads copied in and out) "
                                "or 1 (grads become views into the buckets)", fn, d->grad_views);
    for (i = 0; i < ps->count; i++) {
        const dt_param *p = ps->items[i];
        if (dt__cm_et(p->grad.dtype) != DT_F32 || !p->grad.data)
            return dt_ctx_set_error(c->ctx, DT_ERR_DTYPE, "%s: param \"%s\" has a %s grad%s; expected f32 grads", fn,
                                    p->name, dt_dtype_name(p->grad.dtype), p->grad.data ? "" : " without data");
        if (p->grad.device != ps->items[0]->grad.device)
            return dt_ctx_set_error(c->ctx, DT_ERR_DEVICE, "%s: param \"%s\" has its grad on %s, param \"%s\" on %s; "
                                    "expected every grad on one device", fn, p->name, dt_device_name(p->grad.device),
                                    ps->items[0]->name, dt_device_name(ps->items[0]->grad.device));
    }
    return d->flat ? dt__cm_flat_check(c, ps, d->flat, fn) : DT_OK;
}

static void dt__cm_bucketer_resolve(dt_bucketer_desc *d) {
    if (d->bucket_bytes == 0) d->bucket_bytes = 25 * 1024 * 1024;
    if (d->first_bucket_bytes == 0) d->first_bucket_bytes = 1024 * 1024;
}

/* The object and its arrays, sized for one bucket per param at the most; NULL (everything freed)
   when out of memory. */
static dt_bucketer *dt__cm_bucketer_new(dt_comm *c, dt_params *ps, const dt_bucketer_desc *d) {
    size_t n = (size_t)(ps->count ? ps->count : 1);
    dt_bucketer *b = (dt_bucketer *)dt_alloc_zeroed(c->ctx, sizeof *b);
    if (!b) return NULL;
    b->c = c;
    b->ps = ps;
    b->sync = 1;
    b->op = d->average == -1 ? DT_REDUCE_SUM : DT_REDUCE_AVG;
    b->n_params = ps->count;
    b->slots = (dt__cm_slot *)dt_alloc(c->ctx, n * sizeof(dt__cm_slot));
    b->buckets = (dt__cm_bucket *)dt_alloc_zeroed(c->ctx, n * sizeof(dt__cm_bucket));
    b->by_ptr = (dt__cm_slot **)dt_alloc(c->ctx, n * sizeof(dt__cm_slot *));
    if (!b->slots || !b->buckets || !b->by_ptr) {
        dt_bucketer_free(b); /* views is still 0: no grad was moved into a bucket */
        return NULL;
    }
    return b;
}

/* Slots in reverse registration order (the order backward makes the grads); a bucket closes when
   the next grad would pass its cap. */
static void dt__cm_bucketer_layout(dt_bucketer *b, const dt_bucketer_desc *d) {
    int64_t cap = d->first_bucket_bytes, used = 0;
    int i, k, nb = 0;
    for (k = 0, i = b->n_params - 1; i >= 0; i--, k++) {
        dt_param *p = b->ps->items[i];
        int64_t bytes = p->grad.numel * 4;
        if (nb == 0 || (used > 0 && used + bytes > cap)) {
            if (nb > 0) cap = d->bucket_bytes;
            b->buckets[nb].first = k;
            nb++;
            used = 0;
        }
        b->slots[k].p = p;
        b->slots[k].bucket = nb - 1;
        b->slots[k].offset = used / 4;
        b->slots[k].ready = 0;
        b->buckets[nb - 1].count++;
        used += bytes;
    }
    b->n_buckets = nb;
}

/* Each bucket's flat buffer: its own, or its range of desc.flat. */
static dt_status dt__cm_bucketer_flats(dt_bucketer *b, const dt_bucketer_desc *d) {
    dt_tensor_desc td;
    int i;
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32;
    td.device = b->n_params ? b->ps->items[0]->grad.device : DT_CPU;
    for (i = 0; i < b->n_buckets; i++) {
        const dt__cm_slot *last = &b->slots[b->buckets[i].first + b->buckets[i].count - 1];
        td.shape[0] = last->offset + last->p->grad.numel;
        if (td.shape[0] == 0) td.shape[0] = 1; /* a bucket of empty grads still takes part */
        DT__TRY(d->flat ? dt__cm_bucket_in_flat(b, i, d->flat) : dt_tensor_create(b->c->ctx, &b->buckets[i].flat, &td));
        b->buckets[i].unready = b->buckets[i].count;
    }
    return DT_OK;
}

/* desc.grad_views: each grad moves into its bucket and becomes a view of it. */
static dt_status dt__cm_bucketer_move_grads(dt_bucketer *b) {
    dt_ctx *ctx = b->c->ctx;
    int k;
    for (k = 0; k < b->n_params; k++) {
        dt__cm_slot *sl = &b->slots[k];
        dt_tensor v, old = sl->p->grad;
        if (old.numel == 0) continue;
        DT__TRY(dt_tensor_view(ctx, &v, &b->buckets[sl->bucket].flat, sl->offset, old.ndim, old.shape));
        DT__TRY(dt_tensor_copy(ctx, &v, &old));
        dt_tensor_free(ctx, &sl->p->grad);
        sl->p->grad = v;
    }
    return DT_OK;
}

DT_API dt_status dt_bucketer_create(dt_comm *c, dt_bucketer **out, dt_params *ps, const dt_bucketer_desc *desc) {
    const char *fn = "dt_bucketer_create";
    dt_bucketer_desc d;
    dt_bucketer *b;
    dt_status st;
    int k;
    if (out) *out = NULL;
    if (!c) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if (!ps) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "%s: ps is NULL", fn);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    DT__TRY(dt__cm_bucketer_check(c, ps, &d, fn));
    dt__cm_bucketer_resolve(&d);
    if (!(b = dt__cm_bucketer_new(c, ps, &d))) return DT_ERR_OOM;
    dt__cm_bucketer_layout(b, &d);
    st = dt__cm_bucketer_flats(b, &d);
    if (!st) b->views = d.flat ? 2 : d.grad_views; /* before the move: free gives moved grads memory back */
    if (!st && b->views == 1) st = dt__cm_bucketer_move_grads(b);
    if (st) {
        dt_bucketer_free(b);
        return st;
    }
    for (k = 0; k < ps->count; k++) b->by_ptr[k] = &b->slots[k];
    qsort(b->by_ptr, (size_t)ps->count, sizeof(dt__cm_slot *), dt__cm_slot_cmp);
    *out = b;
    return DT_OK;
}

DT_API int dt_bucketer_count(const dt_bucketer *b) { return b ? b->n_buckets : 0; }
DT_API dt_status dt_bucketer_set_sync(dt_bucketer *b, int sync) {
    if (!b) return DT_ERR_ARG;
    if (sync != 0 && sync != 1)
        return dt_ctx_set_error(b->c->ctx, DT_ERR_ARG, "dt_bucketer_set_sync: sync = %d; expected 1 (all-reduce at "
                                "finish) or 0 (an accumulation micro-step: grads stay local)", sync);
    b->sync = sync;
    return DT_OK;
}

/* Copies p's grad into its place in the bucket. */
static dt_status dt__cm_pack(dt_bucketer *b, dt__cm_slot *s) {
    dt_tensor v;
    int64_t n = s->p->grad.numel;
    dt_status st;
    s->ready = 1;
    b->buckets[s->bucket].unready--;
    if (n == 0 || b->views) return DT_OK; /* a view is in its bucket already */
    st = dt_tensor_view(b->c->ctx, &v, &b->buckets[s->bucket].flat, s->offset, 1, &n);
    if (!st) st = dt_tensor_copy(b->c->ctx, &v, &s->p->grad);
    return st;
}

/* Launches the full buckets at the front of the line, in order. */
static dt_status dt__cm_launch_ready(dt_bucketer *b) {
    while (b->next_launch < b->n_buckets && b->buckets[b->next_launch].unready == 0) {
        dt__cm_bucket *bk = &b->buckets[b->next_launch];
        dt_status st = dt_comm_iallreduce(b->c, &bk->flat, b->op, &bk->req);
        if (st) return st;
        b->next_launch++;
    }
    return DT_OK;
}

DT_API dt_status dt_bucketer_mark_ready(dt_bucketer *b, dt_param *p) {
    const char *fn = "dt_bucketer_mark_ready";
    dt__cm_slot key, *kp = &key, **found;
    dt_status st;
    if (!b) return DT_ERR_ARG;
    if (!b->sync) return DT_OK;
    if (!p) return dt_ctx_set_error(b->c->ctx, DT_ERR_ARG, "%s: p is NULL", fn);
    if (b->ps->count != b->n_params)
        return dt_ctx_set_error(b->c->ctx, DT_ERR_STATE, "%s: the parameter set has %d params, the bucketer was made "
                                "for %d; make a new bucketer", fn, b->ps->count, b->n_params);
    key.p = p;
    found = (dt__cm_slot **)bsearch(&kp, b->by_ptr, (size_t)b->n_params, sizeof(dt__cm_slot *), dt__cm_slot_cmp);
    if (!found)
        return dt_ctx_set_error(b->c->ctx, DT_ERR_ARG, "%s: param \"%s\" is not in the bucketer's parameter set", fn,
                                p->name);
    if ((*found)->ready)
        return dt_ctx_set_error(b->c->ctx, DT_ERR_STATE, "%s: param \"%s\" was marked ready twice in this step (call "
                                "dt_bucketer_finish to end a step)", fn, p->name);
    st = dt__cm_pack(b, *found);
    if (!st) st = dt__cm_launch_ready(b);
    if (!st) dt__cm_progress(b->c); /* keep the buckets in flight moving */
    return st;
}

DT_API dt_status dt_bucketer_finish(dt_bucketer *b) {
    const char *fn = "dt_bucketer_finish";
    dt_status st = DT_OK, w;
    int i, k;
    if (!b) return DT_ERR_ARG;
    if (!b->sync) return DT_OK;
    if (b->ps->count != b->n_params) /* still wait for the buckets in flight and reset below */
        st = dt_ctx_set_error(b->c->ctx, DT_ERR_STATE, "%s: the parameter set has %d params, the bucketer was made "
                              "for %d; make a new bucketer", fn, b->ps->count, b->n_params);
    for (k = 0; k < b->n_params && !st; k++)
        if (!b->slots[k].ready) st = dt__cm_pack(b, &b->slots[k]);
    if (!st) st = dt__cm_launch_ready(b);
    for (i = 0; i < b->n_buckets; i++) { /* wait for all, even after an error, so none is left in flight */
        if (!b->buckets[i].req) continue;
        w = dt_comm_wait(b->buckets[i].req);
        b->buckets[i].req = NULL;
        if (w && !st) st = w;
    }
    for (k = 0; k < b->n_params; k++) {
        dt__cm_slot *s = &b->slots[k];
        int64_t n = s->p->grad.numel;
        dt_tensor v;
        if (!st && n > 0 && !b->views) {
            st = dt_tensor_view(b->c->ctx, &v, &b->buckets[s->bucket].flat, s->offset, 1, &n);
            if (!st) st = dt_tensor_copy(b->c->ctx, &s->p->grad, &v);
        }
        s->ready = 0;
    }
    for (i = 0; i < b->n_buckets; i++) b->buckets[i].unready = b->buckets[i].count;
    b->next_launch = 0;
    return st;
}

/* ==== >>stats: statistics and the observer ==================================================== */

DT_API dt_status dt_comm_stats(const dt_comm *c, dt_comm_stat *out, dt_coll kind) {
    if (out) memset(out, 0, sizeof *out);
    if (!c) return DT_ERR_ARG;
    dt__cm_reap((dt_comm *)c, 1); /* blocking NCCL calls count once they have run (a wait if they still run) */
    if (!out) return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_stats: out is NULL");
    if ((int)kind < 0 || kind >= DT_COLL_COUNT)
        return dt_ctx_set_error(c->ctx, DT_ERR_ARG, "dt_comm_stats: kind = %d is not a dt_coll", (int)kind);
    out->calls = (int64_t)c->stat_calls[kind];
    out->nccl_calls = (int64_t)c->stat_nccl[kind];
    out->hier_calls = (int64_t)c->stat_hier[kind];
    out->bytes = c->stat_bytes[kind];
    out->seconds = c->stat_secs[kind];
    out->algbw = out->seconds > 0 ? out->bytes / out->seconds / 1e9 : 0.0;
    out->busbw = out->algbw * dt_coll_bus_factor(kind, c->size);
    return DT_OK;
}

DT_API dt_status dt_comm_set_observer(dt_comm *c, dt_comm_observer_fn fn, void *user) {
    if (!c) return DT_ERR_ARG;
    c->observer = fn;
    c->observer_user = fn ? user : NULL;
    return DT_OK;
}

DT_API double dt_comm_now(void) { return dt__cm_now(); }

DT_API void dt_comm_stats_reset(dt_comm *c) {
    if (!c) return;
    dt__cm_reap(c, 1); /* the calls made before count before */
    memset(c->stat_calls, 0, sizeof c->stat_calls);
    memset(c->stat_nccl, 0, sizeof c->stat_nccl);
    memset(c->stat_hier, 0, sizeof c->stat_hier);
    memset(c->stat_bytes, 0, sizeof c->stat_bytes);
    memset(c->stat_secs, 0, sizeof c->stat_secs);
}

DT_API size_t dt_comm_stats_format(const dt_comm *c, char *buf, size_t n) {
    size_t len = 0;
    int k;
    char tmp[160];
    if (buf && n) buf[0] = 0;
    if (!c) return 0;
    dt__cm_reap((dt_comm *)c, 1);
#define DT__CM_PUT(...)                                                                            \
    do {                                                                                           \
        int w_ = snprintf(tmp, sizeof tmp, __VA_ARGS__);                                           \
        if (buf && len < n) snprintf(buf + len, n - len, "%s", tmp);                               \
        len += (size_t)(w_ > 0 ? w_ : 0);                                                          \
    } while (0)
    DT__CM_PUT("communication on group %s (size %d, rank %d)\n", c->name, c->size, c->rank);
    DT__CM_PUT("  %-15s %10s %14s %11s %11s %11s\n", "collective", "calls", "bytes", "seconds", "algbw GB/s",
               "busbw GB/s");
    for (k = 0; k < DT_COLL_COUNT; k++) {
        dt_comm_stat s;
        if (c->stat_calls[k] == 0) continue;
        dt_comm_stats(c, &s, (dt_coll)k);
        DT__CM_PUT("  %-15s %10lld %14.0f %11.4f %11.3f %11.3f", dt_coll_name((dt_coll)k), (long long)s.calls,
                   s.bytes, s.seconds, s.algbw, s.busbw);
        if (s.nccl_calls) DT__CM_PUT("  (device, NCCL: %lld)", (long long)s.nccl_calls);
        if (s.hier_calls) DT__CM_PUT("  (two levels: %lld)", (long long)s.hier_calls);
        DT__CM_PUT("\n");
    }
#undef DT__CM_PUT
    return len;
}

DT_API void dt_comm_stats_print(const dt_comm *c) {
    char buf[2048];
    dt_comm_stats_format(c, buf, sizeof buf);
    fputs(buf, stdout);
    fflush(stdout);
}

#ifdef __cplusplus
}
#endif
DT__STATIC_QUIET_END
#endif /* DT_COMM_IMPLEMENTATION_DONE */
#endif /* DT_COMM_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the dt authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
