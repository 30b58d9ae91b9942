/* dt_tensor.h - tensors, dtypes, devices, core ops (forward + backward), counter-based RNG,
   parameter sets and safetensors I/O for the dt toolkit.              v0.2, MIT licence

   The lesson. A model is a chain of ops. Each op has a forward and a backward that share a
   name stem, and the backward ADDS (+=) into the gradients it is given, as llm.c does:
         x --linear_fwd--> h --gelu_fwd--> a --linear_fwd--> y --softmax_xent_fwd--> loss
        dx <-linear_bwd--- dh <-gelu_bwd--- da <-linear_bwd--- dy <-softmax_xent_bwd---
                 |                                 |
                 +--> dw1 += dh^T x, db1 += sum dh +--> dw2 += dy^T a, db2 += sum dy
   So a tensor used twice gets both contributions, and the caller zeroes the gradients once per
   step (dt_params_zero_grad); forward outputs are overwritten. Everything hangs off a dt_ctx
   (allocator, last error, scratch); a dt_tensor is a plain struct the caller owns (dtype,
   device, shape, data), and a view looks into another tensor's memory.
   Random numbers are counter-based (Philox4x32-10): value k of a tensor is a pure function of
   (seed, name, global index k), so an initialisation does not depend on the order of the calls
   or on how the tensor is sharded; a shard of a parallel run holds the whole tensor's numbers:
        dt_tensor_init, name "fc.w":   whole, one rank    [ w0 w1 w2 w3 | w4 w5 w6 w7 ]
                                       tp = 2, rank 1                   [ w4 w5 w6 w7 ]

   Contents. Each marker finds this line, its section in the declarations and the same section
   in the implementation (which starts at >>implementation):
       >>status        statuses and their names
       >>dtypes        dtypes (f32, bf16, f16, i32, i64, u8), devices, conversions
       >>ctx           the context: allocator, errors, log callback, scratch
       >>tensors       tensors: create, view, reshape, copy, fill, cast; checked sizes
       >>rng           counter-based RNG and dt_tensor_init
       >>ops           ops, forward and backward: GEMM, matmul, linear, activations, layernorm,
                       losses, elementwise, embedding, attention, dot interaction, concat / split
       >>params        parameter sets (named values with gradients)
       >>json          the small JSON reader and escaper (safetensors headers, manifests)
       >>strbuf        a growable string (dt_strbuf)
       >>safetensors   safetensors files: save, open, read; dt_params_save / _load

   API in one breath, in the order a program calls it:
       dt_ctx_init                    the context (allocator, device); dt_ctx_error after a failure
       dt_params_add                  each parameter (value + f32 grad), then dt_tensor_init
       dt_tensor_create / _view / _reshape / _copy / _fill / _cast   activations and buffers
       each step:   dt_params_zero_grad; the ops' _fwd in order (dt_matmul, dt_linear,
                    dt_bias_add, dt_relu, dt_gelu, dt_layernorm, dt_attention, dt_embedding,
                    dt_softmax_xent, dt_bce_logits, dt_add, dt_mul, dt_scale, dt_axpy, dt_sum,
                    dt_sumsq, dt_dot_interaction, dt_concat, dt_split), then their _bwd in
                    reverse order (dt_linear_gelu_fwd: a linear and its GELU in one call, one
                    GEMM on CUDA; its backward is dt_gelu_bwd then dt_linear_bwd)
       dt_params_save / _load, dt_safetensors_save / _open / _read / _close
       dt_tensor_free, dt_params_free, dt_ctx_shutdown

   Do this:
       #define DT_TENSOR_IMPLEMENTATION      (or DT_IMPLEMENTATION for every dt header)
   before you include this file in *one* C or C++ file to create the implementation.
   Every other file includes it without the define.

   Compile-time options. The first group changes declarations, so define it the same way in
   EVERY file that includes dt (or in the compiler flags); the second only matters in the file
   with the implementation (as stb_ds's STBDS_* options do):
     in every file:
       DT_STATIC       every function is `static` (two libraries can each vendor their own copy).
       DT_API          the decoration of every external symbol (default: extern, or static under
                       DT_STATIC).
     in the implementation file only:
       DT_CBLAS        CPU GEMM through cblas_sgemm (link -lopenblas). Without it a portable
                       blocked GEMM in this file is used.
       DT_CUDA         CUDA tensors (cudaMalloc, cudaMemcpy), and the ops matmul, linear,
                       bias_add, relu, gelu, layernorm, attention, embedding, softmax_xent (fwd
                       and bwd), axpy, concat and split on them through kernels/ (link the
                       objects of nvcc -c kernels/dt_*.cu, -lcublasLt -lcublas -lcudart; the other ops take
                       CPU tensors only). Without it asking for a CUDA tensor returns
                       DT_ERR_DEVICE "built without DT_CUDA".
       DT_ASSERT(c)    internal invariant checks (default: assert.h). Never used for user errors.
       DT_TENSOR_NO_SIMD  plain C loops instead of SSE2 in gelu, layernorm, softmax_xent,
                       attention's softmax and the dot interaction (same results, bit for bit:
                       the lanes do the scalar ops). Neither needs more than -lm: the exp is this
                       file's own (see "4-lane vectors").
       DT_TENSOR_NO_AVX2  gelu on 4 lanes even where the CPU has AVX2 (by default, on x86-64
                       under GCC or Clang, it takes 8 when the CPU has them; the same bits
                       either way: see "8-lane vectors").
       DT_TENSOR_NO_AMX   bf16 GEMMs (a bf16 w in dt_linear, a bf16 qkv in attention) as f32
                       GEMMs of the rounded operands even where the CPU has AMX or AVX512_BF16
                       (by default, on x86-64 Linux under GCC >= 11 or Clang >= 12, AMX tiles
                       when the CPU has AMX-BF16, else VDPBF16PS when it has AVX512_BF16: see
                       "bf16 GEMMs on the CPU"; DT_CPU_BF16=avx512 or f32 at run time).

   Conventions (every dt header follows them, and so should code that extends dt):
     - Argument order: the ctx, or the handle that carries one (dt_comm, dt_optimizer,
       dt_bucketer), first; then the object the function is named after when that is not the
       handle (dt_params_add's set, dt_safetensors_read's file); then what the call writes (output
       tensors, the out-pointer of a constructor, result scalars); then what it reads; the desc
       last. An asynchronous call's request comes at the very end, so an i-form is its blocking
       form plus one argument. dt_gemm_portable keeps BLAS's order.
     - Lifetimes: dt_X_create makes something that owns memory, dt_X_free gives it back. A handle
       comes back through `dt_X **out`; a value the caller holds (dt_tensor) is filled in place.
       dt_X_init fills storage the caller owns (dt_ctx_init pairs with dt_ctx_shutdown, which
       releases its scratch; dt_tensor_init fills values). dt_X_open pairs with dt_X_close.
     - Frees take the ctx only when the object does not keep one: handles (dt_comm, dt_optimizer,
       dt_bucketer) and dt_strbuf keep theirs, dt_tensor, dt_params, dt_st_file and dt_json do
       not. Every free accepts NULL, and a value already freed (frees zero what they free).
     - Statuses: DT_ERR_CUDA for a failing CUDA or cuBLAS call, DT_ERR_COMM for MPI and NCCL and
       for ranks that disagree, DT_ERR_DEVICE for a tensor on the wrong device or a backend that
       is not compiled in, DT_ERR_OOM when an allocator (malloc, cudaMalloc) returns nothing.
     - Backward functions take NULL for a gradient the caller does not want; it is skipped.
       (dt_concat_bwd needs every part: their widths say where each slice starts.)
     - Flags (int fields and arguments that mean on/off) are 0 or 1; anything else is DT_ERR_ARG.
     - Sizes: element counts are int64_t, bytes size_t; every product of sizes is checked
       (dt_mul_ok) and one that does not fit is DT_ERR_ARG naming the operands, never a wrap.
       Float-to-integer conversions saturate (NaN becomes 0) or are named errors, never UB.
     - Empty tensors are tensors: a dim may be 0 (give dt_tensor_desc.ndim), and every op
       accepts numel 0.

   Memory: every byte comes from the allocator in dt_ctx_desc (malloc/free by default) and is
   counted: ctx->bytes_in_use and ctx->bytes_peak. Tensors are plain structs owned by the
   caller; a tensor made by dt_tensor_create owns its memory, a view does not (it must not
   outlive the tensor it looks into, exactly like a pointer into an array). An op's output that
   shares memory with one of its inputs (dt_tensor_overlap) is DT_ERR_ARG naming both, except in
   the ops that say they run in place, and there only as the very same tensor.

   Errors: every public function that can fail returns dt_status (0 = DT_OK). The message,
   retrievable with dt_ctx_error(ctx), names the argument, the value and what was expected:
       dt_matmul_fwd: b.shape[0] = 7 does not match a.shape[1] = 8 (inner dimension)
   An optional log callback in dt_ctx_desc sees every error as it is set; silent by default.
   The library never calls exit() or abort() on a user error.

   Threads: a dt_ctx and the tensors made with it belong to one thread at a time. Different
   contexts may be used from different threads. No function keeps hidden global state.

   The licence (MIT) is at the end of this file.
*/
#ifndef DT_TENSOR_H
#define DT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifndef DT_API
#ifdef DT_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define DT_API static __attribute__((unused)) /* a program need not call every function */
#else
#define DT_API static
#endif
#else
#define DT_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>status: statuses ====================================================================== */

typedef enum dt_status {
    DT_OK = 0,
    DT_ERR_ARG,         /* an argument is NULL, negative, out of its range */
    DT_ERR_SHAPE,       /* shapes do not fit together */
    DT_ERR_DTYPE,       /* dtype not supported by this op or mismatched */
    DT_ERR_DEVICE,      /* wrong device, or backend not compiled in */
    DT_ERR_OOM,         /* the allocator returned NULL */
    DT_ERR_IO,          /* open / read / write / rename failed */
    DT_ERR_FORMAT,      /* a file is truncated, corrupt or foreign */
    DT_ERR_RANGE,       /* an index (id, target) is out of range */
    DT_ERR_UNSUPPORTED, /* valid request this build cannot do */
    DT_ERR_COMM,        /* MPI / NCCL failure, mismatched collective */
    DT_ERR_TIMEOUT,     /* a collective did not complete in time */
    DT_ERR_CUDA,        /* CUDA / cuBLAS error */
    DT_ERR_STATE,       /* object used in the wrong state (not initialised, already freed) */
    DT_STATUS_COUNT
} dt_status;

DT_API const char *dt_status_name(dt_status s);

/* ==== >>dtypes: dtypes and devices ============================================================ */

typedef enum dt_dtype {
    DT_DTYPE_DEFAULT = 0, /* = DT_F32 */
    DT_F32,
    DT_BF16,
    DT_F16,
    DT_I32,
    DT_I64,
    DT_U8,
    DT_DTYPE_COUNT
} dt_dtype;

typedef enum dt_device {
    DT_DEVICE_DEFAULT = 0, /* = DT_CPU */
    DT_CPU,
    DT_CUDA_DEVICE,
    DT_DEVICE_COUNT
} dt_device;

DT_API size_t dt_dtype_size(dt_dtype t);
DT_API const char *dt_dtype_name(dt_dtype t);   /* "f32", "bf16", ... */
DT_API const char *dt_device_name(dt_device d); /* "cpu", "cuda" */

/* bf16 / f16 storage is uint16_t; conversions round to nearest even, keep NaN a NaN. */
DT_API uint16_t dt_f32_to_bf16(float f);
DT_API float dt_bf16_to_f32(uint16_t h);
DT_API uint16_t dt_f32_to_f16(float f);
DT_API float dt_f16_to_f32(uint16_t h);

/* ==== >>ctx: the context: allocator, errors, scratch ========================================== */

typedef struct dt_allocator {
    void *(*alloc_fn)(size_t bytes, void *user);
    void (*release_fn)(void *ptr, void *user);
    void *user;
} dt_allocator;

typedef void (*dt_log_fn)(dt_status status, const char *message, void *user);

typedef struct dt_ctx_desc {
    dt_device device;      /* default device for dt_tensor_desc.device == DEFAULT */
    int cuda_device;       /* ordinal used with DT_CUDA */
    dt_allocator allocator;/* host memory; zero = malloc/free */
    dt_log_fn log;         /* sees every error message; NULL = silent */
    void *log_user;
    int tf32;              /* CUDA: f32 GEMMs (dt_matmul, dt_linear) may run on TF32 tensor cores
                              (inputs rounded to 10 mantissa bits, f32 sums: ~1e-3 relative). 0, the
                              default: exact f32, as the CPU path (PyTorch's allow_tf32 = False) */
} dt_ctx_desc;

#define DT_ERROR_MAX 512

/* What a ctx asked of the device since dt_ctx_counters_reset: the proof that a training step
   stays on the GPU. Every device allocation, free, host<->device copy and host wait that dt makes
   goes through the dt_cuda_* calls below, which count here (a CPU ctx keeps zeros). */
typedef struct dt_cuda_counters {
    int64_t syncs;                /* waits of the host for the device */
    int64_t allocs, frees;        /* cudaMalloc / cudaFree */
    int64_t h2d_bytes, h2d_calls; /* host -> device copies */
    int64_t d2h_bytes, d2h_calls; /* device -> host copies */
    int64_t lt_fused, lt_separate; /* dt_linear's GEMMs with a bias / GELU / dbias that ran with
                                      cuBLASLt's epilogue, and that took the separate ops instead
                                      (no algorithm on this GPU, a vector not on 16 bytes, a size 0):
                                      what a GPU run reads to know which path its linears took */
} dt_cuda_counters;

#define DT_CUDA_SCRATCH_CHUNKS 8
#define DT_CUDA_CHECK_SITES 64

typedef struct dt_ctx {
    dt_device device;
    int cuda_device;
    int tf32;              /* dt_ctx_desc.tf32 (0 or 1) */
    void *cuda_stream;     /* cudaStream_t under DT_CUDA (NULL = default stream) */
    void *cublas;          /* cublasHandle_t, created by the CUDA backend on first use */
    void *cublaslt;        /* cublasLtHandle_t (dt_linear's fused epilogues), made beside it */
    void *cublas_workspace; /* its workspace (dt_cuda_alloc, counted; freed by dt_ctx_shutdown) */
    size_t cublas_workspace_bytes;
    dt_allocator allocator;
    dt_log_fn log;
    void *log_user;
    size_t bytes_in_use;   /* host + device bytes currently held by tensors of this ctx */
    size_t bytes_peak;     /* high-water mark of bytes_in_use */
    dt_status last_status;
    char last_error[DT_ERROR_MAX];
    float *scratch;        /* scratch of per-step ops (GEMM packing, attention bwd), grown on demand */
    size_t scratch_floats;
    int initialised;
    dt_cuda_counters counters;  /* what this ctx asked of the device (dt_ctx_counters_reset) */
    /* CUDA only (see >>ctx's "CUDA memory"): the stream-ordered scratch, the status word the
       device checks write, and the names of the checks that may write it */
    void *cuda_scratch[DT_CUDA_SCRATCH_CHUNKS];
    size_t cuda_scratch_size[DT_CUDA_SCRATCH_CHUNKS];
    int cuda_scratch_chunks;
    size_t cuda_scratch_top;    /* bytes handed out of the last chunk */
    size_t cuda_scratch_want;   /* bytes of the one chunk that replaces several at the next begin */
    int cuda_scratch_depth;
    void *cuda_status;          /* device int64[8]: check word [0..4], loss (double) [5], n_valid [6] */
    const char *cuda_check_fn[DT_CUDA_CHECK_SITES], *cuda_check_arg[DT_CUDA_CHECK_SITES];
    int cuda_check_sites;
    int cuda_checks_pending;    /* checks queued since the status word was last read */
    /* dt_tensor_copy_side: the side stream, the events of its last DT_SIDE_EVENTS copies, the event
       it waits on (the ctx stream's work so far), the copies made */
    void *side_stream, *side_ev[16], *side_dep;
    uint64_t side_next;
} dt_ctx;

DT_API dt_status dt_ctx_init(dt_ctx *ctx, const dt_ctx_desc *desc); /* desc may be NULL */
DT_API void dt_ctx_shutdown(dt_ctx *ctx);
DT_API const char *dt_ctx_error(const dt_ctx *ctx); /* message of the last error, "" if none */
/* Sets the ctx error (printf-style) and returns `status`; for use by the other dt headers
   and by user code that wants its errors to travel the same way. */
DT_API dt_status dt_ctx_set_error(dt_ctx *ctx, dt_status status, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
DT_API void dt_ctx_clear_error(dt_ctx *ctx);
/* Raw counted host memory from the ctx allocator, 64-byte aligned. NULL on failure (with the
   ctx error set). dt_release(ctx, NULL) is a no-op. */
DT_API void *dt_alloc(dt_ctx *ctx, size_t bytes);
/* dt_alloc with every byte zero: a struct that starts with nothing set, or an array of counts. */
DT_API void *dt_alloc_zeroed(dt_ctx *ctx, size_t bytes);
DT_API void dt_release(dt_ctx *ctx, void *ptr);

/* CUDA memory and waits (each a DT_ERR_DEVICE without DT_CUDA). A training step on CUDA tensors
   allocates nothing after its first run, copies only its inputs up, and waits for the device at
   most once: where the loss is read. These are the calls that allocate, copy and wait, each
   counted in ctx->counters; the other dt headers use them, and so may a user's own CUDA code.
     dt_cuda_alloc / _release    cudaMalloc / cudaFree (release of NULL is a no-op)
     dt_cuda_memcpy              a copy on ctx's stream; to the host it waits (one sync) so the
                                 bytes are there when it returns; host to device and device to
                                 device do not wait. The devices say the direction.
     dt_cuda_memset              cudaMemsetAsync on ctx's stream (no count: it moves no bytes)
     dt_cuda_scratch             device memory for the kernels of one op, valid between
                                 dt_cuda_scratch_begin and _end (a stack: ops nest). Ordered by
                                 the stream, so taking it never waits; it grows during the first
                                 step (counted allocations) and then reuses one block.
     dt_ctx_sync                 waits for ctx's stream; then reports a device-side check that
                                 failed since the last report (an id out of range: DT_ERR_RANGE
                                 naming the op, the argument, the index and the value).
     dt_ctx_counters_reset       zeroes ctx->counters. */
DT_API void dt_ctx_counters_reset(dt_ctx *ctx);
DT_API dt_status dt_ctx_sync(dt_ctx *ctx);
DT_API dt_status dt_cuda_alloc(dt_ctx *ctx, void **ptr, size_t bytes, const char *fn);
DT_API void dt_cuda_release(dt_ctx *ctx, void *ptr);
DT_API dt_status dt_cuda_memcpy(dt_ctx *ctx, void *dst, dt_device dst_device, const void *src, dt_device src_device,
                                size_t bytes, const char *fn);
DT_API dt_status dt_cuda_memset(dt_ctx *ctx, void *ptr, int value, size_t bytes, const char *fn);
DT_API size_t dt_cuda_scratch_begin(dt_ctx *ctx);
DT_API void *dt_cuda_scratch(dt_ctx *ctx, size_t bytes, const char *fn); /* 256-byte aligned; NULL + error on failure */
DT_API void dt_cuda_scratch_end(dt_ctx *ctx, size_t mark);
/* Queues the device check "every ids[i] (i32 or i64 by ids_dtype, n of them) is in [lo, hi) or
   is skip (when has_skip)"; a failure is reported by the next dt_ctx_sync or dt_cuda_read_loss
   as "fn: arg[i] = v is outside [lo, hi)". fn and arg must outlive the ctx (string literals). */
DT_API dt_status dt_cuda_check_range(dt_ctx *ctx, const void *ids, dt_dtype ids_dtype, int64_t n, int64_t lo,
                                     int64_t hi, int has_skip, int64_t skip, const char *fn, const char *arg);
/* Loss kernels leave the loss (as a double) and its count in the ctx's status block; this reads
   both with the check word in one copy and one wait (the logging step's read). loss and n_valid
   may be NULL. */
DT_API double *dt_cuda_loss_slot(dt_ctx *ctx); /* device double[2]: loss, then n_valid */
DT_API dt_status dt_cuda_read_loss(dt_ctx *ctx, float *loss, int64_t *n_valid, const char *fn);

/* ==== >>tensors: create, view, copy, fill, cast, sizes ======================================== */

#define DT_MAX_DIMS 8
#define DT_NAME_MAX 96

typedef struct dt_tensor {
    void *data;                   /* first element of this tensor or view */
    dt_dtype dtype;
    dt_device device;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    int64_t numel;
    int owns;                     /* 1: created by dt_tensor_create, freed by dt_tensor_free */
} dt_tensor;

/* shape: with ndim 0 (the default) the dims are the leading non-zero entries, so
   `{ .shape = {B, D} }` is 2-D and an all-zero shape is a scalar. To have a zero dim, say how
   many dims there are: `{ .shape = {0, 64}, .ndim = 2 }` is an empty [0, 64] tensor. */
typedef struct dt_tensor_desc {
    dt_dtype dtype;
    dt_device device;
    int64_t shape[DT_MAX_DIMS];
    int ndim;                     /* 0 = count the leading non-zero dims; 1..DT_MAX_DIMS = exactly */
} dt_tensor_desc;

/* Allocates and zero-fills. On error *t is left empty (data NULL). The bytes (numel x dtype
   size) must fit in a ptrdiff_t: a larger shape is DT_ERR_ARG, checked before allocating. */
DT_API dt_status dt_tensor_create(dt_ctx *ctx, dt_tensor *t, const dt_tensor_desc *desc);
/* A new tensor with t's shape; dtype / device DEFAULT = t's. */
DT_API dt_status dt_tensor_create_like(dt_ctx *ctx, dt_tensor *out, const dt_tensor *t, dt_dtype dtype,
                                       dt_device device);
DT_API void dt_tensor_free(dt_ctx *ctx, dt_tensor *t);
DT_API size_t dt_tensor_bytes(const dt_tensor *t);
/* *out = a * b for a, b >= 0; returns 0 (and leaves *out alone) when a or b is negative or the
   product does not fit in int64_t. The one checked multiply every size in dt goes through. */
DT_API int dt_mul_ok(int64_t a, int64_t b, int64_t *out);
/* The product of shape[0..ndim), or -1 when a dim is negative or the product of the non-zero
   dims overflows (so no product of some of the dims of a valid shape overflows either). */
DT_API int64_t dt_shape_numel(int ndim, const int64_t *shape);
/* Grows *items (elem bytes each, *cap of them, from the ctx allocator) to hold at least `need`:
   to need and an eighth more (at least 8); the contents are kept. An eighth, not doubling: a
   buffer sized by a step's need (ids, gradients, exchange buffers) then holds at most 12.5% above
   the largest need seen, where doubling held anything up to twice it, by where the need fell
   between powers of two, so what a step held could not be added up from its parts (dt_plan.h);
   appends still cost O(1) each, amortized (each growth adds an eighth). DT_ERR_OOM / DT_ERR_ARG
   (need too large) with the ctx error naming `what`. The one growable array of the dt headers. */
DT_API dt_status dt_grow(dt_ctx *ctx, void **items, int64_t *cap, int64_t need, size_t elem,
                         const char *what);
/* n values from src (src_dtype) into dst (dst_dtype): any pair of f32 / bf16 / f16 (round to
   nearest even) and f32 <-> i32 / i64 / u8 (float to integer saturates, NaN -> 0). Plain host
   arrays; the loop every f32 <-> bf16 / f16 conversion of dt runs. DT_ERR_DTYPE for a pair it
   does not convert (it then writes nothing). ctx may be NULL (no message, the status only). */
DT_API dt_status dt_convert(dt_ctx *ctx, void *dst, dt_dtype dst_dtype, const void *src, dt_dtype src_dtype,
                            int64_t n);
/* A view of `numel(shape)` elements starting at element `offset` of t (row-major, contiguous). */
DT_API dt_status dt_tensor_view(dt_ctx *ctx, dt_tensor *view, const dt_tensor *t,
                                int64_t offset, int ndim, const int64_t *shape);
/* Same memory, new shape with the same numel. */
DT_API dt_status dt_tensor_reshape(dt_ctx *ctx, dt_tensor *view, const dt_tensor *t,
                                   int ndim, const int64_t *shape);
/* dst = src; same dtype and numel, any device pair (CPU<->CUDA needs DT_CUDA). */
DT_API dt_status dt_tensor_copy(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src);
/* Copies that overlap compute (activation offload). dt_tensor_copy_side copies src into dst (same
   dtype and numel) on the ctx's side stream, after everything queued on the ctx stream so far
   (so it copies what those ops wrote), and returns at once; *ticket names the copy.
   dt_side_wait(ctx, ticket) makes the ctx stream wait for that copy and every earlier one (the
   side stream runs in order); the host does not wait. Until then the caller neither writes src
   nor reads dst. A host buffer should be pinned (cudaMallocHost) for the copy to run beside the
   compute; pageable memory still gives the right bytes. Without a CUDA tensor among the two the
   copy is dt_tensor_copy's, done at once (ticket 0; its wait returns at once). Bytes count in
   ctx->counters as dt_tensor_copy's; no host wait. */
DT_API dt_status dt_tensor_copy_side(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src, uint64_t *ticket);
DT_API dt_status dt_side_wait(dt_ctx *ctx, uint64_t ticket);
DT_API dt_status dt_tensor_fill(dt_ctx *ctx, dt_tensor *t, double value);
/* dst = (dst.dtype) src; f32 <-> bf16 / f16 (round to nearest even), and any pair of
   f32/i32/i64/u8. Same numel, CPU; under DT_CUDA both on cuda for f32/bf16/f16 (the same bits). */
DT_API dt_status dt_tensor_cast(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src);
DT_API int dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b);
/* Whether a and b share memory: 0 apart (or either NULL, empty, without data, or on another
   device), 2 the very same elements (data, dtype and numel: an op that runs in place takes that),
   1 any other overlap (two views a few elements apart). */
DT_API int dt_tensor_overlap(const dt_tensor *a, const dt_tensor *b);
/* "[4, 8]" into buf; returns buf. */
DT_API const char *dt_shape_str(const dt_tensor *t, char *buf, size_t n);
/* Validate that t is a CPU tensor of dtype `dtype` (DEFAULT = any float dtype);
   names `fn` and `arg` in the error. For the other dt headers and user ops. */
DT_API dt_status dt_check_tensor(dt_ctx *ctx, const dt_tensor *t, dt_dtype dtype,
                                 const char *fn, const char *arg);

/* ==== >>rng: counter-based RNG (Philox4x32-10) ================================================ */

/* Philox4x32-10 (Salmon et al., SC'11): 4 x u32 out of a 128-bit counter and 64-bit key. */
DT_API void dt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
DT_API uint64_t dt_hash_name(const char *name); /* FNV-1a 64 */

typedef enum dt_init_kind {
    DT_INIT_DEFAULT = 0,   /* = DT_INIT_ZEROS */
    DT_INIT_ZEROS,
    DT_INIT_CONST,         /* value */
    DT_INIT_UNIFORM,       /* U[low, high) */
    DT_INIT_NORMAL,        /* N(mean, std^2) */
    DT_INIT_SCALED_NORMAL, /* N(0, (gain / sqrt(fan_in))^2), fan_in = prod(global_shape[1:]),
                              PyTorch's fan_in of a [out, in] Linear weight; gain 0 = 1 */
    DT_INIT_KIND_COUNT
} dt_init_kind;

/* Value k of a tensor is a pure function of (seed, name, global index k): a shard initialised
   on its own equals the same slice of the whole tensor. For a shard, give the logical tensor's
   global_shape and the shard's start per dim; the shard's extent is the tensor's own shape.
   Zero global_shape = the tensor is whole. */
typedef struct dt_init_desc {
    dt_init_kind kind;
    uint64_t seed;
    const char *name;
    double value, low, high, mean, std, gain;
    int64_t global_shape[DT_MAX_DIMS];
    int64_t start[DT_MAX_DIMS];
} dt_init_desc;

DT_API dt_status dt_tensor_init(dt_ctx *ctx, dt_tensor *t, const dt_init_desc *desc);
/* The i-th uniform in [0,1) / standard normal of stream (seed, stream): the same numbers
   dt_tensor_init uses, for data generators (sample i is a pure function of (seed, i)). */
DT_API float dt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t i);
DT_API float dt_rng_normal(uint64_t seed, uint64_t stream, uint64_t i);

/* ==== >>ops: ops, forward and backward ===========================================================

   Shapes are checked; a mismatch is DT_ERR_SHAPE naming both tensors. "rows" means every
   leading dimension flattened: a [B, T, C] tensor is B*T rows of C. */

/* out = alpha * op(a) @ op(b) + beta * out, op = transpose when trans_* is 1.
   2-D: a [M,K] (or [K,M]), b [K,N] (or [N,K]), out [M,N].
   Batched: a and out 3-D [B,...]; b 3-D with the same B, or 2-D (shared by every batch). */
DT_API dt_status dt_matmul_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b,
                               int trans_a, int trans_b, float alpha, float beta);
/* da += alpha * d(out)/d(a), db += ...; da or db may be NULL. */
DT_API dt_status dt_matmul_bwd(dt_ctx *ctx, dt_tensor *da, dt_tensor *db, const dt_tensor *dout,
                               const dt_tensor *a, const dt_tensor *b, int trans_a, int trans_b,
                               float alpha);
/* Raw row-major SGEMM, C = alpha op(A) op(B) + beta C, through the portable blocked kernel even
   when DT_CBLAS is on (so tests and benchmarks can compare the two paths). As in BLAS, each ld is
   at least 1 and the row length of its matrix as stored (lda: K, or M with ta; ldb: N, or K with
   tb; ldc: N); anything else is DT_ERR_ARG naming it. */
DT_API dt_status dt_gemm_portable(dt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                  float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                  float beta, float *C, int64_t ldc);
/* With DT_CBLAS on OpenBLAS (x86-64 Linux): NULL when OpenBLAS's kernels fit this CPU, else a
   sentence naming its kernels and the OPENBLAS_CORETYPE that fits. An OpenBLAS older than the
   CPU model (Debian 12's 0.3.21 on Emerald Rapids) takes its SSE3 "Prescott" kernels: f32 GEMMs
   4-5x slower. OpenBLAS reads OPENBLAS_CORETYPE once, as it loads. */
DT_API const char *dt_blas_note(void);
/* Call first in main(), before MPI_Init: when dt_blas_note() has a fit and OPENBLAS_CORETYPE is
   unset, sets it and runs the program again (execv of argv[0] when it holds a '/', else of
   /proc/self/exe; the same argv; rank 0 says so on stderr). Returns when it has nothing to do,
   or when the execv failed. */
DT_API void dt_blas_rerun(char **argv);
/* Linear layer, PyTorch layout: out[N,O] = x[N,I] @ w[O,I]^T + bias[O] (bias may be NULL). w may
   be bf16: the GEMMs (fwd and bwd) then multiply in bf16 and add in f32, with f32 outputs, x and
   dout rounded to bf16 on the way in (as torch.autocast): on CUDA on the tensor cores, on the CPU
   on AMX or AVX512_BF16 where it has them, else as f32 GEMMs of the rounded values
   (dt_cpu_bf16_gemm says which). With a bf16 w, the activations may be bf16 too (as llm.c keeps
   them): x is then read as it is (the same values an f32 x would be rounded to), and a bf16 out
   gets the f32 sum plus the bias, each value rounded once; the bias is then read in bf16 (rounded
   to nearest), as cuBLASLt reads a bias beside a bf16 output. So may the gradients of the
   activations: a bf16 dout is read as it is (no rounding pass on CUDA), dbias summing its values;
   a bf16 dx becomes dx + dout w summed in f32, rounded once (cuBLAS's beta 1 on a bf16 C). dw and
   dbias stay f32. A bf16 x, out, dout or dx with an f32 w is DT_ERR_DTYPE. */
DT_API dt_status dt_linear_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x, const dt_tensor *w,
                               const dt_tensor *bias);
DT_API dt_status dt_linear_bwd(dt_ctx *ctx, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                               const dt_tensor *dout, const dt_tensor *x, const dt_tensor *w);
/* A linear layer and the GELU after it: pre = x @ w^T + bias (dt_linear_fwd), out = gelu(pre)
   (dt_gelu_fwd); pre [N,O] is kept for the backward, which is dt_gelu_bwd(dpre, dout, pre) then
   dt_linear_bwd. One call so that CUDA can do all of it inside the GEMM: cuBLASLt's
   GELU_AUX_BIAS epilogue writes out and pre once, where the separate ops write pre, read it for
   the bias, write it, read it for the GELU and write out (its GELU is cuBLASLt's own, whose
   accuracy its header does not state: within 2e-6 relative of dt_gelu_fwd's on the emulator, a GPU
   unmeasured). Where cuBLASLt has no algorithm (it wants O % 8 == 0, bias and pre on 16 bytes),
   and on the CPU, it runs the separate ops. out and pre must not overlap. With a bf16 w, out and
   pre may both be bf16 (bf16 activations, as dt_linear_fwd): pre is the f32 value rounded once,
   out the GELU of the f32 value rounded once, and the backward's dt_gelu_bwd reads that bf16 pre. */
DT_API dt_status dt_linear_gelu_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *pre, const dt_tensor *x,
                                    const dt_tensor *w, const dt_tensor *bias);
/* How this process multiplies a bf16 w on the CPU, found at run time: "amx-bf16" (Intel AMX
   tiles), "avx512-bf16 (why not AMX)" (VDPBF16PS, where it makes at least as many products a
   cycle as f32 FMAs), or "f32 GEMMs of bf16-rounded operands (why)": the same products, summed
   in other orders. DT_CPU_BF16=avx512 in the environment asks for the second at best,
   DT_CPU_BF16=f32 for the third. */
DT_API const char *dt_cpu_bf16_gemm(void);
/* out[rows, C] += bias[C] (in place); dbias[C] += sum over rows of dout (dout may be bf16). */
DT_API dt_status dt_bias_add_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *bias);
DT_API dt_status dt_bias_add_bwd(dt_ctx *ctx, dt_tensor *dbias, const dt_tensor *dout);
/* out = max(x, 0) (out may be x); dx += dout * (x > 0). */
DT_API dt_status dt_relu_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x);
DT_API dt_status dt_relu_bwd(dt_ctx *ctx, dt_tensor *dx, const dt_tensor *dout, const dt_tensor *x);
/* GELU, tanh approximation (GPT-2); dx += dout * gelu'(x). Computed as x / (1 + exp(-2u)) with
   this file's vector exp: within 1e-6 relative of the formula in double for x > -3, and within
   (1e-6 + 2e-7 |2u|) relative below (the argument's float rounding; tests/test_tensor_ops_simd.c).
   x, the forward's out and the backward's dx and dout may each be bf16: the same f32 arithmetic
   on their values, a bf16 out or dx rounded once. */
DT_API dt_status dt_gelu_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x);
DT_API dt_status dt_gelu_bwd(dt_ctx *ctx, dt_tensor *dx, const dt_tensor *dout, const dt_tensor *x);
/* LayerNorm over the last dim C: out = (x - mean) * rstd * w + b; mean, rstd [rows] are saved
   for the backward (may be NULL in the forward when not needed). Row sums in float, 8 lanes in a
   fixed order: a row gives the same bits wherever it sits (rows can be sharded). out may be bf16
   (a GEMM's bf16 input): the f32 result rounded once; x, w, b, mean, rstd stay f32. An f32 out may
   be x itself (in place); every other output that shares memory with an input or another output
   (mean in x, dx over x or dout, dw over db, ...) is DT_ERR_ARG naming both, on either device. */
DT_API dt_status dt_layernorm_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *mean, dt_tensor *rstd,
                                  const dt_tensor *x, const dt_tensor *w, const dt_tensor *b,
                                  float eps);
DT_API dt_status dt_layernorm_bwd(dt_ctx *ctx, dt_tensor *dx, dt_tensor *dw, dt_tensor *db,
                                  const dt_tensor *dout, const dt_tensor *x, const dt_tensor *w,
                                  const dt_tensor *mean, const dt_tensor *rstd);
/* Fused softmax + cross entropy. logits [N,V], targets i32 [N]; a target == ignore_index is
   skipped. *loss = mean over non-ignored targets (0 when none), *n_valid (may be NULL) their
   count. probs [N,V] receives the softmax for the backward.
   loss NULL: nothing is read back; on CUDA the loss stays on the device, dt_cuda_read_loss
   reads the last one (a CUDA op reads it, one copy and one wait, only when loss or n_valid is
   set; a target out of range is then reported by the next dt_ctx_sync / dt_cuda_read_loss).
   bwd: dlogits += dloss / n_valid * (probs - onehot(target)) on non-ignored rows (on CUDA
   n_valid is counted on the device: nothing waits).
   probs may be logits (in place), dlogits may be probs. exp within 1 ulp; row sums in float;
   on CUDA the mean is a fixed-order two-stage sum (the same bits every run, not the CPU's). */
DT_API dt_status dt_softmax_xent_fwd(dt_ctx *ctx, float *loss, int64_t *n_valid, dt_tensor *probs,
                                     const dt_tensor *logits, const dt_tensor *targets,
                                     int ignore_index);
DT_API dt_status dt_softmax_xent_bwd(dt_ctx *ctx, dt_tensor *dlogits, const dt_tensor *probs,
                                     const dt_tensor *targets, int ignore_index, float dloss);
/* Binary cross entropy with logits, mean over all N elements (stable form).
   bwd: dlogits += dloss / N * (sigmoid(z) - y).
   loss NULL: nothing is read back; on CUDA the loss stays on the device, dt_cuda_read_loss
   reads the last one. On CUDA, labels may be on the host: copied up (the step's input). */
DT_API dt_status dt_bce_logits_fwd(dt_ctx *ctx, float *loss, const dt_tensor *logits,
                                   const dt_tensor *labels);
DT_API dt_status dt_bce_logits_bwd(dt_ctx *ctx, dt_tensor *dlogits, const dt_tensor *logits,
                                   const dt_tensor *labels, float dloss);
/* Elementwise, same numel. out = a + b (out may be a or b itself; an output that only partly
   overlaps an input is DT_ERR_ARG, in every op that runs in place); x *= alpha; y += alpha * x.
   The backward of add is dt_axpy(dA, 1, dout) for each input. */
DT_API dt_status dt_add(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b);
DT_API dt_status dt_scale(dt_ctx *ctx, dt_tensor *x, float alpha);
/* Elementwise product, same numel: out = a * b (out may alias a or b), as DCNv2's cross layer
   x0 * (W x + b) needs. bwd: da += dout * b, db += dout * a (either may be NULL). */
DT_API dt_status dt_mul_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b);
DT_API dt_status dt_mul_bwd(dt_ctx *ctx, dt_tensor *da, dt_tensor *db, const dt_tensor *dout,
                            const dt_tensor *a, const dt_tensor *b);
DT_API dt_status dt_axpy(dt_ctx *ctx, dt_tensor *y, float alpha, const dt_tensor *x);
/* Reductions in double, fixed order (deterministic). On CUDA: a two-stage device sum (not the
   CPU's order, the same bits every run) and one copy of the double to the host, which waits. */
DT_API dt_status dt_sum(dt_ctx *ctx, double *out, const dt_tensor *x);
DT_API dt_status dt_sumsq(dt_ctx *ctx, double *out, const dt_tensor *x);
/* Dense embedding: out[N,D] = table[ids[n], :], ids i32 or i64 [N] (any shape, N = numel).
   bwd: dtable[ids[n], :] += dout[n, :]. An id outside [0, V) is DT_ERR_RANGE naming it (on
   CUDA found on the device and reported by the next dt_ctx_sync or dt_cuda_read_loss; the op
   skips it). */
DT_API dt_status dt_embedding_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *table,
                                  const dt_tensor *ids);
DT_API dt_status dt_embedding_bwd(dt_ctx *ctx, dt_tensor *dtable, const dt_tensor *dout,
                                  const dt_tensor *ids);
/* Causal multi-head self-attention (GPT-2, as llm.c): qkv [B,T,3C] packed q|k|v, out [B,T,C],
   att [B,H,T,T] receives the softmaxed scores for the backward (0 above the diagonal: the mask).
   Both run per (batch, head) on GEMMs (dt_matmul's), the backward with a [T,T] ctx scratch.
   On CUDA tensors att may be NULL: the fused (flash) kernels, nothing [T,T] stored, the
   backward recomputing the forward (head size <= 96; see dt__cu_attention_fwd). A bf16 qkv on
   CUDA (att NULL; dout f32, out and dqkv f32 or bf16) runs on the tensor cores: FlashAttention-2
   on mma.sync, f32 accumulation, head size 16, 32, 64, 96 or 128, compute capability >= 8.0 (a
   bf16 out, on either device, is the f32 result rounded once: bf16 activations). A bf16
   qkv on the CPU (att f32, kept as above) multiplies in bf16 with f32 sums (dt_linear's bf16 GEMMs:
   AMX where the CPU has it): the scores of bf16 q, k scaled in f32, the softmax in f32, and P,
   dout and the softmax's gradient rounded to bf16 on their way into the products (torch.autocast's
   attention in bf16). Beside a bf16 qkv, dqkv may be bf16 too, on either device: dqkv plus the f32
   gradient, each value rounded once (the gradients kept as llm.c keeps them). */
DT_API dt_status dt_attention_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *att, const dt_tensor *qkv,
                                  int n_head);
DT_API dt_status dt_attention_bwd(dt_ctx *ctx, dt_tensor *dqkv, const dt_tensor *dout,
                                  const dt_tensor *qkv, const dt_tensor *att, int n_head);
/* Grouped-query attention (n_kv_head K dividing n_head H; K = H is dt_attention_fwd): qkv
   [B, T, (H + 2K) hs] holds each row's H query heads, then K key heads, then K value heads;
   query head h reads kv head h / (H / K). out [B, T, H hs], att [B, H, T, T] as above; the
   backward adds each group's query heads into their one dK, dV in head order. CPU tensors, or
   on CUDA a bf16 qkv with att NULL (the tensor-core kernels, which take kv heads) or an f32 qkv
   with att (the kv heads repeated into a multi-head qkv in device scratch for dt_attention's
   kernels); an f32 qkv on CUDA with att NULL and K != H is DT_ERR_UNSUPPORTED. */
DT_API dt_status dt_attention_gqa_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *att, const dt_tensor *qkv,
                                      int n_head, int n_kv_head);
DT_API dt_status dt_attention_gqa_bwd(dt_ctx *ctx, dt_tensor *dqkv, const dt_tensor *dout,
                                      const dt_tensor *qkv, const dt_tensor *att, int n_head, int n_kv_head);
/* Attention of a block of query rows against a block of key / value rows, with the logsumexp of
   each row, merged into what earlier blocks gave (the online softmax): the piece context
   parallelism computes at each step of its ring (dt_parallel.h's dt_cp_attention_*). dt_attention
   over [0, T) equals the blocks of any split of [0, T) merged in any order (to rounding; one block
   of every key gives its bits).
     q    [B, Tq, Wq]          the queries are each row's first H*hs columns (a packed qkv row, as
                               dt_attention reads, works as it is: its q part)
     kv   [B, Tk, 2*Hkv*hs]    each row the keys of the Hkv heads, then their values; query head h
                               reads kv head h / (H / Hkv) (grouped-query attention)
     out  [B, Tq, H*hs]        f32, merged: start it at 0 ...
     lse  [B, H, Tq]           ... and lse at -INFINITY (no key seen yet); natural log
   d picks rows and positions: query row q_row + i sits at sequence position q_pos + i, key row
   k_row + j at k_pos + j, and key position kp is seen by query position qp when kp <= qp (the
   causal mask), so a block entirely above the diagonal is a no-op. Rows outside the ranges are
   not touched. The backward takes the final (merged) out and lse and adds the block's part of
   the gradients: dq (q's layout; only the first H*hs columns of each row) and dkv (kv's layout).
   f32, on the CPU or (under DT_CUDA, every operand on cuda) through kernels/dt_attention.cu's
   dt_k_attention_block_fwd / _bwd: one thread per row, deterministic, simple rather than fast. */
typedef struct dt_attn_block {
    int n_head, n_kv_head;        /* H; Hkv (0 = H) must divide H */
    int64_t q_row, q_rows, q_pos; /* rows [q_row, q_row + q_rows) of q, the first at position q_pos */
    int64_t k_row, k_rows, k_pos; /* rows [k_row, k_row + k_rows) of kv, the first at position k_pos */
} dt_attn_block;
DT_API dt_status dt_attention_block_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *lse, const dt_tensor *q,
                                        const dt_tensor *kv, const dt_attn_block *d);
DT_API dt_status dt_attention_block_bwd(dt_ctx *ctx, dt_tensor *dq, dt_tensor *dkv, const dt_tensor *dout,
                                        const dt_tensor *q, const dt_tensor *kv, const dt_tensor *out,
                                        const dt_tensor *lse, const dt_attn_block *d);
/* DLRM dot interaction: dense [B,D], emb [B,F,D]. With T = [dense; emb_1..emb_F] (F+1 vectors),
   out [B, D + (F+1)F/2] = [dense, <T_i,T_j> for i = 1..F, j = 0..i-1] (the order of the
   reference DLRM "dot" interaction without self terms). */
DT_API dt_status dt_dot_interaction_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *dense,
                                        const dt_tensor *emb);
DT_API dt_status dt_dot_interaction_bwd(dt_ctx *ctx, dt_tensor *ddense, dt_tensor *demb,
                                        const dt_tensor *dout, const dt_tensor *dense,
                                        const dt_tensor *emb);
/* Concatenate n tensors along the last dim (same rows). bwd: dins[i] += slice of dout.
   split is the same pair read the other way round. */
DT_API dt_status dt_concat_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *const *ins, int n);
DT_API dt_status dt_concat_bwd(dt_ctx *ctx, dt_tensor *const *dins, int n, const dt_tensor *dout);
DT_API dt_status dt_split_fwd(dt_ctx *ctx, dt_tensor *const *outs, int n, const dt_tensor *in);
DT_API dt_status dt_split_bwd(dt_ctx *ctx, dt_tensor *din, const dt_tensor *const *douts, int n);

/* ==== >>params: parameter sets ================================================================ */

/* A parameter: its value, its gradient (same shape, f32) and where it sits in the logical
   tensor when sharded (global_shape / start, as in dt_init_desc). */
typedef struct dt_param {
    char name[DT_NAME_MAX];
    dt_tensor value;
    dt_tensor grad;
    int64_t global_shape[DT_MAX_DIMS]; /* equals value.shape when not sharded */
    int64_t start[DT_MAX_DIMS];
    int no_decay;                      /* optimizers skip weight decay (biases, norms) */
    int sharded;                       /* 1 when this rank holds a slice of a larger tensor */
    int group;                         /* optimizer parameter group (0 = default) */
} dt_param;

typedef struct dt_param_desc {
    const char *name;
    dt_dtype dtype;                     /* of the value; the grad is always f32 */
    dt_device device;
    int64_t shape[DT_MAX_DIMS];         /* this rank's shape */
    int64_t global_shape[DT_MAX_DIMS];  /* zero = same as shape */
    int64_t start[DT_MAX_DIMS];
    dt_init_desc init;                  /* name and shard fields are filled in from above */
    int no_decay;
    int group;
    int ndim;                           /* as dt_tensor_desc.ndim: needed when a dim of shape is 0 */
} dt_param_desc;

typedef struct dt_params {
    dt_param **items; /* stable pointers, in registration order */
    int count, capacity;
} dt_params;

DT_API dt_status dt_params_add(dt_ctx *ctx, dt_params *ps, dt_param **out,
                               const dt_param_desc *desc); /* out may be NULL */
DT_API dt_param *dt_params_find(const dt_params *ps, const char *name);
DT_API void dt_params_zero_grad(dt_ctx *ctx, dt_params *ps);
DT_API int64_t dt_params_numel(const dt_params *ps);
DT_API void dt_params_free(dt_ctx *ctx, dt_params *ps);

/* ==== >>json: JSON: reader and escaper ======================================================== */

typedef enum dt_json_type {
    DT_JSON_NULL = 0, DT_JSON_BOOL, DT_JSON_NUMBER, DT_JSON_STRING, DT_JSON_ARRAY, DT_JSON_OBJECT
} dt_json_type;

typedef struct dt_json {
    dt_json_type type;
    double number;              /* NUMBER, BOOL (0/1) */
    char *string;               /* STRING (NUL-terminated, unescaped) */
    char *key;                  /* the key when this value is an object member */
    struct dt_json *items;      /* ARRAY elements / OBJECT members */
    int count;
} dt_json;

/* Parses text[0..len); nesting deeper than 64 or any syntax error is DT_ERR_FORMAT with the
   byte offset. *out is freed with dt_json_free. */
DT_API dt_status dt_json_parse(dt_ctx *ctx, dt_json **out, const char *text, size_t len);
DT_API const dt_json *dt_json_get(const dt_json *obj, const char *key); /* NULL if absent */
DT_API void dt_json_free(dt_ctx *ctx, dt_json *j);
/* 1 and *out = the value when j is a JSON number that is a whole count in [0, 2^53] (exact in a
   double); 0 otherwise (NULL, another type, negative, fractional, too large). out may be NULL. */
DT_API int dt_json_count(const dt_json *j, int64_t *out);
/* Appends s as a JSON string literal (quotes included) to buf; returns bytes needed. */
DT_API size_t dt_json_escape(char *buf, size_t n, const char *s);

/* ==== >>strbuf: text builder (dt_strbuf) ====================================================== */

/* A growable NUL-terminated string from the ctx allocator (headers, manifests). Running out of
   memory, a NULL string or a NULL b->ctx sets `failed` and turns later appends into no-ops, so a
   writer checks once at the end. Every function takes b == NULL as a no-op.
   Start from `dt_strbuf b = {0}; b.ctx = ctx;`, end with dt_strbuf_free. */
typedef struct dt_strbuf {
    dt_ctx *ctx;
    char *text;
    size_t len, cap;
    int failed;
} dt_strbuf;

DT_API void dt_strbuf_add(dt_strbuf *b, const char *s, size_t n);
DT_API void dt_strbuf_str(dt_strbuf *b, const char *s);
DT_API void dt_strbuf_printf(dt_strbuf *b, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
DT_API void dt_strbuf_json(dt_strbuf *b, const char *s); /* s as a JSON string literal */
DT_API void dt_strbuf_free(dt_strbuf *b);

/* ==== >>safetensors: safetensors files ======================================================== */

/* Writes tensors (CPU or CUDA) as a safetensors file: 8-byte little-endian header length,
   JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {k: v}}, then the data.
   Written to path.tmp, flushed, fsync'd and renamed, so a crash never leaves a half file under
   `path`. meta: n_meta (key, value) string pairs, may be NULL. */
DT_API dt_status dt_safetensors_save(dt_ctx *ctx, const char *path, const dt_tensor *const *tensors,
                                     const char *const *names, int n, const char *const *meta,
                                     int n_meta);
DT_API dt_status dt_params_save(dt_ctx *ctx, const dt_params *ps, const char *path);
DT_API dt_status dt_params_load(dt_ctx *ctx, dt_params *ps, const char *path);

DT_API const char *dt_safetensors_dtype_name(dt_dtype t);   /* "F32", "BF16", ...; NULL if none */
DT_API dt_dtype dt_safetensors_dtype_from(const char *name); /* DT_DTYPE_COUNT when unknown */

/* Appends to *out the header of a file holding these tensors back to back in this order: the
   JSON, padded with spaces to a multiple of 8 bytes (the 8-byte length is not included).
   Checks names (non-empty, unique, not "__metadata__") and dtypes. For writers that stream the
   data themselves, such as dt_opt.h's checkpoints, which hash it on the way out. */
DT_API dt_status dt_safetensors_header(dt_ctx *ctx, dt_strbuf *out, const dt_tensor *const *tensors,
                                       const char *const *names, int n, const char *const *meta,
                                       int n_meta);
/* Appends to *out everything a safetensors file of these tensors holds before their data: the
   8-byte little-endian header length, then the header of dt_safetensors_header. *file_bytes
   (may be NULL) = the size of the whole file: this prefix plus every tensor's bytes, which
   follow back to back in this order. The one place the file's layout is computed: for
   dt_safetensors_save and for writers that stream the data themselves (dt_opt.h's checkpoints,
   which hash it on the way out). On an error nothing is appended (an out that ran out of memory
   stays failed, as after any dt_strbuf write). */
DT_API dt_status dt_safetensors_prefix(dt_ctx *ctx, dt_strbuf *out, uint64_t *file_bytes,
                                       const dt_tensor *const *tensors, const char *const *names, int n,
                                       const char *const *meta, int n_meta);

typedef struct dt_st_entry {
    char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t begin, end;      /* byte offsets into the data section */
} dt_st_entry;

typedef struct dt_st_file {
    void *fp;                 /* FILE*; NULL after dt_safetensors_parse */
    uint64_t header_len;
    uint64_t data_len;        /* bytes after the header */
    dt_st_entry *entries;     /* sorted by offset */
    int n_entries;
    char **meta_keys, **meta_values;
    int n_meta;
} dt_st_file;

/* The header-length limit of the reference implementation (100 MiB). */
#define DT_SAFETENSORS_MAX_HEADER ((uint64_t)100 << 20)
/* The header length from a file's first 8 bytes (little endian), checked against the file's size
   and DT_SAFETENSORS_MAX_HEADER: DT_ERR_FORMAT naming `path` (may be NULL) when it cannot be
   (then *len = 0). */
DT_API dt_status dt_safetensors_header_len(dt_ctx *ctx, uint64_t *len, const unsigned char first8[8],
                                           uint64_t file_size, const char *path);
/* Reads and validates the header: every entry's offsets must be in the file, sorted, non
   overlapping, consistent with dtype x shape. A truncated or foreign file is DT_ERR_FORMAT. */
DT_API dt_status dt_safetensors_open(dt_ctx *ctx, dt_st_file *f, const char *path);
/* The validation of dt_safetensors_open on header text already in memory, against `data_len`
   bytes of data; fills f's entries and metadata (f->fp stays NULL; free with
   dt_safetensors_close). `path` only names the file in messages. For readers that stream the
   file themselves. */
DT_API dt_status dt_safetensors_parse(dt_ctx *ctx, dt_st_file *f, const char *text, size_t len,
                                      uint64_t data_len, const char *path);
DT_API const dt_st_entry *dt_safetensors_find(const dt_st_file *f, const char *name);
DT_API const char *dt_safetensors_meta(const dt_st_file *f, const char *key); /* NULL if absent */
/* Reads entry `name` into dst (same dtype and shape; CPU or CUDA). */
DT_API dt_status dt_safetensors_read(dt_ctx *ctx, dt_st_file *f, dt_tensor *dst, const char *name);
DT_API void dt_safetensors_close(dt_ctx *ctx, dt_st_file *f);

#ifdef __cplusplus
}
#endif
/* The one private macro for passing a failed status up, used by every dt implementation (and
   examples' headers written like them). */
#define DT__TRY(x) do { dt_status dt__s = (x); if (dt__s) return dt__s; } while (0)

#endif /* DT_TENSOR_H */

/* ============================================================================================
   Implementation                                                              >>implementation
   ============================================================================================ */
#if defined(DT_IMPLEMENTATION) && !defined(DT_TENSOR_IMPLEMENTATION)
#define DT_TENSOR_IMPLEMENTATION
#endif
#ifdef DT_TENSOR_IMPLEMENTATION
#ifndef DT_TENSOR_IMPLEMENTATION_DONE
#define DT_TENSOR_IMPLEMENTATION_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <float.h>
#ifndef DT_ASSERT
#include <assert.h>
#define DT_ASSERT(c) assert(c)
#endif
#ifdef DT_CBLAS
#include <cblas.h>
#endif
#ifdef DT_CUDA
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include "kernels/dt_kernels.h" /* the launchers (kernels/dt_*.cu, compiled by nvcc, linked in) */
#endif
#if defined(__SSE2__) && !defined(DT_TENSOR_NO_SIMD)
/* gelu, layernorm and softmax_xent run 4 lanes at a time (x86-64 always has SSE2); see
   "4-lane vectors" below */
#define DT__TENSOR_SSE2 1
#include <emmintrin.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DT_TENSOR_NO_AVX2)
/* and gelu on 8 lanes where the CPU has AVX2, chosen at run time: see "8-lane vectors" */
#define DT__TENSOR_AVX2 1
#include <immintrin.h>
#endif
#endif

/* bf16 GEMMs on AMX tiles or AVX512_BF16 (x86-64 Linux, GCC >= 11 or Clang >= 12), chosen at run
   time where the CPU has them: see "bf16 GEMMs on the CPU". DT_TENSOR_NO_AMX leaves both out. */
#if defined(__x86_64__) && defined(__linux__) && !defined(DT_TENSOR_NO_AMX) && !defined(__CUDACC__) &&              \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define DT__TENSOR_AMX 1
#include <immintrin.h>
#include <cpuid.h>
#endif

#if !defined(__cplusplus) && (defined(__unix__) || defined(__APPLE__))
/* POSIX, declared here because strict -std=c99 hides them in the system headers. */
extern int fsync(int fd);
extern int fileno(FILE *stream);
extern int setenv(const char *name, const char *value, int overwrite);
extern int unsetenv(const char *name);
extern int execv(const char *path, char *const argv[]);
#elif defined(__cplusplus)
#include <unistd.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif


/* ==== >>status: statuses ====================================================================== */

DT_API const char *dt_status_name(dt_status s) {
    static const char *names[DT_STATUS_COUNT] = {
        "ok", "bad argument", "shape mismatch", "dtype mismatch", "device mismatch",
        "out of memory", "i/o error", "bad file format", "index out of range", "unsupported",
        "communication error", "timeout", "cuda error", "bad state"};
    return ((int)s >= 0 && s < DT_STATUS_COUNT) ? names[s] : "unknown status";
}

/* ==== >>dtypes: dtypes and devices ============================================================ */

static dt_dtype dt__dtype(dt_dtype t) { return t == DT_DTYPE_DEFAULT ? DT_F32 : t; }

DT_API size_t dt_dtype_size(dt_dtype t) {
    switch (dt__dtype(t)) {
    case DT_F32: case DT_I32: return 4;
    case DT_BF16: case DT_F16: return 2;
    case DT_I64: return 8;
    case DT_U8: return 1;
    default: return 0;
    }
}

DT_API const char *dt_dtype_name(dt_dtype t) {
    switch (dt__dtype(t)) {
    case DT_F32: return "f32";
    case DT_BF16: return "bf16";
    case DT_F16: return "f16";
    case DT_I32: return "i32";
    case DT_I64: return "i64";
    case DT_U8: return "u8";
    default: return "invalid-dtype";
    }
}

DT_API const char *dt_device_name(dt_device d) {
    switch (d) {
    case DT_DEVICE_DEFAULT: case DT_CPU: return "cpu";
    case DT_CUDA_DEVICE: return "cuda";
    default: return "invalid-device";
    }
}

static uint32_t dt__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float dt__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

DT_API uint16_t dt_f32_to_bf16(float f) {
    uint32_t u = dt__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    /* round to nearest even: add 0x7fff plus the lowest kept bit, then truncate */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

DT_API float dt_bf16_to_f32(uint16_t h) { return dt__bits_f32((uint32_t)h << 16); }

DT_API uint16_t dt_f32_to_f16(float f) {
    uint32_t u = dt__f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* >= 65520 rounds to inf */
    if (absu < 0x38800000u) {                                       /* subnormal half (< 2^-14) */
        /* value = absf * 2^24 in units of the smallest subnormal; round to nearest even */
        float absf = dt__bits_f32(absu);
        float scaled = absf * 16777216.0f; /* exact: power of two */
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even */
    {
        uint32_t mant_round = absu + 0xfffu + ((absu >> 13) & 1u);
        uint32_t h = (mant_round >> 13) - ((127u - 15u) << 10);
        return (uint16_t)(sign | h);
    }
}

DT_API float dt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) { /* zero / subnormal: mant * 2^-24 */
        float f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return dt__bits_f32(sign | 0x7f800000u | (mant << 13));
    return dt__bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* ==== >>ctx: the context: allocator, errors, scratch ========================================== */

static void *dt__default_alloc(size_t bytes, void *user) { (void)user; return malloc(bytes); }
static void dt__default_release(void *ptr, void *user) { (void)user; free(ptr); }

DT_API dt_status dt_ctx_set_error(dt_ctx *ctx, dt_status status, const char *fmt, ...) {
    va_list ap;
    if (!ctx) return status;
    va_start(ap, fmt);
    vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
    va_end(ap);
    ctx->last_status = status;
    if (ctx->log) ctx->log(status, ctx->last_error, ctx->log_user);
    return status;
}

DT_API void dt_ctx_clear_error(dt_ctx *ctx) {
    if (!ctx) return;
    ctx->last_status = DT_OK;
    ctx->last_error[0] = 0;
}

DT_API const char *dt_ctx_error(const dt_ctx *ctx) { return ctx ? ctx->last_error : "ctx is NULL"; }

DT_API dt_status dt_ctx_init(dt_ctx *ctx, const dt_ctx_desc *desc) {
    dt_ctx_desc d;
    if (!ctx) return DT_ERR_ARG;
    memset(ctx, 0, sizeof *ctx);
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    ctx->log = d.log;
    ctx->log_user = d.log_user;
    if ((d.allocator.alloc_fn == NULL) != (d.allocator.release_fn == NULL))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_ctx_init: desc.allocator has only one of "
                                "alloc_fn / release_fn set; expected both or neither");
    ctx->allocator = d.allocator;
    if (!ctx->allocator.alloc_fn) {
        ctx->allocator.alloc_fn = dt__default_alloc;
        ctx->allocator.release_fn = dt__default_release;
    }
    if ((int)d.device < 0 || d.device >= DT_DEVICE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_ctx_init: desc.device = %d is not a dt_device",
                                (int)d.device);
    ctx->device = d.device == DT_DEVICE_DEFAULT ? DT_CPU : d.device;
    ctx->cuda_device = d.cuda_device;
    ctx->tf32 = d.tf32 != 0;
#ifdef DT_CUDA
    if (ctx->device == DT_CUDA_DEVICE) {
        /* each start-up step named: a machine without a GPU or a driver, a wrong ordinal, a
           device that is busy or out of memory all say which */
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess)
            return dt_ctx_set_error(ctx, DT_ERR_CUDA, "dt_ctx_init: no usable CUDA device: cudaGetDeviceCount: %s (%s)"
                                    "; is there a GPU and an NVIDIA driver (nvidia-smi)?", cudaGetErrorString(e),
                                    cudaGetErrorName(e));
        if (count == 0)
            return dt_ctx_set_error(ctx, DT_ERR_CUDA, "dt_ctx_init: cudaGetDeviceCount found no CUDA device");
        if (d.cuda_device < 0 || d.cuda_device >= count)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_ctx_init: desc.cuda_device = %d; this machine has %d CUDA "
                                    "device%s (0..%d)", d.cuda_device, count, count == 1 ? "" : "s", count - 1);
        e = cudaSetDevice(d.cuda_device);
        if (e != cudaSuccess)
            return dt_ctx_set_error(ctx, DT_ERR_CUDA, "dt_ctx_init: cudaSetDevice(%d): %s (%s)",
                                    d.cuda_device, cudaGetErrorString(e), cudaGetErrorName(e));
        if (dt_cuda_alloc(ctx, &ctx->cuda_status, 8 * sizeof(int64_t), "dt_ctx_init (the device status block)"))
            return ctx->last_status;
        if (dt_cuda_memset(ctx, ctx->cuda_status, 0, 8 * sizeof(int64_t), "dt_ctx_init")) {
            dt_cuda_release(ctx, ctx->cuda_status);
            ctx->cuda_status = NULL;
            return ctx->last_status;
        }
    }
#else
    if (ctx->device == DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "dt_ctx_init: desc.device = cuda, but dt was "
                                "built without DT_CUDA; rebuild with -DDT_CUDA or use DT_CPU");
#endif
    ctx->initialised = 1;
    return DT_OK;
}

/* Every host block carries a 64-byte header holding its size and the pointer the allocator
   returned, so the counters stay exact and the data is 64-byte aligned (SIMD, cache lines). */
#define DT__ALIGN 64
DT_API void *dt_alloc(dt_ctx *ctx, size_t bytes) {
    unsigned char *raw, *p;
    if (!ctx || !ctx->allocator.alloc_fn) return NULL;
    if (bytes > (size_t)-1 - 2 * DT__ALIGN) {
        dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_alloc: %zu bytes is too large", bytes);
        return NULL;
    }
    raw = (unsigned char *)ctx->allocator.alloc_fn(bytes + 2 * DT__ALIGN, ctx->allocator.user);
    if (!raw) {
        dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_alloc: the allocator returned NULL for %zu bytes "
                         "(%zu bytes in use)", bytes, ctx->bytes_in_use);
        return NULL;
    }
    p = raw + DT__ALIGN;
    p += (DT__ALIGN - ((uintptr_t)p % DT__ALIGN)) % DT__ALIGN;
    memcpy(p - sizeof(size_t), &bytes, sizeof(size_t));
    memcpy(p - 2 * sizeof(size_t), &raw, sizeof(void *));
    ctx->bytes_in_use += bytes;
    if (ctx->bytes_in_use > ctx->bytes_peak) ctx->bytes_peak = ctx->bytes_in_use;
    return p;
}

DT_API void *dt_alloc_zeroed(dt_ctx *ctx, size_t bytes) {
    void *p = dt_alloc(ctx, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

DT_API void dt_release(dt_ctx *ctx, void *ptr) {
    unsigned char *p = (unsigned char *)ptr, *raw;
    size_t bytes;
    if (!ctx || !ptr) return;
    memcpy(&bytes, p - sizeof(size_t), sizeof(size_t));
    memcpy(&raw, p - 2 * sizeof(size_t), sizeof(void *));
    ctx->bytes_in_use -= bytes;
    ctx->allocator.release_fn(raw, ctx->allocator.user);
}

DT_API void dt_ctx_shutdown(dt_ctx *ctx) {
    int i;
    if (!ctx) return;
#ifdef DT_CUDA
    if (ctx->side_stream) { /* its copies are done before their buffers go */
        cudaStreamSynchronize((cudaStream_t)ctx->side_stream);
        for (i = 0; i < 16; i++) cudaEventDestroy((cudaEvent_t)ctx->side_ev[i]);
        cudaEventDestroy((cudaEvent_t)ctx->side_dep);
        cudaStreamDestroy((cudaStream_t)ctx->side_stream);
        ctx->side_stream = NULL;
    }
    if (ctx->cublaslt) dt_k_lt_destroy(ctx->cublaslt);
    ctx->cublaslt = NULL;
    if (ctx->cublas) cublasDestroy((cublasHandle_t)ctx->cublas);
    ctx->cublas = NULL;
    dt_cuda_release(ctx, ctx->cublas_workspace); /* after the handle: its last GEMMs are queued before */
    ctx->cublas_workspace = NULL;
    ctx->cublas_workspace_bytes = 0;
#endif
    for (i = 0; i < ctx->cuda_scratch_chunks; i++) dt_cuda_release(ctx, ctx->cuda_scratch[i]);
    ctx->cuda_scratch_chunks = 0;
    dt_cuda_release(ctx, ctx->cuda_status);
    ctx->cuda_status = NULL;
    dt_release(ctx, ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_floats = 0;
    ctx->initialised = 0;
}

/* ---------------------------------------------------------------- CUDA memory and waits

   The only places dt allocates device memory, copies across PCIe or waits for the device: each
   counts in ctx->counters, so a test can prove a step does none of it. */
DT_API void dt_ctx_counters_reset(dt_ctx *ctx) {
    if (ctx) memset(&ctx->counters, 0, sizeof ctx->counters);
}

#ifdef DT_CUDA
static dt_status dt__cuda_err(dt_ctx *ctx, cudaError_t e, const char *fn, const char *call) {
    if (e == cudaSuccess) return DT_OK;
    (void)cudaGetLastError(); /* named here, to this call's caller: not again by the next launch's check */
    return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s: %s (%s)", fn ? fn : "dt", call, cudaGetErrorString(e),
                            cudaGetErrorName(e));
}
/* A launcher's status (0, or a cudaError_t / 1000 + cublasStatus_t) as DT_ERR_CUDA naming it. */
static dt_status dt__cuda_kstatus(dt_ctx *ctx, int st, const char *fn, const char *launcher) {
    if (st == 0) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s failed: %s", fn, launcher, dt_k_error_string(st));
}
#else
static dt_status dt__no_cuda(dt_ctx *ctx, const char *fn) {
    return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: a CUDA call, but dt was built without DT_CUDA; rebuild with "
                            "-DDT_CUDA", fn ? fn : "dt");
}
#endif

DT_API dt_status dt_cuda_alloc(dt_ctx *ctx, void **ptr, size_t bytes, const char *fn) {
    if (!ctx) return DT_ERR_ARG;
    if (!ptr) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dt_cuda_alloc: ptr is NULL", fn ? fn : "dt");
    *ptr = NULL;
#ifdef DT_CUDA
    {
        cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
        if (e != cudaSuccess) {
            *ptr = NULL;
            (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
            return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: cudaMalloc(%zu bytes): %s", fn ? fn : "dt", bytes,
                                    cudaGetErrorString(e));
        }
        ctx->counters.allocs++;
        return DT_OK;
    }
#else
    (void)bytes;
    return dt__no_cuda(ctx, fn);
#endif
}

DT_API void dt_cuda_release(dt_ctx *ctx, void *ptr) {
    if (!ctx || !ptr) return;
#ifdef DT_CUDA
    cudaFree(ptr);
    ctx->counters.frees++;
#endif
}

DT_API dt_status dt_cuda_memcpy(dt_ctx *ctx, void *dst, dt_device dst_device, const void *src, dt_device src_device,
                                size_t bytes, const char *fn) {
    if (!ctx) return DT_ERR_ARG;
    if (bytes == 0 || dst == src) return DT_OK;
    if (!dst || !src)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a copy of %zu bytes with dst %s and src %s", fn ? fn : "dt",
                                bytes, dst ? "set" : "NULL", src ? "set" : "NULL");
#ifdef DT_CUDA
    {
        int up = dst_device == DT_CUDA_DEVICE, down = src_device == DT_CUDA_DEVICE;
        cudaStream_t s = (cudaStream_t)ctx->cuda_stream;
        enum cudaMemcpyKind k = up ? (down ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                   : (down ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
        cudaError_t e;
        if (!up && !down) { memmove(dst, src, bytes); return DT_OK; }
        e = cudaMemcpyAsync(dst, src, bytes, k, s);
        if (up && !down) { ctx->counters.h2d_bytes += (int64_t)bytes; ctx->counters.h2d_calls++; }
        if (down && !up) {
            ctx->counters.d2h_bytes += (int64_t)bytes;
            ctx->counters.d2h_calls++;
            /* the bytes must be there when the call returns (the caller reads them next) */
            if (e == cudaSuccess) { e = cudaStreamSynchronize(s); ctx->counters.syncs++; }
        }
        return dt__cuda_err(ctx, e, fn, "cudaMemcpyAsync");
    }
#else
    if (dst_device != DT_CUDA_DEVICE && src_device != DT_CUDA_DEVICE) { memmove(dst, src, bytes); return DT_OK; }
    return dt__no_cuda(ctx, fn);
#endif
}

DT_API dt_status dt_cuda_memset(dt_ctx *ctx, void *ptr, int value, size_t bytes, const char *fn) {
    if (!ctx) return DT_ERR_ARG;
    if (bytes == 0) return DT_OK;
#ifdef DT_CUDA
    return dt__cuda_err(ctx, cudaMemsetAsync(ptr, value, bytes, (cudaStream_t)ctx->cuda_stream), fn,
                        "cudaMemsetAsync");
#else
    (void)ptr; (void)value;
    return dt__no_cuda(ctx, fn);
#endif
}

/* The scratch is a stack over at most DT_CUDA_SCRATCH_CHUNKS device blocks. While an op holds
   scratch, a request that does not fit the last block opens a new one (the old ones stay: their
   pointers are in use). At the next outermost begin, several blocks are replaced by one that
   holds them all, so from the second step on one block serves every op and nothing is allocated.
   A block is reused by the next op without a wait: both ops' kernels run in order on one stream. */
DT_API size_t dt_cuda_scratch_begin(dt_ctx *ctx) {
    int i;
    if (!ctx) return 0;
    if (ctx->cuda_scratch_depth++ == 0) {
        if (ctx->cuda_scratch_chunks > 1) {
            for (i = 0; i < ctx->cuda_scratch_chunks; i++) dt_cuda_release(ctx, ctx->cuda_scratch[i]);
            ctx->cuda_scratch_chunks = 0;
        }
        ctx->cuda_scratch_top = 0;
    }
    return ctx->cuda_scratch_top | ((size_t)ctx->cuda_scratch_chunks << 56);
}

DT_API void *dt_cuda_scratch(dt_ctx *ctx, size_t bytes, const char *fn) {
    size_t need, cap;
    int c;
    void *p;
    if (!ctx) return NULL;
    if (ctx->cuda_scratch_depth <= 0) {
        dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dt_cuda_scratch outside dt_cuda_scratch_begin / _end", fn ? fn : "dt");
        return NULL;
    }
    if (bytes > ((size_t)1 << 48)) {
        dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: %zu bytes of device scratch is too large", fn ? fn : "dt", bytes);
        return NULL;
    }
    need = (bytes + 255) & ~(size_t)255;
    c = ctx->cuda_scratch_chunks;
    if (c > 0 && ctx->cuda_scratch_top + need <= ctx->cuda_scratch_size[c - 1]) {
        p = (char *)ctx->cuda_scratch[c - 1] + ctx->cuda_scratch_top;
        ctx->cuda_scratch_top += need;
        return p;
    }
    if (c == DT_CUDA_SCRATCH_CHUNKS) {
        dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: device scratch: %d blocks in use by nested ops; expected fewer",
                         fn ? fn : "dt", c);
        return NULL;
    }
    /* a new block: big enough for this request and for what the step used before (so the
       replacement at the next begin holds everything) */
    cap = need > ctx->cuda_scratch_want ? need : ctx->cuda_scratch_want;
    if (cap < ((size_t)1 << 20)) cap = (size_t)1 << 20;
    if (dt_cuda_alloc(ctx, &p, cap, fn)) return NULL;
    ctx->cuda_scratch[c] = p;
    ctx->cuda_scratch_size[c] = cap;
    ctx->cuda_scratch_chunks = c + 1;
    ctx->cuda_scratch_top = need;
    {
        size_t total = 0;
        int i;
        for (i = 0; i <= c; i++) total += ctx->cuda_scratch_size[i];
        if (total > ctx->cuda_scratch_want) ctx->cuda_scratch_want = total;
    }
    return p;
}

DT_API void dt_cuda_scratch_end(dt_ctx *ctx, size_t mark) {
    if (!ctx || ctx->cuda_scratch_depth <= 0) return;
    ctx->cuda_scratch_depth--;
    /* back to the mark when its block is still the last one; else the blocks opened since stay
       until the outermost begin merges them */
    if ((int)(mark >> 56) == ctx->cuda_scratch_chunks) ctx->cuda_scratch_top = mark & (((size_t)1 << 56) - 1);
}

/* The status block: int64 [0..4] the check word (site + 1, index, value, lo, hi), [5..6] the loss
   and its count as doubles. Made by dt_ctx_init on a CUDA ctx. */
#define DT__STATUS_WORDS 8
DT_API double *dt_cuda_loss_slot(dt_ctx *ctx) {
    return ctx && ctx->cuda_status ? (double *)((int64_t *)ctx->cuda_status + 5) : NULL;
}

DT_API dt_status dt_cuda_check_range(dt_ctx *ctx, const void *ids, dt_dtype ids_dtype, int64_t n, int64_t lo,
                                     int64_t hi, int has_skip, int64_t skip, const char *fn, const char *arg) {
    int site;
    if (!ctx) return DT_ERR_ARG;
    if (ids_dtype != DT_I32 && ids_dtype != DT_I64)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s has dtype %s; expected i32 or i64", fn, arg,
                                dt_dtype_name(ids_dtype));
#ifdef DT_CUDA
    if (!ctx->cuda_status) return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on cuda but the ctx is not a cuda "
                                                   "ctx (dt_ctx_desc.device = DT_CUDA_DEVICE)", fn, arg);
    for (site = 0; site < ctx->cuda_check_sites; site++)
        if (ctx->cuda_check_fn[site] == fn && ctx->cuda_check_arg[site] == arg) break;
    if (site == ctx->cuda_check_sites) {
        if (site == DT_CUDA_CHECK_SITES) site--; /* more sites than names: the last name is shared */
        else ctx->cuda_check_sites++;
        ctx->cuda_check_fn[site] = fn;
        ctx->cuda_check_arg[site] = arg;
    }
    ctx->cuda_checks_pending = 1;
    {
        int e = dt_k_check_range((int64_t *)ctx->cuda_status, ids, ids_dtype == DT_I64, n, lo, hi, has_skip, skip,
                                 site + 1, ctx->cuda_stream);
        return dt__cuda_kstatus(ctx, e, fn, "dt_k_check_range");
    }
#else
    (void)ids; (void)n; (void)lo; (void)hi; (void)has_skip; (void)skip; (void)site;
    return dt__no_cuda(ctx, fn);
#endif
}

/* The check word as read from the device: a failure becomes the error of the check's op. */
static dt_status dt__cuda_report(dt_ctx *ctx, int64_t *w) {
#ifdef DT_CUDA
    if (w[0] > 0 && w[0] <= ctx->cuda_check_sites) {
        int site = (int)w[0] - 1;
        dt_status st;
        dt_cuda_memset(ctx, ctx->cuda_status, 0, 5 * sizeof(int64_t), "dt_ctx_sync"); /* reported once */
        st = dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: %s[%lld] = %lld is outside [%lld, %lld) (found on the "
                              "device; reported at the next synchronisation)", ctx->cuda_check_fn[site],
                              ctx->cuda_check_arg[site], (long long)w[1], (long long)w[2], (long long)w[3],
                              (long long)w[4]);
        return st;
    }
#endif
    (void)ctx; (void)w;
    return DT_OK;
}

DT_API dt_status dt_cuda_read_loss(dt_ctx *ctx, float *loss, int64_t *n_valid, const char *fn) {
    int64_t w[DT__STATUS_WORDS] = {0};
    double d[2] = {0, 0};
    if (!ctx) return DT_ERR_ARG;
    if (!ctx->cuda_status) return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: not a cuda ctx", fn);
    DT__TRY(dt_cuda_memcpy(ctx, w, DT_CPU, ctx->cuda_status, DT_CUDA_DEVICE, sizeof w, fn));
    ctx->cuda_checks_pending = 0;
    DT__TRY(dt__cuda_report(ctx, w));
    memcpy(d, &w[5], sizeof d);
    if (loss) *loss = (float)d[0];
    if (n_valid) *n_valid = d[1] >= 0 && d[1] < 9.0e18 ? (int64_t)d[1] : 0; /* a count; never a cast of NaN */
    return DT_OK;
}

DT_API dt_status dt_ctx_sync(dt_ctx *ctx) {
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (ctx->device != DT_CUDA_DEVICE && !ctx->cuda_status) return DT_OK;
    if (ctx->cuda_checks_pending) return dt_cuda_read_loss(ctx, NULL, NULL, "dt_ctx_sync"); /* one copy, one wait */
    ctx->counters.syncs++;
    return dt__cuda_err(ctx, cudaStreamSynchronize((cudaStream_t)ctx->cuda_stream), "dt_ctx_sync",
                        "cudaStreamSynchronize");
#else
    return DT_OK;
#endif
}

/* ---------------------------------------------------------------- sizes */

DT_API int dt_mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* The product of the non-zero dims must fit too, whatever the order: [0, 2^40, 2^40] is refused
   like [2^40, 2^40, 0], so that an op on an empty tensor may still multiply its other dims. */
DT_API int64_t dt_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    int i, empty = 0;
    if (ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape)) return -1;
    for (i = 0; i < ndim; i++) {
        if (shape[i] == 0) empty = 1;
        else if (!dt_mul_ok(n, shape[i], &n)) return -1;
    }
    return empty ? 0 : n;
}

/* numel elements of `dtype` as bytes, when they fit in a ptrdiff_t (so that every pointer
   difference and int64 byte offset inside the block is defined). */
static int dt__bytes_ok(int64_t numel, dt_dtype dtype, size_t *bytes) {
    int64_t b;
    if (!dt_mul_ok(numel, (int64_t)dt_dtype_size(dtype), &b) || (uint64_t)b > (uint64_t)PTRDIFF_MAX) return 0;
    *bytes = (size_t)b;
    return 1;
}

DT_API dt_status dt_grow(dt_ctx *ctx, void **items, int64_t *cap, int64_t need, size_t elem, const char *what) {
    int64_t nc, bytes;
    void *p;
    if (!ctx) return DT_ERR_ARG;
    if (!what) what = "array";
    if (!items || !cap) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_grow: %s: %s is NULL", what, items ? "cap" : "items");
    if (elem == 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_grow: %s: elem 0; expected the item's size in bytes", what);
    if (need < 0 || *cap < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_grow: %s: %s = %lld; expected >= 0", what, need < 0 ? "need" : "*cap",
                                (long long)(need < 0 ? need : *cap));
    if (need <= *cap) return DT_OK;
    nc = need > INT64_MAX - need / 8 ? need : need + need / 8; /* an eighth more: the header's comment */
    if (nc < 8) nc = 8;
    if (!dt_mul_ok(nc, (int64_t)elem, &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
        nc = need; /* the eighth does not fit: the need alone */
    if (!dt_mul_ok(nc, (int64_t)elem, &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_grow: %s: %lld items of %zu bytes do not fit in memory",
                                what, (long long)need, elem);
    p = dt_alloc(ctx, (size_t)bytes);
    if (!p) return dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_grow: %s: out of memory for %lld items of %zu bytes",
                                    what, (long long)nc, elem);
    if (*items && *cap) memcpy(p, *items, (size_t)*cap * elem);
    dt_release(ctx, *items);
    *items = p;
    *cap = nc;
    return DT_OK;
}

/* ==== >>tensors: create, view, copy, fill, cast, sizes ======================================== */

DT_API size_t dt_tensor_bytes(const dt_tensor *t) {
    size_t b = 0;
    return t && t->numel > 0 && dt__bytes_ok(t->numel, t->dtype, &b) ? b : 0;
}

DT_API const char *dt_shape_str(const dt_tensor *t, char *buf, size_t n) {
    size_t used = 0;
    int i;
    if (!buf || n == 0) return "";
    buf[0] = 0;
    if (!t) { snprintf(buf, n, "(null)"); return buf; }
    used += (size_t)snprintf(buf, n, "[");
    for (i = 0; i < t->ndim && i < DT_MAX_DIMS && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

DT_API int dt_tensor_overlap(const dt_tensor *a, const dt_tensor *b) {
    uintptr_t pa, pb;
    size_t na, nb;
    if (!a || !b || !a->data || !b->data || a->device != b->device) return 0;
    na = dt_tensor_bytes(a); nb = dt_tensor_bytes(b);
    pa = (uintptr_t)a->data; pb = (uintptr_t)b->data;
    if (!na || !nb || pa >= pb + nb || pb >= pa + na) return 0;
    return pa == pb && a->dtype == b->dtype && a->numel == b->numel ? 2 : 1;
}

DT_API int dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b) {
    int i;
    if (!a || !b || a->ndim != b->ndim || a->ndim < 0 || a->ndim > DT_MAX_DIMS) return 0;
    for (i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* The dims of a desc's shape: `nd_given` of them (zeros allowed), or with nd_given 0 the leading
   non-zero entries; the entries after the dims must be 0 either way. */
static dt_status dt__shape_from(dt_ctx *ctx, const char *fn, const char *arg, const int64_t *shape,
                                int nd_given, int *ndim_out) {
    int nd = 0, i;
    if (nd_given < 0 || nd_given > DT_MAX_DIMS)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ndim = %d; expected 0 (count %s) or 1..%d", fn,
                                nd_given, arg, DT_MAX_DIMS);
    if (nd_given) nd = nd_given;
    else while (nd < DT_MAX_DIMS && shape[nd] != 0) nd++;
    for (i = nd; i < DT_MAX_DIMS; i++)
        if (shape[i] != 0)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s[%d] = %lld comes after the %d dims; a shape "
                                    "lists its dims first and pads with zeros (give ndim for a zero dim)",
                                    fn, arg, i, (long long)shape[i], nd);
    for (i = 0; i < nd; i++)
        if (shape[i] < 0)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s[%d] = %lld; expected >= 0", fn, arg, i,
                                    (long long)shape[i]);
    *ndim_out = nd;
    return DT_OK;
}

/* numel and bytes of a shape, or DT_ERR_ARG naming the shape that does not fit. */
static dt_status dt__size_of(dt_ctx *ctx, const char *fn, int nd, const int64_t *shape, dt_dtype dtype,
                             int64_t *numel, size_t *bytes) {
    char s[DT_MAX_DIMS * 22 + 4];
    size_t used = 0;
    int i;
    *numel = dt_shape_numel(nd, shape);
    if (*numel >= 0 && dt__bytes_ok(*numel, dtype, bytes)) return DT_OK;
    s[0] = 0;
    for (i = 0; i < nd && used < sizeof s; i++)
        used += (size_t)snprintf(s + used, sizeof s - used, i ? " x %lld" : "%lld", (long long)shape[i]);
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: shape %s of %s is too large: %s", fn, nd ? s : "[]",
                            dt_dtype_name(dtype), *numel < 0 ? "the element count overflows int64"
                            : "its bytes overflow the address space");
}

static dt_status dt__alloc_data(dt_ctx *ctx, dt_tensor *t, size_t bytes, const char *fn) {
    if (t->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
        void *p = NULL;
        DT__TRY(dt_cuda_alloc(ctx, &p, bytes, fn));
        if (dt_cuda_memset(ctx, p, 0, bytes, fn)) {
            dt_cuda_release(ctx, p);
            return ctx->last_status;
        }
        t->data = p;
        ctx->bytes_in_use += bytes;
        if (ctx->bytes_in_use > ctx->bytes_peak) ctx->bytes_peak = ctx->bytes_in_use;
        return DT_OK;
#else
        (void)bytes;
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: device = cuda, but dt was built without DT_CUDA; "
                                "rebuild with -DDT_CUDA or use DT_CPU", fn);
#endif
    }
    t->data = dt_alloc(ctx, bytes ? bytes : 1); /* never NULL for a live tensor, even an empty one */
    if (!t->data) return DT_ERR_OOM;
    memset(t->data, 0, bytes);
    return DT_OK;
}

static dt_status dt__create(dt_ctx *ctx, dt_tensor *t, dt_dtype dtype, dt_device dev, int nd,
                            const int64_t *shape, const char *fn, const char *arg) {
    size_t bytes = 0; /* set by dt__size_of when it succeeds; gcc -O2 cannot always see that (-Wmaybe-uninitialized) */
    dt_status st;
    int i;
    if (!ctx->initialised) /* a zeroed ctx has no allocator: say so, not "out of memory" */
        return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the ctx is not initialised (call dt_ctx_init first; after "
                                "dt_ctx_shutdown it must be initialised again)", fn);
    if ((int)dtype < 0 || dtype >= DT_DTYPE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s = %d is not a dt_dtype", fn, arg ? "desc.dtype" : "dtype",
                                (int)dtype);
    if ((int)dev < 0 || dev >= DT_DEVICE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s = %d is not a dt_device", fn,
                                arg ? "desc.device" : "device", (int)dev);
    t->dtype = dtype == DT_DTYPE_DEFAULT ? DT_F32 : dtype;
    t->device = dev == DT_DEVICE_DEFAULT ? (ctx->device == DT_DEVICE_DEFAULT ? DT_CPU : ctx->device) : dev;
    t->ndim = nd;
    for (i = 0; i < nd; i++) t->shape[i] = shape[i];
    st = dt__size_of(ctx, fn, nd, t->shape, t->dtype, &t->numel, &bytes);
    if (!st) st = dt__alloc_data(ctx, t, bytes, fn);
    if (st) { memset(t, 0, sizeof *t); return st; }
    t->owns = 1;
    return DT_OK;
}

DT_API dt_status dt_tensor_create(dt_ctx *ctx, dt_tensor *t, const dt_tensor_desc *desc) {
    int nd = 0;
    if (t) memset(t, 0, sizeof *t); /* outputs are written first, on every path */
    if (!ctx) return DT_ERR_ARG;
    if (!t) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_create: t is NULL");
    if (!desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_create: desc is NULL");
    DT__TRY(dt__shape_from(ctx, "dt_tensor_create", "desc.shape", desc->shape, desc->ndim, &nd));
    return dt__create(ctx, t, desc->dtype, desc->device, nd, desc->shape, "dt_tensor_create", "desc");
}

DT_API void dt_tensor_free(dt_ctx *ctx, dt_tensor *t) {
    if (!ctx || !t) return;
    if (t->owns && t->data) {
        if (t->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
            size_t bytes = dt_tensor_bytes(t);
            dt_cuda_release(ctx, t->data);
            ctx->bytes_in_use -= bytes;
#endif
        } else {
            dt_release(ctx, t->data);
        }
    }
    memset(t, 0, sizeof *t);
}

/* The prelude of every function that takes a tensor: a struct that is not a live tensor
   (freed, never created, or with fields no dt function makes) is named here, before any
   pointer in it is followed. A freed tensor is all zeros, so its dtype is 0 (DEFAULT), which
   no live tensor has. */
static dt_status dt__valid(dt_ctx *ctx, const dt_tensor *t, const char *fn, const char *arg) {
    if (!t) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, arg);
    if (t->dtype == DT_DTYPE_DEFAULT && !t->data)
        return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: %s is not a live tensor (freed, or never created)",
                                fn, arg);
    if ((int)t->dtype <= 0 || t->dtype >= DT_DTYPE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s.dtype = %d is not a dt_dtype", fn, arg, (int)t->dtype);
    if ((int)t->device < 0 || t->device >= DT_DEVICE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s.device = %d is not a dt_device", fn, arg,
                                (int)t->device);
    if (t->ndim < 0 || t->ndim > DT_MAX_DIMS)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s.ndim = %d; expected 0..%d", fn, arg, t->ndim,
                                DT_MAX_DIMS);
    if (t->numel < 0 || dt_shape_numel(t->ndim, t->shape) != t->numel)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s.numel = %lld does not match its shape", fn, arg,
                                (long long)t->numel);
    if (!t->data)
        return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: %s has no data (freed or never created; the grads of a "
                                "ZeRO 2-3 arena exist only from dt_zero_backward_begin to dt_zero_step: was it "
                                "called before this backward?)", fn, arg);
    return DT_OK;
}

DT_API dt_status dt_tensor_create_like(dt_ctx *ctx, dt_tensor *out, const dt_tensor *t, dt_dtype dtype,
                                       dt_device device) {
    const char *fn = "dt_tensor_create_like";
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    DT__TRY(dt__valid(ctx, t, fn, "t"));
    if (out == t) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is t", fn);
    memset(out, 0, sizeof *out);
    return dt__create(ctx, out, dtype == DT_DTYPE_DEFAULT ? t->dtype : dtype,
                      device == DT_DEVICE_DEFAULT ? t->device : device, t->ndim, t->shape, fn, NULL);
}

DT_API dt_status dt_tensor_view(dt_ctx *ctx, dt_tensor *view, const dt_tensor *t, int64_t offset,
                                int ndim, const int64_t *shape) {
    const char *fn = "dt_tensor_view";
    dt_tensor v;
    int i;
    if (!ctx) return DT_ERR_ARG;
    if (!view || (!shape && ndim > 0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !view ? "view" : "shape");
    DT__TRY(dt__valid(ctx, t, fn, "t"));
    if (ndim < 0 || ndim > DT_MAX_DIMS)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ndim = %d; expected 0..%d", fn, ndim, DT_MAX_DIMS);
    memset(&v, 0, sizeof v);
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: shape[%d] = %lld; expected >= 0", fn, i,
                                    (long long)shape[i]);
        v.shape[i] = shape[i];
    }
    v.ndim = ndim;
    v.numel = dt_shape_numel(ndim, v.shape);
    if (v.numel < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the shape's element count overflows int64", fn);
    if (offset < 0 || offset > t->numel || v.numel > t->numel - offset)
        return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: offset %lld + %lld elements exceeds the %lld elements "
                                "of t", fn, (long long)offset, (long long)v.numel, (long long)t->numel);
    v.dtype = t->dtype;
    v.device = t->device;
    v.data = (char *)t->data + (size_t)offset * dt_dtype_size(t->dtype); /* <= the bytes of t */
    v.owns = 0;
    *view = v;
    return DT_OK;
}

DT_API dt_status dt_tensor_reshape(dt_ctx *ctx, dt_tensor *view, const dt_tensor *t, int ndim,
                                   const int64_t *shape) {
    const char *fn = "dt_tensor_reshape";
    int64_t n;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__valid(ctx, t, fn, "t"));
    if ((!shape && ndim > 0) || ndim < 0 || ndim > DT_MAX_DIMS)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: shape is NULL or ndim = %d is outside 0..%d", fn, ndim,
                                DT_MAX_DIMS);
    n = dt_shape_numel(ndim, shape);
    if (n != t->numel)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the new shape has %s%lld elements, t has %lld", fn,
                                n < 0 ? "a negative dim or an overflowing count, not " : "",
                                (long long)(n < 0 ? t->numel : n), (long long)t->numel);
    return dt_tensor_view(ctx, view, t, 0, ndim, shape);
}

DT_API dt_status dt_check_tensor(dt_ctx *ctx, const dt_tensor *t, dt_dtype dtype, const char *fn,
                                 const char *arg) {
    DT__TRY(dt__valid(ctx, t, fn, arg));
    if (t->device == DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on cuda; this op runs on cpu tensors "
                                "(the cuda kernels live in kernels/)", fn, arg);
    if (dtype != DT_DTYPE_DEFAULT && t->dtype != dtype)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s has dtype %s; expected %s", fn, arg,
                                dt_dtype_name(t->dtype), dt_dtype_name(dtype));
    return DT_OK;
}

DT_API dt_status dt_tensor_copy(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src) {
    size_t bytes;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__valid(ctx, dst, "dt_tensor_copy", "dst"));
    DT__TRY(dt__valid(ctx, src, "dt_tensor_copy", "src"));
    if (dst->dtype != src->dtype)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "dt_tensor_copy: dst dtype %s != src dtype %s; use "
                                "dt_tensor_cast to convert", dt_dtype_name(dst->dtype), dt_dtype_name(src->dtype));
    if (dst->numel != src->numel)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "dt_tensor_copy: dst has %lld elements, src %lld",
                                (long long)dst->numel, (long long)src->numel);
    bytes = dt_tensor_bytes(src);
    if (bytes == 0 || dst->data == src->data) return DT_OK;
    if (dst->device == DT_CUDA_DEVICE || src->device == DT_CUDA_DEVICE) {
#ifdef DT_CUDA
        /* on the ctx's stream: device to device and host to device do not wait, device to host
           waits for its bytes (dt_cuda_memcpy) */
        return dt_cuda_memcpy(ctx, dst->data, dst->device, src->data, src->device, bytes, "dt_tensor_copy");
#else
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "dt_tensor_copy: a cuda tensor, but dt was built "
                                "without DT_CUDA");
#endif
    }
    memmove(dst->data, src->data, bytes);
    return DT_OK;
}

DT_API dt_status dt_tensor_copy_side(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src, uint64_t *ticket) {
    const char *fn = "dt_tensor_copy_side";
    if (ticket) *ticket = 0;
    if (!ctx) return DT_ERR_ARG;
    if (!ticket) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ticket is NULL", fn);
    if (!dst || !src || (dst->device != DT_CUDA_DEVICE && src->device != DT_CUDA_DEVICE))
        return dt_tensor_copy(ctx, dst, src); /* its checks and its copy, now */
#ifdef DT_CUDA
    {
        cudaStream_t cs = (cudaStream_t)ctx->cuda_stream, ss;
        int up = dst->device == DT_CUDA_DEVICE, down = src->device == DT_CUDA_DEVICE, i;
        enum cudaMemcpyKind k = up ? (down ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : cudaMemcpyDeviceToHost;
        size_t bytes = dt_tensor_bytes(src);
        cudaError_t e = cudaSuccess;
        DT__TRY(dt__valid(ctx, dst, fn, "dst"));
        DT__TRY(dt__valid(ctx, src, fn, "src"));
        if (dst->dtype != src->dtype || dst->numel != src->numel)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: dst is %lld x %s, src %lld x %s; expected the same", fn,
                                    (long long)dst->numel, dt_dtype_name(dst->dtype), (long long)src->numel,
                                    dt_dtype_name(src->dtype));
        if (!ctx->side_stream) {
            cudaStream_t made;
            e = cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking);
            for (i = 0; e == cudaSuccess && i < 16; i++)
                e = cudaEventCreateWithFlags((cudaEvent_t *)&ctx->side_ev[i], cudaEventDisableTiming);
            if (e == cudaSuccess) e = cudaEventCreateWithFlags((cudaEvent_t *)&ctx->side_dep, cudaEventDisableTiming);
            DT__TRY(dt__cuda_err(ctx, e, fn, "cudaStreamCreateWithFlags / cudaEventCreateWithFlags"));
            ctx->side_stream = (void *)made;
        }
        ss = (cudaStream_t)ctx->side_stream;
        e = cudaEventRecord((cudaEvent_t)ctx->side_dep, cs); /* after the ctx stream's work so far */
        if (e == cudaSuccess) e = cudaStreamWaitEvent(ss, (cudaEvent_t)ctx->side_dep, 0);
        if (e == cudaSuccess && bytes) e = cudaMemcpyAsync(dst->data, src->data, bytes, k, ss);
        if (e == cudaSuccess) e = cudaEventRecord((cudaEvent_t)ctx->side_ev[ctx->side_next % 16], ss);
        DT__TRY(dt__cuda_err(ctx, e, fn, "cudaMemcpyAsync on the side stream"));
        if (up && !down) { ctx->counters.h2d_bytes += (int64_t)bytes; ctx->counters.h2d_calls++; }
        if (down && !up) { ctx->counters.d2h_bytes += (int64_t)bytes; ctx->counters.d2h_calls++; }
        *ticket = ++ctx->side_next;
        return DT_OK;
    }
#else
    return dt__no_cuda(ctx, fn);
#endif
}

DT_API dt_status dt_side_wait(dt_ctx *ctx, uint64_t ticket) {
    if (!ctx) return DT_ERR_ARG;
    if (!ticket) return DT_OK;
    if (ticket > ctx->side_next)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_side_wait: ticket %llu; expected one dt_tensor_copy_side gave "
                                "(%llu so far)", (unsigned long long)ticket, (unsigned long long)ctx->side_next);
#ifdef DT_CUDA
    /* the event of that copy, or of a later one that reused it: in order, so at least as late */
    return dt__cuda_err(ctx, cudaStreamWaitEvent((cudaStream_t)ctx->cuda_stream,
                                                 (cudaEvent_t)ctx->side_ev[(ticket - 1) % 16], 0),
                        "dt_side_wait", "cudaStreamWaitEvent");
#else
    return DT_OK;
#endif
}


/* Conversions out of double that C leaves undefined outside the target's range are defined
   here: to an integer, saturate at the type's limits and NaN -> 0 (the comparisons are with
   doubles that are exact: 2^31, 2^63, 255). To float, C follows IEEE 754 (Annex F, which gcc
   and clang implement): rounded, and +-inf beyond the largest float. */
static int64_t dt__to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}
static int32_t dt__to_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483648.0) return INT32_MAX;
    if (v < -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}
static uint8_t dt__to_u8(double v) {
    if (v != v || v <= 0) return 0;
    if (v >= 255.0) return 255;
    return (uint8_t)v;
}

/* Reads element i of a CPU array of any dtype as double, and writes one. */
static double dt__get(const void *p, dt_dtype dtype, int64_t i) {
    switch (dtype) {
    case DT_F32: return ((const float *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I64: return (double)((const int64_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

static void dt__set(void *p, dt_dtype dtype, int64_t i, double v) {
    switch (dtype) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_BF16: ((uint16_t *)p)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)p)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)p)[i] = dt__to_i32(v); break;
    case DT_I64: ((int64_t *)p)[i] = dt__to_i64(v); break;
    case DT_U8: ((uint8_t *)p)[i] = dt__to_u8(v); break;
    default: break;
    }
}

static int dt__is_float(dt_dtype t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

#ifdef DT__TENSOR_AVX2
/* dt_f32_to_bf16 on 8 lanes, the same bits (round to nearest even on the integers, NaN kept
   quiet); returns how many it did (n rounded down to 8) */
__attribute__((target("avx2"))) static int64_t dt__w_to_bf16(uint16_t *d, const float *s, int64_t n) {
    int64_t i;
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), abs = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(s + i)), hi = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, half), _mm256_and_si256(hi, one)), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        v = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08); /* the 8 halves into the low 128 bits */
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(v));
    }
    return i;
}
#endif

DT_API dt_status dt_convert(dt_ctx *ctx, void *dst, dt_dtype dst_dtype, const void *src, dt_dtype src_dtype,
                            int64_t n) {
    int64_t i;
    /* ctx may be NULL: the status alone then (dt_ctx_set_error takes a NULL ctx) */
    if (n < 0 || (n > 0 && (!dst || !src)))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_convert: n = %lld, dst %s, src %s; expected n >= 0 and "
                                "non-NULL arrays", (long long)n, dst ? "set" : "NULL", src ? "set" : "NULL");
    if ((int)dst_dtype <= 0 || dst_dtype >= DT_DTYPE_COUNT || (int)src_dtype <= 0 || src_dtype >= DT_DTYPE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "dt_convert: dtypes %d -> %d; expected dt_dtype values",
                                (int)src_dtype, (int)dst_dtype);
    if (!(dt__is_float(src_dtype) && dt__is_float(dst_dtype)) && src_dtype != DT_F32 && dst_dtype != DT_F32 &&
        !(!dt__is_float(src_dtype) && !dt__is_float(dst_dtype)))
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "dt_convert: %s -> %s is not supported; convert through f32",
                                dt_dtype_name(src_dtype), dt_dtype_name(dst_dtype));
    if (src_dtype == dst_dtype) {
        if (n && dst != src) memmove(dst, src, (size_t)n * dt_dtype_size(src_dtype));
        return DT_OK;
    }
    /* the hot pairs (master weights <-> bf16 / f16 values) as plain loops */
    if (src_dtype == DT_F32 && dst_dtype == DT_BF16) {
        i = 0;
#ifdef DT__TENSOR_AVX2
        if (__builtin_cpu_supports("avx2")) i = dt__w_to_bf16((uint16_t *)dst, (const float *)src, n);
#endif
        for (; i < n; i++) ((uint16_t *)dst)[i] = dt_f32_to_bf16(((const float *)src)[i]);
    } else if (src_dtype == DT_F32 && dst_dtype == DT_F16) {
        for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = dt_f32_to_f16(((const float *)src)[i]);
    } else if (src_dtype == DT_BF16 && dst_dtype == DT_F32) {
        for (i = 0; i < n; i++) ((float *)dst)[i] = dt_bf16_to_f32(((const uint16_t *)src)[i]);
    } else if (src_dtype == DT_F16 && dst_dtype == DT_F32) {
        for (i = 0; i < n; i++) ((float *)dst)[i] = dt_f16_to_f32(((const uint16_t *)src)[i]);
    } else {
        for (i = 0; i < n; i++) dt__set(dst, dst_dtype, i, dt__get(src, src_dtype, i));
    }
    return DT_OK;
}

/* Runs `fill(t_host)` on t, through a host copy when t lives on the GPU. */
typedef dt_status (*dt__host_fn)(dt_ctx *ctx, dt_tensor *t, const void *arg);
static dt_status dt__on_host(dt_ctx *ctx, dt_tensor *t, dt__host_fn fn, const void *arg) {
    dt_tensor h;
    dt_status st;
    if (t->device != DT_CUDA_DEVICE) return fn(ctx, t, arg);
    st = dt_tensor_create_like(ctx, &h, t, DT_DTYPE_DEFAULT, DT_CPU);
    if (st) return st;
    st = fn(ctx, &h, arg);
    if (!st) st = dt_tensor_copy(ctx, t, &h);
    dt_tensor_free(ctx, &h);
    return st;
}

static dt_status dt__fill_host(dt_ctx *ctx, dt_tensor *t, const void *arg) {
    double v = *(const double *)arg, zero = 0.0;
    int64_t i;
    (void)ctx;
    if (memcmp(&v, &zero, sizeof v) == 0) { /* +0 is all-zero bits in every dtype: memset's wide stores (zeroing
                                      gradients before an accumulating backward: 4% of a DLRM step) */
        if (t->numel > 0) memset(t->data, 0, (size_t)t->numel * dt_dtype_size(t->dtype));
        return DT_OK;
    }
    if (t->dtype == DT_F32) {
        float f = (float)v, *p = (float *)t->data;
        for (i = 0; i < t->numel; i++) p[i] = f;
    } else {
        for (i = 0; i < t->numel; i++) dt__set(t->data, t->dtype, i, v);
    }
    return DT_OK;
}

/* The range of an integer dtype as doubles (exact), for the fill check. */
static int dt__int_range(dt_dtype t, double *lo, double *hi) {
    switch (t) {
    case DT_I32: *lo = -2147483648.0; *hi = 2147483647.0; return 1;
    case DT_I64: *lo = -9223372036854775808.0; *hi = 9223372036854775807.0; return 1;
    case DT_U8: *lo = 0; *hi = 255; return 1;
    default: return 0;
    }
}

DT_API dt_status dt_tensor_fill(dt_ctx *ctx, dt_tensor *t, double value) {
    double lo, hi;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__valid(ctx, t, "dt_tensor_fill", "t"));
    /* an integer tensor cannot hold NaN or a value outside its range: say so, do not clamp */
    if (dt__int_range(t->dtype, &lo, &hi) && !(value >= lo && value <= hi))
        return dt_ctx_set_error(ctx, DT_ERR_RANGE, "dt_tensor_fill: value %g does not fit a %s tensor "
                                "(range [%.0f, %.0f])", value, dt_dtype_name(t->dtype), lo, hi);
#ifdef DT_CUDA
    if (t->device == DT_CUDA_DEVICE) { /* on the device, in stream order: no host copy, no wait */
        uint64_t bits = 0;
        size_t elem = dt_dtype_size(t->dtype);
        dt__set(&bits, t->dtype, 0, value);
        if (bits == 0) return dt_cuda_memset(ctx, t->data, 0, dt_tensor_bytes(t), "dt_tensor_fill");
        return dt__cuda_kstatus(ctx, dt_k_fill(t->data, bits, (int)elem, t->numel, ctx->cuda_stream), "dt_tensor_fill",
                                "dt_k_fill");
    }
#endif
    return dt__on_host(ctx, t, dt__fill_host, &value);
}

/* dst = (dst.dtype) src. Integer targets saturate (NaN -> 0), as dt_convert does. */
#ifdef DT_CUDA
static dt_status dt__cu_cast(dt_ctx *, dt_tensor *, const dt_tensor *); /* (the CUDA section) */
#endif
DT_API dt_status dt_tensor_cast(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src) {
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if ((dst && dst->device == DT_CUDA_DEVICE) || (src && src->device == DT_CUDA_DEVICE))
        return dt__cu_cast(ctx, dst, src);
#endif
    if ((st = dt_check_tensor(ctx, dst, DT_DTYPE_DEFAULT, "dt_tensor_cast", "dst"))) return st;
    if ((st = dt_check_tensor(ctx, src, DT_DTYPE_DEFAULT, "dt_tensor_cast", "src"))) return st;
    if (dst->numel != src->numel)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "dt_tensor_cast: dst has %lld elements, src %lld",
                                (long long)dst->numel, (long long)src->numel);
    if ((src->dtype == DT_BF16 || src->dtype == DT_F16) && !dt__is_float(dst->dtype))
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "dt_tensor_cast: %s -> %s is not supported; cast "
                                "through f32", dt_dtype_name(src->dtype), dt_dtype_name(dst->dtype));
    if ((dst->dtype == DT_BF16 || dst->dtype == DT_F16) && !dt__is_float(src->dtype))
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "dt_tensor_cast: %s -> %s is not supported; cast "
                                "through f32", dt_dtype_name(src->dtype), dt_dtype_name(dst->dtype));
    if (src->data == dst->data && src->dtype != dst->dtype && src->numel > 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_cast: dst and src share memory but differ in dtype");
    return dt_convert(ctx, dst->data, dst->dtype, src->data, src->dtype, src->numel);
}

/* ==== >>rng: counter-based RNG (Philox4x32-10) ================================================ */

DT_API void dt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    int r;
    for (r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

DT_API uint64_t dt_hash_name(const char *name) {
    uint64_t h = 1469598103934665603ull;
    if (!name) return h;
    while (*name) { h ^= (unsigned char)*name++; h *= 1099511628211ull; }
    return h;
}

/* One Philox block per element: counter = (index, stream), key = seed. Wasteful of the four
   outputs, but it makes every element independent of how the tensor is split. */
static void dt__rng_block(uint64_t seed, uint64_t stream, uint64_t i, uint32_t out[4]) {
    uint32_t ctr[4], key[2];
    ctr[0] = (uint32_t)i; ctr[1] = (uint32_t)(i >> 32);
    ctr[2] = (uint32_t)stream; ctr[3] = (uint32_t)(stream >> 32);
    key[0] = (uint32_t)seed; key[1] = (uint32_t)(seed >> 32);
    dt_philox4x32(ctr, key, out);
}

DT_API float dt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
    uint32_t r[4];
    dt__rng_block(seed, stream, i, r);
    return (float)(r[0] >> 8) * (1.0f / 16777216.0f); /* 24 bits: exactly representable */
}

DT_API float dt_rng_normal(uint64_t seed, uint64_t stream, uint64_t i) {
    uint32_t r[4];
    double u1, u2;
    dt__rng_block(seed, stream, i, r);
    u1 = ((double)(r[0] >> 8) + 1.0) * (1.0 / 16777216.0); /* (0, 1]: log() stays finite */
    u2 = (double)(r[1] >> 8) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

typedef struct dt__init_job {
    const dt_init_desc *d;
    const int64_t *gshape;
    int gnd;
} dt__init_job;

static dt_status dt__init_host(dt_ctx *ctx, dt_tensor *t, const void *arg) {
    const dt__init_job *job = (const dt__init_job *)arg;
    const dt_init_desc *d = job->d;
    uint64_t stream = dt_hash_name(d->name);
    int64_t gstride[DT_MAX_DIMS], idx[DT_MAX_DIMS], k, fan_in = 1;
    int nd = t->ndim, i;
    double std = d->std;
    dt_init_kind kind = d->kind == DT_INIT_DEFAULT ? DT_INIT_ZEROS : d->kind;
    (void)ctx;
    for (i = 1; i < job->gnd; i++) fan_in *= job->gshape[i];
    if (kind == DT_INIT_SCALED_NORMAL) std = (d->gain != 0 ? d->gain : 1.0) / sqrt((double)fan_in);
    for (i = nd - 1, k = 1; i >= 0; i--) { gstride[i] = k; k *= job->gshape[i]; idx[i] = 0; }
    for (k = 0; k < t->numel; k++) {
        int64_t g = 0;
        double v = 0;
        for (i = 0; i < nd; i++) g += (d->start[i] + idx[i]) * gstride[i];
        switch (kind) {
        case DT_INIT_ZEROS: v = 0; break;
        case DT_INIT_CONST: v = d->value; break;
        case DT_INIT_UNIFORM: v = d->low + (d->high - d->low) * dt_rng_uniform(d->seed, stream, (uint64_t)g); break;
        case DT_INIT_NORMAL: v = d->mean + std * dt_rng_normal(d->seed, stream, (uint64_t)g); break;
        case DT_INIT_SCALED_NORMAL: v = std * dt_rng_normal(d->seed, stream, (uint64_t)g); break;
        default: break;
        }
        dt__set(t->data, t->dtype, k, v);
        for (i = nd - 1; i >= 0; i--) { /* odometer over the local shape */
            if (++idx[i] < t->shape[i]) break;
            idx[i] = 0;
        }
    }
    return DT_OK;
}

DT_API dt_status dt_tensor_init(dt_ctx *ctx, dt_tensor *t, const dt_init_desc *desc) {
    dt__init_job job;
    int64_t gshape[DT_MAX_DIMS];
    int gnd = 0, i;
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__valid(ctx, t, "dt_tensor_init", "t"));
    if (!desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_init: desc is NULL");
    if ((int)desc->kind < 0 || desc->kind >= DT_INIT_KIND_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_init: desc.kind = %d is not a dt_init_kind",
                                (int)desc->kind);
    if (desc->kind == DT_INIT_UNIFORM && !(desc->high >= desc->low))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_init: uniform low = %g > high = %g",
                                desc->low, desc->high);
    if ((desc->kind == DT_INIT_NORMAL) && !(desc->std >= 0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_init: desc.std = %g; expected >= 0", desc->std);
    if (desc->global_shape[0] != 0) {
        st = dt__shape_from(ctx, "dt_tensor_init", "desc.global_shape", desc->global_shape, t->ndim ? t->ndim : 1, &gnd);
        if (st) return st;
        if (gnd != t->ndim)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "dt_tensor_init: desc.global_shape has %d dims, "
                                    "t has %d", gnd, t->ndim);
        for (i = 0; i < gnd; i++) {
            gshape[i] = desc->global_shape[i];
            if (desc->start[i] < 0 || desc->start[i] > gshape[i] - t->shape[i]) /* no overflowing sum */
                return dt_ctx_set_error(ctx, DT_ERR_RANGE, "dt_tensor_init: shard dim %d starts at %lld with %lld "
                                        "elements, outside the global extent %lld", i, (long long)desc->start[i],
                                        (long long)t->shape[i], (long long)gshape[i]);
        }
    } else {
        gnd = t->ndim;
        for (i = 0; i < gnd; i++) {
            gshape[i] = t->shape[i];
            if (desc->start[i] != 0)
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_init: desc.start[%d] = %lld without "
                                        "desc.global_shape", i, (long long)desc->start[i]);
        }
    }
    if (dt_shape_numel(gnd, gshape) < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_tensor_init: desc.global_shape's element count overflows int64");
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16 && desc->kind != DT_INIT_ZEROS &&
        desc->kind != DT_INIT_CONST && desc->kind != DT_INIT_DEFAULT)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "dt_tensor_init: random init of a %s tensor; expected "
                                "f32, bf16 or f16", dt_dtype_name(t->dtype));
    job.d = desc;
    job.gshape = gshape;
    job.gnd = gnd;
    return dt__on_host(ctx, t, dt__init_host, &job);
}

/* ==== >>ops: ops, forward and backward (GEMM first, then op by op) ============================ */

/* ---------------------------------------------------------------- GEMM
   C[M,N] = alpha * op(A) op(B) + beta * C, row-major, lda/ldb/ldc as stored.
   The portable path is the Goto/BLIS scheme: pack a KC x NC panel of B and an MC x KC block
   of A into contiguous slivers, then an MR x NR register-tile kernel the compiler vectorises.
   Sizes: a KC x MR sliver of A (6 KB) and a KC x NR sliver of B (16 KB) fit a 32 KB L1, the
   MC x KC block of A (192 KB) an L2, the KC x NC panel of B (2 MB) an L3. */

#define DT__MR 6
#define DT__NR 16   /* even: the GCC kernel takes two column groups NR/2 apart */
#define DT__KC 256
#define DT__MC 192  /* a multiple of DT__MR */
#define DT__NC 2048

#if defined(__cplusplus) || !defined(__STDC_VERSION__) || __STDC_VERSION__ < 199901L
#if defined(__GNUC__) || defined(_MSC_VER)
#define DT__RESTRICT __restrict
#else
#define DT__RESTRICT
#endif
#else
#define DT__RESTRICT restrict
#endif

/* GCC (at -O2 as at -O3) leaves the textbook kernel's acc[MR][NR] in memory, a load and a
   store per multiply-add, but vectorises a column loop placed outside the k loop with the MR
   rows unrolled inside it (it needs the unroll pragma at -O2). Clang is the other way round:
   its SLP vectoriser keeps the textbook acc in registers and does not vectorise the column
   form. Other compilers get the textbook form. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER)
#define DT__GEMM_COLUMNS 1
#if __GNUC__ >= 8
#define DT__UNROLL _Pragma("GCC unroll 16")
#endif
#else
#define DT__GEMM_COLUMNS 0
#endif
#ifndef DT__UNROLL
#define DT__UNROLL
#endif

static float dt__at(const float *X, int64_t ld, int trans, int64_t r, int64_t c) {
    return trans ? X[c * ld + r] : X[r * ld + c];
}

/* Rows [r0, r0+nr) x columns [k0, k0+kc) of op(X) (X transposed when t) as slivers of W rows,
   each stored k-major (kc x W); the last sliver is zero-padded to W rows so the kernel never
   branches. A's block is this of op(A) with W = MR; B's panel, slivers of NR columns, is this of
   op(B)^T (t = !tb). */
static void dt__pack(float *DT__RESTRICT dst, const float *DT__RESTRICT X, int64_t ld, int t, int64_t r0,
                     int64_t nr, int64_t k0, int64_t kc, int W) {
    int64_t i, k, r;
    for (i = 0; i < nr; i += W) {
        if (i + W > nr) {
            for (k = 0; k < kc; k++)
                for (r = 0; r < W; r++)
                    *dst++ = (i + r < nr) ? dt__at(X, ld, t, r0 + i + r, k0 + k) : 0.0f;
        } else if (t) {
            for (k = 0; k < kc; k++, dst += W) {
                const float *s = X + (k0 + k) * ld + r0 + i;
                for (r = 0; r < W; r++) dst[r] = s[r];
            }
        } else {
            const float *s = X + (r0 + i) * ld + k0;
            for (k = 0; k < kc; k++, dst += W)
                for (r = 0; r < W; r++) dst[r] = s[r * ld + k];
        }
    }
}

/* t[MR][NR] = a_sliver^T b_sliver; every sum runs over k in order. The GCC form takes two
   column groups NR/2 apart per pass, so one broadcast of a[k][r] feeds two multiplies (SSE2
   has no broadcast from memory, and its shuffles compete with the arithmetic); 6 rows x 2
   vectors = 12 accumulators, which fits the 16 SSE registers. */
static void dt__micro(int64_t kc, const float *DT__RESTRICT a, const float *DT__RESTRICT b,
                      float *DT__RESTRICT t) {
    int64_t k;
    int r, c;
#if DT__GEMM_COLUMNS
    for (c = 0; c < DT__NR / 2; c++) {
        float s0[DT__MR], s1[DT__MR];
        DT__UNROLL for (r = 0; r < DT__MR; r++) s0[r] = s1[r] = 0.0f;
        for (k = 0; k < kc; k++) {
            float b0 = b[k * DT__NR + c], b1 = b[k * DT__NR + DT__NR / 2 + c];
            DT__UNROLL for (r = 0; r < DT__MR; r++) {
                float ar = a[k * DT__MR + r];
                s0[r] += ar * b0;
                s1[r] += ar * b1;
            }
        }
        DT__UNROLL for (r = 0; r < DT__MR; r++) {
            t[r * DT__NR + c] = s0[r];
            t[r * DT__NR + DT__NR / 2 + c] = s1[r];
        }
    }
#else
    float acc[DT__MR][DT__NR];
    memset(acc, 0, sizeof acc);
    for (k = 0; k < kc; k++)
        for (r = 0; r < DT__MR; r++) {
            float ar = a[k * DT__MR + r];
            for (c = 0; c < DT__NR; c++) acc[r][c] += ar * b[k * DT__NR + c];
        }
    for (r = 0; r < DT__MR; r++)
        for (c = 0; c < DT__NR; c++) t[r * DT__NR + c] = acc[r][c];
#endif
}

/* C tile (its first mr x nr) += alpha * t; outside the kernel so that alpha does not hold one
   of the registers the accumulators need (with it inside, GCC spilled one to the stack). */
static void dt__tile_add(float *DT__RESTRICT C, int64_t ldc, const float *DT__RESTRICT t, float alpha,
                         int64_t mr, int64_t nr) {
    int64_t r, c;
    if (mr == DT__MR && nr == DT__NR) {
        for (r = 0; r < DT__MR; r++)
            for (c = 0; c < DT__NR; c++) C[r * ldc + c] += alpha * t[r * DT__NR + c];
    } else {
        for (r = 0; r < mr; r++)
            for (c = 0; c < nr; c++) C[r * ldc + c] += alpha * t[r * DT__NR + c];
    }
}

/* The ctx's scratch floats, grown on demand and kept until dt_ctx_shutdown, so per-step ops
   (GEMM packing, the attention backward's row buffer) allocate only the first time. */
static float *dt__scratch(dt_ctx *ctx, size_t floats) {
    if (floats > (size_t)PTRDIFF_MAX / sizeof(float)) {
        dt_ctx_set_error(ctx, DT_ERR_OOM, "dt scratch: %zu floats do not fit in memory", floats);
        return NULL;
    }
    if (ctx->scratch_floats < floats) {
        dt_release(ctx, ctx->scratch);
        ctx->scratch = (float *)dt_alloc(ctx, floats * sizeof(float));
        ctx->scratch_floats = ctx->scratch ? floats : 0;
    }
    return ctx->scratch;
}

/* The scratch floats the portable GEMM packs into; callers may keep their own data past them. */
#define DT__GEMM_SCRATCH ((size_t)(DT__MC * DT__KC + DT__KC * (DT__NC + DT__NR)))

static dt_status dt__gemm_portable(dt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                   float beta, float *C, int64_t ldc) {
    size_t need = DT__GEMM_SCRATCH;
    int64_t i, j, jc, pc, ic;
    float *pa, *pb, tile[DT__MR * DT__NR];
    if (beta != 1.0f)
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    if (K == 0 || alpha == 0.0f) return DT_OK;
    if (!dt__scratch(ctx, need)) return DT_ERR_OOM;
    pa = ctx->scratch;
    pb = ctx->scratch + DT__MC * DT__KC;
    for (jc = 0; jc < N; jc += DT__NC) {
        int64_t nc = N - jc < DT__NC ? N - jc : DT__NC;
        for (pc = 0; pc < K; pc += DT__KC) {
            int64_t kc = K - pc < DT__KC ? K - pc : DT__KC;
            dt__pack(pb, B, ldb, !tb, jc, nc, pc, kc, DT__NR);
            for (ic = 0; ic < M; ic += DT__MC) {
                int64_t mc = M - ic < DT__MC ? M - ic : DT__MC;
                dt__pack(pa, A, lda, ta, ic, mc, pc, kc, DT__MR);
                for (j = 0; j < nc; j += DT__NR)
                    for (i = 0; i < mc; i += DT__MR) {
                        dt__micro(kc, pa + i * kc, pb + j * kc, tile);
                        dt__tile_add(C + (ic + i) * ldc + jc + j, ldc, tile, alpha,
                                     mc - i < DT__MR ? mc - i : DT__MR, nc - j < DT__NR ? nc - j : DT__NR);
                    }
            }
        }
    }
    return DT_OK;
}

/* One matrix's leading dimension, row-major as BLAS wants it: at least its row length and 1, and
   rows x ld inside int64 (the kernels index row * ld). */
static dt_status dt__gemm_check_ld(dt_ctx *ctx, const char *fn, const char *ld_name, int64_t ld, const char *mat,
                                   int t, int64_t rows, const char *rows_name, int64_t cols, const char *cols_name) {
    int64_t need = cols > 1 ? cols : 1, span;
    if (ld < need)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s = %lld, expected >= %lld (%s = %lld, the length of a row of %s%s, "
                                "and >= 1)", fn, ld_name, (long long)ld, (long long)need, cols_name, (long long)cols, mat,
                                t ? " as stored, transposed" : "");
    if (!dt_mul_ok(rows, ld, &span))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s = %lld times %s = %lld rows of %s overflows int64", fn, ld_name,
                                (long long)ld, rows_name, (long long)rows, mat);
    return DT_OK;
}

/* The sizes of a row-major SGEMM, named, before either path reads a matrix: CBLAS only prints a
   complaint on a bad ld and the portable kernel would read and write past the rows. (The ops
   pass NULL data for an empty operand, which is never read: NULL is the public entry's check.) */
static dt_status dt__gemm_check(dt_ctx *ctx, const char *fn, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                int64_t lda, int64_t ldb, int64_t ldc) {
    dt_status st;
    if (ta != 0 && ta != 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ta = %d, expected 0 or 1", fn, ta);
    if (tb != 0 && tb != 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: tb = %d, expected 0 or 1", fn, tb);
    if (M < 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: M = %lld, expected >= 0", fn, (long long)M);
    if (N < 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: N = %lld, expected >= 0", fn, (long long)N);
    if (K < 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: K = %lld, expected >= 0", fn, (long long)K);
    /* op(A) is M x K: stored M x K (ta 0) or K x M (ta 1); op(B) K x N: K x N or N x K */
    st = ta ? dt__gemm_check_ld(ctx, fn, "lda", lda, "A", 1, K, "K", M, "M")
            : dt__gemm_check_ld(ctx, fn, "lda", lda, "A", 0, M, "M", K, "K");
    if (!st) st = tb ? dt__gemm_check_ld(ctx, fn, "ldb", ldb, "B", 1, N, "N", K, "K")
                     : dt__gemm_check_ld(ctx, fn, "ldb", ldb, "B", 0, K, "K", N, "N");
    if (!st) st = dt__gemm_check_ld(ctx, fn, "ldc", ldc, "C", 0, M, "M", N, "N");
    return st;
}

static dt_status dt__gemm(dt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                          int64_t ldc) {
    dt_status st;
    if (M == 0 || N == 0) return DT_OK;
    /* the ops pass a zero ld for an empty row (K = 0), which is never read; BLAS wants >= 1 */
    if (lda == 0 && !ta && K == 0) lda = 1;
    if (ldb == 0 && tb && K == 0) ldb = 1;
    st = dt__gemm_check(ctx, "dt_tensor GEMM", ta, tb, M, N, K, lda, ldb, ldc);
    if (st) return st;
#ifdef DT_CBLAS
    if (M <= 2147483647 && N <= 2147483647 && K <= 2147483647 && lda <= 2147483647 && ldb <= 2147483647 &&
        ldc <= 2147483647) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
        return DT_OK;
    }
#endif
    return dt__gemm_portable(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#if defined(DT_CBLAS) && defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
/* OpenBLAS's own name for the kernels it chose; weak: NULL when the CBLAS is another vendor's */
extern char *openblas_get_corename(void) __attribute__((weak));
#define DT__BLAS_NOTE 1
#endif

/* The OPENBLAS_CORETYPE that fits this CPU when OpenBLAS took kernels older than its AVX2 (or
   AVX-512), else NULL; *got: what it took. */
static const char *dt__blas_fit(const char **got) {
#ifdef DT__BLAS_NOTE
    static const char *old[] = {"unknown", "katmai", "coppermine", "northwood", "prescott", "banias", "atom",
                                "core2", "penryn", "dunnington", "nehalem", "athlon", "opteron", "opteron_sse3",
                                "barcelona", "nano", "sandybridge", "bobcat", "bulldozer", "piledriver"};
    char name[32];
    const char *n = openblas_get_corename ? openblas_get_corename() : NULL;
    size_t i;
    if (!n) return NULL;
    for (i = 0; n[i] && i + 1 < sizeof name; i++) name[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] - 'A' + 'a' : n[i]);
    name[i] = 0;
    *got = n;
    for (i = 0; i < sizeof old / sizeof old[0]; i++)
        if (!strcmp(name, old[i])) {
            __builtin_cpu_init();
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
                return "SkylakeX";
            if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
            return NULL;
        }
#endif
    (void)got;
    return NULL;
}

DT_API const char *dt_blas_note(void) {
    static char note[256];
    const char *got = "", *fit = dt__blas_fit(&got);
    if (!fit) return NULL;
    snprintf(note, sizeof note, "OpenBLAS took its %s kernels on a CPU with %s (an OpenBLAS older than this CPU "
             "model): OPENBLAS_CORETYPE=%s in the environment fits it", got, strcmp(fit, "Haswell") ? "AVX-512" : "AVX2",
             fit);
    return note;
}

DT_API void dt_blas_rerun(char **argv) {
#ifdef DT__BLAS_NOTE
    const char *got = "", *fit = dt__blas_fit(&got), *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!fit || !argv || !argv[0] || getenv("OPENBLAS_CORETYPE")) return;
    if (!rank) rank = getenv("PMI_RANK");
    if (setenv("OPENBLAS_CORETYPE", fit, 1)) return;
    if (!rank || !strcmp(rank, "0"))
        fprintf(stderr, "dt: %s; running again with OPENBLAS_CORETYPE=%s\n", dt_blas_note(), fit);
    fflush(NULL);
    execv(strchr(argv[0], '/') ? argv[0] : "/proc/self/exe", argv); /* a path as run (valgrind's own
                                                                      /proc/self/exe is valgrind) */
    unsetenv("OPENBLAS_CORETYPE"); /* the execv failed: go on with the kernels OpenBLAS took */
#else
    (void)argv;
#endif
}

DT_API dt_status dt_gemm_portable(dt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K,
                                  float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                                  float beta, float *C, int64_t ldc) {
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    if (!A) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gemm_portable: A is NULL");
    if (!B) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gemm_portable: B is NULL");
    if (!C) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gemm_portable: C is NULL");
    st = dt__gemm_check(ctx, "dt_gemm_portable", ta, tb, M, N, K, lda, ldb, ldc);
    if (st) return st;
    if (M == 0 || N == 0) return DT_OK;
    return dt__gemm_portable(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---------------------------------------------------------------- bf16 GEMMs on the CPU

   dt_linear with a bf16 w (--dtype bf16) multiplies in bf16 and adds in f32, as a GPU's tensor
   cores and torch.autocast do: its f32 operands (x, dout) are rounded to bf16 (nearest even) on
   the way in, every product of two bf16 is exact in f32, and the sums are f32. Three ways:

     AMX (Intel Sapphire Rapids and later; dt_cpu_bf16_gemm() says "amx-bf16"): the operands are
     packed into tiles, 16 rows x 32 bf16 for op(A) and 16 pairs of k x 16 columns for op(B), and
     TDPBF16PS adds a 16 x 32 by 32 x 16 product into a 16 x 16 f32 tile of C; four such tiles of
     C (32 x 32) take each pair of A tiles and B tiles loaded. Blocks of DT__AMX_KC k's, MC rows
     and NC columns (BLIS' loops); C is loaded into the tiles and stored back once a block
     (dt_linear_fwd's bias is where its tiles start: no second pass over out). Subnormal
     operands count as zero there (the hardware's rule).
     AVX512_BF16 without AMX ("avx512-bf16"), where VDPBF16PS makes at least as many products a
     cycle as f32 FMAs (dt__rate_probe times both once; an Intel core without AMX, as VMs show
     Sapphire Rapids and later, issues it at half the FMAs' rate and takes the fallback): the
     same packs and blocks, and VDPBF16PS adds the two products of a pair of k (an A row's pair
     broadcast to 16 lanes, a row of a B tile's pairs) into 16 f32 lanes: 8 rows x 32 columns
     of C in 16 zmm registers a step. Subnormals count as zero here too.
     elsewhere (the fallback, named by dt_cpu_bf16_gemm): the same rounded operands as f32 into
     scratch and one f32 GEMM: the same products, the sums in another order.

   Either way a sum of K products is within K * 2^-24 * sum |a b| of the exact one
   (tests/test_bf16_gemm.c checks each way against a double reference). DT_CPU_BF16=avx512 in
   the environment leaves AMX out, DT_CPU_BF16=f32 takes the fallback (to compare the ways). */

/* A bf16 w: *wf is its shape as f32, for the checks the f32 path makes. */
static int dt__bf16_w(const dt_tensor *w, dt_tensor *wf) {
    if (!w || w->dtype != DT_BF16) return 0;
    *wf = *w;
    wf->dtype = DT_F32;
    return 1;
}

/* An activation that may be bf16 (ok): t itself, or a bf16 t as f32 in *tmp, for the f32 checks
   of its shape. */
static const dt_tensor *dt__bf16_as_f32(const dt_tensor *t, int ok, dt_tensor *tmp) {
    if (!ok || !t || t->dtype != DT_BF16) return t;
    *tmp = *t;
    tmp->dtype = DT_F32;
    return tmp;
}

#ifdef DT__TENSOR_AMX
#if defined(__GNUC__) && !defined(__clang__)
/* GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32(), which -Wmaybe-uninitialized
   flags at some optimisation levels */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define DT__AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define DT__BF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) /* no AMX: the packs, VDPBF16PS */
/* GCC's AMX intrinsics (amxtileintrin.h up to GCC 13 at least) are asm statements that do not
   tell the compiler which memory they read or write: _tile_loadconfig names 8 of its 64 bytes, the
   tile loads and stores none. Without a barrier GCC 12 dropped the config's memset (LDTILECFG then
   read stack garbage and faulted, SIGSEGV, on a Sapphire Rapids-class VM) and may move C's or the
   staging tiles' plain loads and stores across the tile instructions. DT__AMX_FENCE is a compiler
   barrier at each boundary between the tile instructions and C code's memory. */
#define DT__AMX_FENCE() __asm__ volatile("" ::: "memory")
#define DT__AMX_KC 512  /* k's per packed block (a multiple of 32) */
#define DT__AMX_MC 64   /* rows of op(A) per packed block (a multiple of 32) */
#define DT__AMX_NC 1024 /* columns of op(B) per packed block (a multiple of 32) */
#define DT__AMX_WS ((size_t)(DT__AMX_MC * DT__AMX_KC + DT__AMX_KC * DT__AMX_NC) / 2) /* the packs, in floats: */
typedef char dt__amx_ws_fits[DT__AMX_WS <= DT__GEMM_SCRATCH ? 1 : -1]; /* within what callers leave the GEMMs */

static int dt__amx_state;         /* 0: not asked yet, 2: AMX, 1: AVX512_BF16 only, -1: neither */
static const char *dt__amx_why = ""; /* why not AMX (state 1), why neither (state -1) */
static char dt__amx_said[200];

/* TSC ticks of 2048 x 16 VDPBF16PS (dp) or f32 FMAs, 16 independent sums: the instructions'
   rate, the best of 5 runs. An Intel core without AMX (as VMs show Sapphire Rapids and later)
   issues VDPBF16PS at half its rate of FMAs: 0.5-0.6x the products. */
static DT__BF uint64_t dt__rate_probe(int dp) {
    __m512 c[16], a = _mm512_set1_ps(1.0f), z = _mm512_setzero_ps();
    uint64_t best = 0;
    float f[16];
    volatile float sink;
    int rep, r, i;
    __asm__ volatile("" : "+v"(a), "+v"(z)); /* not constants to the compiler */
    for (rep = 0; rep < 5; rep++) {
        uint64_t t0, t;
        for (r = 0; r < 16; r++) c[r] = z;
        t0 = __rdtsc();
        if (dp)
            for (i = 0; i < 2048; i++) {
#pragma GCC unroll 16
                for (r = 0; r < 16; r++) c[r] = _mm512_dpbf16_ps(c[r], (__m512bh)a, (__m512bh)a);
            }
        else
            for (i = 0; i < 2048; i++) {
#pragma GCC unroll 16
                for (r = 0; r < 16; r++) c[r] = _mm512_fmadd_ps(c[r], a, a);
            }
        t = __rdtsc() - t0;
        for (r = 1; r < 16; r++) c[0] = _mm512_add_ps(c[0], c[r]);
        _mm512_storeu_ps(f, c[0]);
        sink = f[0]; /* the sums are used */
        (void)sink;
        if (!rep || t < best) best = t;
    }
    return best;
}

/* AVX512_BF16 is on when the CPU has AVX-512 F/BW/VL with AVX512_BF16 and the OS saves the
   AVX-512 registers; AMX also when it has AMX-BF16 and AMX-TILE and Linux grants this process the
   tile data (arch_prctl ARCH_REQ_XCOMP_PERM, 0x1023, for XFEATURE_XTILEDATA, 18: Linux >= 5.16).
   DT_CPU_BF16 (avx512, f32) caps it. Asked once a process (two threads asking at once both probe,
   and both store an answer). Returns the state. */
static int dt__amx_on(void) {
    if (!dt__amx_state) {
        unsigned a = 0, b = 0, c = 0, d = 0, a1 = 0, b1 = 0, c1 = 0, d1 = 0, lo = 0, hi = 0, c0 = 0;
        long r = -1;
        int st = -1;
        const char *e = getenv("DT_CPU_BF16");
        int cpu = __get_cpuid(1, &a, &b, &c0, &d) && (c0 & (1u << 27)) && /* OSXSAVE: xgetbv may run */
                  __get_cpuid_count(7, 0, &a, &b, &c, &d) && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
        if (cpu) __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if (e && *e && strcmp(e, "f32") && strcmp(e, "avx512") && strcmp(e, "amx"))
            dt__amx_why = "DT_CPU_BF16 in the environment is none of amx, avx512, f32";
        else if (e && !strcmp(e, "f32")) dt__amx_why = "DT_CPU_BF16=f32 in the environment";
        else if (!cpu || !(b & (1u << 16)) || !(b & (1u << 30)) || !(b & (1u << 31)) || !(a1 & (1u << 5)))
            dt__amx_why = "this CPU has no AVX-512 F/BW/VL with AVX512_BF16";
        else if ((lo & 0xe6) != 0xe6) dt__amx_why = "the OS does not keep the AVX-512 registers";
        else {
            st = 1;
            if (e && !strcmp(e, "avx512")) dt__amx_why = "DT_CPU_BF16=avx512 in the environment";
            else if (!(d & (1u << 22)) || !(d & (1u << 24))) {
                /* VDPBF16PS makes two products a lane, an FMA one: faster only at >= half the rate */
                double x = 2.0 * (double)dt__rate_probe(0) / (double)(dt__rate_probe(1) + 1);
                snprintf(dt__amx_said, sizeof dt__amx_said,
                         "no AMX-BF16 on this CPU (or VM); its VDPBF16PS makes %.2fx the products a cycle of its "
                         "f32 FMAs%s", x, x >= 1.0 ? "" : ": DT_CPU_BF16=avx512 takes it anyway");
                dt__amx_why = dt__amx_said;
                if (x < 1.0) st = -1;
            } else {
                __asm__ volatile("syscall" : "=a"(r) : "a"(158L), "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
                if (r) dt__amx_why = "Linux did not grant the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)";
                else st = 2;
            }
        }
        (void)hi;
        dt__amx_state = st;
    }
    return dt__amx_state;
}

/* One operand of a bf16 GEMM, f32 (rounded as it is packed) or bf16: element (x, k), x a row of
   op(A) or a column of op(B), at p[x * sx + k * sk]. */
typedef struct dt__bop {
    const void *p;
    int bf16;
    int64_t sx, sk;
} dt__bop;

static inline uint16_t dt__bop_at(const dt__bop *o, int64_t x, int64_t k) {
    int64_t i = x * o->sx + k * o->sk;
    return o->bf16 ? ((const uint16_t *)o->p)[i] : dt_f32_to_bf16(((const float *)o->p)[i]);
}

/* 16 bf16 from (x, k) on, along x or along k, the first n of them (the rest 0) */
static inline DT__BF __m256i dt__bop_16(const dt__bop *o, int64_t x, int64_t k, int64_t n, int along_x) {
    uint16_t t[16];
    int64_t j;
    if ((along_x ? o->sx : o->sk) == 1 && n == 16) {
        int64_t i = x * o->sx + k * o->sk;
        if (o->bf16) return _mm256_loadu_si256((const __m256i *)((const uint16_t *)o->p + i));
        return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)o->p + i));
    }
    for (j = 0; j < 16; j++) t[j] = j < n ? (along_x ? dt__bop_at(o, x + j, k) : dt__bop_at(o, x, k + j)) : 0;
    return _mm256_loadu_si256((const __m256i *)t);
}

/* d = the transpose of the 16 x 16 dwords at t (rows of 16): 32-bit, then 64-bit unpacks within
   128-bit lanes, then two rounds of lane shuffles */
static inline DT__BF void dt__tr16(const uint32_t *t, uint32_t *d) {
    __m512i r[16], u[16];
    int i, c;
    for (i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(t + 16 * i);
    for (i = 0; i < 16; i += 2) { /* lane L of u[i]: r[i][4L], r[i+1][4L], r[i][4L+1], r[i+1][4L+1] */
        u[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (i = 0; i < 16; i += 4) { /* lane L of r[i + c]: column 4L + c of rows i .. i + 3 */
        r[i] = _mm512_unpacklo_epi64(u[i], u[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(u[i], u[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(u[i + 1], u[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(u[i + 1], u[i + 3]);
    }
    for (c = 0; c < 4; c++) { /* u[c]: columns c and 8 + c of rows 0-7; u[4 + c]: 4 + c, 12 + c; u[8 + ...]: rows 8-15 */
        u[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
        u[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        u[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        u[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (c = 0; c < 4; c++) {
        _mm512_storeu_si512(d + 16 * c, _mm512_shuffle_i32x4(u[c], u[8 + c], 0x88));
        _mm512_storeu_si512(d + 16 * (8 + c), _mm512_shuffle_i32x4(u[c], u[8 + c], 0xdd));
        _mm512_storeu_si512(d + 16 * (4 + c), _mm512_shuffle_i32x4(u[4 + c], u[12 + c], 0x88));
        _mm512_storeu_si512(d + 16 * (12 + c), _mm512_shuffle_i32x4(u[4 + c], u[12 + c], 0xdd));
    }
}

/* k is the operand's short stride: its blocks are read along k (rows of x), else along x */
static int dt__bop_along_k(const dt__bop *o) { return o->sk == 1 || (o->sx != 1 && o->sk < o->sx); }

/* The 16 x 16 pairs of x0 .. x0 + 15 (nx of them) by k0 .. k0 + 31 (nk) as dwords (pair kp: k
   2kp in the low half, 2kp + 1 in the high), d[x][kp] (an A tile) when by_x, else d[kp][x] (a B
   tile); 0 past nx and nk. Read along k (two runs of 16) where k is the short stride, else along
   x (pairs of k interleaved); the other layout is a transpose of the dwords. */
static DT__BF void dt__bop_block(const dt__bop *o, int64_t x0, int64_t nx, int64_t k0, int64_t nk, int by_x,
                                  uint32_t *d) {
    uint32_t t[16 * 16];
    int along_k = dt__bop_along_k(o);
    uint32_t *r = along_k == by_x ? d : t;
    int64_t j, n = nx < 16 ? nx : 16;
    for (j = 0; j < 16; j++) {
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256(), u, v;
        if (along_k) { /* row x0 + j: its 32 k's */
            if (j < nx) {
                lo = dt__bop_16(o, x0 + j, k0, nk < 16 ? nk : 16, 0);
                if (nk > 16) hi = dt__bop_16(o, x0 + j, k0 + 16, nk < 32 ? nk - 16 : 16, 0);
            }
            _mm256_storeu_si256((__m256i *)(r + j * 16), lo);
            _mm256_storeu_si256((__m256i *)(r + j * 16 + 8), hi);
        } else { /* pair j: k0 + 2j and k0 + 2j + 1 of the 16 x's, interleaved (within 128-bit lanes,
                    then the lanes put in order) */
            if (2 * j < nk) lo = dt__bop_16(o, x0, k0 + 2 * j, n, 1);
            if (2 * j + 1 < nk) hi = dt__bop_16(o, x0, k0 + 2 * j + 1, n, 1);
            u = _mm256_unpacklo_epi16(lo, hi); /* x 0-3, 8-11 */
            v = _mm256_unpackhi_epi16(lo, hi); /* x 4-7, 12-15 */
            _mm256_storeu_si256((__m256i *)(r + j * 16), _mm256_permute2x128_si256(u, v, 0x20));
            _mm256_storeu_si256((__m256i *)(r + j * 16 + 8), _mm256_permute2x128_si256(u, v, 0x31));
        }
    }
    if (r == t) dt__tr16(t, d);
}

/* A block's packs, x0 .. x0 + nx by k0 .. k0 + kc into dst ([nx / 16][kc / 32] tiles of 512 bf16):
   an operand read along x goes k by k through the block (its rows in order) */
static DT__BF void dt__bop_pack(const dt__bop *o, int64_t x0, int64_t nx, int64_t k0, int64_t kc, int by_x,
                                 uint16_t *dst) {
    int64_t ks = (kc + 31) / 32, x, s;
    if (dt__bop_along_k(o)) {
        for (x = 0; x < nx; x += 16)
            for (s = 0; s < ks; s++)
                dt__bop_block(o, x0 + x, nx - x, k0 + s * 32, kc - s * 32, by_x, (uint32_t *)(dst + ((x / 16) * ks + s) * 512));
    } else {
        for (s = 0; s < ks; s++)
            for (x = 0; x < nx; x += 16)
                dt__bop_block(o, x0 + x, nx - x, k0 + s * 32, kc - s * 32, by_x, (uint32_t *)(dst + ((x / 16) * ks + s) * 512));
    }
}

typedef struct dt__amx_cfg { /* LDTILECFG's 64 bytes, palette 1 */
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} dt__amx_cfg;

/* C[mc x nc] (+)= the packed blocks' product: pa [mc / 16][kc / 32] A tiles, pb [nc / 16][kc / 32]
   B tiles (512 bf16 each). Tiles 0-3: C's 32 x 32; 4, 5: A; 6, 7: B. acc: C is loaded first, else
   the tiles start at bias (nc of them, every row: a tile load of stride 0) or at 0. A block at the
   edge of C goes through tmp. */
static DT__AMX void dt__amx_block(int64_t mc, int64_t nc, int64_t kc, const uint16_t *pa, const uint16_t *pb,
                                  float *C, int64_t ldc, int acc, const float *bias) {
    int64_t ks = (kc + 31) / 32, i, j, s, ld = ldc * 4;
    float tmp[4][256];
    DT__AMX_FENCE(); /* the packs and C written before */
    for (j = 0; j < nc; j += 32)
        for (i = 0; i < mc; i += 32) {
            const uint16_t *a0 = pa + (i / 16) * ks * 512, *a1 = a0 + ks * 512;
            const uint16_t *b0 = pb + (j / 16) * ks * 512, *b1 = b0 + ks * 512;
            float *c = C + i * ldc + j;
            int q, r, e, two_m = mc - i > 16, two_n = nc - j > 16;
            if (mc - i >= 32 && nc - j >= 32) {
                if (acc) {
                    _tile_loadd(0, c, ld); _tile_loadd(1, c + 16, ld);
                    _tile_loadd(2, c + 16 * ldc, ld); _tile_loadd(3, c + 16 * ldc + 16, ld);
                } else if (bias) {
                    _tile_loadd(0, bias + j, 0); _tile_loadd(1, bias + j + 16, 0);
                    _tile_loadd(2, bias + j, 0); _tile_loadd(3, bias + j + 16, 0);
                } else {
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                }
                for (s = 0; s < ks; s++) {
                    _tile_loadd(4, a0 + s * 512, 64);
                    _tile_loadd(6, b0 + s * 512, 64);
                    _tile_loadd(7, b1 + s * 512, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(5, a1 + s * 512, 64);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, c, ld); _tile_stored(1, c + 16, ld);
                _tile_stored(2, c + 16 * ldc, ld); _tile_stored(3, c + 16 * ldc + 16, ld);
                continue;
            }
            for (q = 0; q < 4; q++) {
                int64_t ri = i + (q >> 1) * 16, cj = j + (q & 1) * 16;
                for (r = 0; r < 16; r++)
                    for (e = 0; e < 16; e++)
                        tmp[q][r * 16 + e] = !(ri + r < mc && cj + e < nc) ? 0.0f
                                             : acc ? C[(ri + r) * ldc + cj + e] : bias ? bias[cj + e] : 0.0f;
            }
            DT__AMX_FENCE();
            _tile_loadd(0, tmp[0], 64); _tile_loadd(1, tmp[1], 64);
            _tile_loadd(2, tmp[2], 64); _tile_loadd(3, tmp[3], 64);
            for (s = 0; s < ks; s++) {
                _tile_loadd(4, a0 + s * 512, 64);
                _tile_loadd(6, b0 + s * 512, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (two_n) { _tile_loadd(7, b1 + s * 512, 64); _tile_dpbf16ps(1, 4, 7); }
                if (two_m) {
                    _tile_loadd(5, a1 + s * 512, 64);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two_n) _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, tmp[0], 64); _tile_stored(1, tmp[1], 64);
            _tile_stored(2, tmp[2], 64); _tile_stored(3, tmp[3], 64);
            DT__AMX_FENCE();
            for (q = 0; q < 4; q++) {
                int64_t ri = i + (q >> 1) * 16, cj = j + (q & 1) * 16;
                for (r = 0; r < 16 && ri + r < mc; r++)
                    for (e = 0; e < 16 && cj + e < nc; e++) C[(ri + r) * ldc + cj + e] = tmp[q][r * 16 + e];
            }
        }
    DT__AMX_FENCE(); /* C's tiles stored before the caller reads them */
}

static DT__AMX void dt__amx_start(void) {
    dt__amx_cfg cfg;
    int x;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (x = 0; x < 8; x++) { cfg.rows[x] = 16; cfg.colsb[x] = 64; }
    DT__AMX_FENCE(); /* all 64 bytes written: GCC's _tile_loadconfig names 8 */
    _tile_loadconfig(&cfg);
}
static DT__AMX void dt__amx_stop(void) { _tile_release(); }

/* dt__amx_block's work without AMX, from the same packs: 8 rows x 32 columns of C a step, in 16
   zmm accumulators; for each pair of k, VDPBF16PS multiplies an A row's pair (broadcast to 16
   lanes) with a row of a B tile (the pair for each of 16 columns) and adds both products to the
   lanes. Rows and columns past mc and nc are the packs' zeros: summed, neither loaded nor stored. */
static DT__BF void dt__dpbf_block(int64_t mc, int64_t nc, int64_t kc, const uint16_t *pa, const uint16_t *pb,
                                  float *C, int64_t ldc, int acc, const float *bias) {
    int64_t ks = (kc + 31) / 32, i, j, s;
    int p, r;
    for (j = 0; j < nc; j += 32) {
        const uint16_t *b0 = pb + (j / 16) * ks * 512, *b1 = nc - j > 16 ? b0 + ks * 512 : b0;
        __mmask16 m0 = (__mmask16)(nc - j >= 16 ? 0xffff : (1u << (nc - j)) - 1);
        __mmask16 m1 = (__mmask16)(nc - j >= 32 ? 0xffff : nc - j > 16 ? (1u << (nc - j - 16)) - 1 : 0);
        __m512 z0 = bias ? _mm512_maskz_loadu_ps(m0, bias + j) : _mm512_setzero_ps();
        __m512 z1 = bias ? _mm512_maskz_loadu_ps(m1, bias + j + 16) : _mm512_setzero_ps();
        for (i = 0; i < mc; i += 8) {
            const uint32_t *a0 = (const uint32_t *)(pa + (i / 16) * ks * 512) + (i % 16) * 16;
            int nr = mc - i < 8 ? (int)(mc - i) : 8;
            __m512 c0[8], c1[8];
#pragma GCC unroll 8
            for (r = 0; r < 8; r++) {
                const float *cr = C + (i + r) * ldc + j;
                c0[r] = acc && r < nr ? _mm512_maskz_loadu_ps(m0, cr) : z0;
                c1[r] = acc && r < nr ? _mm512_maskz_loadu_ps(m1, cr + 16) : z1;
            }
            for (s = 0; s < ks; s++) {
                const uint32_t *at = a0 + s * 256;
                const uint16_t *x0 = b0 + s * 512, *x1 = b1 + s * 512;
                for (p = 0; p < 16; p++) {
                    __m512bh w0 = (__m512bh)_mm512_loadu_si512(x0 + p * 32);
                    __m512bh w1 = (__m512bh)_mm512_loadu_si512(x1 + p * 32);
#pragma GCC unroll 8
                    for (r = 0; r < 8; r++) {
                        __m512bh v = (__m512bh)_mm512_set1_epi32((int)at[r * 16 + p]);
                        c0[r] = _mm512_dpbf16_ps(c0[r], v, w0);
                        c1[r] = _mm512_dpbf16_ps(c1[r], v, w1);
                    }
                }
            }
            for (r = 0; r < nr; r++) {
                float *cr = C + (i + r) * ldc + j;
                _mm512_mask_storeu_ps(cr, m0, c0[r]);
                _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
            }
        }
    }
}

/* C[M x N] = op(A) op(B) (+ C when acc, else + bias[N] when not NULL), K > 0, on AMX tiles when
   amx, else with VDPBF16PS; ws: DT__AMX_WS floats. */
static DT__BF void dt__bf_gemm(int amx, int64_t M, int64_t N, int64_t K, const dt__bop *A, const dt__bop *B,
                               float *C, int64_t ldc, int acc, const float *bias, float *ws) {
    int64_t jc, pc, ic;
    uint16_t *pa = (uint16_t *)ws, *pb = pa + DT__AMX_MC * DT__AMX_KC;
    if (amx) dt__amx_start();
    for (jc = 0; jc < N; jc += DT__AMX_NC) {
        int64_t nc = N - jc < DT__AMX_NC ? N - jc : DT__AMX_NC;
        for (pc = 0; pc < K; pc += DT__AMX_KC) {
            int64_t kc = K - pc < DT__AMX_KC ? K - pc : DT__AMX_KC;
            dt__bop_pack(B, jc, nc, pc, kc, 0, pb);
            for (ic = 0; ic < M; ic += DT__AMX_MC) {
                int64_t mc = M - ic < DT__AMX_MC ? M - ic : DT__AMX_MC;
                float *c = C + ic * ldc + jc;
                dt__bop_pack(A, ic, mc, pc, kc, 1, pa);
                if (amx) dt__amx_block(mc, nc, kc, pa, pb, c, ldc, acc || pc > 0, bias ? bias + jc : NULL);
                else dt__dpbf_block(mc, nc, kc, pa, pb, c, ldc, acc || pc > 0, bias ? bias + jc : NULL);
            }
        }
    }
    if (amx) dt__amx_stop();
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

DT_API const char *dt_cpu_bf16_gemm(void) {
    static char why[288];
#ifdef DT__TENSOR_AMX
    int st = dt__amx_on();
    if (st == 2) return "amx-bf16";
    snprintf(why, sizeof why, "%s (%s)", st == 1 ? "avx512-bf16" : "f32 GEMMs of bf16-rounded operands", dt__amx_why);
#else
    snprintf(why, sizeof why, "f32 GEMMs of bf16-rounded operands (built without AMX: not x86-64 Linux with GCC >= 11 "
             "or Clang >= 12, or DT_TENSOR_NO_AMX)");
#endif
    return why;
}


#ifdef DT__TENSOR_AVX2
/* d[i] = s[i] rounded to bf16 (s f32, or bf16 when bf), as f32, 8 lanes; returns how many (n
   rounded down to 8). The same bits as dt_bf16_to_f32(dt_f32_to_bf16(.)). */
__attribute__((target("avx2"))) static int64_t dt__round_bf16_w(float *d, const void *s, int bf, int64_t n) {
    int64_t i;
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff), abs = _mm256_set1_epi32(0x7fffffff);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x400000);
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256i u, r, nan;
        if (bf) {
            u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)s + i)));
            _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(u, 16));
            continue;
        }
        u = _mm256_loadu_si256((const __m256i *)((const float *)s + i));
        r = _mm256_add_epi32(_mm256_add_epi32(u, half), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
        nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), nan);
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_and_si256(r, top));
    }
    return i;
}
#endif

/* d[0 .. n) = s[0 .. n) rounded to bf16, as f32 (s bf16 when bf) */
static void dt__round_bf16(float *d, const void *s, int bf, int64_t n) {
    int64_t i = 0;
#ifdef DT__TENSOR_AVX2
    if (__builtin_cpu_supports("avx2")) i = dt__round_bf16_w(d, s, bf, n);
#endif
    for (; i < n; i++)
        d[i] = bf ? dt_bf16_to_f32(((const uint16_t *)s)[i]) : dt_bf16_to_f32(dt_f32_to_bf16(((const float *)s)[i]));
}

/* C[M x N] = op(A) op(B) (+ C when acc, else + bias[N] when not NULL), A and B f32 or bf16 (abf,
   bbf), row-major with lda, ldb as dt__gemm's: bf16 products, f32 sums (see above; on AMX and
   AVX512_BF16 the bias is where the sums start, in the fallback it is added after). keep: floats
   of the ctx scratch past DT__GEMM_SCRATCH that the caller holds data in; it reserved room for the
   fallback's operands past them (the packs stay within DT__GEMM_SCRATCH). */
static dt_status dt__gemm_bf16_keep(dt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A,
                                    int abf, int64_t lda, const void *B, int bbf, int64_t ldb, int acc, float *C,
                                    int64_t ldc, size_t keep, const float *bias) {
    int64_t na, nb, i, ra, ca, rb, cb;
    float *s;
    if (M == 0 || N == 0) return DT_OK;
    if (lda == 0 && !ta && K == 0) lda = 1;
    if (ldb == 0 && tb && K == 0) ldb = 1;
    DT__TRY(dt__gemm_check(ctx, "dt_tensor bf16 GEMM", ta, tb, M, N, K, lda, ldb, ldc));
#ifdef DT__TENSOR_AMX
    if (K > 0 && dt__amx_on() > 0) {
        dt__bop a, b;
        if (!(s = dt__scratch(ctx, DT__AMX_WS))) return ctx->last_status;
        a.p = A; a.bf16 = abf; a.sx = ta ? 1 : lda; a.sk = ta ? lda : 1;
        b.p = B; b.bf16 = bbf; b.sx = tb ? ldb : 1; b.sk = tb ? 1 : ldb;
        dt__bf_gemm(dt__amx_on() == 2, M, N, K, &a, &b, C, ldc, acc, acc ? NULL : bias, s);
        return DT_OK;
    }
#endif
    /* the operands' rows, rounded, packed tight (ld = their cols: a head's columns of qkv, not
       the rows between) */
    ra = ta ? K : M; ca = ta ? M : K; rb = tb ? N : K; cb = tb ? K : N;
    na = ra * ca;
    nb = rb * cb;
    if (keep && ctx->scratch_floats < DT__GEMM_SCRATCH + keep + (size_t)na + (size_t)nb)
        return dt_ctx_set_error(ctx, DT_ERR_STATE, "dt_tensor bf16 GEMM: the caller reserved too little scratch");
    if (!(s = dt__scratch(ctx, DT__GEMM_SCRATCH + keep + (size_t)na + (size_t)nb))) return ctx->last_status;
    s += DT__GEMM_SCRATCH + keep; /* past what the portable GEMM packs into, and the caller's */
    for (i = 0; ca > 0 && i < ra; i++) dt__round_bf16(s + i * ca, (const char *)A + i * lda * (abf ? 2 : 4), abf, ca);
    for (i = 0; cb > 0 && i < rb; i++) dt__round_bf16(s + na + i * cb, (const char *)B + i * ldb * (bbf ? 2 : 4), bbf, cb);
    DT__TRY(dt__gemm(ctx, ta, tb, M, N, K, 1.0f, s, ca > 0 ? ca : 1, s + na, cb > 0 ? cb : 1, acc ? 1.0f : 0.0f, C, ldc));
    if (bias && !acc)
        for (i = 0; i < M; i++) {
            int64_t j;
            for (j = 0; j < N; j++) C[i * ldc + j] += bias[j];
        }
    return DT_OK;
}
static dt_status dt__gemm_bf16(dt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int abf,
                               int64_t lda, const void *B, int bbf, int64_t ldb, int acc, float *C, int64_t ldc) {
    return dt__gemm_bf16_keep(ctx, ta, tb, M, N, K, A, abf, lda, B, bbf, ldb, acc, C, ldc, 0, NULL);
}

/* ---------------------------------------------------------------- op helpers */

#define DT__F(t) ((float *)(t)->data)
#define DT__CF(t) ((const float *)(t)->data)

static int64_t dt__last(const dt_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
/* The leading dims flattened (not numel / last: a [4, 0] tensor still has 4 rows). */
static int64_t dt__rows(const dt_tensor *t) {
    int64_t r = 1;
    int i;
    for (i = 0; i + 1 < t->ndim; i++) r *= t->shape[i]; /* fits: the tensor passed dt__valid */
    return r;
}

static dt_status dt__f32(dt_ctx *ctx, const dt_tensor *t, const char *fn, const char *arg) {
    return dt_check_tensor(ctx, t, DT_F32, fn, arg);
}

/* An op's output that shares a byte with one of its inputs (two views of one buffer that
   overlap): DT_ERR_ARG naming both, before anything is written. The ops read their inputs while
   they write, so such an output would be garbage (and memcpy between them undefined); only the
   ops that say so (relu, add, mul, axpy, softmax_xent's probs) may run in place. NULL, empty or
   dataless tensors never overlap (their own checks name them). */
static dt_status dt__apart(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *in, const char *fn, const char *on,
                           const char *in_name) {
    if (!dt_tensor_overlap(out, in)) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s shares memory with %s; expected an op's outputs apart from its "
                            "inputs (it reads one while it writes the other)", fn, on, in_name);
}

/* For the ops that run in place: out may be in itself (the same data, dtype and element count: each
   element is read before it is written, by the same thread), else apart; a partial overlap (out a
   few elements past in) would read elements already written. */
static dt_status dt__same_or_apart(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *in, const char *fn,
                                   const char *on, const char *in_name) {
    return dt_tensor_overlap(out, in) == 2 ? DT_OK : dt__apart(ctx, out, in, fn, on, in_name);
}

static dt_status dt__same(dt_ctx *ctx, const dt_tensor *a, const dt_tensor *b, const char *fn,
                          const char *an, const char *bn) {
    char sa[96], sb[96];
    if (dt_tensor_same_shape(a, b)) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s does not match %s shape %s", fn, an,
                            dt_shape_str(a, sa, sizeof sa), bn, dt_shape_str(b, sb, sizeof sb));
}

static dt_status dt__same_numel(dt_ctx *ctx, const dt_tensor *a, const dt_tensor *b, const char *fn,
                                const char *an, const char *bn) {
    if (a->numel == b->numel) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s has %lld elements, %s has %lld", fn, an,
                            (long long)a->numel, bn, (long long)b->numel);
}

static dt_status dt__ndim(dt_ctx *ctx, const dt_tensor *t, int lo, int hi, const char *fn, const char *arg) {
    if (t->ndim >= lo && t->ndim <= hi) return DT_OK;
    if (lo == hi)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s has %d dims; expected %d", fn, arg, t->ndim, lo);
    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s has %d dims; expected %d..%d", fn, arg, t->ndim, lo, hi);
}

static dt_status dt__dim(dt_ctx *ctx, int64_t got, int64_t want, const char *fn, const char *what,
                         const char *expect) {
    if (got == want) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s = %lld does not match %s = %lld", fn, what,
                            (long long)got, expect, (long long)want);
}

/* ---------------------------------------------------------------- CUDA dispatch

   Under DT_CUDA an op whose operands are CUDA tensors runs the launcher of kernels/ with the
   same stem (dt_matmul_fwd -> dt_k_matmul_fwd) on ctx->cuda_stream. Its arguments are checked by
   the CPU path's own checks, run on "shadows" (copies of the tensor structs marked cpu: the
   checks read shapes and dtypes, never data), so both paths name the same problems the same
   way. Every operand must be on cuda (DT_ERR_DEVICE names the one that is not); a failing
   launch is DT_ERR_CUDA naming the launcher and the CUDA / cuBLAS error. Ops with a CUDA path:
   matmul, linear, bias_add, relu, gelu, layernorm, attention, embedding, softmax_xent, bce_logits,
   mul, dot_interaction (each _fwd and _bwd), add, scale, axpy, sum, sumsq, tensor_cast; concat
   and split (_fwd, _bwd: f32, kernels/dt_parallel.cu's dt_k_concat).
   None of them allocates, copies to the host or waits, except dt_sum / dt_sumsq (their result
   is a host double) and a loss op asked for its loss: temporaries come from dt_cuda_scratch, ids
   and targets are checked on the device (dt_cuda_check_range), losses stay in the loss slot. */
#ifdef DT_CUDA
static int dt__cu(const dt_tensor *t) { return t && t->device == DT_CUDA_DEVICE; }

/* *s = t marked cpu (NULL stays NULL: *ps = NULL), after checking t is a live cuda tensor. */
static dt_status dt__cu_shadow(dt_ctx *ctx, dt_tensor *s, const dt_tensor **ps, const dt_tensor *t, const char *fn,
                               const char *arg) {
    *ps = NULL;
    if (!t) return DT_OK;
    DT__TRY(dt__valid(ctx, t, fn, arg));
    if (t->device != DT_CUDA_DEVICE)
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is on %s but other operands are on cuda; every "
                                "operand of an op must be on one device", fn, arg, dt_device_name(t->device));
    *s = *t;
    s->device = DT_CPU;
    *ps = s;
    return DT_OK;
}

static dt_status dt__cu_status(dt_ctx *ctx, int st, const char *fn, const char *call) {
    if (st == 0) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s failed: %s", fn, call, dt_k_error_string(st));
}

/* The cuBLAS handle of the ctx, created on first use (dt_ctx_shutdown destroys it), with a
   workspace of dt's: cuBLAS would otherwise cudaMalloc its own inside the first GEMM of a shape
   (uncounted, inside a step). 32 MiB on Hopper and later, 4 MiB before (as llm.c and PyTorch).
   cublasSetStream drops the workspace, so both are set again whenever ctx->cuda_stream is not
   the handle's stream any more (the launchers set the stream only when it differs). The
   cuBLASLt handle (dt_linear's fused epilogues) is made with it and uses the same workspace:
   every GEMM of the ctx runs on ctx->cuda_stream, one after another. */
static dt_status dt__cu_blas(dt_ctx *ctx, const char *fn) {
    cublasHandle_t h = (cublasHandle_t)ctx->cublas;
    cudaStream_t cur = NULL;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const char *call = "cublasCreate";
    int fresh = !h;
    if (fresh) {
        int dev = 0, major = 0, lt_st;
        size_t bytes;
        st = cublasCreate(&h);
        if (st != CUBLAS_STATUS_SUCCESS)
            return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: cublasCreate failed: %s", fn,
                                    dt_k_error_string(1000 + (int)st));
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            major = 0; /* unknown: the smaller size */
            (void)cudaGetLastError(); /* the failed query's error is not the next call's */
        }
        bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
        if (!ctx->cublaslt && (lt_st = dt_k_lt_create(&ctx->cublaslt)) != 0) {
            cublasDestroy(h);
            return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: cublasLtCreate failed: %s", fn, dt_k_error_string(lt_st));
        }
        if (dt_cuda_alloc(ctx, &ctx->cublas_workspace, bytes, fn)) {
            cublasDestroy(h);
            return ctx->last_status;
        }
        ctx->cublas_workspace_bytes = bytes;
        ctx->cublas = h;
    } else {
        call = "cublasGetStream";
        st = cublasGetStream(h, &cur);
    }
    if (st == CUBLAS_STATUS_SUCCESS && (fresh || cur != (cudaStream_t)ctx->cuda_stream)) {
        call = "cublasSetStream";
        st = cublasSetStream(h, (cudaStream_t)ctx->cuda_stream);
        if (st == CUBLAS_STATUS_SUCCESS) {
            call = "cublasSetWorkspace";
            st = cublasSetWorkspace(h, ctx->cublas_workspace, ctx->cublas_workspace_bytes);
        }
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return dt_ctx_set_error(ctx, DT_ERR_CUDA, "%s: %s failed: %s", fn, call, dt_k_error_string(1000 + (int)st));
    return DT_OK;
}

static dt_status dt__cu_matmul_fwd(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *, int, int, float, float);
static dt_status dt__cu_matmul_bwd(dt_ctx *, dt_tensor *, dt_tensor *, const dt_tensor *, const dt_tensor *,
                                   const dt_tensor *, int, int, float);
static dt_status dt__cu_linear_fwd(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *, const dt_tensor *);
static dt_status dt__cu_linear_fwd_ep(dt_ctx *, dt_tensor *, dt_tensor *, const dt_tensor *, const dt_tensor *,
                                      const dt_tensor *, const char *);
static dt_status dt__cu_linear_bwd(dt_ctx *, dt_tensor *, dt_tensor *, dt_tensor *, const dt_tensor *,
                                   const dt_tensor *, const dt_tensor *);
static dt_status dt__cu_bias_add(dt_ctx *, dt_tensor *, const dt_tensor *, int bwd);
static dt_status dt__cu_unary(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *, int bwd, int relu);
static dt_status dt__cu_layernorm_fwd(dt_ctx *, dt_tensor *, dt_tensor *, dt_tensor *, const dt_tensor *,
                                      const dt_tensor *, const dt_tensor *, float);
static dt_status dt__cu_layernorm_bwd(dt_ctx *, dt_tensor *, dt_tensor *, dt_tensor *, const dt_tensor *,
                                      const dt_tensor *, const dt_tensor *, const dt_tensor *, const dt_tensor *);
static dt_status dt__cu_embedding(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *, int bwd);
static dt_status dt__cu_attention_fwd(dt_ctx *, dt_tensor *, dt_tensor *, const dt_tensor *, int);
static dt_status dt__cu_attention_gqa_tc(dt_ctx *, const dt_tensor *, const dt_tensor *, int, int, int, dt_tensor *,
                                         const char *, const char *);
static dt_status dt__cu_attention_gqa_f32(dt_ctx *, dt_tensor *, dt_tensor *, const dt_tensor *, int, int, int,
                                          dt_tensor *, const char *);
struct dt__ablk;
static dt_status dt__cu_ablk(dt_ctx *, const struct dt__ablk *, const dt_attn_block *, dt_tensor *, dt_tensor *,
                             const dt_tensor *, const dt_tensor *, dt_tensor *, dt_tensor *, const dt_tensor *,
                             const char *);
static dt_status dt__cu_attention_bwd(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *,
                                      const dt_tensor *, int);
static dt_status dt__cu_softmax_xent_fwd(dt_ctx *, float *, int64_t *, dt_tensor *, const dt_tensor *,
                                         const dt_tensor *, int);
static dt_status dt__cu_softmax_xent_bwd(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *, int, float);
static dt_status dt__cu_axpy(dt_ctx *, dt_tensor *, float, const dt_tensor *);
static dt_status dt__cu_binary(dt_ctx *, dt_tensor *, dt_tensor *, const dt_tensor *, const dt_tensor *,
                               const dt_tensor *, int op);
static dt_status dt__cu_dot(dt_ctx *, dt_tensor *, dt_tensor *, const dt_tensor *, const dt_tensor *,
                            const dt_tensor *, int bwd);
static dt_status dt__cu_concat(dt_ctx *, dt_tensor *, dt_tensor *const *, int, int, int, const char *);
static dt_status dt__cu_bce(dt_ctx *, float *, dt_tensor *, const dt_tensor *, const dt_tensor *, float, int bwd);
static dt_status dt__cu_sum(dt_ctx *, double *, const dt_tensor *, int sq, const char *);
static dt_status dt__cu_scale(dt_ctx *, dt_tensor *, float);
#endif

/* ---------------------------------------------------------------- matmul */

typedef struct dt__mm {
    int64_t batch, M, N, K, sa, sb, sc; /* batch count and per-batch element strides */
    int64_t lda, ldb;
} dt__mm;

static dt_status dt__mm_shapes(dt_ctx *ctx, dt__mm *m, const dt_tensor *out, const dt_tensor *a,
                               const dt_tensor *b, int ta, int tb, const char *fn) {
    int ad, bd;
    int64_t Ka, Kb;
    if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: trans_a = %d, trans_b = %d; each must be 0 or 1", fn, ta, tb);
    DT__TRY(dt__f32(ctx, a, fn, "a"));
    DT__TRY(dt__f32(ctx, b, fn, "b"));
    DT__TRY(dt__f32(ctx, out, fn, "out"));
    DT__TRY(dt__ndim(ctx, a, 2, 3, fn, "a"));
    DT__TRY(dt__ndim(ctx, b, 2, 3, fn, "b"));
    ad = a->ndim - 2;
    bd = b->ndim - 2;
    m->batch = ad ? a->shape[0] : 1;
    if (bd && !ad)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: b is batched (3 dims) but a is not", fn);
    if (bd && b->shape[0] != m->batch)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: b.shape[0] = %lld (batch) does not match a.shape[0] "
                                "= %lld", fn, (long long)b->shape[0], (long long)m->batch);
    m->M = ta ? a->shape[ad + 1] : a->shape[ad];
    Ka = ta ? a->shape[ad] : a->shape[ad + 1];
    Kb = tb ? b->shape[bd + 1] : b->shape[bd];
    m->N = tb ? b->shape[bd] : b->shape[bd + 1];
    m->K = Ka;
    if (Ka != Kb)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: inner dims differ: op(a) is [%lld, %lld] (trans_a=%d), "
                                "op(b) is [%lld, %lld] (trans_b=%d)", fn, (long long)m->M, (long long)Ka, ta,
                                (long long)Kb, (long long)m->N, tb);
    if (out->ndim != a->ndim || (ad && out->shape[0] != m->batch) || out->shape[ad] != m->M ||
        out->shape[ad + 1] != m->N) {
        char so[96];
        if (ad)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: out shape %s; expected [%lld, %lld, %lld]", fn,
                                    dt_shape_str(out, so, sizeof so), (long long)m->batch, (long long)m->M,
                                    (long long)m->N);
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: out shape %s; expected [%lld, %lld]", fn,
                                dt_shape_str(out, so, sizeof so), (long long)m->M, (long long)m->N);
    }
    m->lda = a->shape[ad + 1];
    m->ldb = b->shape[bd + 1];
    m->sa = a->shape[ad] * a->shape[ad + 1];
    m->sb = bd ? b->shape[bd] * b->shape[bd + 1] : 0;
    m->sc = m->M * m->N;
    return DT_OK;
}

DT_API dt_status dt_matmul_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b,
                               int trans_a, int trans_b, float alpha, float beta) {
    dt__mm m;
    int64_t i;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(a) || dt__cu(b)) {
        DT__TRY(dt__apart(ctx, out, a, "dt_matmul_fwd", "out", "a"));
        DT__TRY(dt__apart(ctx, out, b, "dt_matmul_fwd", "out", "b"));
        return dt__cu_matmul_fwd(ctx, out, a, b, trans_a, trans_b, alpha, beta);
    }
#endif
    DT__TRY(dt__mm_shapes(ctx, &m, out, a, b, trans_a, trans_b, "dt_matmul_fwd"));
    DT__TRY(dt__apart(ctx, out, a, "dt_matmul_fwd", "out", "a"));
    DT__TRY(dt__apart(ctx, out, b, "dt_matmul_fwd", "out", "b"));
    for (i = 0; i < m.batch; i++)
        DT__TRY(dt__gemm(ctx, trans_a, trans_b, m.M, m.N, m.K, alpha, DT__CF(a) + i * m.sa, m.lda,
                         DT__CF(b) + i * m.sb, m.ldb, beta, DT__F(out) + i * m.sc, m.N));
    return DT_OK;
}

/* The backward's gradients apart from what it reads and from each other (the linear's too:
   dx, dw of dout, x, w). */
static dt_status dt__mm_apart(dt_ctx *ctx, const dt_tensor *da, const dt_tensor *db, const dt_tensor *dout,
                              const dt_tensor *a, const dt_tensor *b, const char *fn) {
    const int lin = strcmp(fn, "dt_linear_bwd") == 0;
    DT__TRY(dt__apart(ctx, da, dout, fn, lin ? "dx" : "da", "dout"));
    DT__TRY(dt__apart(ctx, da, b, fn, lin ? "dx" : "da", lin ? "w" : "b"));
    DT__TRY(dt__apart(ctx, db, dout, fn, lin ? "dw" : "db", "dout"));
    DT__TRY(dt__apart(ctx, db, a, fn, lin ? "dw" : "db", lin ? "x" : "a"));
    /* da over a (db over b): the second GEMM would read what the first wrote */
    DT__TRY(dt__apart(ctx, da, a, fn, lin ? "dx" : "da", lin ? "x" : "a"));
    DT__TRY(dt__apart(ctx, db, b, fn, lin ? "dw" : "db", lin ? "w" : "b"));
    return dt__apart(ctx, da, db, fn, lin ? "dx" : "da", lin ? "dw" : "db");
}

/* With Ao = op(A) [M,K], Bo = op(B) [K,N]: dAo = alpha dout Bo^T, dBo = alpha Ao^T dout; a
   transposed operand receives the transpose, which is again one GEMM with flipped flags. */
DT_API dt_status dt_matmul_bwd(dt_ctx *ctx, dt_tensor *da, dt_tensor *db, const dt_tensor *dout,
                               const dt_tensor *a, const dt_tensor *b, int trans_a, int trans_b, float alpha) {
    const char *fn = "dt_matmul_bwd";
    dt__mm m;
    int64_t i;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(dout) || dt__cu(a) || dt__cu(b) || dt__cu(da) || dt__cu(db)) {
        DT__TRY(dt__mm_apart(ctx, da, db, dout, a, b, fn));
        return dt__cu_matmul_bwd(ctx, da, db, dout, a, b, trans_a, trans_b, alpha);
    }
#endif
    DT__TRY(dt__mm_shapes(ctx, &m, (dt_tensor *)dout, a, b, trans_a, trans_b, fn));
    if (da) { DT__TRY(dt__f32(ctx, da, fn, "da")); DT__TRY(dt__same(ctx, da, a, fn, "da", "a")); }
    if (db) { DT__TRY(dt__f32(ctx, db, fn, "db")); DT__TRY(dt__same(ctx, db, b, fn, "db", "b")); }
    DT__TRY(dt__mm_apart(ctx, da, db, dout, a, b, fn));
    for (i = 0; i < m.batch; i++) {
        const float *A = DT__CF(a) + i * m.sa, *B = DT__CF(b) + i * m.sb, *D = DT__CF(dout) + i * m.sc;
        if (da) {
            float *dA = DT__F(da) + i * m.sa;
            if (!trans_a) DT__TRY(dt__gemm(ctx, 0, !trans_b, m.M, m.K, m.N, alpha, D, m.N, B, m.ldb, 1.0f, dA, m.lda));
            else DT__TRY(dt__gemm(ctx, trans_b, 1, m.K, m.M, m.N, alpha, B, m.ldb, D, m.N, 1.0f, dA, m.lda));
        }
        if (db) {
            float *dB = DT__F(db) + i * m.sb;
            if (!trans_b) DT__TRY(dt__gemm(ctx, !trans_a, 0, m.K, m.N, m.M, alpha, A, m.lda, D, m.N, 1.0f, dB, m.ldb));
            else DT__TRY(dt__gemm(ctx, 1, trans_a, m.N, m.K, m.M, alpha, D, m.N, A, m.lda, 1.0f, dB, m.ldb));
        }
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- linear, bias */

static dt_status dt__linear_check(dt_ctx *ctx, const dt_tensor *y, const dt_tensor *x, const dt_tensor *w,
                                  const dt_tensor *bias, const char *fn, const char *yname) {
    DT__TRY(dt__f32(ctx, x, fn, "x"));
    DT__TRY(dt__f32(ctx, w, fn, "w"));
    DT__TRY(dt__f32(ctx, y, fn, yname));
    DT__TRY(dt__ndim(ctx, w, 2, 2, fn, "w"));
    DT__TRY(dt__ndim(ctx, x, 1, DT_MAX_DIMS, fn, "x"));
    DT__TRY(dt__dim(ctx, dt__last(x), w->shape[1], fn, "x.shape[-1]", "w.shape[1] (in features)"));
    if (dt__last(y) != w->shape[0] || dt__rows(y) != dt__rows(x)) {
        char s[96];
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected %lld rows (as x) of %lld (w.shape[0], out "
                                "features)", fn, yname, dt_shape_str(y, s, sizeof s), (long long)dt__rows(x),
                                (long long)w->shape[0]);
    }
    if (bias) {
        DT__TRY(dt__f32(ctx, bias, fn, "bias"));
        DT__TRY(dt__dim(ctx, bias->numel, w->shape[0], fn, "bias numel", "w.shape[0]"));
    }
    return DT_OK;
}

/* The linear's bf16 activations: x (and, in the forward, out and pre) may be bf16 with a bf16 w
   only; their shapes are then checked as f32 (xs, ys: the views to check). y is the output named
   yname, pre (may be NULL) the other output of dt_linear_gelu_fwd. */
static dt_status dt__linear_dtypes(dt_ctx *ctx, const dt_tensor *w, const dt_tensor *x, const dt_tensor *y,
                                   const dt_tensor *pre, const char *fn, const char *yname, dt_tensor *xt,
                                   dt_tensor *yt, const dt_tensor **xs, const dt_tensor **ys) {
    int bf = w && w->dtype == DT_BF16;
    if (!bf && ((x && x->dtype == DT_BF16) || (y && y->dtype == DT_BF16) || (pre && pre->dtype == DT_BF16)))
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s is bf16 but w is %s; bf16 activations go with a bf16 w", fn,
                                x && x->dtype == DT_BF16 ? "x" : y && y->dtype == DT_BF16 ? yname
                                                                 : strcmp(yname, "pre") ? "pre" : "out",
                                w ? dt_dtype_name(w->dtype) : "NULL");
    if (pre && y && pre->dtype != y->dtype && (pre->dtype == DT_BF16 || y->dtype == DT_BF16))
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: %s is %s, %s is %s; expected out and pre of one dtype (f32 or "
                                "bf16)", fn, yname, dt_dtype_name(y->dtype), strcmp(yname, "pre") ? "pre" : "out",
                                dt_dtype_name(pre->dtype));
    *xs = dt__bf16_as_f32(x, bf, xt);
    *ys = dt__bf16_as_f32(y, bf, yt);
    return DT_OK;
}

/* dt_linear_bwd's dx: bf16 only beside a bf16 w. */
static dt_status dt__linear_grad_dtype(dt_ctx *ctx, const dt_tensor *dx, int bf, const char *fn) {
    if (dx && dx->dtype == DT_BF16 && !bf)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: dx is bf16 but w is f32; bf16 gradients go with a bf16 w", fn);
    return DT_OK;
}

/* A bf16 w and a bf16 out (and pre): row blocks of the GEMM in f32 (the bias, rounded to bf16
   as cuBLASLt reads it beside a bf16 output, added in f32), each value rounded once into out;
   with pre, pre = that rounded and out = gelu of the f32 value, rounded (cuBLASLt's GELU_AUX
   epilogue with a bf16 D). */
static void dt__gelu_fwd_f(float *o, const float *x, int64_t n);
static dt_status dt__linear_bf16_out(dt_ctx *ctx, dt_tensor *out, dt_tensor *pre, const dt_tensor *x,
                                     const dt_tensor *w, const dt_tensor *bias) {
    int64_t N = dt__rows(x), In = w->shape[1], Out = w->shape[0], rb, r, nb;
    size_t xe = x->dtype == DT_BF16 ? 2 : 4, keep;
    float *t, *rbias = NULL;
    dt_status st = DT_OK;
    if (N == 0 || Out == 0) return DT_OK;
    rb = (int64_t)1 << 18; /* about 1 MB of f32 a block */
    rb = rb / Out > 0 ? rb / Out : 1;
    if (rb > N) rb = N;
    /* the block and the rounded bias in the ctx's scratch past the GEMM's packs, with room after
       them for the bf16 GEMM's rounded operands (dt__gemm_bf16_keep): nothing allocated per call
       once the scratch has grown. Each term is a product of a tensor's dims (fits). */
    keep = (size_t)rb * (size_t)Out + (size_t)Out;
    if (!(t = dt__scratch(ctx, DT__GEMM_SCRATCH + keep + (size_t)rb * (size_t)In + (size_t)Out * (size_t)In)))
        return ctx->last_status;
    t += DT__GEMM_SCRATCH;
    if (bias) {
        rbias = t + rb * Out;
        dt__round_bf16(rbias, bias->data, 0, Out);
    }
    for (r = 0; r < N && !st; r += nb) {
        nb = N - r < rb ? N - r : rb;
        st = dt__gemm_bf16_keep(ctx, 0, 1, nb, Out, In, In ? (const char *)x->data + (size_t)(r * In) * xe : x->data,
                                x->dtype == DT_BF16, In, w->data, 1, In, 0, t, Out, keep, rbias);
        if (st) break;
        if (pre) { /* pre rounded, then the GELU of the f32 values in place (the rows allow it) */
            dt_convert(ctx, (uint16_t *)pre->data + r * Out, DT_BF16, t, DT_F32, nb * Out);
            dt__gelu_fwd_f(t, t, nb * Out);
        }
        dt_convert(ctx, (uint16_t *)out->data + r * Out, DT_BF16, t, DT_F32, nb * Out);
    }
    return st;
}

static dt_status dt__linear_apart(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *x, const dt_tensor *w,
                                  const dt_tensor *bias) {
    DT__TRY(dt__apart(ctx, out, x, "dt_linear_fwd", "out", "x"));
    DT__TRY(dt__apart(ctx, out, w, "dt_linear_fwd", "out", "w"));
    return dt__apart(ctx, out, bias, "dt_linear_fwd", "out", "bias");
}

DT_API dt_status dt_linear_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x, const dt_tensor *w,
                               const dt_tensor *bias) {
    int64_t N, In, Out;
    dt_tensor wf, xt, yt;
    const dt_tensor *xs, *ys;
    int bf;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(x) || dt__cu(w) || dt__cu(bias)) {
        DT__TRY(dt__linear_apart(ctx, out, x, w, bias));
        return dt__cu_linear_fwd(ctx, out, x, w, bias);
    }
#endif
    bf = dt__bf16_w(w, &wf);
    DT__TRY(dt__linear_dtypes(ctx, w, x, out, NULL, "dt_linear_fwd", "out", &xt, &yt, &xs, &ys));
    DT__TRY(dt__linear_check(ctx, ys, xs, bf ? &wf : w, bias, "dt_linear_fwd", "out"));
    DT__TRY(dt__linear_apart(ctx, out, x, w, bias));
    N = dt__rows(x); In = w->shape[1]; Out = w->shape[0];
    if (bf && out->dtype == DT_BF16) return dt__linear_bf16_out(ctx, out, NULL, x, w, bias);
    if (bf) /* the bias goes in with the GEMM (on AMX its tiles start there) */
        return dt__gemm_bf16_keep(ctx, 0, 1, N, Out, In, x->data, x->dtype == DT_BF16, In, w->data, 1, In, 0,
                                  DT__F(out), Out, 0, bias ? DT__CF(bias) : NULL);
    DT__TRY(dt__gemm(ctx, 0, 1, N, Out, In, 1.0f, DT__CF(x), In, DT__CF(w), In, 0.0f, DT__F(out), Out));
    return bias ? dt_bias_add_fwd(ctx, out, bias) : DT_OK;
}

DT_API dt_status dt_linear_gelu_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *pre, const dt_tensor *x,
                                    const dt_tensor *w, const dt_tensor *bias) {
    const char *fn = "dt_linear_gelu_fwd";
    const dt_tensor *in[3] = {x, w, bias};
    static const char *const in_name[3] = {"x", "w", "bias"};
    int i;
    if (!ctx) return DT_ERR_ARG;
    if (!out || !pre) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, out ? "pre" : "out");
    DT__TRY(dt__apart(ctx, out, pre, fn, "out", "pre"));
    for (i = 0; i < 3; i++) {
        DT__TRY(dt__apart(ctx, out, in[i], fn, "out", in_name[i]));
        DT__TRY(dt__apart(ctx, pre, in[i], fn, "pre", in_name[i]));
    }
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(pre) || dt__cu(x) || dt__cu(w) || dt__cu(bias))
        return dt__cu_linear_fwd_ep(ctx, out, pre, x, w, bias, fn);
#endif
    { /* checked here so that a message names this op and pre */
        dt_tensor wf, xt, pt, ot;
        const dt_tensor *xs, *ps;
        int bf = dt__bf16_w(w, &wf);
        DT__TRY(dt__linear_dtypes(ctx, w, x, pre, out, fn, "pre", &xt, &pt, &xs, &ps));
        DT__TRY(dt__linear_check(ctx, ps, xs, bf ? &wf : w, bias, fn, "pre"));
        DT__TRY(dt__f32(ctx, dt__bf16_as_f32(out, bf, &ot), fn, "out"));
        DT__TRY(dt__same_numel(ctx, out, pre, fn, "out", "pre"));
        if (bf && out->dtype == DT_BF16) return dt__linear_bf16_out(ctx, out, pre, x, w, bias);
    }
    DT__TRY(dt_linear_fwd(ctx, pre, x, w, bias));
    return dt_gelu_fwd(ctx, out, pre);
}

/* A bf16 w's gradient into a bf16 dx: dx = round(dx + dout w), row blocks of about 4 MB widened
   to f32 in the ctx's scratch past the GEMM's packs (as dt__linear_bf16_out), the GEMM adding into
   them, each value rounded once (a GEMM with beta 1 and a bf16 C, as cuBLAS does it). */
static dt_status dt__linear_dx_bf16(dt_ctx *ctx, dt_tensor *dx, const dt_tensor *dout, const dt_tensor *w) {
    int64_t N = dt__rows(dout), In = w->shape[1], Out = w->shape[0], rb, r, nb;
    size_t ge = dout->dtype == DT_BF16 ? 2 : 4;
    float *t;
    dt_status st = DT_OK;
    if (N == 0 || In == 0) return DT_OK;
    rb = (int64_t)1 << 20; /* about 4 MB of f32 a block: w is widened once a block on the fallback */
    rb = rb / In > 0 ? rb / In : 1;
    if (rb > N) rb = N;
    /* each term a product of a tensor's dims (fits) */
    if (!(t = dt__scratch(ctx, DT__GEMM_SCRATCH + (size_t)rb * (size_t)In + (size_t)rb * (size_t)Out +
                                   (size_t)Out * (size_t)In)))
        return ctx->last_status;
    t += DT__GEMM_SCRATCH;
    for (r = 0; r < N && !st; r += nb) {
        uint16_t *d = (uint16_t *)dx->data + r * In;
        const void *g = Out ? (const char *)dout->data + (size_t)(r * Out) * ge : dout->data;
        nb = N - r < rb ? N - r : rb;
        dt__round_bf16(t, d, 1, nb * In);
        st = dt__gemm_bf16_keep(ctx, 0, 0, nb, In, Out, g, dout->dtype == DT_BF16, Out, w->data, 1, In, 1, t, In,
                                (size_t)rb * (size_t)In, NULL);
        if (!st) st = dt_convert(ctx, d, DT_BF16, t, DT_F32, nb * In);
    }
    return st;
}

/* dbias (added into) apart from the inputs and from the other two gradients. */
static dt_status dt__linear_dbias_apart(dt_ctx *ctx, const dt_tensor *dbias, const dt_tensor *dx, const dt_tensor *dw,
                                        const dt_tensor *dout, const dt_tensor *x, const dt_tensor *w, const char *fn) {
    DT__TRY(dt__apart(ctx, dbias, dout, fn, "dbias", "dout"));
    DT__TRY(dt__apart(ctx, dbias, x, fn, "dbias", "x"));
    DT__TRY(dt__apart(ctx, dbias, w, fn, "dbias", "w"));
    DT__TRY(dt__apart(ctx, dbias, dx, fn, "dbias", "dx"));
    return dt__apart(ctx, dbias, dw, fn, "dbias", "dw");
}

DT_API dt_status dt_linear_bwd(dt_ctx *ctx, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias,
                               const dt_tensor *dout, const dt_tensor *x, const dt_tensor *w) {
    const char *fn = "dt_linear_bwd";
    int64_t N, In, Out;
    dt_tensor wf, xt, yt, dxt;
    const dt_tensor *xs, *ys;
    int bf, gbf;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(dout) || dt__cu(x) || dt__cu(w) || dt__cu(dx) || dt__cu(dw) || dt__cu(dbias)) {
        DT__TRY(dt__mm_apart(ctx, dx, dw, dout, x, w, fn));
        DT__TRY(dt__linear_dbias_apart(ctx, dbias, dx, dw, dout, x, w, fn));
        return dt__cu_linear_bwd(ctx, dx, dw, dbias, dout, x, w);
    }
#endif
    bf = dt__bf16_w(w, &wf);
    DT__TRY(dt__linear_dtypes(ctx, w, x, dout, NULL, fn, "dout", &xt, &yt, &xs, &ys));
    DT__TRY(dt__linear_grad_dtype(ctx, dx, bf, fn));
    DT__TRY(dt__linear_check(ctx, ys, xs, bf ? &wf : w, NULL, fn, "dout"));
    DT__TRY(dt__mm_apart(ctx, dx, dw, dout, x, w, fn));
    DT__TRY(dt__linear_dbias_apart(ctx, dbias, dx, dw, dout, x, w, fn));
    N = dt__rows(x); In = w->shape[1]; Out = w->shape[0];
    gbf = dout->dtype == DT_BF16;
    if (dx) {
        DT__TRY(dt__f32(ctx, dt__bf16_as_f32(dx, bf, &dxt), fn, "dx"));
        DT__TRY(dt__same_numel(ctx, dx, xs, fn, "dx", "x"));
        if (bf && dx->dtype == DT_BF16) DT__TRY(dt__linear_dx_bf16(ctx, dx, dout, w));
        else if (bf)
            DT__TRY(dt__gemm_bf16(ctx, 0, 0, N, In, Out, dout->data, gbf, Out, w->data, 1, In, 1, DT__F(dx), In));
        else DT__TRY(dt__gemm(ctx, 0, 0, N, In, Out, 1.0f, DT__CF(dout), Out, DT__CF(w), In, 1.0f, DT__F(dx), In));
    }
    if (dw) {
        DT__TRY(dt__f32(ctx, dw, fn, "dw"));
        DT__TRY(dt__same(ctx, dw, w, fn, "dw", "w"));
        if (bf)
            DT__TRY(dt__gemm_bf16(ctx, 1, 0, Out, In, N, dout->data, gbf, Out, x->data, x->dtype == DT_BF16, In, 1,
                                  DT__F(dw), In));
        else DT__TRY(dt__gemm(ctx, 1, 0, Out, In, N, 1.0f, DT__CF(dout), Out, DT__CF(x), In, 1.0f, DT__F(dw), In));
    }
    return dbias ? dt_bias_add_bwd(ctx, dbias, dout) : DT_OK;
}

DT_API dt_status dt_bias_add_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *bias) {
    const char *fn = "dt_bias_add_fwd";
    int64_t r, c, C, R;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__apart(ctx, out, bias, fn, "out", "bias"));
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(bias)) return dt__cu_bias_add(ctx, out, bias, 0);
#endif
    DT__TRY(dt__f32(ctx, out, fn, "out"));
    DT__TRY(dt__f32(ctx, bias, fn, "bias"));
    C = dt__last(out); R = dt__rows(out);
    DT__TRY(dt__dim(ctx, bias->numel, C, fn, "bias numel", "out.shape[-1]"));
    for (r = 0; r < R; r++) {
        float *o = DT__F(out) + r * C;
        const float *bp = DT__CF(bias);
        for (c = 0; c + 8 <= C; c += 8) { /* fixed-size copies: no alias check, vector code at -O2 */
            float x[8], y[8];
            int j;
            memcpy(x, o + c, sizeof x);
            memcpy(y, bp + c, sizeof y);
            for (j = 0; j < 8; j++) x[j] += y[j];
            memcpy(o + c, x, sizeof x);
        }
        for (; c < C; c++) o[c] += bp[c];
    }
    return DT_OK;
}

/* Column sums in double, row by row: the same order whatever the shape of dout (and the same
   bits as summing each column down the rows). The rows are read whole, a chunk of DT__BIAS_W
   columns at a time into as many double accumulators, DT__BIAS_R rows per pass so that each
   group of 8 sums is loaded and stored once per pass: walking a column down all the rows would
   touch one cache line per element. */
#define DT__BIAS_W 512
#define DT__BIAS_R 8
DT_API dt_status dt_bias_add_bwd(dt_ctx *ctx, dt_tensor *dbias, const dt_tensor *dout) {
    const char *fn = "dt_bias_add_bwd";
    int64_t r, c, c0, C, R;
    double acc[DT__BIAS_W];
    dt_tensor gt;
    int bf;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__apart(ctx, dbias, dout, fn, "dbias", "dout"));
#ifdef DT_CUDA
    if (dt__cu(dbias) || dt__cu(dout)) return dt__cu_bias_add(ctx, dbias, dout, 1);
#endif
    DT__TRY(dt__f32(ctx, dt__bf16_as_f32(dout, 1, &gt), fn, "dout"));
    if (!dbias) return DT_OK;
    DT__TRY(dt__f32(ctx, dbias, fn, "dbias"));
    C = dt__last(dout); R = dt__rows(dout);
    DT__TRY(dt__dim(ctx, dbias->numel, C, fn, "dbias numel", "dout.shape[-1]"));
    bf = dout->dtype == DT_BF16;
/* the column sums of dout's columns [c0, c0 + w), LD(i) its element i (f32, or bf16 widened:
   exact); twice below, so that each loop's load is fixed (and the f32 one vectorises) */
#define DT__BIAS_SUMS(LD)                                                                               \
    for (r = 0; r < R; r += DT__BIAS_R, i0 += DT__BIAS_R * C) { /* DT__BIAS_R rows at a time */        \
        int64_t rn = R - r < DT__BIAS_R ? R - r : DT__BIAS_R, k;                                       \
        for (c = 0; c + 8 <= w; c += 8) { /* 8 sums stay in registers down the rn rows */             \
            double a[8];                                                                               \
            int j;                                                                                     \
            memcpy(a, acc + c, sizeof a);                                                              \
            for (k = 0; k < rn; k++)                                                                   \
                for (j = 0; j < 8; j++) a[j] += LD(i0 + k * C + c + j);                                \
            memcpy(acc + c, a, sizeof a);                                                              \
        }                                                                                              \
        for (; c < w; c++)                                                                             \
            for (k = 0; k < rn; k++) acc[c] += LD(i0 + k * C + c);                                     \
    }
#define DT__BIAS_F(i) (double)((const float *)dout->data)[i]
#define DT__BIAS_H(i) (double)dt_bf16_to_f32(((const uint16_t *)dout->data)[i])
    for (c0 = 0; c0 < C; c0 += DT__BIAS_W) {
        int64_t w = C - c0 < DT__BIAS_W ? C - c0 : DT__BIAS_W, i0 = c0;
        for (c = 0; c < w; c++) acc[c] = 0.0;
        if (bf) { DT__BIAS_SUMS(DT__BIAS_H) }
        else { DT__BIAS_SUMS(DT__BIAS_F) }
        for (c = 0; c < w; c++) DT__F(dbias)[c0 + c] += (float)acc[c];
    }
#undef DT__BIAS_SUMS
#undef DT__BIAS_F
#undef DT__BIAS_H
    return DT_OK;
}

/* Elementwise loops run in blocks of 8 through local copies: gcc -O2 vectorises a fixed-size
   body that cannot alias (its cheap cost model never adds a remainder loop or an overlap check
   to a plain loop), and the copies make `out` equal to an input correct. BODY sees a[], b[]
   (the inputs; b may be NULL) and o[] (the output block, loaded first so += works). */
#define DT__BLOCKS(n, A, B, O, BODY) do {                                                        \
        const float *pa_ = (A), *pb_ = (B);                                                     \
        float *po_ = (O);                                                                      \
        int64_t i_ = 0, n_ = (n);                                                              \
        int j, m_;                                                                             \
        for (; i_ + 8 <= n_; i_ += 8) { /* fixed-size copies become vector loads and stores */ \
            float a[8], b[8], o[8];                                                            \
            memcpy(a, pa_ + i_, sizeof a);                                                     \
            if (pb_) memcpy(b, pb_ + i_, sizeof b); else memset(b, 0, sizeof b);               \
            memcpy(o, po_ + i_, sizeof o);                                                     \
            for (j = 0; j < 8; j++) BODY;                                                      \
            memcpy(po_ + i_, o, sizeof o);                                                     \
        }                                                                                      \
        if ((m_ = (int)(n_ - i_)) > 0) { /* the tail, padded with zeros */                    \
            float a[8] = {0}, b[8] = {0}, o[8] = {0};                                          \
            memcpy(a, pa_ + i_, (size_t)m_ * sizeof(float));                                   \
            if (pb_) memcpy(b, pb_ + i_, (size_t)m_ * sizeof(float));                          \
            memcpy(o, po_ + i_, (size_t)m_ * sizeof(float));                                   \
            for (j = 0; j < 8; j++) BODY;                                                      \
            memcpy(po_ + i_, o, (size_t)m_ * sizeof(float));                                   \
        }                                                                                      \
    } while (0)

/* ---------------------------------------------------------------- 4-lane vectors

   gelu, layernorm, softmax_xent and attention's softmax are written once, on dt__v4 (4 floats):
   SSE2 intrinsics on x86-64, a struct of 4 floats and plain loops elsewhere and under
   DT_TENSOR_NO_SIMD. Every lane does the IEEE operation the scalar code does (no reciprocal or
   rsqrt estimates, no FMA), so both give the same bits (tests/test_tensor_ops_simd.c checks it)
   and a result does not depend on the machine's vector unit. Row sums run over 8 lanes (two
   dt__v4: element c goes to lane c % 8), then a fixed tree: the same order run after run,
   whatever the thread count.

   Why not libmvec (glibc's _ZGVbN4v_expf / _ZGVdN8v_expf, linked by -lm on glibc >= 2.22, tanhf
   from 2.35)? It exists only with glibc on x86-64, its ifunc picks a different
   implementation per CPU (so two ranks on different machines could differ in the last bit), and
   it has no scalar twin to test against. The polynomial here is portable C99 + SSE2, gives the
   same bits on every x86-64 and on the scalar path, and its error is bounded (dt__v_exp). */
#ifdef DT__TENSOR_SSE2
typedef __m128 dt__v4;
static inline dt__v4 dt__v_set(float a) { return _mm_set1_ps(a); }
static inline dt__v4 dt__v_load(const float *p) { return _mm_loadu_ps(p); }
static inline void dt__v_store(float *p, dt__v4 a) { _mm_storeu_ps(p, a); }
static inline dt__v4 dt__v_add(dt__v4 a, dt__v4 b) { return _mm_add_ps(a, b); }
static inline dt__v4 dt__v_sub(dt__v4 a, dt__v4 b) { return _mm_sub_ps(a, b); }
static inline dt__v4 dt__v_mul(dt__v4 a, dt__v4 b) { return _mm_mul_ps(a, b); }
static inline dt__v4 dt__v_div(dt__v4 a, dt__v4 b) { return _mm_div_ps(a, b); }
/* a < b ? a : b and a > b ? a : b, lane by lane (MINPS, MAXPS: b when either is NaN) */
static inline dt__v4 dt__v_min(dt__v4 a, dt__v4 b) { return _mm_min_ps(a, b); }
static inline dt__v4 dt__v_max(dt__v4 a, dt__v4 b) { return _mm_max_ps(a, b); }
/* k = 1.5 * 2^23 + n (|n| < 2^22, so n sits in the low mantissa bits): *n = n (k - 1.5 * 2^23
   is exact), returns 2^n from the exponent bits, +0 for n = -127 (n in [-127, 127]; lanes that
   are NaN give NaN later whatever these bits are) */
static inline dt__v4 dt__v_pow2(dt__v4 k, dt__v4 *n) {
    *n = _mm_sub_ps(k, _mm_set1_ps(12582912.0f));
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_castps_si128(k), _mm_set1_epi32(127 - 0x4B400000)), 23));
}
/* (a0 + a2) + (a1 + a3); the max in the same tree */
static inline float dt__v_hsum(dt__v4 a) {
    __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
static inline float dt__v_hmax(dt__v4 a) {
    __m128 t = _mm_max_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#else
typedef struct dt__v4 { float f[4]; } dt__v4;
/* the body of a lane-by-lane function: r.f[j] = expr for j = 0..3 */
#define DT__V_LANES(expr) dt__v4 r_; int j; for (j = 0; j < 4; j++) r_.f[j] = (expr); return r_
static inline dt__v4 dt__v_set(float a) { DT__V_LANES(a); }
static inline dt__v4 dt__v_load(const float *p) { DT__V_LANES(p[j]); }
static inline void dt__v_store(float *p, dt__v4 a) { memcpy(p, a.f, sizeof a.f); }
static inline dt__v4 dt__v_add(dt__v4 a, dt__v4 b) { DT__V_LANES(a.f[j] + b.f[j]); }
static inline dt__v4 dt__v_sub(dt__v4 a, dt__v4 b) { DT__V_LANES(a.f[j] - b.f[j]); }
static inline dt__v4 dt__v_mul(dt__v4 a, dt__v4 b) { DT__V_LANES(a.f[j] * b.f[j]); }
static inline dt__v4 dt__v_div(dt__v4 a, dt__v4 b) { DT__V_LANES(a.f[j] / b.f[j]); }
static inline dt__v4 dt__v_min(dt__v4 a, dt__v4 b) { DT__V_LANES(a.f[j] < b.f[j] ? a.f[j] : b.f[j]); }
static inline dt__v4 dt__v_max(dt__v4 a, dt__v4 b) { DT__V_LANES(a.f[j] > b.f[j] ? a.f[j] : b.f[j]); }
static inline dt__v4 dt__v_pow2(dt__v4 k, dt__v4 *n) {
    dt__v4 r;
    int j;
    for (j = 0; j < 4; j++) {
        uint32_t b, e;
        int32_t i;
        memcpy(&b, &k.f[j], sizeof b);
        i = (int32_t)(b & 0x7FFFFFFFu) - 0x4B400000; /* no sign bit: the cast is exact */
        n->f[j] = (float)i;
        e = (uint32_t)(i + 127) << 23;               /* unsigned: a NaN lane's bits wrap, defined */
        memcpy(&r.f[j], &e, sizeof e);
    }
    return r;
}
static inline float dt__v_hsum(dt__v4 a) { return (a.f[0] + a.f[2]) + (a.f[1] + a.f[3]); }
static inline float dt__v_hmax(dt__v4 a) {
    float t0 = a.f[0] > a.f[2] ? a.f[0] : a.f[2], t1 = a.f[1] > a.f[3] ? a.f[1] : a.f[3];
    return t0 > t1 ? t0 : t1;
}
#undef DT__V_LANES
#endif

/* Row access: elements c..c+3 of a row of n, lanes past the end read as `pad` (chosen by each
   caller so that they add nothing) and are not written. */
static inline dt__v4 dt__v_ld(const float *p, int64_t c, int64_t n, float pad) {
    float t[4];
    int j;
    if (c + 4 <= n) return dt__v_load(p + c);
    for (j = 0; j < 4; j++) t[j] = c + j < n ? p[c + j] : pad;
    return dt__v_load(t);
}
static inline void dt__v_st(float *p, int64_t c, int64_t n, dt__v4 a) {
    float t[4];
    int j;
    if (c + 4 <= n) { dt__v_store(p + c, a); return; }
    dt__v_store(t, a);
    for (j = 0; j < 4 && c + j < n; j++) p[c + j] = t[j];
}

/* for (c = 0; c < n; c += step) { BODY } with the last, partial step apart: in the full steps
   the compiler sees that dt__v_ld and dt__v_st take whole vectors and drops their tail code. */
#define DT__ROW_LOOP(c, n, step, ...) do {                                 \
        for ((c) = 0; (c) + (step) <= (n); (c) += (step)) __VA_ARGS__     \
        if ((c) < (n)) __VA_ARGS__                                         \
    } while (0)

/* ---------------------------------------------------------------- 8-lane vectors

   On x86-64 under GCC or Clang, gelu also has a copy on dt__v8 (8 floats, AVX2; its ops are
   dt__w_*, as dt__v4's are dt__v_*), taken when the CPU has AVX2: __builtin_cpu_supports at each
   call (a load and a bit test of the CPU model libgcc reads at start-up), so one binary runs on
   every x86-64. Only these functions are built for AVX2 (target("avx2"), not "fma": without FMA
   the compiler cannot contract a multiply and an add), and each lane does the IEEE operation the
   4-lane and scalar code do: the three give the same bits (tests/test_tensor_ops_simd.c). A
   function is written once and defined for both widths by a DT__DEF_ macro. DT_TENSOR_NO_AVX2
   keeps the 4-lane path (DT_TENSOR_NO_SIMD the scalar one). */
#ifdef DT__TENSOR_AVX2
#define DT__AVX2 __attribute__((target("avx2")))
typedef __m256 dt__v8;
static inline DT__AVX2 dt__v8 dt__w_set(float a) { return _mm256_set1_ps(a); }
static inline DT__AVX2 dt__v8 dt__w_load(const float *p) { return _mm256_loadu_ps(p); }
static inline DT__AVX2 void dt__w_store(float *p, dt__v8 a) { _mm256_storeu_ps(p, a); }
static inline DT__AVX2 dt__v8 dt__w_add(dt__v8 a, dt__v8 b) { return _mm256_add_ps(a, b); }
static inline DT__AVX2 dt__v8 dt__w_sub(dt__v8 a, dt__v8 b) { return _mm256_sub_ps(a, b); }
static inline DT__AVX2 dt__v8 dt__w_mul(dt__v8 a, dt__v8 b) { return _mm256_mul_ps(a, b); }
static inline DT__AVX2 dt__v8 dt__w_div(dt__v8 a, dt__v8 b) { return _mm256_div_ps(a, b); }
/* VMINPS / VMAXPS: b when either is NaN, as MINPS / MAXPS */
static inline DT__AVX2 dt__v8 dt__w_min(dt__v8 a, dt__v8 b) { return _mm256_min_ps(a, b); }
static inline DT__AVX2 dt__v8 dt__w_max(dt__v8 a, dt__v8 b) { return _mm256_max_ps(a, b); }
static inline DT__AVX2 dt__v8 dt__w_pow2(dt__v8 k, dt__v8 *n) { /* as dt__v_pow2 */
    *n = _mm256_sub_ps(k, _mm256_set1_ps(12582912.0f));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(k), _mm256_set1_epi32(127 - 0x4B400000)), 23));
}
static inline DT__AVX2 dt__v8 dt__w_ld(const float *p, int64_t c, int64_t n, float pad) { /* as dt__v_ld */
    float t[8];
    int j;
    if (c + 8 <= n) return dt__w_load(p + c);
    for (j = 0; j < 8; j++) t[j] = c + j < n ? p[c + j] : pad;
    return dt__w_load(t);
}
static inline DT__AVX2 void dt__w_st(float *p, int64_t c, int64_t n, dt__v8 a) {
    float t[8];
    int j;
    if (c + 8 <= n) { dt__w_store(p + c, a); return; }
    dt__w_store(t, a);
    for (j = 0; j < 8 && c + j < n; j++) p[c + j] = t[j];
}
static inline int dt__have_avx2(void) { return __builtin_cpu_supports("avx2") != 0; }
#endif

#define DT__EXP_HI 88.0f  /* exp saturates here, at 1.65e38: never inf */
#define DT__EXP_LO -88.0f /* n = -127 from here down: 2^n is +0, and so is exp */

/* exp, Cephes' expf on 4 lanes (dt__v_exp; dt__w_exp on 8): n = round(x / ln 2) (by adding 1.5 * 2^23), r = x - n ln 2 in two
   parts (Cody-Waite, exact for |n| <= 127), exp(r) by Cephes' degree-7 minimax polynomial on
   [-ln2/2, ln2/2], times 2^n from the exponent bits: within 1 ulp of exp() in double
   (tests/test_tensor_ops_simd.c checks it on [-87.3, 88] and [-1, 1]). Below x = -87.68 (exp < 8e-39, subnormal) the result
   is +0 (libm gives subnormals there), down to -87.68 subnormals; NaN stays NaN. */
#define DT__DEF_EXP(A, V, P)                                                                    \
    static inline A V P##exp(V x) {                                                             \
        V xc = P##max(P##set(DT__EXP_LO), P##min(P##set(DT__EXP_HI), x)); /* NaN passes */      \
        V n, s, r, z, y;                                                                        \
        s = P##pow2(P##add(P##mul(xc, P##set(1.44269504088896341f)), P##set(12582912.0f)), &n); \
        r = P##sub(xc, P##mul(n, P##set(0.693359375f)));                                        \
        r = P##sub(r, P##mul(n, P##set(-2.12194440e-4f)));                                      \
        z = P##mul(r, r);                                                                       \
        y = P##set(1.9875691500e-4f);                                                           \
        y = P##add(P##mul(y, r), P##set(1.3981999507e-3f));                                     \
        y = P##add(P##mul(y, r), P##set(8.3334519073e-3f));                                     \
        y = P##add(P##mul(y, r), P##set(4.1665795894e-2f));                                     \
        y = P##add(P##mul(y, r), P##set(1.6666665459e-1f));                                     \
        y = P##add(P##mul(y, r), P##set(5.0000001201e-1f));                                     \
        y = P##add(P##add(P##mul(y, z), r), P##set(1.0f));                                      \
        return P##mul(y, s);                                                                    \
    }
DT__DEF_EXP(, dt__v4, dt__v_)
#ifdef DT__TENSOR_AVX2
DT__DEF_EXP(DT__AVX2, dt__v8, dt__w_)
#endif

/* ---------------------------------------------------------------- activations */

static dt_status dt__unary_check(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *x, const char *fn,
                                 const char *on) {
    DT__TRY(dt__f32(ctx, out, fn, on));
    DT__TRY(dt__f32(ctx, x, fn, "x"));
    return dt__same_numel(ctx, out, x, fn, on, "x");
}

DT_API dt_status dt_relu_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x) {
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, out, x, "dt_relu_fwd", "out", "x"));
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(x)) return dt__cu_unary(ctx, out, NULL, x, 0, 1);
#endif
    DT__TRY(dt__unary_check(ctx, out, x, "dt_relu_fwd", "out"));
    /* NaN stays NaN (as in PyTorch), so a NaN activation reaches the loss and the loss scaler */
    DT__BLOCKS(x->numel, DT__CF(x), NULL, DT__F(out), o[j] = a[j] > 0.0f || a[j] != a[j] ? a[j] : 0.0f);
    return DT_OK;
}

/* gelu(v) = 0.5 v (1 + tanh(u)), u = sqrt(2/pi) (v + 0.044715 v^3). Computed as v / (1 + e) with
   e = exp(-2u), since 1 + tanh(u) = 2 / (1 + exp(-2u)): one exp and no tanh, and no cancellation
   where tanh(u) nears -1 (v < -3), which costs 1 + tanhf(u) every digit in float. */
#define DT__GELU_M2S -1.5957691216057308f   /* -2 sqrt(2/pi) */
#define DT__GELU_M2SC -0.0713548162726f     /* -2 sqrt(2/pi) 0.044715 */
#define DT__GELU_2S3C 0.2140644488178f      /* 2 sqrt(2/pi) 3 0.044715 */

/* gelu'(v) = 0.5 (1 + tanh u) + 0.5 v (1 - tanh^2 u) du/dv = s + v s (1 - s) 2 sqrt(2/pi)
   (1 + 3 0.044715 v^2), with s = sigmoid(2u) = 1 / (1 + e) and 1 - s = e s (no cancellation).
   The rows of gelu_fwd (out may be x: each block is read before it is written) and gelu_bwd
   (dp += gelu'(x) gp), on W lanes of type V with the ops P##*. */
#define DT__DEF_GELU(A, V, P, W)                                                                       \
    static inline A V P##gelu_e(V v) { /* exp(-2u) */                                                 \
        return P##exp(P##mul(v, P##add(P##set(DT__GELU_M2S), P##mul(P##set(DT__GELU_M2SC), P##mul(v, v))))); \
    }                                                                                                  \
    static A void P##gelu_fwd_rows(float *op, const float *xp, int64_t n) {                           \
        int64_t i;                                                                                     \
        DT__ROW_LOOP(i, n, W, {                                                                        \
            V v = P##ld(xp, i, n, 0.0f);                                                               \
            P##st(op, i, n, P##div(v, P##add(P##set(1.0f), P##gelu_e(v))));                           \
        });                                                                                            \
    }                                                                                                  \
    static A void P##gelu_bwd_rows(float *dp, const float *gp, const float *xp, int64_t n) {          \
        int64_t i;                                                                                     \
        DT__ROW_LOOP(i, n, W, {                                                                        \
            V v = P##ld(xp, i, n, 0.0f), e = P##gelu_e(v);                                             \
            V s = P##div(P##set(1.0f), P##add(P##set(1.0f), e));                                       \
            V q = P##add(P##set(-DT__GELU_M2S), P##mul(P##set(DT__GELU_2S3C), P##mul(v, v)));          \
            V g = P##add(s, P##mul(P##mul(v, s), P##mul(P##mul(e, s), q)));                           \
            P##st(dp, i, n, P##add(P##ld(dp, i, n, 0.0f), P##mul(g, P##ld(gp, i, n, 0.0f))));          \
        });                                                                                            \
    }
DT__DEF_GELU(, dt__v4, dt__v_, 4)
#ifdef DT__TENSOR_AVX2
DT__DEF_GELU(DT__AVX2, dt__v8, dt__w_, 8)
#endif

/* GELU over n floats: the AVX2 rows where the CPU has them, else the 4-lane ones (the same bits). */
static void dt__gelu_fwd_f(float *o, const float *x, int64_t n) {
#ifdef DT__TENSOR_AVX2
    if (dt__have_avx2()) {
        dt__w_gelu_fwd_rows(o, x, n);
        return;
    }
#endif
    dt__v_gelu_fwd_rows(o, x, n);
}
static void dt__gelu_bwd_f(float *dx, const float *dout, const float *x, int64_t n) {
#ifdef DT__TENSOR_AVX2
    if (dt__have_avx2()) {
        dt__w_gelu_bwd_rows(dx, dout, x, n);
        return;
    }
#endif
    dt__v_gelu_bwd_rows(dx, dout, x, n);
}
#define DT__ACT_BLOCK 1024 /* a bf16 x or out goes through f32 blocks of this many on the stack */

DT_API dt_status dt_gelu_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x) {
    dt_tensor t1, t2;
    float xb[DT__ACT_BLOCK], ob[DT__ACT_BLOCK];
    int64_t i, n;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, out, x, "dt_gelu_fwd", "out", "x"));
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(x)) return dt__cu_unary(ctx, out, NULL, x, 0, 0);
#endif
    DT__TRY(dt__unary_check(ctx, dt__bf16_as_f32(out, 1, &t1), dt__bf16_as_f32(x, 1, &t2), "dt_gelu_fwd", "out"));
    if (out->dtype == DT_F32 && x->dtype == DT_F32) {
        dt__gelu_fwd_f(DT__F(out), DT__CF(x), x->numel);
        return DT_OK;
    }
    /* out and x are apart or the very same elements (one dtype): each block is read before written */
    for (i = 0; i < x->numel; i += n) { /* bf16: each value from f32, rounded once */
        n = x->numel - i < DT__ACT_BLOCK ? x->numel - i : DT__ACT_BLOCK;
        if (x->dtype == DT_BF16) dt__round_bf16(xb, (const uint16_t *)x->data + i, 1, n);
        else memcpy(xb, DT__CF(x) + i, (size_t)n * sizeof(float));
        dt__gelu_fwd_f(out->dtype == DT_F32 ? DT__F(out) + i : ob, xb, n);
        if (out->dtype == DT_BF16) DT__TRY(dt_convert(ctx, (uint16_t *)out->data + i, DT_BF16, ob, DT_F32, n));
    }
    return DT_OK;
}

/* relu_bwd and gelu_bwd: the same checks and dispatch, then their own rows. */
static dt_status dt__act_bwd(dt_ctx *ctx, dt_tensor *dx, const dt_tensor *dout, const dt_tensor *x, int relu) {
    const char *fn = relu ? "dt_relu_bwd" : "dt_gelu_bwd";
    dt_tensor xf, gf, df;
    const dt_tensor *xc = dt__bf16_as_f32(x, !relu, &xf); /* gelu's x, dout and dx may be bf16 */
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, dx, dout, fn, "dx", "dout"));
    DT__TRY(dt__same_or_apart(ctx, dx, x, fn, "dx", "x"));
#ifdef DT_CUDA
    if (dt__cu(dx) || dt__cu(dout) || dt__cu(x)) return dt__cu_unary(ctx, dx, dout, x, 1, relu);
#endif
    DT__TRY(dt__unary_check(ctx, dt__bf16_as_f32(dout, !relu, &gf), xc, fn, "dout"));
    if (!dx) return DT_OK;
    DT__TRY(dt__unary_check(ctx, dt__bf16_as_f32(dx, !relu, &df), xc, fn, "dx"));
    if (!relu && (x->dtype == DT_BF16 || dout->dtype == DT_BF16 || dx->dtype == DT_BF16)) {
        /* through f32 blocks: each bf16 value widened, a bf16 dx rounded once */
        float xb[DT__ACT_BLOCK], gb[DT__ACT_BLOCK], db[DT__ACT_BLOCK];
        int64_t i, n;
        /* blocks of other element sizes would meet at other offsets: such dx must not overlap */
        if (dx->dtype != x->dtype) DT__TRY(dt__apart(ctx, dx, x, fn, "dx", "x"));
        if (dx->dtype != dout->dtype) DT__TRY(dt__apart(ctx, dx, dout, fn, "dx", "dout"));
        for (i = 0; i < x->numel; i += n) {
            const float *xp = xb, *gp = gb;
            float *dp = db;
            n = x->numel - i < DT__ACT_BLOCK ? x->numel - i : DT__ACT_BLOCK;
            if (x->dtype == DT_BF16) dt__round_bf16(xb, (const uint16_t *)x->data + i, 1, n);
            else xp = DT__CF(x) + i;
            if (dout->dtype == DT_BF16) dt__round_bf16(gb, (const uint16_t *)dout->data + i, 1, n);
            else gp = DT__CF(dout) + i;
            if (dx->dtype == DT_BF16) dt__round_bf16(db, (const uint16_t *)dx->data + i, 1, n);
            else dp = DT__F(dx) + i;
            dt__gelu_bwd_f(dp, gp, xp, n);
            if (dx->dtype == DT_BF16) DT__TRY(dt_convert(ctx, (uint16_t *)dx->data + i, DT_BF16, db, DT_F32, n));
        }
        return DT_OK;
    }
    if (!relu) {
        dt__gelu_bwd_f(DT__F(dx), DT__CF(dout), DT__CF(x), x->numel);
        return DT_OK;
    }
    /* the gradient passes where the forward passed x through: x > 0, and NaN (PyTorch's
       threshold_backward masks only x <= 0) */
    DT__BLOCKS(x->numel, DT__CF(x), DT__CF(dout), DT__F(dx), o[j] += a[j] > 0.0f || a[j] != a[j] ? b[j] : 0.0f);
    return DT_OK;
}

DT_API dt_status dt_relu_bwd(dt_ctx *ctx, dt_tensor *dx, const dt_tensor *dout, const dt_tensor *x) {
    return dt__act_bwd(ctx, dx, dout, x, 1);
}
DT_API dt_status dt_gelu_bwd(dt_ctx *ctx, dt_tensor *dx, const dt_tensor *dout, const dt_tensor *x) {
    return dt__act_bwd(ctx, dx, dout, x, 0);
}

/* ---------------------------------------------------------------- layernorm */

static dt_status dt__ln_check(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *x, const dt_tensor *w,
                              const dt_tensor *mean, const dt_tensor *rstd, const char *fn, const char *on) {
    int64_t C;
    DT__TRY(dt__f32(ctx, x, fn, "x"));
    DT__TRY(dt__f32(ctx, out, fn, on));
    DT__TRY(dt__f32(ctx, w, fn, "w"));
    DT__TRY(dt__same(ctx, out, x, fn, on, "x"));
    C = dt__last(x);
    DT__TRY(dt__dim(ctx, w->numel, C, fn, "w numel", "x.shape[-1]"));
    if (mean) { DT__TRY(dt__f32(ctx, mean, fn, "mean")); DT__TRY(dt__dim(ctx, mean->numel, dt__rows(x), fn, "mean numel", "x rows")); }
    if (rstd) { DT__TRY(dt__f32(ctx, rstd, fn, "rstd")); DT__TRY(dt__dim(ctx, rstd->numel, dt__rows(x), fn, "rstd numel", "x rows")); }
    return DT_OK;
}

/* The forward's outputs apart from its inputs and from each other, on both devices (mean and rstd
   are written while x is read); out may be x itself, in place (f32: each row is read whole before
   it is written, on the CPU and in the kernel, whose lanes write only what they read). */
static dt_status dt__ln_fwd_apart(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *mean, const dt_tensor *rstd,
                                  const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, const char *fn) {
    const dt_tensor *in[3], *st[2];
    const char *in_name[3] = {"x", "w", "b"}, *st_name[2] = {"mean", "rstd"};
    int i, j;
    in[0] = x; in[1] = w; in[2] = b; st[0] = mean; st[1] = rstd;
    if (!(out && x && out->data == x->data && out->dtype == x->dtype && out->dtype == DT_F32 &&
          dt_tensor_same_shape(out, x)))
        DT__TRY(dt__apart(ctx, out, x, fn, "out", "x"));
    for (i = 1; i < 3; i++) DT__TRY(dt__apart(ctx, out, in[i], fn, "out", in_name[i]));
    for (j = 0; j < 2; j++) {
        for (i = 0; i < 3; i++) DT__TRY(dt__apart(ctx, st[j], in[i], fn, st_name[j], in_name[i]));
        DT__TRY(dt__apart(ctx, st[j], out, fn, st_name[j], "out"));
    }
    return dt__apart(ctx, mean, rstd, fn, "mean", "rstd");
}

/* The backward's outputs (it adds into them) apart from its inputs and from each other. */
static dt_status dt__ln_bwd_apart(dt_ctx *ctx, const dt_tensor *dx, const dt_tensor *dw, const dt_tensor *db,
                                  const dt_tensor *dout, const dt_tensor *x, const dt_tensor *w,
                                  const dt_tensor *mean, const dt_tensor *rstd, const char *fn) {
    const dt_tensor *o[3], *in[5];
    const char *o_name[3] = {"dx", "dw", "db"}, *in_name[5] = {"dout", "x", "w", "mean", "rstd"};
    int i, j;
    o[0] = dx; o[1] = dw; o[2] = db;
    in[0] = dout; in[1] = x; in[2] = w; in[3] = mean; in[4] = rstd;
    for (j = 0; j < 3; j++) {
        for (i = 0; i < 5; i++) DT__TRY(dt__apart(ctx, o[j], in[i], fn, o_name[j], in_name[i]));
        for (i = j + 1; i < 3; i++) DT__TRY(dt__apart(ctx, o[j], o[i], fn, o_name[j], o_name[i]));
    }
    return DT_OK;
}

DT_API dt_status dt_layernorm_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *mean, dt_tensor *rstd,
                                  const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, float eps) {
    const char *fn = "dt_layernorm_fwd";
    int64_t r, c, C, R;
    dt_tensor of;
    float *row = NULL; /* a bf16 out: each row in f32 first, then rounded once */
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__ln_fwd_apart(ctx, out, mean, rstd, x, w, b, fn));
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(x) || dt__cu(w) || dt__cu(b) || dt__cu(mean) || dt__cu(rstd)) return dt__cu_layernorm_fwd(ctx, out, mean, rstd, x, w, b, eps);
#endif
    DT__TRY(dt__ln_check(ctx, dt__bf16_as_f32(out, 1, &of), x, w, mean, rstd, fn, "out"));
    C = dt__last(x); R = dt__rows(x);
    if (b) { DT__TRY(dt__f32(ctx, b, fn, "b")); DT__TRY(dt__dim(ctx, b->numel, C, fn, "b numel", "x.shape[-1]")); }
    if (!(eps > 0 && eps <= FLT_MAX)) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: eps = %g; expected a finite eps > 0", fn, (double)eps);
    if (out->dtype == DT_BF16) {
        if (C && !(row = dt__scratch(ctx, (size_t)C))) return ctx->last_status; /* no GEMM inside: all ours */
    }
    for (r = 0; r < R; r++) {
        const float *xr = DT__CF(x) + r * C, *wp = DT__CF(w), *bp = b ? DT__CF(b) : NULL;
        float *o = row ? row : DT__F(out) + r * C; /* out may be x: the row is read whole before it is written */
        float m, v, s, e;
        dt__v4 a0 = dt__v_set(0.0f), a1 = a0, e0, e1, mv, sv;
        DT__ROW_LOOP(c, C, 8, { /* the 8-lane sum: pads of 0 add nothing */
            a0 = dt__v_add(a0, dt__v_ld(xr, c, C, 0.0f));
            a1 = dt__v_add(a1, dt__v_ld(xr, c + 4, C, 0.0f));
        });
        m = dt__v_hsum(dt__v_add(a0, a1)) / (float)(C ? C : 1); /* an empty row: mean 0, variance 0 */
        mv = dt__v_set(m);
        a0 = a1 = e0 = e1 = dt__v_set(0.0f);
        DT__ROW_LOOP(c, C, 8, { /* two passes: no cancellation; pads of m add (m - m)^2 = 0 */
            dt__v4 d0 = dt__v_sub(dt__v_ld(xr, c, C, m), mv), d1 = dt__v_sub(dt__v_ld(xr, c + 4, C, m), mv);
            e0 = dt__v_add(e0, d0);
            e1 = dt__v_add(e1, d1);
            a0 = dt__v_add(a0, dt__v_mul(d0, d0));
            a1 = dt__v_add(a1, dt__v_mul(d1, d1));
        });
        /* The corrected two-pass form (Chan, Golub, LeVeque 1983): the float mean m is off by up to
           an ulp of |mean|, which matters when the row's mean is large against its spread (rstd
           scales the error up); e = mean of (x - m) is that error, so m + e is the mean to about
           float rounding of the spread, and the variance about m + e is sum d^2 / C - e^2. */
        e = dt__v_hsum(dt__v_add(e0, e1)) / (float)(C ? C : 1);
        v = dt__v_hsum(dt__v_add(a0, a1)) / (float)(C ? C : 1) - e * e;
        if (v < 0) v = 0;
        m += e;
        mv = dt__v_set(m);
        s = (float)(1.0 / sqrt((double)v + eps)); /* once a row: double costs nothing here */
        sv = dt__v_set(s);
        DT__ROW_LOOP(c, C, 4, {
            dt__v4 y = dt__v_mul(dt__v_mul(dt__v_sub(dt__v_ld(xr, c, C, 0.0f), mv), sv), dt__v_ld(wp, c, C, 0.0f));
            dt__v_st(o, c, C, dt__v_add(y, bp ? dt__v_ld(bp, c, C, 0.0f) : dt__v_set(0.0f)));
        });
        if (row) dt_convert(ctx, (uint16_t *)out->data + r * C, DT_BF16, row, DT_F32, C); /* cannot fail here */
        if (mean) DT__F(mean)[r] = m;
        if (rstd) DT__F(rstd)[r] = s;
    }
    return DT_OK;
}

DT_API dt_status dt_layernorm_bwd(dt_ctx *ctx, dt_tensor *dx, dt_tensor *dw, dt_tensor *db,
                                  const dt_tensor *dout, const dt_tensor *x, const dt_tensor *w,
                                  const dt_tensor *mean, const dt_tensor *rstd) {
    const char *fn = "dt_layernorm_bwd";
    int64_t r, c, C, R;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__ln_bwd_apart(ctx, dx, dw, db, dout, x, w, mean, rstd, fn));
#ifdef DT_CUDA
    if (dt__cu(dout) || dt__cu(x) || dt__cu(w) || dt__cu(dx) || dt__cu(dw) || dt__cu(db)) return dt__cu_layernorm_bwd(ctx, dx, dw, db, dout, x, w, mean, rstd);
#endif
    if (!mean || !rstd) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: mean and rstd from the forward are required", fn);
    DT__TRY(dt__ln_check(ctx, dout, x, w, mean, rstd, fn, "dout"));
    C = dt__last(x); R = dt__rows(x);
    if (dx) { DT__TRY(dt__f32(ctx, dx, fn, "dx")); DT__TRY(dt__same(ctx, dx, x, fn, "dx", "x")); }
    if (dw) { DT__TRY(dt__f32(ctx, dw, fn, "dw")); DT__TRY(dt__same_numel(ctx, dw, w, fn, "dw", "w")); }
    if (db) { DT__TRY(dt__f32(ctx, db, fn, "db")); DT__TRY(dt__dim(ctx, db->numel, C, fn, "db numel", "x.shape[-1]")); }
    for (r = 0; r < R; r++) {
        const float *xr = DT__CF(x) + r * C, *g = DT__CF(dout) + r * C, *wp = DT__CF(w);
        float m = DT__CF(mean)[r], s = DT__CF(rstd)[r], gm, gnm;
        dt__v4 mv = dt__v_set(m), sv = dt__v_set(s), a0 = dt__v_set(0.0f), a1 = a0, b0 = a0, b1 = a0, gmv, gnmv;
        DT__ROW_LOOP(c, C, 8, { /* 8-lane sums of gw = g w and gw nrm; pads x = m, g = 0 add 0 */
            dt__v4 n0 = dt__v_mul(dt__v_sub(dt__v_ld(xr, c, C, m), mv), sv);
            dt__v4 n1 = dt__v_mul(dt__v_sub(dt__v_ld(xr, c + 4, C, m), mv), sv);
            dt__v4 gw0 = dt__v_mul(dt__v_ld(g, c, C, 0.0f), dt__v_ld(wp, c, C, 0.0f));
            dt__v4 gw1 = dt__v_mul(dt__v_ld(g, c + 4, C, 0.0f), dt__v_ld(wp, c + 4, C, 0.0f));
            a0 = dt__v_add(a0, gw0);
            a1 = dt__v_add(a1, gw1);
            b0 = dt__v_add(b0, dt__v_mul(gw0, n0));
            b1 = dt__v_add(b1, dt__v_mul(gw1, n1));
        });
        gm = dt__v_hsum(dt__v_add(a0, a1)) / (float)(C ? C : 1);
        gnm = dt__v_hsum(dt__v_add(b0, b1)) / (float)(C ? C : 1);
        gmv = dt__v_set(gm); gnmv = dt__v_set(gnm);
        DT__ROW_LOOP(c, C, 4, {
            dt__v4 gc = dt__v_ld(g, c, C, 0.0f), nrm = dt__v_mul(dt__v_sub(dt__v_ld(xr, c, C, 0.0f), mv), sv);
            if (db) dt__v_st(DT__F(db), c, C, dt__v_add(dt__v_ld(DT__CF(db), c, C, 0.0f), gc));
            if (dw) dt__v_st(DT__F(dw), c, C, dt__v_add(dt__v_ld(DT__CF(dw), c, C, 0.0f), dt__v_mul(nrm, gc)));
            if (dx) {
                dt__v4 gw = dt__v_mul(gc, dt__v_ld(wp, c, C, 0.0f));
                dt__v4 d = dt__v_mul(dt__v_sub(dt__v_sub(gw, gmv), dt__v_mul(nrm, gnmv)), sv);
                dt__v_st(DT__F(dx) + r * C, c, C, dt__v_add(dt__v_ld(DT__CF(dx) + r * C, c, C, 0.0f), d));
            }
        });
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- losses */

/* The shapes and dtypes (the CUDA path checks the values on the device). */
static dt_status dt__xent_shapes(dt_ctx *ctx, const dt_tensor *probs, const dt_tensor *targets, const char *fn,
                                 const char *pn) {
    DT__TRY(dt__f32(ctx, probs, fn, pn));
    DT__TRY(dt_check_tensor(ctx, targets, DT_I32, fn, "targets"));
    return dt__dim(ctx, targets->numel, dt__rows(probs), fn, "targets numel", "logits rows");
}

static dt_status dt__xent_check(dt_ctx *ctx, const dt_tensor *probs, const dt_tensor *targets,
                                int ignore_index, const char *fn, const char *pn) {
    int64_t r, V, R;
    DT__TRY(dt__xent_shapes(ctx, probs, targets, fn, pn));
    V = dt__last(probs); R = dt__rows(probs);
    for (r = 0; r < R; r++) {
        int32_t t = ((const int32_t *)targets->data)[r];
        if (t != ignore_index && (t < 0 || t >= V))
            return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: targets[%lld] = %d is outside [0, %lld) and is "
                                    "not ignore_index = %d", fn, (long long)r, t, (long long)V, ignore_index);
    }
    return DT_OK;
}

/* p[0, n) = softmax(z[0, n)) (p may be z: each block is read before it is written); *mx = the
   max. Returns the sum of exp(z - max), >= 1 (the max's own exp(0)). Eight lanes in a fixed
   order: the same bits every run, whatever the thread count. */
static float dt__softmax_row(float *p, const float *z, int64_t n, float *mx) {
    int64_t c;
    dt__v4 a0 = dt__v_set(-FLT_MAX), a1 = a0, mv, inv;
    float sum;
    DT__ROW_LOOP(c, n, 8, { /* pads of -FLT_MAX, the start value, change no max */
        a0 = dt__v_max(a0, dt__v_ld(z, c, n, -FLT_MAX));
        a1 = dt__v_max(a1, dt__v_ld(z, c + 4, n, -FLT_MAX));
    });
    *mx = dt__v_hmax(dt__v_max(a0, a1));
    mv = dt__v_set(*mx);
    a0 = a1 = dt__v_set(0.0f);
    DT__ROW_LOOP(c, n, 8, { /* the 8-lane sum; pads of -inf give exp = 0 */
        dt__v4 e0 = dt__v_exp(dt__v_sub(dt__v_ld(z, c, n, -INFINITY), mv));
        dt__v4 e1 = dt__v_exp(dt__v_sub(dt__v_ld(z, c + 4, n, -INFINITY), mv));
        dt__v_st(p, c, n, e0);
        dt__v_st(p, c + 4, n, e1);
        a0 = dt__v_add(a0, e0);
        a1 = dt__v_add(a1, e1);
    });
    sum = dt__v_hsum(dt__v_add(a0, a1));
    inv = dt__v_set(1.0f / sum);
    DT__ROW_LOOP(c, n, 4, { dt__v_st(p, c, n, dt__v_mul(dt__v_ld(p, c, n, 0.0f), inv)); });
    return sum;
}

DT_API dt_status dt_softmax_xent_fwd(dt_ctx *ctx, float *loss, int64_t *n_valid, dt_tensor *probs,
                                     const dt_tensor *logits, const dt_tensor *targets, int ignore_index) {
    const char *fn = "dt_softmax_xent_fwd";
    int64_t r, V, R, n = 0;
    double total = 0;
    if (loss) *loss = 0;
    if (n_valid) *n_valid = 0;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, probs, logits, fn, "probs", "logits"));
    DT__TRY(dt__apart(ctx, probs, targets, fn, "probs", "targets"));
#ifdef DT_CUDA
    if (dt__cu(probs) || dt__cu(logits) || dt__cu(targets))
        return dt__cu_softmax_xent_fwd(ctx, loss, n_valid, probs, logits, targets, ignore_index);
#endif
    DT__TRY(dt__f32(ctx, logits, fn, "logits"));
    DT__TRY(dt__xent_check(ctx, logits, targets, ignore_index, fn, "logits"));
    DT__TRY(dt__f32(ctx, probs, fn, "probs"));
    DT__TRY(dt__same(ctx, probs, logits, fn, "probs", "logits"));
    V = dt__last(logits); R = dt__rows(logits);
    for (r = 0; r < R; r++) {
        const float *z = DT__CF(logits) + r * V;
        float *p = DT__F(probs) + r * V, mx, sum, zt = 0.0f;
        int32_t t = ((const int32_t *)targets->data)[r];
        if (t != ignore_index) zt = z[t]; /* read before probs (which may be logits) is written */
        sum = dt__softmax_row(p, z, V, &mx);
        /* = -log softmax, no underflow; max - z[t] first, so log(sum) survives huge logits */
        if (t != ignore_index) { total += log((double)sum) + ((double)mx - zt); n++; }
    }
    if (loss) *loss = n ? (float)(total / (double)n) : 0.0f;
    if (n_valid) *n_valid = n;
    return DT_OK;
}

DT_API dt_status dt_softmax_xent_bwd(dt_ctx *ctx, dt_tensor *dlogits, const dt_tensor *probs,
                                     const dt_tensor *targets, int ignore_index, float dloss) {
    const char *fn = "dt_softmax_xent_bwd";
    int64_t r, v, V, R, n = 0;
    float s;
    dt__v4 sv;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, dlogits, probs, fn, "dlogits", "probs"));
    DT__TRY(dt__apart(ctx, dlogits, targets, fn, "dlogits", "targets"));
#ifdef DT_CUDA
    if (dt__cu(dlogits) || dt__cu(probs) || dt__cu(targets))
        return dt__cu_softmax_xent_bwd(ctx, dlogits, probs, targets, ignore_index, dloss);
#endif
    DT__TRY(dt__xent_check(ctx, probs, targets, ignore_index, fn, "probs"));
    if (!dlogits) return DT_OK;
    DT__TRY(dt__f32(ctx, dlogits, fn, "dlogits"));
    DT__TRY(dt__same(ctx, dlogits, probs, fn, "dlogits", "probs"));
    V = dt__last(probs); R = dt__rows(probs);
    for (r = 0; r < R; r++) n += ((const int32_t *)targets->data)[r] != ignore_index;
    if (n == 0) return DT_OK;
    s = dloss / (float)n;
    sv = dt__v_set(s);
    for (r = 0; r < R; r++) {
        int32_t t = ((const int32_t *)targets->data)[r];
        const float *p = DT__CF(probs) + r * V;
        float *g = DT__F(dlogits) + r * V, gt, pt;
        if (t == ignore_index) continue;
        gt = g[t]; pt = p[t]; /* dlogits may be probs */
        DT__ROW_LOOP(v, V, 4, {
            dt__v_st(g, v, V, dt__v_add(dt__v_ld(g, v, V, 0.0f), dt__v_mul(sv, dt__v_ld(p, v, V, 0.0f))));
        });
        g[t] = gt + s * (pt - 1.0f); /* the one-hot column, as g += s (p - 1) */
    }
    return DT_OK;
}

static dt_status dt__bce_check(dt_ctx *ctx, const dt_tensor *logits, const dt_tensor *labels, const char *fn) {
    DT__TRY(dt__f32(ctx, logits, fn, "logits"));
    DT__TRY(dt__f32(ctx, labels, fn, "labels"));
    return dt__same_numel(ctx, logits, labels, fn, "logits", "labels");
}

DT_API dt_status dt_bce_logits_fwd(dt_ctx *ctx, float *loss, const dt_tensor *logits, const dt_tensor *labels) {
    const char *fn = "dt_bce_logits_fwd";
    int64_t i;
    double total = 0;
    if (loss) *loss = 0;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(logits) || dt__cu(labels)) return dt__cu_bce(ctx, loss, NULL, logits, labels, 0, 0);
#endif
    DT__TRY(dt__bce_check(ctx, logits, labels, fn));
    for (i = 0; i < logits->numel; i++) {
        double z = DT__CF(logits)[i], y = DT__CF(labels)[i];
        total += (z > 0 ? z : 0) - z * y + log1p(exp(-fabs(z))); /* never exp of a large positive */
    }
    if (loss) *loss = logits->numel ? (float)(total / (double)logits->numel) : 0.0f;
    return DT_OK;
}

DT_API dt_status dt_bce_logits_bwd(dt_ctx *ctx, dt_tensor *dlogits, const dt_tensor *logits,
                                   const dt_tensor *labels, float dloss) {
    const char *fn = "dt_bce_logits_bwd";
    int64_t i;
    float s;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, dlogits, logits, fn, "dlogits", "logits"));
    DT__TRY(dt__apart(ctx, dlogits, labels, fn, "dlogits", "labels"));
#ifdef DT_CUDA
    if (dt__cu(dlogits) || dt__cu(logits) || dt__cu(labels)) return dt__cu_bce(ctx, NULL, dlogits, logits, labels, dloss, 1);
#endif
    DT__TRY(dt__bce_check(ctx, logits, labels, fn));
    if (!dlogits) return DT_OK;
    DT__TRY(dt__f32(ctx, dlogits, fn, "dlogits"));
    DT__TRY(dt__same_numel(ctx, dlogits, logits, fn, "dlogits", "logits"));
    if (logits->numel == 0) return DT_OK;
    s = dloss / (float)logits->numel;
    for (i = 0; i < logits->numel; i++) {
        float z = DT__CF(logits)[i];
        float sig = z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
        DT__F(dlogits)[i] += s * (sig - DT__CF(labels)[i]);
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- elementwise, reductions */

DT_API dt_status dt_add(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b) {
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, out, a, "dt_add", "out", "a"));
    DT__TRY(dt__same_or_apart(ctx, out, b, "dt_add", "out", "b"));
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(a) || dt__cu(b)) return dt__cu_binary(ctx, out, NULL, NULL, a, b, 0);
#endif
    DT__TRY(dt__f32(ctx, out, "dt_add", "out"));
    DT__TRY(dt__f32(ctx, a, "dt_add", "a"));
    DT__TRY(dt__f32(ctx, b, "dt_add", "b"));
    DT__TRY(dt__same_numel(ctx, a, b, "dt_add", "a", "b"));
    DT__TRY(dt__same_numel(ctx, out, a, "dt_add", "out", "a"));
    DT__BLOCKS(a->numel, DT__CF(a), DT__CF(b), DT__F(out), o[j] = a[j] + b[j]);
    return DT_OK;
}

static dt_status dt__binary_check(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *a, const dt_tensor *b,
                                  const char *fn, const char *on) {
    DT__TRY(dt__f32(ctx, out, fn, on));
    DT__TRY(dt__f32(ctx, a, fn, "a"));
    DT__TRY(dt__f32(ctx, b, fn, "b"));
    DT__TRY(dt__same_numel(ctx, a, b, fn, "a", "b"));
    return dt__same_numel(ctx, out, a, fn, on, "a");
}

DT_API dt_status dt_mul_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b) {
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, out, a, "dt_mul_fwd", "out", "a"));
    DT__TRY(dt__same_or_apart(ctx, out, b, "dt_mul_fwd", "out", "b"));
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(a) || dt__cu(b)) return dt__cu_binary(ctx, out, NULL, NULL, a, b, 1);
#endif
    DT__TRY(dt__binary_check(ctx, out, a, b, "dt_mul_fwd", "out"));
    DT__BLOCKS(a->numel, DT__CF(a), DT__CF(b), DT__F(out), o[j] = a[j] * b[j]);
    return DT_OK;
}

DT_API dt_status dt_mul_bwd(dt_ctx *ctx, dt_tensor *da, dt_tensor *db, const dt_tensor *dout,
                            const dt_tensor *a, const dt_tensor *b) {
    const char *fn = "dt_mul_bwd";
    const dt_tensor *in[3];
    const char *in_name[3] = {"dout", "a", "b"};
    int i;
    if (!ctx) return DT_ERR_ARG;
    in[0] = dout; in[1] = a; in[2] = b;
    for (i = 0; i < 3; i++) { /* da is added into before db reads them */
        DT__TRY(dt__apart(ctx, da, in[i], fn, "da", in_name[i]));
        DT__TRY(dt__apart(ctx, db, in[i], fn, "db", in_name[i]));
    }
    DT__TRY(dt__same_or_apart(ctx, db, da, fn, "db", "da")); /* da == db: x * x */
#ifdef DT_CUDA
    if (dt__cu(da) || dt__cu(db) || dt__cu(dout) || dt__cu(a) || dt__cu(b)) return dt__cu_binary(ctx, da, db, dout, a, b, 2);
#endif
    DT__TRY(dt__binary_check(ctx, dout, a, b, fn, "dout"));
    if (da) DT__TRY(dt__binary_check(ctx, da, a, b, fn, "da"));
    if (db) DT__TRY(dt__binary_check(ctx, db, a, b, fn, "db"));
    /* da first, then db: with da == db (a == b, x * x) both terms land, in a fixed order */
    if (da) DT__BLOCKS(a->numel, DT__CF(dout), DT__CF(b), DT__F(da), o[j] += a[j] * b[j]);
    if (db) DT__BLOCKS(a->numel, DT__CF(dout), DT__CF(a), DT__F(db), o[j] += a[j] * b[j]);
    return DT_OK;
}

DT_API dt_status dt_scale(dt_ctx *ctx, dt_tensor *x, float alpha) {
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(x)) return dt__cu_scale(ctx, x, alpha);
#endif
    DT__TRY(dt__f32(ctx, x, "dt_scale", "x"));
    DT__BLOCKS(x->numel, DT__CF(x), NULL, DT__F(x), o[j] = alpha * a[j]);
    return DT_OK;
}

DT_API dt_status dt_axpy(dt_ctx *ctx, dt_tensor *y, float alpha, const dt_tensor *x) {
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__same_or_apart(ctx, y, x, "dt_axpy", "y", "x"));
#ifdef DT_CUDA
    if (dt__cu(y) || dt__cu(x)) return dt__cu_axpy(ctx, y, alpha, x);
#endif
    DT__TRY(dt__f32(ctx, y, "dt_axpy", "y"));
    DT__TRY(dt__f32(ctx, x, "dt_axpy", "x"));
    DT__TRY(dt__same_numel(ctx, y, x, "dt_axpy", "y", "x"));
    DT__BLOCKS(x->numel, DT__CF(x), NULL, DT__F(y), o[j] += alpha * a[j]);
    return DT_OK;
}

/* The sum of x (of x * x when sq) in double, in element order. */
static dt_status dt__sum(dt_ctx *ctx, double *out, const dt_tensor *x, int sq, const char *fn) {
    int64_t i;
    double s = 0;
    if (out) *out = 0;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
#ifdef DT_CUDA
    if (dt__cu(x)) return dt__cu_sum(ctx, out, x, sq, fn);
#endif
    DT__TRY(dt__f32(ctx, x, fn, "x"));
    for (i = 0; i < x->numel; i++) { double v = DT__CF(x)[i]; s += sq ? v * v : v; }
    *out = s;
    return DT_OK;
}

DT_API dt_status dt_sum(dt_ctx *ctx, double *out, const dt_tensor *x) { return dt__sum(ctx, out, x, 0, "dt_sum"); }
DT_API dt_status dt_sumsq(dt_ctx *ctx, double *out, const dt_tensor *x) { return dt__sum(ctx, out, x, 1, "dt_sumsq"); }

/* ---------------------------------------------------------------- embedding */

/* values 1: every id is checked against [0, V) here (the CPU); 0: dtype only (CUDA checks them
   on the device). */
static dt_status dt__ids_check(dt_ctx *ctx, const dt_tensor *ids, int64_t V, const char *fn, int values) {
    int64_t i;
    DT__TRY(dt__valid(ctx, ids, fn, "ids"));
    if (ids->dtype != DT_I32 && ids->dtype != DT_I64)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: ids has dtype %s; expected i32 or i64", fn,
                                dt_dtype_name(ids->dtype));
    DT__TRY(dt_check_tensor(ctx, ids, ids->dtype, fn, "ids"));
    for (i = 0; values && i < ids->numel; i++) {
        int64_t id = ids->dtype == DT_I32 ? ((const int32_t *)ids->data)[i] : ((const int64_t *)ids->data)[i];
        if (id < 0 || id >= V)
            return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: ids[%lld] = %lld is outside the table's rows "
                                    "[0, %lld)", fn, (long long)i, (long long)id, (long long)V);
    }
    return DT_OK;
}

static int64_t dt__id(const dt_tensor *ids, int64_t i) {
    return ids->dtype == DT_I32 ? ((const int32_t *)ids->data)[i] : ((const int64_t *)ids->data)[i];
}

static dt_status dt__emb_check(dt_ctx *ctx, const dt_tensor *rows, const dt_tensor *table,
                               const dt_tensor *ids, const char *fn, const char *rn, const char *tn, int values) {
    DT__TRY(dt__f32(ctx, table, fn, tn));
    DT__TRY(dt__f32(ctx, rows, fn, rn));
    DT__TRY(dt__ndim(ctx, table, 2, 2, fn, tn));
    DT__TRY(dt__ids_check(ctx, ids, table->shape[0], fn, values));
    if (dt__last(rows) != table->shape[1] || dt__rows(rows) != ids->numel) {
        char s[96];
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected %lld rows (ids numel) of %lld (%s.shape[1])",
                                fn, rn, dt_shape_str(rows, s, sizeof s), (long long)ids->numel,
                                (long long)table->shape[1], tn);
    }
    return DT_OK;
}

DT_API dt_status dt_embedding_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *table, const dt_tensor *ids) {
    int64_t n, D;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(table) || dt__cu(ids)) {
        DT__TRY(dt__apart(ctx, out, table, "dt_embedding_fwd", "out", "table"));
        return dt__cu_embedding(ctx, out, table, ids, 0);
    }
#endif
    DT__TRY(dt__emb_check(ctx, out, table, ids, "dt_embedding_fwd", "out", "table", 1));
    DT__TRY(dt__apart(ctx, out, table, "dt_embedding_fwd", "out", "table"));
    DT__TRY(dt__apart(ctx, out, ids, "dt_embedding_fwd", "out", "ids"));
    D = table->shape[1];
    for (n = 0; n < ids->numel; n++)
        memcpy(DT__F(out) + n * D, DT__CF(table) + dt__id(ids, n) * D, (size_t)D * sizeof(float));
    return DT_OK;
}

DT_API dt_status dt_embedding_bwd(dt_ctx *ctx, dt_tensor *dtable, const dt_tensor *dout, const dt_tensor *ids) {
    int64_t n, d, D;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__apart(ctx, dtable, dout, "dt_embedding_bwd", "dtable", "dout"));
    DT__TRY(dt__apart(ctx, dtable, ids, "dt_embedding_bwd", "dtable", "ids"));
#ifdef DT_CUDA
    if (dt__cu(dtable) || dt__cu(dout) || dt__cu(ids)) return dt__cu_embedding(ctx, dtable, dout, ids, 1);
#endif
    if (!dtable) return dt__f32(ctx, dout, "dt_embedding_bwd", "dout");
    DT__TRY(dt__emb_check(ctx, dout, dtable, ids, "dt_embedding_bwd", "dout", "dtable", 1));
    D = dtable->shape[1];
    for (n = 0; n < ids->numel; n++) { /* in id order: deterministic even with repeated ids */
        float *row = DT__F(dtable) + dt__id(ids, n) * D;
        const float *g = DT__CF(dout) + n * D;
        for (d = 0; d < D; d++) row[d] += g[d];
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- attention */

/* The sizes of an attention call: qkv [B, T, W], W = (H + 2 Hkv) hs; C = H hs (q and out), Ckv = Hkv hs;
   bf: a bf16 qkv on the CPU (the products in bf16, see dt_attention_gqa_fwd). */
typedef struct dt__attn_dim { int64_t B, T, W, C, Ckv, hs; int H, Hkv, bf; } dt__attn_dim;

static dt_status dt__attn_check(dt_ctx *ctx, const dt_tensor *o, const dt_tensor *att, const dt_tensor *qkv,
                                int n_head, int n_kv_head, const char *fn, const char *on, dt__attn_dim *g) {
    int64_t B, T, C;
    g->bf = 0;
    if (qkv && qkv->dtype == DT_BF16 && qkv->device == DT_CPU && att && !strncmp(fn, "dt_attention", 12)) {
        DT__TRY(dt_check_tensor(ctx, qkv, DT_BF16, fn, "qkv"));
        g->bf = 1;
    } else
        DT__TRY(dt__f32(ctx, qkv, fn, "qkv"));
    DT__TRY(dt__f32(ctx, o, fn, on));
    DT__TRY(dt__f32(ctx, att, fn, "att"));
    DT__TRY(dt__ndim(ctx, qkv, 3, 3, fn, "qkv"));
    B = qkv->shape[0]; T = qkv->shape[1];
    if (n_kv_head == n_head) { /* the packed q | k | v of equal widths */
        C = qkv->shape[2] / 3;
        if (qkv->shape[2] % 3)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: qkv.shape[2] = %lld is not 3*C", fn, (long long)qkv->shape[2]);
        if (n_head <= 0 || C % n_head)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_head = %d must be > 0 and divide C = %lld", fn, n_head,
                                    (long long)C);
        g->hs = C / n_head;
    } else {
        int64_t per = (int64_t)n_head + 2 * (int64_t)n_kv_head;
        if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_head = %d, n_kv_head = %d; expected n_head > 0 and n_kv_head "
                                    "> 0 dividing it", fn, n_head, n_kv_head);
        if (qkv->shape[2] % per)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: qkv.shape[2] = %lld is not (n_head + 2 n_kv_head) x head "
                                    "size = %lld x head size", fn, (long long)qkv->shape[2], (long long)per);
        g->hs = qkv->shape[2] / per;
        C = g->hs * n_head;
    }
    g->B = B; g->T = T; g->W = qkv->shape[2]; g->C = C; g->H = n_head; g->Hkv = n_kv_head;
    g->Ckv = g->hs * n_kv_head;
    DT__TRY(dt__ndim(ctx, o, 3, 3, fn, on));
    if (o->shape[0] != B || o->shape[1] != T || o->shape[2] != C) {
        char s[96];
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected [%lld, %lld, %lld]", fn, on,
                                dt_shape_str(o, s, sizeof s), (long long)B, (long long)T, (long long)C);
    }
    if (att->ndim != 4 || att->shape[0] != B || att->shape[1] != n_head || att->shape[2] != T || att->shape[3] != T) {
        char s[96];
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: att shape %s; expected [%lld, %d, %lld, %lld]", fn,
                                dt_shape_str(att, s, sizeof s), (long long)B, n_head, (long long)T, (long long)T);
    }
    return DT_OK;
}

/* Attention runs per (batch, head) on strided views of the packed qkv (row stride 3C): the score
   and value products go through dt__gemm (OpenBLAS under DT_CBLAS, else the blocked GEMM), the
   causal softmax on dt__v_exp with the 8-lane row max and sum the other row ops use. Only the
   lower triangle matters, so the products run in blocks of DT__ATT_RB query rows (or key
   columns) that stop at the diagonal block: about (1 + RB/T) / 2 of the square's work. The
   blocks depend on T alone, and a GEMM call's result not on the thread count (OpenBLAS splits
   the rows and columns of C among threads, never the inner sum; tests/test_tensor_attn.c
   compares 1 and 2 threads), so the bits are the same run after run. */
#define DT__ATT_RB 64

/* Element off of qkv (bf16 or f32) */
static const void *dt__qkv_at(const dt_tensor *qkv, int bf, int64_t off) {
    return bf ? (const void *)((const uint16_t *)qkv->data + off) : (const void *)((const float *)qkv->data + off);
}

/* One of attention's products, C (+)= op(A) op(B): A f32; B f32, or bf16 (bbf) under bf (a bf16
   qkv: dt__gemm_bf16, the f32 operands rounded to bf16 on the way in, as torch.autocast's SDPA). */
static dt_status dt__att_gemm(dt_ctx *ctx, int bf, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                              int64_t lda, const void *B, int bbf, int64_t ldb, int acc, float *C, int64_t ldc,
                              size_t keep) {
    if (bf) return dt__gemm_bf16_keep(ctx, ta, tb, M, N, K, A, 0, lda, B, bbf, ldb, acc, C, ldc, keep, NULL);
    return dt__gemm(ctx, ta, tb, M, N, K, 1.0f, A, lda, (const float *)B, ldb, acc ? 1.0f : 0.0f, C, ldc);
}

/* One query row of the softmax: a[0..t] holds scaled scores in, probabilities out; a[t+1..T-1]
   becomes 0 (the causal mask: att keeps masked entries 0, the backward's GEMMs read them). */
static void dt__att_softmax_row(float *a, int64_t t, int64_t T) {
    int64_t n = t + 1;
    float mx;
    dt__softmax_row(a, a, n, &mx);
    if (n < T) memset(a + n, 0, (size_t)(T - n) * sizeof(float));
}

/* One query row of the softmax backward, in place: d[0..t] = p * (d - sum_j p_j d_j) * scale,
   d[t+1..n-1] = 0 (n: the columns the GEMMs after it read). */
static void dt__att_softmax_bwd_row(float *d, const float *p, int64_t t, int64_t n, float scale) {
    int64_t c, m = t + 1;
    dt__v4 a0 = dt__v_set(0.0f), a1 = a0, dv, sv = dt__v_set(scale);
    DT__ROW_LOOP(c, m, 8, { /* pads of 0 add nothing */
        a0 = dt__v_add(a0, dt__v_mul(dt__v_ld(p, c, m, 0.0f), dt__v_ld(d, c, m, 0.0f)));
        a1 = dt__v_add(a1, dt__v_mul(dt__v_ld(p, c + 4, m, 0.0f), dt__v_ld(d, c + 4, m, 0.0f)));
    });
    dv = dt__v_set(dt__v_hsum(dt__v_add(a0, a1)));
    DT__ROW_LOOP(c, m, 4, {
        dt__v4 x = dt__v_mul(dt__v_mul(dt__v_ld(p, c, m, 0.0f), dt__v_sub(dt__v_ld(d, c, m, 0.0f), dv)), sv);
        dt__v_st(d, c, m, x);
    });
    if (m < n) memset(d + m, 0, (size_t)(n - m) * sizeof(float));
}

#ifdef DT_CUDA
/* A CUDA tensor with n_kv_head != n_head: the kernels are MHA only for now. */
static dt_status dt__attn_gqa_cuda(dt_ctx *ctx, int n_head, int n_kv_head, const char *fn) {
    return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: n_kv_head = %d != n_head = %d with an f32 qkv on cuda and att "
                            "NULL; pass att (the kv heads are repeated into the multi-head kernels) or a bf16 qkv (the "
                            "tensor-core kernels)", fn, n_kv_head, n_head);
}
#endif

static dt_status dt__attn_apart(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *att, const dt_tensor *qkv,
                                const char *fn) {
    DT__TRY(dt__apart(ctx, out, qkv, fn, "out", "qkv"));
    DT__TRY(dt__apart(ctx, att, qkv, fn, "att", "qkv"));
    return dt__apart(ctx, out, att, fn, "out", "att");
}

/* The backward's one output apart from every input (both devices: it adds into dqkv while it
   reads them). */
static dt_status dt__attn_bwd_apart(dt_ctx *ctx, const dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *qkv,
                                    const dt_tensor *att, const char *fn) {
    DT__TRY(dt__apart(ctx, dqkv, dout, fn, "dqkv", "dout"));
    DT__TRY(dt__apart(ctx, dqkv, qkv, fn, "dqkv", "qkv"));
    return dt__apart(ctx, dqkv, att, fn, "dqkv", "att");
}

DT_API dt_status dt_attention_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *att, const dt_tensor *qkv, int n_head) {
    return dt_attention_gqa_fwd(ctx, out, att, qkv, n_head, n_head);
}

DT_API dt_status dt_attention_gqa_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *att, const dt_tensor *qkv, int n_head,
                                      int n_kv_head) {
    const char *fn = n_kv_head == n_head ? "dt_attention_fwd" : "dt_attention_gqa_fwd";
    dt__attn_dim g;
    int64_t T, W, C, hs, b, r0, t, k;
    int h;
    float scale;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(att) || dt__cu(qkv)) {
        DT__TRY(dt__attn_apart(ctx, out, att, qkv, fn));
        if (n_kv_head == n_head) return dt__cu_attention_fwd(ctx, out, att, qkv, n_head);
        if (!att && qkv && qkv->dtype == DT_BF16) /* the tensor-core kernels take kv heads */
            return dt__cu_attention_gqa_tc(ctx, out, qkv, n_head, n_kv_head, 0, NULL, fn, "out");
        if (att) return dt__cu_attention_gqa_f32(ctx, out, att, qkv, n_head, n_kv_head, 0, NULL, fn);
        return dt__attn_gqa_cuda(ctx, n_head, n_kv_head, fn);
    }
#endif
    if (out && qkv && out->dtype == DT_BF16 && qkv->dtype == DT_BF16) {
        /* bf16 activations: the f32 op into a host buffer, each value rounded once into out */
        dt_tensor of = *out;
        dt_status st;
        of.dtype = DT_F32;
        DT__TRY(dt__attn_check(ctx, &of, att, qkv, n_head, n_kv_head, fn, "out", &g));
        DT__TRY(dt__attn_apart(ctx, out, att, qkv, fn));
        of.owns = 0;
        if (out->numel && !(of.data = dt_alloc(ctx, (size_t)out->numel * sizeof(float)))) return ctx->last_status;
        st = dt_attention_gqa_fwd(ctx, &of, att, qkv, n_head, n_kv_head);
        if (!st) st = dt_convert(ctx, out->data, DT_BF16, of.data, DT_F32, out->numel);
        dt_release(ctx, of.data);
        return st;
    }
    DT__TRY(dt__attn_check(ctx, out, att, qkv, n_head, n_kv_head, fn, "out", &g));
    DT__TRY(dt__attn_apart(ctx, out, att, qkv, fn));
    T = g.T; W = g.W; C = g.C; hs = g.hs;
    scale = hs ? 1.0f / sqrtf((float)hs) : 0.0f; /* C = 0: no features, uniform attention */
    for (b = 0; b < g.B; b++)
        for (h = 0; h < n_head; h++) { /* query head h reads kv head h / (H / Hkv) */
            int64_t qo = b * T * W + h * hs, ko = b * T * W + C + (h / (n_head / n_kv_head)) * hs, vo = ko + g.Ckv;
            float *a = DT__F(att) + (b * n_head + h) * T * T, *o = DT__F(out) + b * T * C + h * hs;
            for (r0 = 0; r0 < T; r0 += DT__ATT_RB) { /* rows r0..r1-1 see keys 0..r1-1 */
                int64_t r1 = T - r0 < DT__ATT_RB ? T : r0 + DT__ATT_RB;
                if (g.bf) { /* bf16 q, k, v: the scores scaled after, in f32 (the mask's columns are not read) */
                    DT__TRY(dt__gemm_bf16(ctx, 0, 1, r1 - r0, r1, hs, dt__qkv_at(qkv, 1, qo + r0 * W), 1, W,
                                          dt__qkv_at(qkv, 1, ko), 1, W, 0, a + r0 * T, T));
                    for (t = r0; t < r1; t++)
                        for (k = 0; k <= t; k++) a[t * T + k] *= scale;
                } else
                    DT__TRY(dt__gemm(ctx, 0, 1, r1 - r0, r1, hs, scale, DT__CF(qkv) + qo + r0 * W, W, DT__CF(qkv) + ko, W,
                                     0.0f, a + r0 * T, T));
                for (t = r0; t < r1; t++) dt__att_softmax_row(a + t * T, t, T);
                DT__TRY(dt__att_gemm(ctx, g.bf, 0, 0, r1 - r0, hs, r1, a + r0 * T, T, dt__qkv_at(qkv, g.bf, vo), g.bf, W, 0,
                                     o + r0 * C, C, 0));
            }
        }
    return DT_OK;
}

/* Per (batch, head), with P = att and G = dout: dV += P^T G, dP = G V^T, the softmax backward
   dS = P * (dP - rowsum(P * dP)) * scale, dQ += dS K, dK += dS^T Q. dS [T, T] lives in the ctx
   scratch past the part the portable GEMM packs into (DT__GEMM_SCRATCH), so no call allocates
   once the scratch has grown. */
DT_API dt_status dt_attention_bwd(dt_ctx *ctx, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *qkv,
                                  const dt_tensor *att, int n_head) {
    return dt_attention_gqa_bwd(ctx, dqkv, dout, qkv, att, n_head, n_head);
}

/* Under grouped-query attention the H / Hkv query heads of a group add into one dK, dV, head after
   head (h in order), so the sums are in a fixed order. */
DT_API dt_status dt_attention_gqa_bwd(dt_ctx *ctx, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *qkv,
                                      const dt_tensor *att, int n_head, int n_kv_head) {
    const char *fn = n_kv_head == n_head ? "dt_attention_bwd" : "dt_attention_gqa_bwd";
    dt__attn_dim g;
    int64_t B, T, W, C, hs, b, r0, t;
    size_t TT;
    int h;
    float scale, *ds;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt__attn_bwd_apart(ctx, dqkv, dout, qkv, att, fn));
#ifdef DT_CUDA
    if (dt__cu(dqkv) || dt__cu(dout) || dt__cu(qkv) || dt__cu(att)) {
        if (n_kv_head == n_head) return dt__cu_attention_bwd(ctx, dqkv, dout, qkv, att, n_head);
        if (!att && qkv && qkv->dtype == DT_BF16)
            return dt__cu_attention_gqa_tc(ctx, dout, qkv, n_head, n_kv_head, 1, dqkv, fn, "dout");
        if (att) return dt__cu_attention_gqa_f32(ctx, (dt_tensor *)dout, (dt_tensor *)att, qkv, n_head, n_kv_head, 1,
                                                 dqkv, fn);
        return dt__attn_gqa_cuda(ctx, n_head, n_kv_head, fn);
    }
#endif
    DT__TRY(dt__attn_check(ctx, dout, att, qkv, n_head, n_kv_head, fn, "dout", &g));
    if (!dqkv) return DT_OK;
    if (dqkv->dtype == DT_BF16 && g.bf) {
        /* bf16 gradients beside a bf16 qkv: dqkv widened into a host buffer, the f32 op adding into
           it, each value rounded once (as the tensor-core kernels store it) */
        dt_tensor df = *dqkv;
        dt_status st;
        DT__TRY(dt_check_tensor(ctx, dqkv, DT_BF16, fn, "dqkv"));
        DT__TRY(dt__same(ctx, dqkv, qkv, fn, "dqkv", "qkv"));
        df.dtype = DT_F32;
        df.owns = 0;
        if (!dqkv->numel) return DT_OK;
        if (!(df.data = dt_alloc(ctx, (size_t)dqkv->numel * sizeof(float)))) return ctx->last_status;
        st = dt_convert(ctx, df.data, DT_F32, dqkv->data, DT_BF16, dqkv->numel);
        if (!st) st = dt_attention_gqa_bwd(ctx, &df, dout, qkv, att, n_head, n_kv_head);
        if (!st) st = dt_convert(ctx, dqkv->data, DT_BF16, df.data, DT_F32, dqkv->numel);
        dt_release(ctx, df.data);
        return st;
    }
    DT__TRY(dt__f32(ctx, dqkv, fn, "dqkv"));
    DT__TRY(dt__same(ctx, dqkv, qkv, fn, "dqkv", "qkv"));
    B = g.B; T = g.T; W = g.W; C = g.C; hs = g.hs;
    if (B == 0 || T == 0) return DT_OK;
    scale = hs ? 1.0f / sqrtf((float)hs) : 0.0f; /* C = 0: no features, uniform attention */
    TT = (size_t)T * (size_t)T; /* fits: att has B*H*T*T elements */
    /* under g.bf the f32 fallback's rounded operands go past ds: at most T x T of att or ds and T x W of qkv */
    if (!dt__scratch(ctx, DT__GEMM_SCRATCH + TT + (g.bf ? TT + (size_t)T * (size_t)W : 0))) return DT_ERR_OOM;
    ds = ctx->scratch + DT__GEMM_SCRATCH;
    for (b = 0; b < B; b++)
        for (h = 0; h < n_head; h++) {
            int64_t kvo = C + (h / (n_head / n_kv_head)) * hs; /* this head's k column in a row */
            int64_t qo = b * T * W + h * hs, ko = b * T * W + kvo, vo = ko + g.Ckv;
            const float *p = DT__CF(att) + (b * n_head + h) * T * T, *gr = DT__CF(dout) + b * T * C + h * hs;
            float *dq = DT__F(dqkv) + qo, *dk = DT__F(dqkv) + ko, *dv = DT__F(dqkv) + vo;
            for (r0 = 0; r0 < T; r0 += DT__ATT_RB) { /* query rows r0..r1-1, key columns 0..r1-1 */
                int64_t r1 = T - r0 < DT__ATT_RB ? T : r0 + DT__ATT_RB;
                DT__TRY(dt__att_gemm(ctx, g.bf, 0, 1, r1 - r0, r1, hs, gr + r0 * C, C, dt__qkv_at(qkv, g.bf, vo), g.bf, W, 0,
                                     ds + r0 * T, T, TT));
                for (t = r0; t < r1; t++) dt__att_softmax_bwd_row(ds + t * T, p + t * T, t, r1, scale);
                DT__TRY(dt__att_gemm(ctx, g.bf, 0, 0, r1 - r0, hs, r1, ds + r0 * T, T, dt__qkv_at(qkv, g.bf, ko), g.bf, W, 1,
                                     dq + r0 * W, W, TT));
            }
            for (r0 = 0; r0 < T; r0 += DT__ATT_RB) { /* key rows r0..r1-1 see query rows r0..T-1 */
                int64_t r1 = T - r0 < DT__ATT_RB ? T : r0 + DT__ATT_RB;
                DT__TRY(dt__att_gemm(ctx, g.bf, 1, 0, r1 - r0, hs, T - r0, p + r0 * T + r0, T, gr + r0 * C, 0, C, 1,
                                     dv + r0 * W, W, TT));
                DT__TRY(dt__att_gemm(ctx, g.bf, 1, 0, r1 - r0, hs, T - r0, ds + r0 * T + r0, T,
                                     dt__qkv_at(qkv, g.bf, qo + r0 * W), g.bf, W, 1, dk + r0 * W, W, TT));
            }
        }
    return DT_OK;
}

/* ---------------------------------------------------------------- attention blocks (online softmax)

   dt_attention_block_fwd / _bwd: one (query block, key block) pair of FlashAttention's loop on the
   CPU's GEMMs. Per (batch, head) and DT__ATT_RB query rows at a time: S = scale Q K^T over the
   keys the last row sees, each row's softmax over its own visible keys (dt__softmax_row, as
   dt_attention), the block's logsumexp l_b = max + log(sum), O_b = P V; then the merge with what
   the row holds (O, l): l' = log(e^l + e^l_b), O' = e^(l - l') O + e^(l_b - l') O_b. The
   backward recomputes P = exp(S - lse) from the final lse and uses D = rowsum(dO * O) for
   rowsum(P * dP), which holds over all the blocks together (O = sum_b P_b V_b). */

typedef struct dt__ablk {
    int64_t B, Tq, Tk, Wq, Wkv, C, Ckv, hs;
    int H, Hkv;
    float scale;
    int dev; /* the operands are on cuda: kernels/dt_attention.cu's dt_k_attention_block_* */
} dt__ablk;

static int dt__ablk_dev(const dt_tensor *t) { return t && t->device != DT_CPU; }

/* Keys the query row i of the block sees: key rows [0, n) of its block. */
static int64_t dt__ablk_nvis(const dt_attn_block *d, int64_t i) {
    int64_t n = d->q_pos + i - d->k_pos + 1; /* positions are < 2^62: no overflow */
    return n < 0 ? 0 : n > d->k_rows ? d->k_rows : n;
}

static dt_status dt__ablk_range(dt_ctx *ctx, const char *fn, const char *what, int64_t row, int64_t rows,
                                int64_t pos, int64_t T) {
    if (row < 0 || rows < 0 || row > T || rows > T - row || pos < 0 || pos > ((int64_t)1 << 62) - rows)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: d.%s_row = %lld, d.%s_rows = %lld, d.%s_pos = %lld; expected "
                                "rows within [0, %lld) and positions in [0, 2^62)", fn, what, (long long)row, what,
                                (long long)rows, what, (long long)pos, (long long)T);
    return DT_OK;
}

static dt_status dt__ablk_check(dt_ctx *ctx, dt__ablk *g, const dt_tensor *out, const dt_tensor *lse,
                                const dt_tensor *q, const dt_tensor *kv, const dt_attn_block *d, const char *fn,
                                const char *on) {
    char s[96];
#ifdef DT_CUDA
    dt_tensor so, sl, sq, sk; /* cpu shadows of cuda tensors, for the checks (the data stays) */
#endif
    if (!d) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: d is NULL", fn);
    if (dt__ablk_dev(out) || dt__ablk_dev(lse) || dt__ablk_dev(q) || dt__ablk_dev(kv)) {
#ifdef DT_CUDA
        const dt_tensor *all[4];
        dt_tensor *sh[4];
        const char *nm[4];
        int k;
        all[0] = out; all[1] = lse; all[2] = q; all[3] = kv;
        sh[0] = &so; sh[1] = &sl; sh[2] = &sq; sh[3] = &sk;
        nm[0] = on; nm[1] = "lse"; nm[2] = "q"; nm[3] = "kv";
        for (k = 0; k < 4; k++) {
            if (!all[k] || all[k]->device != DT_CUDA_DEVICE)
                return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is %s but another operand is on cuda; expected "
                                        "one device", fn, nm[k], all[k] ? dt_device_name(all[k]->device) : "NULL");
            *sh[k] = *all[k];
            sh[k]->device = DT_CPU;
        }
        out = &so; lse = &sl; q = &sq; kv = &sk;
        g->dev = 1;
#else
        return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: CUDA tensors in a build without DT_CUDA", fn);
#endif
    }
    DT__TRY(dt__f32(ctx, q, fn, "q"));
    DT__TRY(dt__f32(ctx, kv, fn, "kv"));
    DT__TRY(dt__f32(ctx, out, fn, on));
    DT__TRY(dt__f32(ctx, lse, fn, "lse"));
    DT__TRY(dt__ndim(ctx, q, 3, 3, fn, "q"));
    DT__TRY(dt__ndim(ctx, kv, 3, 3, fn, "kv"));
    g->H = d->n_head;
    g->Hkv = d->n_kv_head ? d->n_kv_head : d->n_head;
    if (g->H <= 0 || g->Hkv <= 0 || g->H % g->Hkv)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: d.n_head = %d, d.n_kv_head = %d; expected n_head > 0 and "
                                "n_kv_head (0 = n_head) > 0 dividing it", fn, d->n_head, d->n_kv_head);
    g->B = q->shape[0]; g->Tq = q->shape[1]; g->Wq = q->shape[2];
    g->Tk = kv->shape[1]; g->Wkv = kv->shape[2];
    if (kv->shape[0] != g->B)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: kv.shape[0] = %lld; expected q.shape[0] = %lld", fn,
                                (long long)kv->shape[0], (long long)g->B);
    if (g->Wkv % (2 * (int64_t)g->Hkv))
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: kv.shape[2] = %lld; expected 2 x n_kv_head (%d) x head size",
                                fn, (long long)g->Wkv, g->Hkv);
    g->hs = g->Wkv / (2 * (int64_t)g->Hkv);
    g->Ckv = g->Hkv * g->hs;
    g->C = g->H * g->hs; /* <= Wkv x H / 2: fits */
    if (g->C > g->Wq)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: q.shape[2] = %lld; expected >= n_head x head size = %d x %lld",
                                fn, (long long)g->Wq, g->H, (long long)g->hs);
    DT__TRY(dt__ndim(ctx, out, 3, 3, fn, on));
    if (out->shape[0] != g->B || out->shape[1] != g->Tq || out->shape[2] != g->C)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected [%lld, %lld, %lld]", fn, on,
                                dt_shape_str(out, s, sizeof s), (long long)g->B, (long long)g->Tq, (long long)g->C);
    if (lse->ndim != 3 || lse->shape[0] != g->B || lse->shape[1] != g->H || lse->shape[2] != g->Tq)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: lse shape %s; expected [%lld, %d, %lld]", fn,
                                dt_shape_str(lse, s, sizeof s), (long long)g->B, g->H, (long long)g->Tq);
    DT__TRY(dt__ablk_range(ctx, fn, "q", d->q_row, d->q_rows, d->q_pos, g->Tq));
    DT__TRY(dt__ablk_range(ctx, fn, "k", d->k_row, d->k_rows, d->k_pos, g->Tk));
    g->scale = g->hs ? 1.0f / sqrtf((float)g->hs) : 0.0f;
    return DT_OK;
}

/* Merges the block's row (ob [hs], lb) into the held row (o [hs], *l). */
static void dt__ablk_merge(float *o, float *l, const float *ob, float lb, int64_t hs) {
    int64_t c;
    float m, ln, wa, wb;
    if (lb == -INFINITY) return; /* the block gave this row nothing */
    if (*l == -INFINITY) {       /* the first block this row sees: its values as they are */
        memcpy(o, ob, (size_t)hs * sizeof(float));
        *l = lb;
        return;
    }
    m = *l > lb ? *l : lb;
    ln = m + logf(expf(*l - m) + expf(lb - m));
    wa = expf(*l - ln);
    wb = expf(lb - ln);
    for (c = 0; c < hs; c++) o[c] = wa * o[c] + wb * ob[c];
    *l = ln;
}

DT_API dt_status dt_attention_block_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *lse, const dt_tensor *q,
                                        const dt_tensor *kv, const dt_attn_block *d) {
    const char *fn = "dt_attention_block_fwd";
    dt__ablk g;
    int64_t b, r0, i, nmax, need;
    int h;
    float *sc, *ob, *bl;
    if (!ctx) return DT_ERR_ARG;
    memset(&g, 0, sizeof g);
    DT__TRY(dt__ablk_check(ctx, &g, out, lse, q, kv, d, fn, "out"));
    DT__TRY(dt__apart(ctx, out, q, fn, "out", "q"));
    DT__TRY(dt__apart(ctx, out, kv, fn, "out", "kv"));
    DT__TRY(dt__apart(ctx, lse, q, fn, "lse", "q"));
    DT__TRY(dt__apart(ctx, lse, kv, fn, "lse", "kv"));
    DT__TRY(dt__apart(ctx, out, lse, fn, "out", "lse"));
#ifdef DT_CUDA
    if (g.dev) return dt__cu_ablk(ctx, &g, d, out, lse, q, kv, NULL, NULL, NULL, fn);
#endif
    if (!g.B || !d->q_rows || !d->k_rows || !dt__ablk_nvis(d, d->q_rows - 1)) return DT_OK;
    /* past the GEMM's packing: scores [RB, k_rows], the block's output [RB, hs] and lse [RB] */
    if (!dt_mul_ok(DT__ATT_RB, d->k_rows + g.hs + 1, &need) || !dt__scratch(ctx, DT__GEMM_SCRATCH + (size_t)need))
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: no scratch for %d x (k_rows %lld + head size %lld + 1) floats", fn,
                                DT__ATT_RB, (long long)d->k_rows, (long long)g.hs);
    sc = ctx->scratch + DT__GEMM_SCRATCH;
    ob = sc + (size_t)DT__ATT_RB * (size_t)d->k_rows;
    bl = ob + (size_t)DT__ATT_RB * (size_t)g.hs;
    for (b = 0; b < g.B; b++)
        for (h = 0; h < g.H; h++) {
            int hk = h / (g.H / g.Hkv);
            const float *qp = DT__CF(q) + (b * g.Tq + d->q_row) * g.Wq + h * g.hs;
            const float *kp = DT__CF(kv) + (b * g.Tk + d->k_row) * g.Wkv + hk * g.hs, *vp = kp + g.Ckv;
            float *op = DT__F(out) + (b * g.Tq + d->q_row) * g.C + h * g.hs;
            float *lp = DT__F(lse) + (b * g.H + h) * g.Tq + d->q_row;
            for (r0 = 0; r0 < d->q_rows; r0 += DT__ATT_RB) {
                int64_t r1 = d->q_rows - r0 < DT__ATT_RB ? d->q_rows : r0 + DT__ATT_RB;
                nmax = dt__ablk_nvis(d, r1 - 1); /* the rows see prefixes that grow with the row */
                if (!nmax) continue;
                DT__TRY(dt__gemm(ctx, 0, 1, r1 - r0, nmax, g.hs, g.scale, qp + r0 * g.Wq, g.Wq, kp, g.Wkv, 0.0f, sc, nmax));
                for (i = r0; i < r1; i++) {
                    float *row = sc + (i - r0) * nmax, mx = 0;
                    int64_t n = dt__ablk_nvis(d, i);
                    bl[i - r0] = -INFINITY;
                    if (n) {
                        float sum = dt__softmax_row(row, row, n, &mx);
                        bl[i - r0] = mx + logf(sum);
                    }
                    if (n < nmax) memset(row + n, 0, (size_t)(nmax - n) * sizeof(float));
                }
                DT__TRY(dt__gemm(ctx, 0, 0, r1 - r0, g.hs, nmax, 1.0f, sc, nmax, vp, g.Wkv, 0.0f, ob, g.hs));
                for (i = r0; i < r1; i++) dt__ablk_merge(op + i * g.C, lp + i, ob + (i - r0) * g.hs, bl[i - r0], g.hs);
            }
        }
    return DT_OK;
}

DT_API dt_status dt_attention_block_bwd(dt_ctx *ctx, dt_tensor *dq, dt_tensor *dkv, const dt_tensor *dout,
                                        const dt_tensor *q, const dt_tensor *kv, const dt_tensor *out,
                                        const dt_tensor *lse, const dt_attn_block *d) {
    const char *fn = "dt_attention_block_bwd";
    dt__ablk g;
    int64_t b, r0, i, c, nmax, need;
    int h;
    float *sc, *dp;
    if (!ctx) return DT_ERR_ARG;
    memset(&g, 0, sizeof g);
    DT__TRY(dt__ablk_check(ctx, &g, dout, lse, q, kv, d, fn, "dout"));
    {   /* dq and dkv are added into while the rest is read */
        const dt_tensor *in[5];
        const char *in_name[5] = {"dout", "q", "kv", "out", "lse"};
        int k;
        in[0] = dout; in[1] = q; in[2] = kv; in[3] = out; in[4] = lse;
        for (k = 0; k < 5; k++) {
            DT__TRY(dt__apart(ctx, dq, in[k], fn, "dq", in_name[k]));
            DT__TRY(dt__apart(ctx, dkv, in[k], fn, "dkv", in_name[k]));
        }
        DT__TRY(dt__apart(ctx, dq, dkv, fn, "dq", "dkv"));
    }
    if (g.dev) { /* out, dq, dkv on cuda too, checked as their cpu shadows */
        const dt_tensor *all[3];
        const char *nm[3];
        int k;
        all[0] = out; all[1] = dq; all[2] = dkv;
        nm[0] = "out"; nm[1] = "dq"; nm[2] = "dkv";
        for (k = 0; k < 3; k++) {
            dt_tensor sh;
            if (!all[k] && k) continue;
            if (!all[k] || all[k]->device != DT_CUDA_DEVICE)
                return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: %s is %s but dout is on cuda; expected one device", fn,
                                        nm[k], all[k] ? dt_device_name(all[k]->device) : "NULL");
            sh = *all[k];
            sh.device = DT_CPU;
            DT__TRY(dt__f32(ctx, &sh, fn, nm[k]));
            DT__TRY(dt__ndim(ctx, &sh, 3, 3, fn, nm[k]));
            if (sh.shape[0] != g.B || sh.shape[1] != (k == 2 ? g.Tk : g.Tq) ||
                sh.shape[2] != (k == 0 ? g.C : k == 1 ? g.Wq : g.Wkv)) {
                char s[96];
                return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected %s's", fn, nm[k],
                                        dt_shape_str(&sh, s, sizeof s), k == 0 ? "dout" : k == 1 ? "q" : "kv");
            }
        }
#ifdef DT_CUDA
        return dt__cu_ablk(ctx, &g, d, (dt_tensor *)out, (dt_tensor *)lse, q, kv, dq, dkv, dout, fn);
#endif
    }
    DT__TRY(dt__f32(ctx, out, fn, "out"));
    DT__TRY(dt__same(ctx, out, dout, fn, "out", "dout"));
    if (dq) {
        DT__TRY(dt__f32(ctx, dq, fn, "dq"));
        DT__TRY(dt__same(ctx, dq, q, fn, "dq", "q"));
    }
    if (dkv) {
        DT__TRY(dt__f32(ctx, dkv, fn, "dkv"));
        DT__TRY(dt__same(ctx, dkv, kv, fn, "dkv", "kv"));
    }
    if ((!dq && !dkv) || !g.B || !d->q_rows || !d->k_rows || !dt__ablk_nvis(d, d->q_rows - 1)) return DT_OK;
    /* past the GEMM's packing: P [RB, k_rows] and dP, then dS in its place */
    if (!dt_mul_ok(2 * DT__ATT_RB, d->k_rows, &need) || !dt__scratch(ctx, DT__GEMM_SCRATCH + (size_t)need))
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: no scratch for 2 x %d x k_rows %lld floats", fn, DT__ATT_RB,
                                (long long)d->k_rows);
    sc = ctx->scratch + DT__GEMM_SCRATCH;
    dp = sc + (size_t)DT__ATT_RB * (size_t)d->k_rows;
    for (b = 0; b < g.B; b++)
        for (h = 0; h < g.H; h++) {
            int hk = h / (g.H / g.Hkv);
            const float *qp = DT__CF(q) + (b * g.Tq + d->q_row) * g.Wq + h * g.hs;
            const float *kp = DT__CF(kv) + (b * g.Tk + d->k_row) * g.Wkv + hk * g.hs, *vp = kp + g.Ckv;
            const float *go = DT__CF(dout) + (b * g.Tq + d->q_row) * g.C + h * g.hs;
            const float *oo = DT__CF(out) + (b * g.Tq + d->q_row) * g.C + h * g.hs;
            const float *lp = DT__CF(lse) + (b * g.H + h) * g.Tq + d->q_row;
            for (r0 = 0; r0 < d->q_rows; r0 += DT__ATT_RB) {
                int64_t r1 = d->q_rows - r0 < DT__ATT_RB ? d->q_rows : r0 + DT__ATT_RB, rb = r1 - r0;
                nmax = dt__ablk_nvis(d, r1 - 1);
                if (!nmax) continue;
                DT__TRY(dt__gemm(ctx, 0, 1, rb, nmax, g.hs, g.scale, qp + r0 * g.Wq, g.Wq, kp, g.Wkv, 0.0f, sc, nmax));
                DT__TRY(dt__gemm(ctx, 0, 1, rb, nmax, g.hs, 1.0f, go + r0 * g.C, g.C, vp, g.Wkv, 0.0f, dp, nmax));
                for (i = r0; i < r1; i++) { /* P = exp(S - lse); dS = P (dP - D) scale, D = dO . O */
                    float *pr = sc + (i - r0) * nmax, *dr = dp + (i - r0) * nmax;
                    int64_t n = dt__ablk_nvis(d, i);
                    double D = 0;
                    dt__v4 lv, Dv, sv = dt__v_set(g.scale);
                    for (c = 0; c < g.hs; c++) D += (double)go[i * g.C + c] * (double)oo[i * g.C + c];
                    lv = dt__v_set(lp[i]);
                    Dv = dt__v_set((float)D);
                    DT__ROW_LOOP(c, n, 4, {
                        dt__v4 p = dt__v_exp(dt__v_sub(dt__v_ld(pr, c, n, -INFINITY), lv));
                        dt__v_st(dr, c, n, dt__v_mul(dt__v_mul(p, dt__v_sub(dt__v_ld(dr, c, n, 0.0f), Dv)), sv));
                        dt__v_st(pr, c, n, p);
                    });
                    if (n < nmax) {
                        memset(pr + n, 0, (size_t)(nmax - n) * sizeof(float));
                        memset(dr + n, 0, (size_t)(nmax - n) * sizeof(float));
                    }
                }
                if (dq) DT__TRY(dt__gemm(ctx, 0, 0, rb, g.hs, nmax, 1.0f, dp, nmax, kp, g.Wkv, 1.0f,
                                         DT__F(dq) + (b * g.Tq + d->q_row + r0) * g.Wq + h * g.hs, g.Wq));
                if (dkv) {
                    float *dkp = DT__F(dkv) + (b * g.Tk + d->k_row) * g.Wkv + hk * g.hs;
                    DT__TRY(dt__gemm(ctx, 1, 0, nmax, g.hs, rb, 1.0f, dp, nmax, qp + r0 * g.Wq, g.Wq, 1.0f, dkp, g.Wkv));
                    DT__TRY(dt__gemm(ctx, 1, 0, nmax, g.hs, rb, 1.0f, sc, nmax, go + r0 * g.C, g.C, 1.0f, dkp + g.Ckv,
                                     g.Wkv));
                }
            }
        }
    return DT_OK;
}

/* ---------------------------------------------------------------- DLRM dot interaction */

static dt_status dt__dot_check(dt_ctx *ctx, const dt_tensor *out, const dt_tensor *dense, const dt_tensor *emb,
                               const char *fn, const char *on) {
    int64_t B, F, D;
    DT__TRY(dt__f32(ctx, dense, fn, "dense"));
    DT__TRY(dt__f32(ctx, emb, fn, "emb"));
    DT__TRY(dt__f32(ctx, out, fn, on));
    DT__TRY(dt__ndim(ctx, dense, 2, 2, fn, "dense"));
    DT__TRY(dt__ndim(ctx, emb, 3, 3, fn, "emb"));
    DT__TRY(dt__ndim(ctx, out, 2, 2, fn, on));
    B = dense->shape[0]; D = dense->shape[1]; F = emb->shape[1];
    DT__TRY(dt__dim(ctx, emb->shape[0], B, fn, "emb.shape[0]", "dense.shape[0]"));
    DT__TRY(dt__dim(ctx, emb->shape[2], D, fn, "emb.shape[2]", "dense.shape[1]"));
    DT__TRY(dt__dim(ctx, out->shape[0], B, fn, "out.shape[0]", "dense.shape[0]"));
    if (F >= 4294967296LL) /* (F+1)F/2 must fit in int64 */
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: emb.shape[1] = %lld features; expected < 2^32", fn, (long long)F);
    if ((F + 1) * F / 2 > INT64_MAX - D)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: D + (F+1)F/2 overflows int64", fn);
    return dt__dim(ctx, out->shape[1], D + (F + 1) * F / 2, fn, "out.shape[1]", "D + (F+1)F/2");
}

static const float *dt__dot_vec(const dt_tensor *dense, const dt_tensor *emb, int64_t b, int64_t i) {
    int64_t D = dense->shape[1], F = emb->shape[1];
    return i == 0 ? DT__CF(dense) + b * D : DT__CF(emb) + (b * F + i - 1) * D;
}

/* Both directions run on 4-lane vectors (dt__v4) with the scalar code's operations and order
   per element, so SSE2 and DT_TENSOR_NO_SIMD give the same bits as the plain loops they
   replaced. The forward's dot <T_i,T_j> is a sequential sum over d (s = 0; s += x_d y_d): the
   lanes hold four pairs (j..j+3) at once, reading T transposed ([D][P], P = F+1 rounded up to
   4, the padding 0) from the ctx scratch, and two rows i, i+1 run together (dt__dot_rows). The
   backward sums each vector's gradient in registers (dt__dot_grad below): the lanes hold four
   elements d, two vectors k, k+1 at a time. Each sum is a chain of dependent adds, so what
   bounds both directions is the adder's latency, not its throughput: eight chains side by side
   (two rows or vectors x four 4-lane vectors) keep the adders busy where two or four waited
   (DLRM's F 26, D 16: forward + backward were 23% of a 1-rank step, perf). */

/* Rows i and i + 1 of the pairs: o[j] = <x, T_j> for j < n, o2[j] = <x2, T_j> for j < n2 (n2 = n + 1,
   or 0 for no second row: o2, x2 any valid pointers then, nothing is stored). Sixteen pairs of
   both rows at a time (eight sums), then eight, then four; lanes past a row's end are computed
   from T's columns (or its zero padding) and not stored. */
static void dt__dot_rows(float *o, float *o2, const float *x, const float *x2, const float *T, int64_t P, int64_t D,
                         int64_t n, int64_t n2) {
    int64_t j = 0, d, m = n2 > n ? n2 : n;
    for (; j + 12 < m; j += 16) {
        dt__v4 a0 = dt__v_set(0.0f), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (d = 0; d < D; d++) {
            const float *t = T + d * P + j;
            dt__v4 xd = dt__v_set(x[d]), yd = dt__v_set(x2[d]), t0 = dt__v_load(t), t1 = dt__v_load(t + 4),
                   t2 = dt__v_load(t + 8), t3 = dt__v_load(t + 12);
            a0 = dt__v_add(a0, dt__v_mul(xd, t0)); b0 = dt__v_add(b0, dt__v_mul(yd, t0));
            a1 = dt__v_add(a1, dt__v_mul(xd, t1)); b1 = dt__v_add(b1, dt__v_mul(yd, t1));
            a2 = dt__v_add(a2, dt__v_mul(xd, t2)); b2 = dt__v_add(b2, dt__v_mul(yd, t2));
            a3 = dt__v_add(a3, dt__v_mul(xd, t3)); b3 = dt__v_add(b3, dt__v_mul(yd, t3));
        }
        dt__v_st(o, j, n, a0); dt__v_st(o, j + 4, n, a1); dt__v_st(o, j + 8, n, a2); dt__v_st(o, j + 12, n, a3);
        dt__v_st(o2, j, n2, b0); dt__v_st(o2, j + 4, n2, b1); dt__v_st(o2, j + 8, n2, b2); dt__v_st(o2, j + 12, n2, b3);
    }
    for (; j + 4 < m; j += 8) {
        dt__v4 a0 = dt__v_set(0.0f), a1 = a0, b0 = a0, b1 = a0;
        for (d = 0; d < D; d++) {
            const float *t = T + d * P + j;
            dt__v4 xd = dt__v_set(x[d]), yd = dt__v_set(x2[d]), t0 = dt__v_load(t), t1 = dt__v_load(t + 4);
            a0 = dt__v_add(a0, dt__v_mul(xd, t0)); b0 = dt__v_add(b0, dt__v_mul(yd, t0));
            a1 = dt__v_add(a1, dt__v_mul(xd, t1)); b1 = dt__v_add(b1, dt__v_mul(yd, t1));
        }
        dt__v_st(o, j, n, a0); dt__v_st(o, j + 4, n, a1);
        dt__v_st(o2, j, n2, b0); dt__v_st(o2, j + 4, n2, b1);
    }
    if (j < m) { /* the last four pairs or fewer */
        dt__v4 a = dt__v_set(0.0f), b = a;
        for (d = 0; d < D; d++) {
            dt__v4 t = dt__v_load(T + d * P + j);
            a = dt__v_add(a, dt__v_mul(dt__v_set(x[d]), t));
            b = dt__v_add(b, dt__v_mul(dt__v_set(x2[d]), t));
        }
        dt__v_st(o, j, n, a);
        dt__v_st(o2, j, n2, b);
    }
}

DT_API dt_status dt_dot_interaction_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *dense, const dt_tensor *emb) {
    int64_t B, F, D, W, P, b, i, j, d, np;
    float *T;
    if (!ctx) return DT_ERR_ARG;
#ifdef DT_CUDA
    if (dt__cu(out) || dt__cu(dense) || dt__cu(emb)) {
        DT__TRY(dt__apart(ctx, out, dense, "dt_dot_interaction_fwd", "out", "dense"));
        DT__TRY(dt__apart(ctx, out, emb, "dt_dot_interaction_fwd", "out", "emb"));
        return dt__cu_dot(ctx, out, NULL, NULL, dense, emb, 0);
    }
#endif
    DT__TRY(dt__dot_check(ctx, out, dense, emb, "dt_dot_interaction_fwd", "out"));
    DT__TRY(dt__apart(ctx, out, dense, "dt_dot_interaction_fwd", "out", "dense"));
    DT__TRY(dt__apart(ctx, out, emb, "dt_dot_interaction_fwd", "out", "emb"));
    B = dense->shape[0]; D = dense->shape[1]; F = emb->shape[1]; W = out->shape[1];
    if (B == 0) return DT_OK;
    P = (F + 1 + 3) / 4 * 4;
    if (!dt_mul_ok(P, D, &np) || np > (int64_t)(SIZE_MAX / sizeof(float)) - 1)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "dt_dot_interaction_fwd: (F+1) x D = %lld x %lld overflows",
                                (long long)(F + 1), (long long)D);
    if (!(T = dt__scratch(ctx, (size_t)np + 1))) return DT_ERR_OOM;
    for (d = 0; d < D; d++)
        for (j = F + 1; j < P; j++) T[d * P + j] = 0.0f;
    for (b = 0; b < B; b++) {
        float *o = DT__F(out) + b * W;
        memcpy(o, DT__CF(dense) + b * D, (size_t)D * sizeof(float));
        o += D;
        for (j = 0; j <= F; j++) {
            const float *y = dt__dot_vec(dense, emb, b, j);
            for (d = 0; d < D; d++) T[d * P + j] = y[d];
        }
        for (i = 1; i <= F; i += 2) { /* row i's i pairs at o, then row i + 1's i + 1 */
            const float *x = dt__dot_vec(dense, emb, b, i);
            if (i < F) dt__dot_rows(o, o + i, x, dt__dot_vec(dense, emb, b, i + 1), T, P, D, i, i + 1);
            else dt__dot_rows(o, o, x, x, T, P, D, i, 0);
            o += i < F ? 2 * i + 1 : i;
        }
    }
    return DT_OK;
}

/* The gradient of vector k (0: the bottom MLP's output, k >= 1: feature k's pooled vector):
   G_k += sum over m = 0..F, m != k, of S_km v_m, with S_km the output gradient of the pair
   (max(k, m), min(k, m)), gathered into s[0..F] first. The pair loop this replaced (i > j:
   G_i += s v_j, G_j += s v_i, i then j ascending) reached G_k in ascending m, so the sum runs in
   that order per element, here in registers: four 4-lane accumulators over 16 elements (then
   one over 4, then scalars), each element's f32 operations those of the pair loop (acc + s * v),
   G_k loaded and stored once instead of once per pair. db, eb: the sample's dense vector and its
   F pooled vectors; d0: the first element to do (those before it are done). */
#define DT__DOT_V(m) ((m) ? eb + ((m) - 1) * D : db)
static void dt__dot_grad(float *gk, const float *s, const float *db, const float *eb, int64_t k, int64_t F,
                         int64_t D, int64_t d0) {
    int64_t d = d0, m;
    for (; d + 16 <= D; d += 16) {
        dt__v4 a0 = dt__v_load(gk + d), a1 = dt__v_load(gk + d + 4), a2 = dt__v_load(gk + d + 8),
               a3 = dt__v_load(gk + d + 12);
        for (m = 0; m <= F; m++) {
            const float *y = DT__DOT_V(m) + d;
            dt__v4 sm = dt__v_set(s[m]);
            if (m == k) continue;
            a0 = dt__v_add(a0, dt__v_mul(sm, dt__v_load(y)));
            a1 = dt__v_add(a1, dt__v_mul(sm, dt__v_load(y + 4)));
            a2 = dt__v_add(a2, dt__v_mul(sm, dt__v_load(y + 8)));
            a3 = dt__v_add(a3, dt__v_mul(sm, dt__v_load(y + 12)));
        }
        dt__v_store(gk + d, a0); dt__v_store(gk + d + 4, a1); dt__v_store(gk + d + 8, a2); dt__v_store(gk + d + 12, a3);
    }
    for (; d + 4 <= D; d += 4) {
        dt__v4 a = dt__v_load(gk + d);
        for (m = 0; m <= F; m++)
            if (m != k) a = dt__v_add(a, dt__v_mul(dt__v_set(s[m]), dt__v_load(DT__DOT_V(m) + d)));
        dt__v_store(gk + d, a);
    }
    for (; d < D; d++) {
        float a = gk[d];
        for (m = 0; m <= F; m++)
            if (m != k) a += s[m] * DT__DOT_V(m)[d];
        gk[d] = a;
    }
}

/* G_k and G_{k+1} (gk, gk2; their gathered gradients s, s2) together: each load of v_m feeds
   both, eight sums side by side over 16 elements (then two over 4); each sum's terms in
   dt__dot_grad's order (ascending m, its own k skipped: m < k feeds both, m = k only G_{k+1},
   m = k + 1 only G_k, then both again). The last D mod 4 elements go to dt__dot_grad. */
#define DT__DOT_TERM(acc, sx, y, NV)                                                                       \
    do {                                                                                                   \
        acc##0 = dt__v_add(acc##0, dt__v_mul(sx, dt__v_load(y)));                                         \
        if (NV > 1) {                                                                                      \
            acc##1 = dt__v_add(acc##1, dt__v_mul(sx, dt__v_load((y) + 4)));                               \
            acc##2 = dt__v_add(acc##2, dt__v_mul(sx, dt__v_load((y) + 8)));                               \
            acc##3 = dt__v_add(acc##3, dt__v_mul(sx, dt__v_load((y) + 12)));                              \
        }                                                                                                  \
    } while (0)
#define DT__DOT_PAIR_BLOCK(NV)                                                                             \
    do {                                                                                                   \
        for (m = 0; m <= F; m++) {                                                                         \
            const float *y = DT__DOT_V(m) + d;                                                            \
            if (m != k) DT__DOT_TERM(a, dt__v_set(s[m]), y, NV);                                          \
            if (m != k + 1) DT__DOT_TERM(b, dt__v_set(s2[m]), y, NV);                                     \
        }                                                                                                  \
    } while (0)
static void dt__dot_grad2(float *gk, float *gk2, const float *s, const float *s2, const float *db, const float *eb,
                          int64_t k, int64_t F, int64_t D) {
    int64_t d = 0, m;
    for (; d + 16 <= D; d += 16) {
        dt__v4 a0 = dt__v_load(gk + d), a1 = dt__v_load(gk + d + 4), a2 = dt__v_load(gk + d + 8),
               a3 = dt__v_load(gk + d + 12), b0 = dt__v_load(gk2 + d), b1 = dt__v_load(gk2 + d + 4),
               b2 = dt__v_load(gk2 + d + 8), b3 = dt__v_load(gk2 + d + 12);
        DT__DOT_PAIR_BLOCK(4);
        dt__v_store(gk + d, a0); dt__v_store(gk + d + 4, a1); dt__v_store(gk + d + 8, a2); dt__v_store(gk + d + 12, a3);
        dt__v_store(gk2 + d, b0); dt__v_store(gk2 + d + 4, b1); dt__v_store(gk2 + d + 8, b2);
        dt__v_store(gk2 + d + 12, b3);
    }
    for (; d + 4 <= D; d += 4) {
        dt__v4 a0 = dt__v_load(gk + d), b0 = dt__v_load(gk2 + d), a1 = a0, a2 = a0, a3 = a0, b1 = b0, b2 = b0, b3 = b0;
        DT__DOT_PAIR_BLOCK(1);
        (void)a1; (void)a2; (void)a3; (void)b1; (void)b2; (void)b3;
        dt__v_store(gk + d, a0); dt__v_store(gk2 + d, b0);
    }
    if (d < D) {
        dt__dot_grad(gk, s, db, eb, k, F, D, d);
        dt__dot_grad(gk2, s2, db, eb, k + 1, F, D, d);
    }
}
#undef DT__DOT_PAIR_BLOCK
#undef DT__DOT_TERM
#undef DT__DOT_V

/* s[0..F]: the output gradients of vector k's pairs, gathered from the sample's pair gradients
   sg; s[k] = 0 (not read). */
static void dt__dot_gather(float *s, const float *sg, int64_t k, int64_t F) {
    int64_t m;
    for (m = 0; m < k; m++) s[m] = sg[k * (k - 1) / 2 + m];
    for (m = k + 1; m <= F; m++) s[m] = sg[m * (m - 1) / 2 + k];
    s[k] = 0.0f;
}

DT_API dt_status dt_dot_interaction_bwd(dt_ctx *ctx, dt_tensor *ddense, dt_tensor *demb, const dt_tensor *dout,
                                        const dt_tensor *dense, const dt_tensor *emb) {
    const char *fn = "dt_dot_interaction_bwd";
    int64_t B, F, D, W, b, k, d;
    float *s;
    if (!ctx) return DT_ERR_ARG;
    {   /* ddense and demb are added into while dout, dense and emb are read */
        const dt_tensor *in[3];
        const char *in_name[3] = {"dout", "dense", "emb"};
        int i;
        in[0] = dout; in[1] = dense; in[2] = emb;
        for (i = 0; i < 3; i++) {
            DT__TRY(dt__apart(ctx, ddense, in[i], fn, "ddense", in_name[i]));
            DT__TRY(dt__apart(ctx, demb, in[i], fn, "demb", in_name[i]));
        }
        DT__TRY(dt__apart(ctx, ddense, demb, fn, "ddense", "demb"));
    }
#ifdef DT_CUDA
    if (dt__cu(ddense) || dt__cu(demb) || dt__cu(dout) || dt__cu(dense) || dt__cu(emb))
        return dt__cu_dot(ctx, ddense, demb, dout, dense, emb, 1);
#endif
    DT__TRY(dt__dot_check(ctx, dout, dense, emb, fn, "dout"));
    if (ddense) { DT__TRY(dt__f32(ctx, ddense, fn, "ddense")); DT__TRY(dt__same(ctx, ddense, dense, fn, "ddense", "dense")); }
    if (demb) { DT__TRY(dt__f32(ctx, demb, fn, "demb")); DT__TRY(dt__same(ctx, demb, emb, fn, "demb", "emb")); }
    B = dense->shape[0]; D = dense->shape[1]; F = emb->shape[1]; W = dout->shape[1];
    if (B == 0 || (!ddense && !demb)) return DT_OK;
    if (!(s = dt__scratch(ctx, 2 * (size_t)F + 2))) return DT_ERR_OOM;
    for (b = 0; b < B; b++) {
        const float *g = DT__CF(dout) + b * W, *sg = g + D, *db = DT__CF(dense) + b * D, *eb = DT__CF(emb) + b * F * D;
        int64_t k1 = demb ? F : 0;
        if (ddense) /* the pass-through of the dense vector comes first, then its pairs */
            for (d = 0; d < D; d++) DT__F(ddense)[b * D + d] += g[d];
        for (k = ddense ? 0 : 1; k <= k1; k += 2) { /* vectors k and k + 1 together (while k + 1 <= k1) */
            float *gk = k ? DT__F(demb) + (b * F + k - 1) * D : DT__F(ddense) + b * D;
            dt__dot_gather(s, sg, k, F);
            if (k < k1) {
                dt__dot_gather(s + F + 1, sg, k + 1, F);
                dt__dot_grad2(gk, DT__F(demb) + (b * F + k) * D, s, s + F + 1, db, eb, k, F, D);
            } else dt__dot_grad(gk, s, db, eb, k, F, D, 0);
        }
    }
    return DT_OK;
}

#ifdef DT_CUDA
/* ---------------------------------------------------------------- CUDA paths (see "CUDA dispatch") */

#define DT__CU_SH(name, t, arg) dt_tensor name##_s; const dt_tensor *name; DT__TRY(dt__cu_shadow(ctx, &name##_s, &name, t, fn, arg))
#define DT__CU_F(t) ((float *)(t)->data)

static dt_status dt__cu_matmul_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *a, const dt_tensor *b, int ta, int tb,
                                   float alpha, float beta) {
    const char *fn = "dt_matmul_fwd";
    dt__mm m;
    DT__CU_SH(so, out, "out");
    DT__CU_SH(sa, a, "a");
    DT__CU_SH(sb, b, "b");
    if (!so || !sa || !sb) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out, a and b must be non-NULL", fn);
    DT__TRY(dt__mm_shapes(ctx, &m, so, sa, sb, ta, tb, fn));
    DT__TRY(dt__cu_blas(ctx, fn));
    return dt__cu_status(ctx, dt_k_matmul_fwd(ctx->cublas, DT__CU_F(out), a->data, b->data, 1, m.batch, m.M, m.N, m.K,
                                              ta, tb, m.sa, m.sb, m.sc, alpha, beta, ctx->tf32, ctx->cuda_stream),
                         fn, "dt_k_matmul_fwd");
}

static dt_status dt__cu_matmul_bwd(dt_ctx *ctx, dt_tensor *da, dt_tensor *db, const dt_tensor *dout, const dt_tensor *a,
                                   const dt_tensor *b, int ta, int tb, float alpha) {
    const char *fn = "dt_matmul_bwd";
    dt__mm m;
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sa, a, "a");
    DT__CU_SH(sb, b, "b");
    DT__CU_SH(sda, da, "da");
    DT__CU_SH(sdb, db, "db");
    if (!sg || !sa || !sb) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dout, a and b must be non-NULL", fn);
    DT__TRY(dt__mm_shapes(ctx, &m, (dt_tensor *)sg, sa, sb, ta, tb, fn));
    if (sda) { DT__TRY(dt__f32(ctx, sda, fn, "da")); DT__TRY(dt__same(ctx, sda, sa, fn, "da", "a")); }
    if (sdb) { DT__TRY(dt__f32(ctx, sdb, fn, "db")); DT__TRY(dt__same(ctx, sdb, sb, fn, "db", "b")); }
    if (!da && !db) return DT_OK;
    DT__TRY(dt__cu_blas(ctx, fn));
    return dt__cu_status(ctx, dt_k_matmul_bwd(ctx->cublas, da ? DT__CU_F(da) : NULL, db ? DT__CU_F(db) : NULL,
                                              (const float *)dout->data, (const float *)a->data,
                                              (const float *)b->data, m.batch, m.M, m.N, m.K, ta, tb, m.sa, m.sb,
                                              alpha, ctx->tf32, ctx->cuda_stream),
                         fn, "dt_k_matmul_bwd");
}

/* A bf16 weight (CUDA): the GEMMs run on the tensor cores in bf16 with f32 accumulation and f32
   outputs (cublasGemmEx), their f32 operands (x, dout) rounded to bf16 into ctx scratch first,
   as an autocast does (dt__bf16_w gives the checks w's shape as f32). */
static void *dt__cu_to_bf16(dt_ctx *ctx, const dt_tensor *t, const char *fn) {
    void *p = dt_cuda_scratch(ctx, (size_t)t->numel * 2, fn);
    if (p && dt__cu_status(ctx, dt_k_tensor_cast(p, DT_BF16, t->data, DT_F32, t->numel, ctx->cuda_stream), fn,
                           "dt_k_tensor_cast"))
        return NULL;
    return p;
}

/* out[N,O] = x[N,I] w[O,I]^T + bias; with pre (dt_linear_gelu_fwd): pre = that, out = gelu(pre).
   With a bias or a GELU, one cuBLASLt GEMM whose epilogue adds the bias and applies the GELU
   (writing pre beside out); where cuBLASLt has no algorithm for it (the GELU's input needs O % 8
   == 0), and without either, the plain GEMM and then the bias and GELU kernels. A bf16 w may come
   with a bf16 x (read as it is) and a bf16 out and pre (cuBLASLt writes them from its f32 values,
   the bias read in bf16 beside them; the separate ops: the GEMM into f32 scratch, the bias
   rounded to bf16, the GELU in f32, then each output rounded once, as dt__linear_bf16_out). */
static dt_status dt__cu_linear_fwd_ep(dt_ctx *ctx, dt_tensor *out, dt_tensor *pre, const dt_tensor *x,
                                      const dt_tensor *w, const dt_tensor *bias, const char *fn) {
    int64_t N, In, Out;
    dt_tensor wf, xt, yt, ot;
    const dt_tensor *xs, *ys;
    int bf, ob, dt_in, k = DT_K_NO_ALGO;
    size_t mark;
    const void *xa, *ba;
    float *lin, *rb;
    dt_status st = DT_OK;
    DT__CU_SH(so, out, "out");
    DT__CU_SH(sp, pre, "pre");
    DT__CU_SH(sx, x, "x");
    DT__CU_SH(sw, w, "w");
    DT__CU_SH(sbias, bias, "bias");
    if (!so || !sx || !sw) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out, x and w must be non-NULL", fn);
    bf = dt__bf16_w(sw, &wf);
    DT__TRY(dt__linear_dtypes(ctx, sw, sx, sp ? sp : so, sp ? so : NULL, fn, sp ? "pre" : "out", &xt, &yt, &xs, &ys));
    DT__TRY(dt__linear_check(ctx, ys, xs, bf ? &wf : sw, sbias, fn, sp ? "pre" : "out"));
    if (sp) {
        DT__TRY(dt__f32(ctx, dt__bf16_as_f32(so, bf, &ot), fn, "out"));
        DT__TRY(dt__same_numel(ctx, so, sp, fn, "out", "pre"));
    }
    ob = so->dtype == DT_BF16;
    N = dt__rows(x); In = w->shape[1]; Out = w->shape[0];
    DT__TRY(dt__cu_blas(ctx, fn));
    mark = dt_cuda_scratch_begin(ctx);
    dt_in = bf ? DT_BF16 : 1;
    xa = x->data;
    ba = bias ? bias->data : NULL;
    if (bf && x->dtype != DT_BF16 && !(xa = dt__cu_to_bf16(ctx, x, fn))) st = ctx->last_status;
    if (!st && ob && bias && !(ba = dt__cu_to_bf16(ctx, bias, fn))) st = ctx->last_status; /* beside a bf16 D */
    if (!st && (bias || pre || ob)) {
        k = dt_k_linear_lt_fwd(ctx->cublaslt, out->data, pre ? pre->data : NULL, xa, w->data, ba, dt_in,
                               ob ? DT_BF16 : 1, N, Out, In, bf ? 0 : ctx->tf32, ctx->cublas_workspace,
                               ctx->cublas_workspace_bytes, ctx->cuda_stream);
        if (k != DT_K_NO_ALGO) st = dt__cu_status(ctx, k, fn, "dt_k_linear_lt_fwd");
        if (bias || pre) {
            if (k == 0 && Out > 0) ctx->counters.lt_fused++; /* Out 0: nothing ran */
            if (k == DT_K_NO_ALGO) ctx->counters.lt_separate++;
        }
    }
    if (!st && k == DT_K_NO_ALGO) {
        /* what the GEMM and the bias make: pre or out, or under ob f32 scratch */
        lin = ob ? (float *)dt_cuda_scratch(ctx, (size_t)N * (size_t)Out * sizeof(float), fn) : DT__CU_F(pre ? pre : out);
        rb = ob && bias ? (float *)dt_cuda_scratch(ctx, (size_t)Out * sizeof(float), fn) : NULL;
        if (!lin || (ob && bias && !rb)) st = ctx->last_status;
        if (!st && rb) /* the bias as the epilogue reads it beside a bf16 D */
            st = dt__cu_status(ctx, dt_k_tensor_cast(rb, DT_F32, ba, DT_BF16, Out, ctx->cuda_stream), fn,
                               "dt_k_tensor_cast");
        if (!st)
            st = dt__cu_status(ctx, dt_k_matmul_fwd(ctx->cublas, lin, xa, w->data, dt_in, 1, N, Out, In, 0, 1, 0, 0, 0,
                                                    1.0f, 0.0f, bf ? 0 : ctx->tf32, ctx->cuda_stream),
                               fn, "dt_k_matmul_fwd");
        if (!st && bias)
            st = dt__cu_status(ctx, dt_k_bias_add_fwd(lin, rb ? rb : (const float *)bias->data, N, Out,
                                                      ctx->cuda_stream), fn, "dt_k_bias_add_fwd");
        if (!st && ob && pre)
            st = dt__cu_status(ctx, dt_k_tensor_cast(pre->data, DT_BF16, lin, DT_F32, N * Out, ctx->cuda_stream), fn,
                               "dt_k_tensor_cast");
        if (!st && pre)
            st = dt__cu_status(ctx, dt_k_gelu_fwd_t(out->data, ob ? DT_BF16 : 1, lin, 1, N * Out, ctx->cuda_stream),
                               fn, "dt_k_gelu_fwd_t");
        else if (!st && ob)
            st = dt__cu_status(ctx, dt_k_tensor_cast(out->data, DT_BF16, lin, DT_F32, N * Out, ctx->cuda_stream), fn,
                               "dt_k_tensor_cast");
    }
    dt_cuda_scratch_end(ctx, mark);
    return st;
}

static dt_status dt__cu_linear_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *x, const dt_tensor *w,
                                   const dt_tensor *bias) {
    return dt__cu_linear_fwd_ep(ctx, out, NULL, x, w, bias, "dt_linear_fwd");
}

/* dbias[C] += column sums of dout[R, C] (f32, or bf16: widened into the ctx's scratch first);
   the kernels' partials in the ctx's scratch. */
static dt_status dt__cu_bias_bwd(dt_ctx *ctx, float *dbias, const void *dout, dt_dtype dtype, int64_t R, int64_t C,
                                 const char *fn) {
    size_t mark = dt_cuda_scratch_begin(ctx), bytes = dt_k_bias_add_bwd_scratch(R, C);
    void *part = bytes ? dt_cuda_scratch(ctx, bytes, fn) : NULL, *g = NULL;
    dt_status st = bytes && !part ? ctx->last_status : DT_OK;
    if (!st && dtype == DT_BF16 && R * C > 0) { /* R * C: a tensor's numel */
        if (!(g = dt_cuda_scratch(ctx, (size_t)(R * C) * sizeof(float), fn))) st = ctx->last_status;
        else st = dt__cu_status(ctx, dt_k_tensor_cast(g, DT_F32, dout, DT_BF16, R * C, ctx->cuda_stream), fn,
                                "dt_k_tensor_cast");
        dout = g;
    }
    if (!st)
        st = dt__cu_status(ctx, dt_k_bias_add_bwd(dbias, (const float *)dout, R, C, part, ctx->cuda_stream), fn,
                           "dt_k_bias_add_bwd");
    dt_cuda_scratch_end(ctx, mark);
    return st;
}

static dt_status dt__cu_linear_bwd(dt_ctx *ctx, dt_tensor *dx, dt_tensor *dw, dt_tensor *dbias, const dt_tensor *dout,
                                   const dt_tensor *x, const dt_tensor *w) {
    const char *fn = "dt_linear_bwd";
    int64_t N, In, Out;
    dt_tensor wf, xt, yt, dxt;
    const dt_tensor *xs, *ys;
    int bf, dt_in, k = DT_K_NO_ALGO; /* k: the fused dw + dbias GEMM's status */
    size_t mark;
    const void *g, *xa, *wa;
    dt_status st = DT_OK;
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sx, x, "x");
    DT__CU_SH(sw, w, "w");
    DT__CU_SH(sdx, dx, "dx");
    DT__CU_SH(sdw, dw, "dw");
    DT__CU_SH(sdb, dbias, "dbias");
    if (!sg || !sx || !sw) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dout, x and w must be non-NULL", fn);
    bf = dt__bf16_w(sw, &wf);
    DT__TRY(dt__linear_dtypes(ctx, sw, sx, sg, NULL, fn, "dout", &xt, &yt, &xs, &ys));
    DT__TRY(dt__linear_grad_dtype(ctx, sdx, bf, fn));
    DT__TRY(dt__linear_check(ctx, ys, xs, bf ? &wf : sw, NULL, fn, "dout"));
    N = dt__rows(x); In = w->shape[1]; Out = w->shape[0];
    if (sdx) {
        DT__TRY(dt__f32(ctx, dt__bf16_as_f32(sdx, bf, &dxt), fn, "dx"));
        DT__TRY(dt__same_numel(ctx, sdx, xs, fn, "dx", "x"));
    }
    if (sdw) { DT__TRY(dt__f32(ctx, sdw, fn, "dw")); DT__TRY(dt__same(ctx, sdw, bf ? &wf : sw, fn, "dw", "w")); }
    if (sdb) { DT__TRY(dt__f32(ctx, sdb, fn, "dbias")); DT__TRY(dt__dim(ctx, sdb->numel, Out, fn, "dbias numel", "w.shape[0]")); }
    if (dx || dw) DT__TRY(dt__cu_blas(ctx, fn));
    /* a bf16 w: an f32 dout (and x, for dw) rounded to bf16 in scratch, the GEMMs bf16 in, f32
       out (a bf16 dx: its value plus the f32 sum, rounded once, cuBLAS's beta 1 on a bf16 C) */
    mark = dt_cuda_scratch_begin(ctx);
    dt_in = bf ? DT_BF16 : 1;
    g = dout->data, xa = x->data, wa = w->data;
    if (bf && (dx || dw) && dout->dtype != DT_BF16 && !(g = dt__cu_to_bf16(ctx, dout, fn))) st = ctx->last_status;
    if (!st && bf && dw && x->dtype != DT_BF16 && !(xa = dt__cu_to_bf16(ctx, x, fn))) st = ctx->last_status;
    if (!st && dx) /* dx += dout w */
        st = dt__cu_status(ctx, dt_k_matmul_fwd_t(ctx->cublas, dx->data, (int)dx->dtype, g, wa, dt_in, 1, N, In, Out, 0,
                                                  0, 0, 0, 0, 1.0f, 1.0f, bf ? 0 : ctx->tf32, ctx->cuda_stream),
                           fn, "dt_k_matmul_fwd_t");
    if (!st && dw && dbias) { /* dw += dout^T x, the bias gradient from its epilogue (into scratch: it is
                                 written, and dbias accumulates) */
        float *db = (float *)dt_cuda_scratch(ctx, (size_t)Out * sizeof(float), fn);
        if (!db) st = ctx->last_status;
        else {
            k = dt_k_linear_lt_dw(ctx->cublaslt, DT__CU_F(dw), db, g, xa, dt_in, N, Out, In, bf ? 0 : ctx->tf32,
                                  ctx->cublas_workspace, ctx->cublas_workspace_bytes, ctx->cuda_stream);
            if (k != DT_K_NO_ALGO) st = dt__cu_status(ctx, k, fn, "dt_k_linear_lt_dw");
            if (k == 0 && Out > 0) ctx->counters.lt_fused++; /* Out 0: nothing ran */
            if (k == DT_K_NO_ALGO) ctx->counters.lt_separate++;
            if (!st && k == 0)
                st = dt__cu_status(ctx, dt_k_axpy(DT__CU_F(dbias), 1.0f, db, Out, ctx->cuda_stream), fn, "dt_k_axpy");
        }
    }
    if (!st && dw && k == DT_K_NO_ALGO) /* dw += dout^T x */
        st = dt__cu_status(ctx, dt_k_matmul_fwd(ctx->cublas, DT__CU_F(dw), g, xa, dt_in, 1, Out, In, N, 1, 0, 0, 0, 0,
                                                1.0f, 1.0f, bf ? 0 : ctx->tf32, ctx->cuda_stream), fn, "dt_k_matmul_fwd");
    dt_cuda_scratch_end(ctx, mark);
    DT__TRY(st);
    if (!dbias || k == 0) return DT_OK;
    return dt__cu_bias_bwd(ctx, DT__CU_F(dbias), dout->data, dout->dtype, N, Out, fn);
}

/* fwd: t = out[rows, C] += u = bias[C]; bwd: t = dbias[C] += column sums of u = dout. */
static dt_status dt__cu_bias_add(dt_ctx *ctx, dt_tensor *t, const dt_tensor *u, int bwd) {
    const char *fn = bwd ? "dt_bias_add_bwd" : "dt_bias_add_fwd";
    int64_t C, R;
    dt_tensor ut;
    DT__CU_SH(st, t, bwd ? "dbias" : "out");
    DT__CU_SH(su, u, bwd ? "dout" : "bias");
    if (!su) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, bwd ? "dout" : "bias");
    if (bwd) su = dt__bf16_as_f32(su, 1, &ut); /* dout may be bf16 */
    if (!st) return bwd ? dt__f32(ctx, su, fn, "dout") : dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    DT__TRY(dt__f32(ctx, st, fn, bwd ? "dbias" : "out"));
    DT__TRY(dt__f32(ctx, su, fn, bwd ? "dout" : "bias"));
    C = dt__last(bwd ? su : st); R = dt__rows(bwd ? su : st);
    DT__TRY(dt__dim(ctx, (bwd ? st : su)->numel, C, fn, bwd ? "dbias numel" : "bias numel",
                    bwd ? "dout.shape[-1]" : "out.shape[-1]"));
    if (bwd) return dt__cu_bias_bwd(ctx, DT__CU_F(t), u->data, u->dtype, R, C, fn);
    return dt__cu_status(ctx, dt_k_bias_add_fwd(DT__CU_F(t), (const float *)u->data, R, C, ctx->cuda_stream), fn,
                         "dt_k_bias_add_fwd");
}

/* fwd: t = out = f(x); bwd: t = dx += dout f'(x); f = gelu, or relu when relu = 1. */
static dt_status dt__cu_unary(dt_ctx *ctx, dt_tensor *t, const dt_tensor *dout, const dt_tensor *x, int bwd, int relu) {
    static const char *const names[2][2] = {{"dt_gelu_fwd", "dt_gelu_bwd"}, {"dt_relu_fwd", "dt_relu_bwd"}};
    const char *fn = names[relu][bwd];
    dt_tensor tx, tt, tg;
    const dt_tensor *cx, *ct;
    float *o;
    int st;
    DT__CU_SH(st_, t, bwd ? "dx" : "out");
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sx, x, "x");
    if (!sx || (bwd && !sg)) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, sx ? "dout" : "x");
    cx = dt__bf16_as_f32(sx, !relu, &tx); /* gelu: x, out, dx and dout may be bf16 */
    if (bwd) DT__TRY(dt__unary_check(ctx, dt__bf16_as_f32(sg, !relu, &tg), cx, fn, "dout"));
    if (!st_) {
        if (!bwd) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
        return DT_OK;
    }
    ct = dt__bf16_as_f32(st_, !relu, &tt);
    DT__TRY(dt__unary_check(ctx, ct, cx, fn, bwd ? "dx" : "out"));
    o = DT__CU_F(t);
    if (!relu && (x->dtype == DT_BF16 || t->dtype == DT_BF16 || (bwd && dout->dtype == DT_BF16))) {
        /* elements of other sizes would meet at other offsets: such operands must not overlap (the
           very same elements of one dtype may: each thread reads its elements before it writes them) */
        if (t->dtype != x->dtype) DT__TRY(dt__apart(ctx, t, x, fn, bwd ? "dx" : "out", "x"));
        if (bwd && t->dtype != dout->dtype) DT__TRY(dt__apart(ctx, t, dout, fn, "dx", "dout"));
        st = bwd ? dt_k_gelu_bwd_t(t->data, (int)t->dtype, dout->data, (int)dout->dtype, x->data, (int)x->dtype,
                                   x->numel, ctx->cuda_stream)
                 : dt_k_gelu_fwd_t(t->data, (int)t->dtype, x->data, (int)x->dtype, x->numel, ctx->cuda_stream);
        return dt__cu_status(ctx, st, fn, bwd ? "dt_k_gelu_bwd_t" : "dt_k_gelu_fwd_t");
    }
    if (!bwd) st = relu ? dt_k_relu_fwd(o, (const float *)x->data, x->numel, ctx->cuda_stream)
                        : dt_k_gelu_fwd(o, (const float *)x->data, x->numel, ctx->cuda_stream);
    else st = relu ? dt_k_relu_bwd(o, (const float *)dout->data, (const float *)x->data, x->numel, ctx->cuda_stream)
                   : dt_k_gelu_bwd(o, (const float *)dout->data, (const float *)x->data, x->numel, ctx->cuda_stream);
    return dt__cu_status(ctx, st, fn, relu ? (bwd ? "dt_k_relu_bwd" : "dt_k_relu_fwd")
                                           : (bwd ? "dt_k_gelu_bwd" : "dt_k_gelu_fwd"));
}

static dt_status dt__cu_layernorm_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *mean, dt_tensor *rstd,
                                      const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, float eps) {
    const char *fn = "dt_layernorm_fwd";
    int64_t C;
    dt_tensor of;
    DT__CU_SH(so, out, "out");
    DT__CU_SH(sm, mean, "mean");
    DT__CU_SH(sr, rstd, "rstd");
    DT__CU_SH(sx, x, "x");
    DT__CU_SH(sw, w, "w");
    DT__CU_SH(sb, b, "b");
    if (!so || !sx || !sw) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out, x and w must be non-NULL", fn);
    DT__TRY(dt__ln_check(ctx, dt__bf16_as_f32(so, 1, &of), sx, sw, sm, sr, fn, "out"));
    C = dt__last(sx);
    if (sb) { DT__TRY(dt__f32(ctx, sb, fn, "b")); DT__TRY(dt__dim(ctx, sb->numel, C, fn, "b numel", "x.shape[-1]")); }
    if (!(eps > 0 && eps <= FLT_MAX)) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: eps = %g; expected a finite eps > 0", fn, (double)eps);
    if (out->dtype == DT_BF16) { /* a GEMM's bf16 input: each value rounded once */
        DT__TRY(dt__apart(ctx, out, x, fn, "out", "x"));
        return dt__cu_status(ctx, dt_k_layernorm_fwd_bf16((uint16_t *)out->data, mean ? DT__CU_F(mean) : NULL,
                                                          rstd ? DT__CU_F(rstd) : NULL, (const float *)x->data,
                                                          (const float *)w->data, b ? (const float *)b->data : NULL, eps,
                                                          dt__rows(sx), C, ctx->cuda_stream), fn, "dt_k_layernorm_fwd_bf16");
    }
    return dt__cu_status(ctx, dt_k_layernorm_fwd(DT__CU_F(out), mean ? DT__CU_F(mean) : NULL,
                                                 rstd ? DT__CU_F(rstd) : NULL, (const float *)x->data,
                                                 (const float *)w->data, b ? (const float *)b->data : NULL, eps,
                                                 dt__rows(sx), C, ctx->cuda_stream), fn, "dt_k_layernorm_fwd");
}

static dt_status dt__cu_layernorm_bwd(dt_ctx *ctx, dt_tensor *dx, dt_tensor *dw, dt_tensor *db, const dt_tensor *dout,
                                      const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                                      const dt_tensor *rstd) {
    const char *fn = "dt_layernorm_bwd";
    int64_t C;
    DT__CU_SH(sdx, dx, "dx");
    DT__CU_SH(sdw, dw, "dw");
    DT__CU_SH(sdb, db, "db");
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sx, x, "x");
    DT__CU_SH(sw, w, "w");
    DT__CU_SH(sm, mean, "mean");
    DT__CU_SH(sr, rstd, "rstd");
    if (!sm || !sr) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: mean and rstd from the forward are required", fn);
    if (!sg || !sx || !sw) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dout, x and w must be non-NULL", fn);
    DT__TRY(dt__ln_check(ctx, sg, sx, sw, sm, sr, fn, "dout"));
    C = dt__last(sx);
    if (sdx) { DT__TRY(dt__f32(ctx, sdx, fn, "dx")); DT__TRY(dt__same(ctx, sdx, sx, fn, "dx", "x")); }
    if (sdw) { DT__TRY(dt__f32(ctx, sdw, fn, "dw")); DT__TRY(dt__same_numel(ctx, sdw, sw, fn, "dw", "w")); }
    if (sdb) { DT__TRY(dt__f32(ctx, sdb, fn, "db")); DT__TRY(dt__dim(ctx, sdb->numel, C, fn, "db numel", "x.shape[-1]")); }
    {
        /* dw and db: two-stage column sums, their partials in the ctx's scratch */
        size_t mark = dt_cuda_scratch_begin(ctx), bytes = dw || db ? dt_k_layernorm_bwd_scratch(dt__rows(sx), C) : 0;
        void *part = bytes ? dt_cuda_scratch(ctx, bytes, fn) : NULL;
        dt_status st = bytes && !part ? ctx->last_status
                     : dt__cu_status(ctx, dt_k_layernorm_bwd(dx ? DT__CU_F(dx) : NULL, dw ? DT__CU_F(dw) : NULL,
                                                             db ? DT__CU_F(db) : NULL, (const float *)dout->data,
                                                             (const float *)x->data, (const float *)w->data,
                                                             (const float *)mean->data, (const float *)rstd->data,
                                                             dt__rows(sx), C, part, ctx->cuda_stream),
                                     fn, "dt_k_layernorm_bwd");
        dt_cuda_scratch_end(ctx, mark);
        return st;
    }
}

/* The CPU path's shape checks on shadows; the ids' values are checked on the device
   (dt_cuda_check_range: reported by the next dt_ctx_sync or loss read, naming the index and the
   value; the kernels skip a bad id). fwd: rows = out, table; bwd: rows = dout, table = dtable. */
static dt_status dt__cu_embedding(dt_ctx *ctx, dt_tensor *t, const dt_tensor *u, const dt_tensor *ids, int bwd) {
    const char *fn = bwd ? "dt_embedding_bwd" : "dt_embedding_fwd";
    DT__CU_SH(s0, t, bwd ? "dtable" : "out");
    DT__CU_SH(s1, u, bwd ? "dout" : "table");
    DT__CU_SH(si, ids, "ids");
    if (!s1 || !si) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, s1 ? "ids" : bwd ? "dout" : "table");
    if (!s0) {
        if (!bwd) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
        return dt__f32(ctx, s1, fn, "dout");
    }
    DT__TRY(bwd ? dt__emb_check(ctx, s1, s0, si, fn, "dout", "dtable", 0)
                : dt__emb_check(ctx, s0, s1, si, fn, "out", "table", 0));
    if (ids->numel > 0)
        DT__TRY(dt_cuda_check_range(ctx, ids->data, ids->dtype, ids->numel, 0, bwd ? t->shape[0] : u->shape[0], 0, 0, fn,
                                    "ids"));
    if (bwd)
        return dt__cu_status(ctx, dt_k_embedding_bwd(DT__CU_F(t), (const float *)u->data, ids->data, ids->dtype == DT_I64,
                                                     ids->numel, t->shape[0], t->shape[1], NULL, ctx->cuda_stream),
                             fn, "dt_k_embedding_bwd");
    return dt__cu_status(ctx, dt_k_embedding_fwd(DT__CU_F(t), (const float *)u->data, ids->data, ids->dtype == DT_I64,
                                                 ids->numel, u->shape[0], u->shape[1], NULL, ctx->cuda_stream),
                         fn, "dt_k_embedding_fwd");
}

/* CUDA attention chooses by att: given, the baseline kernels (att [B,H,T,T] holds the
   probabilities, as on the CPU); NULL (CUDA only: the CPU op needs att), the fused pair:
   dt_k_attention_fwd_flash, and a backward that reruns it into scratch for out and lse (B*T*C +
   B*H*T floats, activation recompute: bitwise the forward's out) and then dt_k_attention_bwd_flash.
   No [T,T] matrix is stored; head size C / n_head <= 96. att_like: the shape checks of
   dt__attn_check without an att, through a stand-in [B,H,T,T] that is never read. */
static dt_status dt__cu_att_like(dt_ctx *ctx, dt_tensor *like, const dt_tensor *o, const dt_tensor *qkv, int n_head,
                                 const char *fn, const char *on) {
    int64_t hs;
    DT__TRY(dt__f32(ctx, qkv, fn, "qkv"));
    DT__TRY(dt__ndim(ctx, qkv, 3, 3, fn, "qkv"));
    *like = *qkv;
    like->ndim = 4;
    like->shape[0] = qkv->shape[0]; like->shape[1] = n_head; like->shape[2] = like->shape[3] = qkv->shape[1];
    like->numel = dt_shape_numel(4, like->shape);
    if (like->numel < 0 && n_head > 0)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: qkv has B = %lld, T = %lld: B * n_head * T * T overflows int64",
                                fn, (long long)qkv->shape[0], (long long)qkv->shape[1]);
    if (like->numel < 0) like->shape[0] = like->shape[1] = like->shape[2] = like->shape[3] = like->numel = 0;
    {
        dt__attn_dim g;
        DT__TRY(dt__attn_check(ctx, o, like, qkv, n_head, n_head, fn, on, &g));
    }
    hs = qkv->shape[2] / 3 / n_head;
    if (hs > 96)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: att is NULL (the fused kernels) with head size C / n_head "
                                "= %lld; the fused kernels take at most 96: pass att", fn, (long long)hs);
    return DT_OK;
}

/* y (out or dout, yn) against qkv: with att (sa) the CPU op's check; without, the fused kernels'. */
static dt_status dt__cu_att_check(dt_ctx *ctx, const dt_tensor *y, const dt_tensor *sa, const dt_tensor *sq, int n_head,
                                  const char *fn, const char *yn) {
    dt_tensor like;
    dt__attn_dim g;
    if (sa) return dt__attn_check(ctx, y, sa, sq, n_head, n_head, fn, yn, &g);
    return dt__cu_att_like(ctx, &like, y, sq, n_head, fn, yn);
}

/* bf16 qkv (CUDA, att NULL): the tensor-core kernels of kernels/dt_flash.cu (FlashAttention-2 on
   mma.sync: bf16 q, k, v, f32 accumulation and softmax statistics; out f32 or bf16 (rounded once),
   dqkv f32 or bf16 (dqkv + the f32 gradient, rounded once);
   compute capability >= 8.0, head size 16, 32, 64, 96 or 128). y is out (fwd) or dout (bwd:
   dqkv +=, NULL checks only; the forward rerun into scratch for out and lse). The error of bf16
   attention is bounded in tests/cuda_emu/k_flash.cpp. */
static dt_status dt__cu_attention_tc(dt_ctx *ctx, const dt_tensor *y, const dt_tensor *att, const dt_tensor *qkv,
                                     int n_head, int n_kv_head, int bwd, dt_tensor *dqkv, const char *fn, const char *yn) {
    int64_t B, T, C, hs, W, Ckv;
    dt_k_flash a;
    size_t mark;
    dt_status st;
    if (att)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: qkv is bf16 (the tensor-core kernels, which store no [T,T] "
                                "scores): att must be NULL", fn);
    DT__TRY(dt__ndim(ctx, qkv, 3, 3, fn, "qkv"));
    DT__TRY(dt_check_tensor(ctx, y, !bwd && y->dtype == DT_BF16 ? DT_BF16 : DT_F32, fn, yn)); /* out may be bf16 */
    B = qkv->shape[0]; T = qkv->shape[1]; W = qkv->shape[2];
    if (n_kv_head == n_head) {
        C = W / 3;
        if (W % 3)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: qkv.shape[2] = %lld is not 3*C", fn, (long long)W);
        if (n_head <= 0 || C % n_head)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_head = %d must be > 0 and divide C = %lld", fn, n_head,
                                    (long long)C);
    } else { /* grouped-query: q of n_head heads, then k and v of n_kv_head (dt_attention_gqa_fwd) */
        int64_t per = (int64_t)n_head + 2 * (int64_t)n_kv_head;
        if (n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_head = %d, n_kv_head = %d; expected n_head > 0 and n_kv_head "
                                    "> 0 dividing it", fn, n_head, n_kv_head);
        if (W % per)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: qkv.shape[2] = %lld is not (n_head + 2 n_kv_head) x head "
                                    "size = %lld x head size", fn, (long long)W, (long long)per);
        C = W / per * n_head;
    }
    Ckv = C / n_head * n_kv_head;
    DT__TRY(dt__ndim(ctx, y, 3, 3, fn, yn));
    if (y->shape[0] != B || y->shape[1] != T || y->shape[2] != C) {
        char sh[96];
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s shape %s; expected [%lld, %lld, %lld]", fn, yn,
                                dt_shape_str(y, sh, sizeof sh), (long long)B, (long long)T, (long long)C);
    }
    if (dqkv) { /* f32, or bf16 (the gradients kept as qkv: rounded once) */
        DT__TRY(dt_check_tensor(ctx, dqkv, dqkv->dtype == DT_BF16 ? DT_BF16 : DT_F32, fn, "dqkv"));
        DT__TRY(dt__ndim(ctx, dqkv, 3, 3, fn, "dqkv"));
        if (dqkv->shape[0] != B || dqkv->shape[1] != T || dqkv->shape[2] != W)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: dqkv must have qkv's shape [%lld, %lld, %lld]", fn,
                                    (long long)B, (long long)T, (long long)W);
    }
    hs = C / n_head;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 96 && hs != 128)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: qkv is bf16 with head size C / n_head = %lld; the "
                                "tensor-core kernels take 16, 32, 64, 96 or 128", fn, (long long)hs);
    if ((uintptr_t)qkv->data % 16)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: qkv's data is not 16-byte aligned (a view at an odd "
                                "offset); the tensor-core kernels load 16 bytes at a time", fn);
    if (n_head > 65535 / (B ? B : 1))
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: B * n_head = %lld * %d: the kernels take at most 65535",
                                fn, (long long)B, n_head);
    if (!B || !T || (bwd && !dqkv)) return DT_OK;
    memset(&a, 0, sizeof a);
    a.B = B, a.T = T, a.H = n_head, a.H_kv = n_kv_head, a.hs = (int)hs;
    a.q = (const uint16_t *)qkv->data, a.k = a.q + C, a.v = a.q + C + Ckv;
    a.q_stride = a.kv_stride = W, a.out_stride = C;
    mark = dt_cuda_scratch_begin(ctx);
    a.lse = (float *)dt_cuda_scratch(ctx, (size_t)(B * n_head * T) * sizeof(float), fn);
    if (!bwd && y->dtype == DT_BF16) a.out16 = (uint16_t *)y->data; /* bf16 activations: out rounded once */
    else if (!bwd) a.out = DT__CU_F(y);
    else if (a.lse) a.out = (float *)dt_cuda_scratch(ctx, (size_t)y->numel * sizeof(float), fn);
    st = a.lse && (a.out || a.out16) ? DT_OK : ctx->last_status;
    if (!st) st = dt__cu_status(ctx, dt_k_flash_fwd(&a, ctx->cuda_stream), fn, "dt_k_flash_fwd");
    if (!st && bwd) {
        a.dout = (const float *)y->data;
        if (dqkv->dtype == DT_BF16)
            a.dq16 = (uint16_t *)dqkv->data, a.dk16 = a.dq16 + C, a.dv16 = a.dq16 + C + Ckv;
        else a.dq = DT__CU_F(dqkv), a.dk = a.dq + C, a.dv = a.dq + C + Ckv;
        a.dq_stride = a.dkv_stride = W;
        size_t bytes = dt_k_flash_bwd_scratch(B, T, n_head, (int)hs); /* 0: a size past size_t */
        a.scratch = bytes ? dt_cuda_scratch(ctx, bytes, fn) : NULL;
        if (!bytes) st = dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: B * T * C = %lld * %lld * %lld: the backward's "
                                          "scratch overflows", fn, (long long)B, (long long)T, (long long)C);
        else st = a.scratch ? dt__cu_status(ctx, dt_k_flash_bwd(&a, ctx->cuda_stream), fn, "dt_k_flash_bwd")
                            : ctx->last_status;
    }
    dt_cuda_scratch_end(ctx, mark);
    if (st && ctx->last_status == DT_ERR_CUDA && strstr(dt_ctx_error(ctx), "not supported"))
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: qkv is bf16, whose tensor-core kernels need compute "
                                "capability 8.0 or newer (mma.sync with bf16); cast qkv to f32", fn);
    return st;
}

/* dt_attention_gqa_fwd / _bwd with a bf16 qkv on cuda (att NULL): the tensor-core kernels. */
static dt_status dt__cu_attention_gqa_tc(dt_ctx *ctx, const dt_tensor *y, const dt_tensor *qkv, int n_head,
                                         int n_kv_head, int bwd, dt_tensor *dqkv, const char *fn, const char *yn) {
    DT__CU_SH(sy, y, yn);
    DT__CU_SH(sq, qkv, "qkv");
    DT__CU_SH(sd, dqkv, "dqkv");
    if (!sy || !sq) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s and qkv must be non-NULL", fn, yn);
    return dt__cu_attention_tc(ctx, sy, NULL, sq, n_head, n_kv_head, bwd, (dt_tensor *)sd, fn, yn);
}

/* dt_attention_gqa_fwd / _bwd with an f32 qkv on cuda and att: each kv head repeated for its
   query heads into a multi-head [B, T, 3C] qkv in device scratch (kernels/dt_parallel.cu's column
   copy), dt_attention's kernels on it; backward, the dk, dv of a group's query heads added back
   into their kv head in head order (as the CPU op adds them). */
static dt_status dt__cu_attention_gqa_f32(dt_ctx *ctx, dt_tensor *y, dt_tensor *att, const dt_tensor *qkv, int H,
                                          int K, int bwd, dt_tensor *dqkv, const char *fn) {
    const char *yn = bwd ? "dout" : "out";
    dt__attn_dim g;
    dt_tensor full, dfull;
    size_t mark;
    int64_t R, C, W, hs, Ckv;
    int h, part;
    float *tmp;
    dt_status st = DT_OK;
    DT__CU_SH(sy, y, yn);
    DT__CU_SH(sa, att, "att");
    DT__CU_SH(sq, qkv, "qkv");
    DT__TRY(dt__attn_check(ctx, sy, sa, sq, H, K, fn, yn, &g));
    if (bwd && !dqkv) return DT_OK;
    if (bwd) {
        DT__CU_SH(sd, dqkv, "dqkv");
        DT__TRY(dt__f32(ctx, sd, fn, "dqkv"));
        DT__TRY(dt__same(ctx, sd, sq, fn, "dqkv", "qkv"));
    }
    R = g.B * g.T; C = g.C; W = g.W; hs = g.hs; Ckv = g.Ckv;
    if (!R) return DT_OK;
    memset(&full, 0, sizeof full);
    full.dtype = DT_F32; full.device = DT_CUDA_DEVICE; full.ndim = 3;
    full.shape[0] = g.B; full.shape[1] = g.T; full.shape[2] = 3 * C; full.numel = R * 3 * C;
    dfull = full;
    mark = dt_cuda_scratch_begin(ctx);
    full.data = dt_cuda_scratch(ctx, (size_t)(R * 3 * C) * sizeof(float), fn);
    tmp = (float *)dt_cuda_scratch(ctx, (size_t)(R * C) * sizeof(float), fn); /* one column block in transit */
    if (bwd) dfull.data = dt_cuda_scratch(ctx, (size_t)(R * 3 * C) * sizeof(float), fn);
    if (!full.data || !tmp || (bwd && !dfull.data)) { dt_cuda_scratch_end(ctx, mark); return ctx->last_status; }
#define DT__GQA_CP(whole, Ww, col, n, to, acc) \
    if (!st) st = dt__cu_status(ctx, dt_k_concat((float *)(whole), tmp, R, Ww, col, n, to, acc, ctx->cuda_stream), fn, "dt_k_concat")
    DT__GQA_CP(qkv->data, W, 0, C, 0, 0); /* q as it is */
    DT__GQA_CP(full.data, 3 * C, 0, C, 1, 0);
    for (h = 0; h < H; h++)
        for (part = 1; part <= 2; part++) { /* k, then v, of kv head h / (H / K) */
            DT__GQA_CP(qkv->data, W, C + (part - 1) * Ckv + (h / (H / K)) * hs, hs, 0, 0);
            DT__GQA_CP(full.data, 3 * C, part * C + h * hs, hs, 1, 0);
        }
    if (!st && !bwd) st = dt__cu_attention_fwd(ctx, y, att, &full, H);
    if (!st && bwd) {
        st = dt_cuda_memset(ctx, dfull.data, 0, (size_t)(R * 3 * C) * sizeof(float), fn);
        if (!st) st = dt__cu_attention_bwd(ctx, &dfull, y, &full, att, H);
        DT__GQA_CP(dfull.data, 3 * C, 0, C, 0, 0); /* dq added as it is */
        DT__GQA_CP(dqkv->data, W, 0, C, 1, 1);
        for (h = 0; h < H; h++)
            for (part = 1; part <= 2; part++) {
                DT__GQA_CP(dfull.data, 3 * C, part * C + h * hs, hs, 0, 0);
                DT__GQA_CP(dqkv->data, W, C + (part - 1) * Ckv + (h / (H / K)) * hs, hs, 1, 1);
            }
    }
#undef DT__GQA_CP
    dt_cuda_scratch_end(ctx, mark);
    return st;
}

/* dt_attention_block_fwd (dq, dkv, dout NULL) / _bwd on cuda tensors, checked by the caller. */
static dt_status dt__cu_ablk(dt_ctx *ctx, const struct dt__ablk *g, const dt_attn_block *d, dt_tensor *out,
                             dt_tensor *lse, const dt_tensor *q, const dt_tensor *kv, dt_tensor *dq, dt_tensor *dkv,
                             const dt_tensor *dout, const char *fn) {
    dt_k_attn_block a;
    a.B = g->B; a.Tq = g->Tq; a.Wq = g->Wq; a.Tk = g->Tk; a.Wkv = g->Wkv; a.hs = g->hs; a.H = g->H; a.Hkv = g->Hkv;
    a.q_row = d->q_row; a.q_rows = d->q_rows; a.q_pos = d->q_pos;
    a.k_row = d->k_row; a.k_rows = d->k_rows; a.k_pos = d->k_pos;
    if (!dout)
        return dt__cu_status(ctx, dt_k_attention_block_fwd(DT__CU_F(out), DT__CU_F(lse), (const float *)q->data,
                                                           (const float *)kv->data, &a, ctx->cuda_stream),
                             fn, "dt_k_attention_block_fwd");
    return dt__cu_status(ctx, dt_k_attention_block_bwd(dq ? DT__CU_F(dq) : NULL, dkv ? DT__CU_F(dkv) : NULL,
                                                       (const float *)dout->data, (const float *)q->data,
                                                       (const float *)kv->data, (const float *)out->data,
                                                       (const float *)lse->data, &a, ctx->cuda_stream),
                         fn, "dt_k_attention_block_bwd");
}

static dt_status dt__cu_attention_fwd(dt_ctx *ctx, dt_tensor *out, dt_tensor *att, const dt_tensor *qkv, int n_head) {
    const char *fn = "dt_attention_fwd";
    DT__CU_SH(so, out, "out");
    DT__CU_SH(sa, att, "att");
    DT__CU_SH(sq, qkv, "qkv");
    if (!so || !sq) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out and qkv must be non-NULL", fn);
    if (sq->dtype == DT_BF16) return dt__cu_attention_tc(ctx, so, sa, sq, n_head, n_head, 0, NULL, fn, "out");
    DT__TRY(dt__cu_att_check(ctx, so, sa, sq, n_head, fn, "out"));
    if (!sa)
        return dt__cu_status(ctx, dt_k_attention_fwd_flash(DT__CU_F(out), NULL, (const float *)qkv->data, qkv->shape[0],
                                                           qkv->shape[1], qkv->shape[2] / 3, n_head, ctx->cuda_stream),
                             fn, "dt_k_attention_fwd_flash");
    return dt__cu_status(ctx, dt_k_attention_fwd(DT__CU_F(out), DT__CU_F(att), (const float *)qkv->data, qkv->shape[0],
                                                 qkv->shape[1], qkv->shape[2] / 3, n_head, ctx->cuda_stream),
                         fn, "dt_k_attention_fwd");
}

static dt_status dt__cu_attention_bwd(dt_ctx *ctx, dt_tensor *dqkv, const dt_tensor *dout, const dt_tensor *qkv,
                                      const dt_tensor *att, int n_head) {
    const char *fn = "dt_attention_bwd";
    DT__CU_SH(sd, dqkv, "dqkv");
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sq, qkv, "qkv");
    DT__CU_SH(sa, att, "att");
    if (!sg || !sq) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dout and qkv must be non-NULL", fn);
    if (sq->dtype == DT_BF16) return dt__cu_attention_tc(ctx, sg, sa, sq, n_head, n_head, 1, (dt_tensor *)sd, fn, "dout");
    DT__TRY(dt__cu_att_check(ctx, sg, sa, sq, n_head, fn, "dout"));
    if (!sd) return DT_OK;
    DT__TRY(dt__f32(ctx, sd, fn, "dqkv"));
    DT__TRY(dt__same(ctx, sd, sq, fn, "dqkv", "qkv"));
    if (!sa) { /* the fused backward: out and lse recomputed by the fused forward, into scratch */
        int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
        size_t mark = dt_cuda_scratch_begin(ctx), nrow = (size_t)(B * n_head * T);
        float *o = (float *)dt_cuda_scratch(ctx, (size_t)dout->numel * sizeof(float), fn);
        float *lse = o ? (float *)dt_cuda_scratch(ctx, nrow * sizeof(float), fn) : NULL;
        float *dd = lse ? (float *)dt_cuda_scratch(ctx, nrow * sizeof(float), fn) : NULL;
        dt_status st = dd ? DT_OK : ctx->last_status;
        if (!st)
            st = dt__cu_status(ctx, dt_k_attention_fwd_flash(o, lse, (const float *)qkv->data, B, T, C, n_head,
                                                             ctx->cuda_stream), fn, "dt_k_attention_fwd_flash");
        if (!st)
            st = dt__cu_status(ctx, dt_k_attention_bwd_flash(DT__CU_F(dqkv), (const float *)dout->data,
                                                             (const float *)qkv->data, o, lse, B, T, C, n_head, dd,
                                                             ctx->cuda_stream),
                               fn, "dt_k_attention_bwd_flash");
        dt_cuda_scratch_end(ctx, mark);
        return st;
    }
    {
        size_t mark = dt_cuda_scratch_begin(ctx);
        float *dpre = (float *)dt_cuda_scratch(ctx, (size_t)att->numel * sizeof(float), fn);
        dt_status st = dpre ? DT_OK : ctx->last_status;
        if (!st)
            st = dt__cu_status(ctx, dt_k_attention_bwd(DT__CU_F(dqkv), (const float *)dout->data,
                                                       (const float *)qkv->data, (const float *)att->data,
                                                       qkv->shape[0], qkv->shape[1], qkv->shape[2] / 3, n_head, dpre,
                                                       ctx->cuda_stream),
                               fn, "dt_k_attention_bwd");
        dt_cuda_scratch_end(ctx, mark);
        return st;
    }
}
/* softmax_xent keeps the API's probabilities, and the loss on the device: one kernel per row
   writes the row's loss and its probabilities, a two-stage sum puts the mean and n_valid into the
   ctx's loss slot, read (one copy, one wait) only when the caller asks for loss or n_valid. The
   targets are checked on the device (dt_cuda_check_range, ignore_index allowed), the backward
   counts n_valid on the device. Temporaries come from the stream-ordered scratch. */
static dt_status dt__cu_loss_ctx(dt_ctx *ctx, const char *fn) {
    if (dt_cuda_loss_slot(ctx)) return DT_OK;
    return dt_ctx_set_error(ctx, DT_ERR_DEVICE, "%s: the tensors are on cuda but the ctx is not a cuda ctx (its "
                            "dt_ctx_desc.device is cpu): a device loss needs the cuda ctx's status block", fn);
}

static dt_status dt__cu_softmax_xent_fwd(dt_ctx *ctx, float *loss, int64_t *n_valid, dt_tensor *probs,
                                         const dt_tensor *logits, const dt_tensor *targets, int ignore_index) {
    const char *fn = "dt_softmax_xent_fwd";
    int64_t R, V;
    size_t mark;
    void *scratch;
    dt_status st;
    DT__CU_SH(sp, probs, "probs");
    DT__CU_SH(sz, logits, "logits");
    DT__CU_SH(stg, targets, "targets");
    DT__TRY(dt__f32(ctx, sz, fn, "logits"));
    DT__TRY(dt__xent_shapes(ctx, sz, stg, fn, "logits"));
    DT__TRY(dt__f32(ctx, sp, fn, "probs"));
    DT__TRY(dt__same(ctx, sp, sz, fn, "probs", "logits"));
    DT__TRY(dt__cu_loss_ctx(ctx, fn));
    V = dt__last(sz); R = dt__rows(sz);
    if (R > 0) DT__TRY(dt_cuda_check_range(ctx, targets->data, DT_I32, R, 0, V, 1, ignore_index, fn, "targets"));
    mark = dt_cuda_scratch_begin(ctx);
    scratch = dt_cuda_scratch(ctx, dt_k_loss_scratch_bytes(R), fn);
    st = scratch ? DT_OK : ctx->last_status;
    if (!st)
        st = dt__cu_status(ctx, dt_k_softmax_xent_fwd(dt_cuda_loss_slot(ctx), DT__CU_F(probs), DT__CU_F(logits),
                                                      (const int32_t *)targets->data, ignore_index, R, V, scratch,
                                                      ctx->cuda_stream), fn, "dt_k_softmax_xent_fwd");
    dt_cuda_scratch_end(ctx, mark);
    if (st || (!loss && !n_valid)) return st;
    return dt_cuda_read_loss(ctx, loss, n_valid, fn);
}

static dt_status dt__cu_softmax_xent_bwd(dt_ctx *ctx, dt_tensor *dlogits, const dt_tensor *probs,
                                         const dt_tensor *targets, int ignore_index, float dloss) {
    const char *fn = "dt_softmax_xent_bwd";
    int64_t R, V;
    size_t mark;
    void *scratch;
    dt_status st;
    DT__CU_SH(sg, dlogits, "dlogits");
    DT__CU_SH(sp, probs, "probs");
    DT__CU_SH(stg, targets, "targets");
    DT__TRY(dt__xent_shapes(ctx, sp, stg, fn, "probs"));
    if (sg) DT__TRY(dt__f32(ctx, sg, fn, "dlogits"));
    if (sg) DT__TRY(dt__same(ctx, sg, sp, fn, "dlogits", "probs"));
    V = dt__last(sp); R = dt__rows(sp);
    if (R > 0) DT__TRY(dt_cuda_check_range(ctx, targets->data, DT_I32, R, 0, V, 1, ignore_index, fn, "targets"));
    if (!sg || R * V == 0) return DT_OK;
    mark = dt_cuda_scratch_begin(ctx);
    scratch = dt_cuda_scratch(ctx, dt_k_loss_scratch_bytes(R), fn);
    st = scratch ? DT_OK : ctx->last_status;
    if (!st)
        st = dt__cu_status(ctx, dt_k_softmax_xent_bwd(DT__CU_F(dlogits), (const float *)probs->data,
                                                      (const int32_t *)targets->data, ignore_index, dloss, R, V, scratch,
                                                      ctx->cuda_stream), fn, "dt_k_softmax_xent_bwd");
    dt_cuda_scratch_end(ctx, mark);
    return st;
}

/* y += alpha x (an SGD step on CUDA parameters: dt_axpy(ctx, &p->value, -lr, &p->grad)). */
static dt_status dt__cu_axpy(dt_ctx *ctx, dt_tensor *y, float alpha, const dt_tensor *x) {
    const char *fn = "dt_axpy";
    DT__CU_SH(sy, y, "y");
    DT__CU_SH(sx, x, "x");
    DT__TRY(dt__f32(ctx, sy, fn, "y"));
    DT__TRY(dt__f32(ctx, sx, fn, "x"));
    DT__TRY(dt__same_numel(ctx, sy, sx, fn, "y", "x"));
    return dt__cu_status(ctx, dt_k_axpy(DT__CU_F(y), alpha, (const float *)x->data, x->numel, ctx->cuda_stream), fn,
                         "dt_k_axpy");
}
/* dt_tensor_cast on cuda: both tensors on the device, f32 <-> bf16 / f16 (and bf16 <-> f16
   through f32) by dt_k_tensor_cast, rounded as dt_convert; other dtypes are the CPU's. */
static dt_status dt__cu_cast(dt_ctx *ctx, dt_tensor *dst, const dt_tensor *src) {
    const char *fn = "dt_tensor_cast";
    DT__CU_SH(sd, dst, "dst");
    DT__CU_SH(ss, src, "src");
    if (!sd || !ss) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, sd ? "src" : "dst");
    if (!dt__is_float(sd->dtype) || !dt__is_float(ss->dtype))
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: %s -> %s on cuda; the device casts f32, bf16 and f16 "
                                "(cast other dtypes on the cpu)", fn, dt_dtype_name(ss->dtype), dt_dtype_name(sd->dtype));
    DT__TRY(dt__same_numel(ctx, sd, ss, fn, "dst", "src"));
    if (src->data == dst->data && src->dtype != dst->dtype && src->numel > 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dst and src share memory but differ in dtype", fn);
    if (src->numel == 0) return DT_OK;
    return dt__cu_status(ctx, dt_k_tensor_cast(dst->data, (int)dst->dtype, src->data, (int)src->dtype, src->numel,
                                               ctx->cuda_stream), fn, "dt_k_tensor_cast");
}
/* dt_add (op 0), dt_mul_fwd (1), dt_mul_bwd (2): the elementwise kernels, the CPU ops' checks. */
static dt_status dt__cu_binary(dt_ctx *ctx, dt_tensor *o1, dt_tensor *o2, const dt_tensor *dout, const dt_tensor *a,
                               const dt_tensor *b, int op) {
    const char *fn = op == 0 ? "dt_add" : op == 1 ? "dt_mul_fwd" : "dt_mul_bwd";
    int st;
    DT__CU_SH(s1, o1, op == 2 ? "da" : "out");
    DT__CU_SH(s2, o2, "db");
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sa, a, "a");
    DT__CU_SH(sb, b, "b");
    if (op < 2) {
        if (!s1 || !sa || !sb) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !s1 ? "out" : !sa ? "a" : "b");
        DT__TRY(dt__binary_check(ctx, s1, sa, sb, fn, "out"));
        st = op == 0 ? dt_k_add(DT__CU_F(o1), (const float *)a->data, (const float *)b->data, a->numel, ctx->cuda_stream)
                     : dt_k_mul_fwd(DT__CU_F(o1), (const float *)a->data, (const float *)b->data, a->numel,
                                    ctx->cuda_stream);
        return dt__cu_status(ctx, st, fn, op == 0 ? "dt_k_add" : "dt_k_mul_fwd");
    }
    if (!sg || !sa || !sb) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !sg ? "dout" : !sa ? "a" : "b");
    DT__TRY(dt__binary_check(ctx, sg, sa, sb, fn, "dout"));
    if (s1) DT__TRY(dt__binary_check(ctx, s1, sa, sb, fn, "da"));
    if (s2) DT__TRY(dt__binary_check(ctx, s2, sa, sb, fn, "db"));
    return dt__cu_status(ctx, dt_k_mul_bwd(o1 ? DT__CU_F(o1) : NULL, o2 ? DT__CU_F(o2) : NULL, (const float *)dout->data,
                                           (const float *)a->data, (const float *)b->data, a->numel, ctx->cuda_stream),
                         fn, "dt_k_mul_bwd");
}

/* dt_dot_interaction_fwd / _bwd: kernels/dt_embed.cu's batched GEMMs (cuBLAS's sum orders),
   their packed X_b and Z_b (or S_b, dX_b) in the ctx's scratch. */
static dt_status dt__cu_dot(dt_ctx *ctx, dt_tensor *o1, dt_tensor *o2, const dt_tensor *dout, const dt_tensor *dense,
                            const dt_tensor *emb, int bwd) {
    const char *fn = bwd ? "dt_dot_interaction_bwd" : "dt_dot_interaction_fwd";
    int64_t B, F, D;
    size_t bytes, mark;
    void *scratch;
    dt_status st;
    DT__CU_SH(s1, o1, bwd ? "ddense" : "out");
    DT__CU_SH(s2, o2, "demb");
    DT__CU_SH(sg, dout, "dout");
    DT__CU_SH(sd, dense, "dense");
    DT__CU_SH(se, emb, "emb");
    if (!sd || !se) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, sd ? "emb" : "dense");
    if (!bwd) {
        if (!s1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
        DT__TRY(dt__dot_check(ctx, s1, sd, se, fn, "out"));
    } else {
        if (!sg) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: dout is NULL", fn);
        DT__TRY(dt__dot_check(ctx, sg, sd, se, fn, "dout"));
        if (s1) { DT__TRY(dt__f32(ctx, s1, fn, "ddense")); DT__TRY(dt__same(ctx, s1, sd, fn, "ddense", "dense")); }
        if (s2) { DT__TRY(dt__f32(ctx, s2, fn, "demb")); DT__TRY(dt__same(ctx, s2, se, fn, "demb", "emb")); }
    }
    B = dense->shape[0]; D = dense->shape[1]; F = emb->shape[1];
    if (B == 0 || (bwd && !o1 && !o2)) return DT_OK;
    bytes = dt_k_dot_interaction_scratch(B, F, D, bwd);
    if (!bytes || B > 2147483647LL || F >= 2147483647LL || D > 2147483647LL)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: B = %lld, F = %lld, D = %lld; expected each below 2^31 (cuBLAS's "
                                "ints) and the scratch to fit in memory", fn, (long long)B, (long long)F, (long long)D);
    DT__TRY(dt__cu_blas(ctx, fn));
    mark = dt_cuda_scratch_begin(ctx);
    if (!(scratch = dt_cuda_scratch(ctx, bytes, fn))) st = ctx->last_status;
    else if (!bwd)
        st = dt__cu_status(ctx, dt_k_dot_interaction_fwd(ctx->cublas, DT__CU_F(o1), (const float *)dense->data,
                                                         (const float *)emb->data, B, F, D, scratch, ctx->cuda_stream),
                           fn, "dt_k_dot_interaction_fwd");
    else
        st = dt__cu_status(ctx, dt_k_dot_interaction_bwd(ctx->cublas, o1 ? DT__CU_F(o1) : NULL, o2 ? DT__CU_F(o2) : NULL,
                                                         (const float *)dout->data, (const float *)dense->data,
                                                         (const float *)emb->data, B, F, D, scratch, ctx->cuda_stream),
                           fn, "dt_k_dot_interaction_bwd");
    dt_cuda_scratch_end(ctx, mark);
    return st;
}

/* dt_concat / dt_split on cuda: the CPU path's checks on shadows, then one column copy per part. */
static dt_status dt__cu_concat(dt_ctx *ctx, dt_tensor *whole, dt_tensor *const *parts, int n, int to_whole,
                               int accumulate, const char *fn) {
    int64_t R, W, off = 0;
    int i;
    char name[32];
    DT__CU_SH(sw, whole, "the concatenated tensor");
    if (n <= 0 || !parts) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n = %d parts; expected >= 1", fn, n);
    DT__TRY(dt__f32(ctx, sw, fn, "the concatenated tensor"));
    R = dt__rows(sw); W = dt__last(sw);
    for (i = 0; i < n; i++) {
        dt_tensor ps;
        const dt_tensor *pp;
        snprintf(name, sizeof name, "part %d", i);
        DT__TRY(dt__cu_shadow(ctx, &ps, &pp, parts[i], fn, name));
        DT__TRY(dt__f32(ctx, pp, fn, name));
        DT__TRY(dt__dim(ctx, dt__rows(pp), R, fn, "part rows", "concatenated rows"));
        if (dt__last(pp) > INT64_MAX - off)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the parts' last dims sum past int64", fn);
        off += dt__last(pp);
    }
    if (off != W)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the parts' last dims sum to %lld, the concatenated "
                                "tensor's is %lld", fn, (long long)off, (long long)W);
    for (off = 0, i = 0; i < n; i++) {
        int64_t C = dt__last(parts[i]);
        DT__TRY(dt__cu_status(ctx, dt_k_concat(DT__CU_F(whole), DT__CU_F(parts[i]), R, W, off, C, to_whole, accumulate,
                                               ctx->cuda_stream), fn, "dt_k_concat"));
        off += C;
    }
    return DT_OK;
}

/* dt_bce_logits_fwd / _bwd on cuda tensors: the elementwise kernels, the mean into the loss
   slot (read only when loss is set). logits (and dlogits) on the device; labels there too, or on
   the host (a batch's labels as loaded): then copied up into scratch, the step's input upload. */
static dt_status dt__cu_bce(dt_ctx *ctx, float *loss, dt_tensor *dlogits, const dt_tensor *logits,
                            const dt_tensor *labels, float dloss, int bwd) {
    const char *fn = bwd ? "dt_bce_logits_bwd" : "dt_bce_logits_fwd";
    dt_tensor lab;
    const float *y;
    size_t mark;
    void *scratch = NULL;
    dt_status st = DT_OK;
    DT__CU_SH(sz, logits, "logits");
    DT__CU_SH(sg, dlogits, "dlogits");
    if (!sz) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: logits is NULL", fn);
    if (!labels) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: labels is NULL", fn);
    DT__TRY(dt__valid(ctx, labels, fn, "labels"));
    lab = *labels;
    lab.device = DT_CPU; /* a shadow for the checks, as the others */
    DT__TRY(dt__bce_check(ctx, sz, &lab, fn));
    if (sg) {
        DT__TRY(dt__f32(ctx, sg, fn, "dlogits"));
        DT__TRY(dt__same_numel(ctx, sg, sz, fn, "dlogits", "logits"));
    }
    if (!bwd) DT__TRY(dt__cu_loss_ctx(ctx, fn));
    if (bwd && (!sg || logits->numel == 0)) return DT_OK;
    mark = dt_cuda_scratch_begin(ctx);
    y = (const float *)labels->data;
    if (labels->device != DT_CUDA_DEVICE && logits->numel > 0) {
        float *up = (float *)dt_cuda_scratch(ctx, (size_t)logits->numel * sizeof(float), fn);
        st = up ? dt_cuda_memcpy(ctx, up, DT_CUDA_DEVICE, labels->data, labels->device,
                                 (size_t)logits->numel * sizeof(float), fn) : ctx->last_status;
        y = up;
    }
    if (!st && !bwd) {
        scratch = dt_cuda_scratch(ctx, dt_k_loss_scratch_bytes(0), fn);
        st = scratch ? dt__cu_status(ctx, dt_k_bce_logits_fwd(dt_cuda_loss_slot(ctx), (const float *)logits->data, y,
                                                              logits->numel, scratch, ctx->cuda_stream),
                                     fn, "dt_k_bce_logits_fwd")
                     : ctx->last_status;
    }
    if (!st && bwd)
        st = dt__cu_status(ctx, dt_k_bce_logits_bwd(DT__CU_F(dlogits), (const float *)logits->data, y, dloss,
                                                    logits->numel, ctx->cuda_stream), fn, "dt_k_bce_logits_bwd");
    dt_cuda_scratch_end(ctx, mark);
    if (st || bwd || !loss) return st;
    return dt_cuda_read_loss(ctx, loss, NULL, fn);
}

/* dt_sum / dt_sumsq: the two-stage device sum into scratch, then the double itself comes back
   (the output is a host value: this one copy and its wait are the op's). */
static dt_status dt__cu_sum(dt_ctx *ctx, double *out, const dt_tensor *x, int sq, const char *fn) {
    size_t mark;
    double *d, r[2] = {0, 0};
    void *scratch;
    dt_status st;
    DT__CU_SH(sx, x, "x");
    DT__TRY(dt__f32(ctx, sx, fn, "x"));
    mark = dt_cuda_scratch_begin(ctx);
    d = (double *)dt_cuda_scratch(ctx, 2 * sizeof(double), fn);
    scratch = d ? dt_cuda_scratch(ctx, dt_k_loss_scratch_bytes(0), fn) : NULL;
    st = scratch ? dt__cu_status(ctx, dt_k_sum(d, (const float *)x->data, x->numel, sq, scratch, ctx->cuda_stream), fn,
                                 "dt_k_sum")
                 : ctx->last_status;
    if (!st) st = dt_cuda_memcpy(ctx, r, DT_CPU, d, DT_CUDA_DEVICE, sizeof(double), fn);
    dt_cuda_scratch_end(ctx, mark);
    if (!st) *out = r[0];
    return st;
}

static dt_status dt__cu_scale(dt_ctx *ctx, dt_tensor *x, float alpha) {
    const char *fn = "dt_scale";
    DT__CU_SH(sx, x, "x");
    DT__TRY(dt__f32(ctx, sx, fn, "x"));
    return dt__cu_status(ctx, dt_k_scale(DT__CU_F(x), alpha, x->numel, ctx->cuda_stream), fn, "dt_k_scale");
}

#undef DT__CU_SH
#undef DT__CU_F
#endif /* DT_CUDA */

/* ---------------------------------------------------------------- concat / split */

/* Each part apart from the whole (one is read while the other is written); parts that are copied
   into (split) apart from each other too (two copies over the same bytes: the later one wins). */
static dt_status dt__concat_apart(dt_ctx *ctx, const dt_tensor *whole, dt_tensor *const *parts, int n, int parts_copied,
                                  const char *fn) {
    char name[32], other[32];
    int i, j;
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof name, "part %d", i);
        DT__TRY(dt__apart(ctx, whole, parts[i], fn, "the concatenated tensor", name));
        for (j = 0; parts_copied && j < i; j++) {
            snprintf(other, sizeof other, "part %d", j);
            DT__TRY(dt__apart(ctx, parts[i], parts[j], fn, name, other));
        }
    }
    return DT_OK;
}

/* Copies (or accumulates) between the n parts [rows, C_i] and the whole [rows, sum C_i]. */
static dt_status dt__concat(dt_ctx *ctx, dt_tensor *whole, dt_tensor *const *parts, int n, int to_whole,
                            int accumulate, const char *fn) {
    int64_t R, W, off = 0, r, c;
    int i;
    char name[32];
    if (!ctx) return DT_ERR_ARG;
    if (n <= 0 || !parts) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n = %d parts; expected >= 1", fn, n);
#ifdef DT_CUDA
    if (dt__cu(whole) || dt__cu(parts[0])) {
        DT__TRY(dt__concat_apart(ctx, whole, parts, n, !to_whole && !accumulate, fn));
        return dt__cu_concat(ctx, whole, parts, n, to_whole, accumulate, fn);
    }
#endif
    DT__TRY(dt__f32(ctx, whole, fn, "the concatenated tensor"));
    R = dt__rows(whole); W = dt__last(whole);
    for (i = 0; i < n; i++) {
        snprintf(name, sizeof name, "part %d", i);
        DT__TRY(dt__f32(ctx, parts[i], fn, name));
        DT__TRY(dt__dim(ctx, dt__rows(parts[i]), R, fn, "part rows", "concatenated rows"));
        if (dt__last(parts[i]) > INT64_MAX - off)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the parts' last dims sum past int64", fn);
        off += dt__last(parts[i]);
    }
    if (off != W)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: the parts' last dims sum to %lld, the concatenated "
                                "tensor's is %lld", fn, (long long)off, (long long)W);
    DT__TRY(dt__concat_apart(ctx, whole, parts, n, !to_whole && !accumulate, fn));
    for (off = 0, i = 0; i < n; i++) {
        int64_t C = dt__last(parts[i]);
        for (r = 0; r < R; r++) {
            float *w = DT__F(whole) + r * W + off, *p = DT__F(parts[i]) + r * C;
            if (to_whole && accumulate) for (c = 0; c < C; c++) w[c] += p[c];
            else if (to_whole) memcpy(w, p, (size_t)C * sizeof(float));
            else if (accumulate) for (c = 0; c < C; c++) p[c] += w[c];
            else memcpy(p, w, (size_t)C * sizeof(float));
        }
        off += C;
    }
    return DT_OK;
}

DT_API dt_status dt_concat_fwd(dt_ctx *ctx, dt_tensor *out, const dt_tensor *const *ins, int n) {
    return dt__concat(ctx, out, (dt_tensor *const *)ins, n, 1, 0, "dt_concat_fwd");
}
DT_API dt_status dt_concat_bwd(dt_ctx *ctx, dt_tensor *const *dins, int n, const dt_tensor *dout) {
    return dt__concat(ctx, (dt_tensor *)dout, dins, n, 0, 1, "dt_concat_bwd");
}
DT_API dt_status dt_split_fwd(dt_ctx *ctx, dt_tensor *const *outs, int n, const dt_tensor *in) {
    return dt__concat(ctx, (dt_tensor *)in, outs, n, 0, 0, "dt_split_fwd");
}
DT_API dt_status dt_split_bwd(dt_ctx *ctx, dt_tensor *din, const dt_tensor *const *douts, int n) {
    if (ctx && !din) return DT_OK;
    return dt__concat(ctx, din, (dt_tensor *const *)douts, n, 1, 1, "dt_split_bwd");
}

/* ==== >>params: parameter sets ================================================================ */

DT_API dt_status dt_params_add(dt_ctx *ctx, dt_params *ps, dt_param **out, const dt_param_desc *desc) {
    const char *fn = "dt_params_add";
    dt_param *p;
    dt_tensor_desc td;
    dt_init_desc init;
    int nd, gnd, i;
    dt_status st;
    if (out) *out = NULL;
    if (!ctx) return DT_ERR_ARG;
    if (!ps || !desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, ps ? "desc" : "ps");
    if (!desc->name || !desc->name[0] || strlen(desc->name) >= DT_NAME_MAX)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.name must be 1..%d characters", fn, DT_NAME_MAX - 1);
    if ((desc->no_decay != 0 && desc->no_decay != 1) || desc->group < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: \"%s\": desc.no_decay = %d (expected 0 or 1), desc.group = %d "
                                "(expected >= 0)", fn, desc->name, desc->no_decay, desc->group);
    if (dt_params_find(ps, desc->name))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a parameter named \"%s\" is already in the set", fn, desc->name);
    DT__TRY(dt__shape_from(ctx, fn, "desc.shape", desc->shape, desc->ndim, &nd));
    if (nd == 0) return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" has an empty desc.shape", fn, desc->name);
    if (desc->global_shape[0]) {
        DT__TRY(dt__shape_from(ctx, fn, "desc.global_shape", desc->global_shape, desc->ndim, &gnd));
        if (gnd != nd)
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" global_shape has %d dims, shape %d", fn,
                                    desc->name, gnd, nd);
    }
    for (i = 0; i < nd; i++) {
        int64_t g = desc->global_shape[0] ? desc->global_shape[i] : desc->shape[i];
        if (desc->start[i] < 0 || desc->start[i] > g - desc->shape[i]) /* no overflowing sum */
            return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: \"%s\" dim %d starts at %lld with %lld elements, "
                                    "outside the global extent %lld", fn, desc->name, i, (long long)desc->start[i],
                                    (long long)desc->shape[i], (long long)g);
    }
    if (ps->count == ps->capacity) {
        int64_t cap = ps->capacity;
        if (ps->count == 2147483647)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the set already holds INT_MAX parameters", fn);
        DT__TRY(dt_grow(ctx, (void **)&ps->items, &cap, (int64_t)ps->count + 1, sizeof(dt_param *), "dt_params"));
        ps->capacity = cap > 2147483647 ? 2147483647 : (int)cap;
    }
    p = (dt_param *)dt_alloc_zeroed(ctx, sizeof *p);
    if (!p) return DT_ERR_OOM;
    memcpy(p->name, desc->name, strlen(desc->name) + 1);
    memset(&td, 0, sizeof td);
    td.dtype = desc->dtype;
    td.device = desc->device;
    td.ndim = nd;
    for (i = 0; i < nd; i++) {
        td.shape[i] = desc->shape[i];
        p->global_shape[i] = desc->global_shape[0] ? desc->global_shape[i] : desc->shape[i];
        p->start[i] = desc->start[i];
        if (p->global_shape[i] != desc->shape[i]) p->sharded = 1;
    }
    p->no_decay = desc->no_decay;
    p->group = desc->group;
    st = dt_tensor_create(ctx, &p->value, &td);
    td.dtype = DT_F32;
    if (!st) st = dt_tensor_create(ctx, &p->grad, &td);
    if (!st) {
        init = desc->init;
        init.name = p->name;
        /* a whole parameter is initialised as whole (its shape may have a zero dim, which a
           zero-padded global_shape cannot say); a shard with its place in the whole */
        for (i = 0; i < DT_MAX_DIMS; i++) {
            init.global_shape[i] = p->sharded ? p->global_shape[i] : 0;
            init.start[i] = p->sharded ? p->start[i] : 0;
        }
        st = dt_tensor_init(ctx, &p->value, &init);
    }
    if (st) {
        dt_tensor_free(ctx, &p->value);
        dt_tensor_free(ctx, &p->grad);
        dt_release(ctx, p);
        return st;
    }
    ps->items[ps->count++] = p;
    if (out) *out = p;
    return DT_OK;
}

DT_API dt_param *dt_params_find(const dt_params *ps, const char *name) {
    int i;
    if (!ps || !name) return NULL;
    for (i = 0; i < ps->count; i++)
        if (strcmp(ps->items[i]->name, name) == 0) return ps->items[i];
    return NULL;
}

DT_API void dt_params_zero_grad(dt_ctx *ctx, dt_params *ps) {
    int i;
    if (!ctx || !ps) return;
    for (i = 0; i < ps->count; i++) dt_tensor_fill(ctx, &ps->items[i]->grad, 0.0);
}

DT_API int64_t dt_params_numel(const dt_params *ps) {
    int64_t n = 0;
    int i;
    if (!ps) return 0;
    for (i = 0; i < ps->count; i++) n += ps->items[i]->value.numel;
    return n;
}

DT_API void dt_params_free(dt_ctx *ctx, dt_params *ps) {
    int i;
    if (!ctx || !ps) return;
    for (i = 0; i < ps->count; i++) {
        dt_tensor_free(ctx, &ps->items[i]->value);
        dt_tensor_free(ctx, &ps->items[i]->grad);
        dt_release(ctx, ps->items[i]);
    }
    dt_release(ctx, ps->items);
    memset(ps, 0, sizeof *ps);
}

/* ==== >>json: JSON: reader and escaper ======================================================== */

typedef struct dt__jp {
    dt_ctx *ctx;
    const char *s;
    size_t n, i;
    int depth;
} dt__jp;

static dt_status dt__jp_err(dt__jp *p, const char *what) {
    return dt_ctx_set_error(p->ctx, DT_ERR_FORMAT, "dt_json_parse: %s at byte %zu", what, p->i);
}

static void dt__jp_ws(dt__jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int dt__hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    int k;
    for (k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* Parses a string literal at p->i into freshly allocated UTF-8. The decoded text is never
   longer than the literal, so one allocation of the literal's length suffices. */
static dt_status dt__jp_string(dt__jp *p, char **out) {
    size_t j = p->i + 1, k = 0;
    char *o;
    while (j < p->n && p->s[j] != '"') j += (p->s[j] == '\\') ? 2 : 1;
    if (j >= p->n) return dt__jp_err(p, "unterminated string");
    o = (char *)dt_alloc(p->ctx, j - p->i);
    if (!o) return DT_ERR_OOM;
    for (p->i++; p->s[p->i] != '"'; p->i++) {
        char c = p->s[p->i];
        if ((unsigned char)c < 0x20) { dt_release(p->ctx, o); return dt__jp_err(p, "control character in string"); }
        if (c != '\\') { o[k++] = c; continue; }
        c = p->s[++p->i];
        switch (c) {
        case '"': case '\\': case '/': o[k++] = c; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (p->i + 4 >= p->n || !dt__hex4(p->s + p->i + 1, &cp)) { dt_release(p->ctx, o); return dt__jp_err(p, "bad \\u escape"); }
            p->i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p->i + 6 < p->n && p->s[p->i + 1] == '\\' && p->s[p->i + 2] == 'u' &&
                dt__hex4(p->s + p->i + 3, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->i += 6;
            }
            /* \uXXXX is 6 bytes of input and at most 3 of output; a pair is 12 in, 4 out */
            if (cp < 0x80) o[k++] = (char)cp;
            else if (cp < 0x800) { o[k++] = (char)(0xC0 | (cp >> 6)); o[k++] = (char)(0x80 | (cp & 63)); }
            else if (cp < 0x10000) {
                o[k++] = (char)(0xE0 | (cp >> 12)); o[k++] = (char)(0x80 | ((cp >> 6) & 63)); o[k++] = (char)(0x80 | (cp & 63));
            } else {
                o[k++] = (char)(0xF0 | (cp >> 18)); o[k++] = (char)(0x80 | ((cp >> 12) & 63));
                o[k++] = (char)(0x80 | ((cp >> 6) & 63)); o[k++] = (char)(0x80 | (cp & 63));
            }
            break;
        }
        default: dt_release(p->ctx, o); return dt__jp_err(p, "bad escape");
        }
    }
    p->i++;
    o[k] = 0;
    *out = o;
    return DT_OK;
}

static dt_status dt__jp_value(dt__jp *p, dt_json *v);

static dt_status dt__jp_push(dt__jp *p, dt_json *v, int64_t *cap, dt_json **slot) {
    if (v->count == 2147483647) return dt__jp_err(p, "more than INT_MAX items in one array or object");
    DT__TRY(dt_grow(p->ctx, (void **)&v->items, cap, (int64_t)v->count + 1, sizeof(dt_json), "dt_json_parse"));
    *slot = &v->items[v->count++];
    memset(*slot, 0, sizeof **slot);
    return DT_OK;
}

static dt_status dt__jp_container(dt__jp *p, dt_json *v, char close) {
    int64_t cap = 0;
    v->type = close == ']' ? DT_JSON_ARRAY : DT_JSON_OBJECT;
    if (++p->depth > 64) return dt__jp_err(p, "nesting deeper than 64");
    p->i++;
    dt__jp_ws(p);
    if (p->i < p->n && p->s[p->i] == close) { p->i++; p->depth--; return DT_OK; }
    for (;;) {
        dt_json *item = NULL;
        dt__jp_ws(p);
        DT__TRY(dt__jp_push(p, v, &cap, &item));
        if (close == '}') {
            if (p->i >= p->n || p->s[p->i] != '"') return dt__jp_err(p, "expected a key string");
            DT__TRY(dt__jp_string(p, &item->key));
            dt__jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return dt__jp_err(p, "expected ':'");
            p->i++;
        }
        DT__TRY(dt__jp_value(p, item));
        dt__jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->n && p->s[p->i] == close) { p->i++; p->depth--; return DT_OK; }
        return dt__jp_err(p, close == ']' ? "expected ',' or ']'" : "expected ',' or '}'");
    }
}

static dt_status dt__jp_value(dt__jp *p, dt_json *v) {
    char c;
    dt__jp_ws(p);
    if (p->i >= p->n) return dt__jp_err(p, "unexpected end of text");
    c = p->s[p->i];
    if (c == '{') return dt__jp_container(p, v, '}');
    if (c == '[') return dt__jp_container(p, v, ']');
    if (c == '"') { v->type = DT_JSON_STRING; return dt__jp_string(p, &v->string); }
    if (p->n - p->i >= 4 && memcmp(p->s + p->i, "true", 4) == 0) { v->type = DT_JSON_BOOL; v->number = 1; p->i += 4; return DT_OK; }
    if (p->n - p->i >= 5 && memcmp(p->s + p->i, "false", 5) == 0) { v->type = DT_JSON_BOOL; p->i += 5; return DT_OK; }
    if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) { v->type = DT_JSON_NULL; p->i += 4; return DT_OK; }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64], *end;
        size_t k = 0;
        while (p->i + k < p->n && k < sizeof buf - 1 && strchr("+-0123456789.eE", p->s[p->i + k])) {
            buf[k] = p->s[p->i + k];
            k++;
        }
        buf[k] = 0;
        v->type = DT_JSON_NUMBER;
        v->number = strtod(buf, &end);
        if (end == buf || (size_t)(end - buf) != k) return dt__jp_err(p, "bad number");
        p->i += k;
        return DT_OK;
    }
    return dt__jp_err(p, "unexpected character");
}

static void dt__json_free_items(dt_ctx *ctx, dt_json *j) {
    int i;
    for (i = 0; i < j->count; i++) dt__json_free_items(ctx, &j->items[i]);
    dt_release(ctx, j->items);
    dt_release(ctx, j->string);
    dt_release(ctx, j->key);
}

DT_API void dt_json_free(dt_ctx *ctx, dt_json *j) {
    if (!ctx || !j) return;
    dt__json_free_items(ctx, j);
    dt_release(ctx, j);
}

DT_API dt_status dt_json_parse(dt_ctx *ctx, dt_json **out, const char *text, size_t len) {
    dt__jp p;
    dt_json *root;
    dt_status st;
    if (out) *out = NULL;
    if (!ctx) return DT_ERR_ARG;
    if (!text || !out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_json_parse: %s is NULL", text ? "out" : "text");
    root = (dt_json *)dt_alloc_zeroed(ctx, sizeof *root);
    if (!root) return DT_ERR_OOM;
    p.ctx = ctx; p.s = text; p.n = len; p.i = 0; p.depth = 0;
    st = dt__jp_value(&p, root);
    if (!st) {
        dt__jp_ws(&p);
        if (p.i != p.n) st = dt__jp_err(&p, "trailing characters after the value");
    }
    if (st) { dt_json_free(ctx, root); return st; }
    *out = root;
    return DT_OK;
}

DT_API const dt_json *dt_json_get(const dt_json *obj, const char *key) {
    int i;
    if (!obj || !key || obj->type != DT_JSON_OBJECT) return NULL;
    for (i = 0; i < obj->count; i++)
        if (obj->items[i].key && strcmp(obj->items[i].key, key) == 0) return &obj->items[i];
    return NULL;
}

DT_API size_t dt_json_escape(char *buf, size_t n, const char *s) {
    size_t k = 0;
#define DT__PUT(ch) do { if (k + 1 < n) buf[k] = (ch); k++; } while (0)
    DT__PUT('"');
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { DT__PUT('\\'); DT__PUT((char)c); }
        else if (c == '\n') { DT__PUT('\\'); DT__PUT('n'); }
        else if (c == '\t') { DT__PUT('\\'); DT__PUT('t'); }
        else if (c == '\r') { DT__PUT('\\'); DT__PUT('r'); }
        else if (c < 0x20) {
            char hex[8];
            int h;
            snprintf(hex, sizeof hex, "\\u%04x", c);
            for (h = 0; h < 6; h++) DT__PUT(hex[h]);
        } else DT__PUT((char)c);
    }
    DT__PUT('"');
#undef DT__PUT
    if (n) buf[k < n ? k : n - 1] = 0;
    return k;
}

/* ==== >>strbuf: text builder (dt_strbuf) ====================================================== */

DT_API void dt_strbuf_add(dt_strbuf *b, const char *s, size_t n) {
    if (!b || b->failed) return;
    if ((!s && n) || !b->ctx) { b->failed = 1; return; } /* a NULL string is a failed write, not a crash */
    if (n >= (size_t)PTRDIFF_MAX - b->len) { b->failed = 1; return; }
    if (b->len + n + 1 > b->cap) { /* the one growable array (n < PTRDIFF_MAX - len: fits int64) */
        int64_t cap = (int64_t)b->cap;
        if (dt_grow(b->ctx, (void **)&b->text, &cap, (int64_t)(b->len + n + 1), 1, "dt_strbuf")) {
            b->failed = 1;
            return;
        }
        b->cap = (size_t)cap;
    }
    if (n) memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = 0;
}

DT_API void dt_strbuf_str(dt_strbuf *b, const char *s) { dt_strbuf_add(b, s, s ? strlen(s) : 1); }

DT_API void dt_strbuf_printf(dt_strbuf *b, const char *fmt, ...) {
    char small[256], *tmp = small;
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (!b || b->failed) return;
    if (n < 0 || !b->ctx) { b->failed = 1; return; }
    if ((size_t)n >= sizeof small) { /* rare: format again into a buffer of the right size */
        if (!(tmp = (char *)dt_alloc(b->ctx, (size_t)n + 1))) { b->failed = 1; return; }
        va_start(ap, fmt);
        vsnprintf(tmp, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    dt_strbuf_add(b, tmp, (size_t)n);
    if (tmp != small) dt_release(b->ctx, tmp);
}

DT_API void dt_strbuf_json(dt_strbuf *b, const char *s) {
    size_t need;
    char small[256], *tmp;
    if (!b || b->failed) return;
    if (!s || !b->ctx) { b->failed = 1; return; }
    need = dt_json_escape(NULL, 0, s);
    tmp = need < sizeof small ? small : (char *)dt_alloc(b->ctx, need + 1);
    if (!tmp) { b->failed = 1; return; }
    dt_json_escape(tmp, need + 1, s);
    dt_strbuf_add(b, tmp, need);
    if (tmp != small) dt_release(b->ctx, tmp);
}

DT_API void dt_strbuf_free(dt_strbuf *b) {
    if (!b) return;
    dt_release(b->ctx, b->text);
    b->text = NULL;
    b->len = b->cap = 0;
}

/* ==== >>safetensors: safetensors files ======================================================== */

DT_API const char *dt_safetensors_dtype_name(dt_dtype t) {
    switch (t) {
    case DT_F32: return "F32"; case DT_BF16: return "BF16"; case DT_F16: return "F16";
    case DT_I32: return "I32"; case DT_I64: return "I64"; case DT_U8: return "U8";
    default: return NULL;
    }
}

DT_API dt_dtype dt_safetensors_dtype_from(const char *name) {
    int t;
    for (t = DT_F32; name && t < DT_DTYPE_COUNT; t++)
        if (strcmp(name, dt_safetensors_dtype_name((dt_dtype)t)) == 0) return (dt_dtype)t;
    return DT_DTYPE_COUNT;
}

DT_API dt_status dt_safetensors_header(dt_ctx *ctx, dt_strbuf *out, const dt_tensor *const *tensors,
                                       const char *const *names, int n, const char *const *meta, int n_meta) {
    const char *fn = "dt_safetensors_header";
    uint64_t off = 0;
    size_t start;
    int i, j, k;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    if (n < 0 || n_meta < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n = %d, n_meta = %d; expected counts >= 0", fn, n, n_meta);
    if (n > 0 && (!tensors || !names))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n = %d tensors but %s is NULL", fn, n, tensors ? "names" : "tensors");
    if (n_meta > 0 && !meta)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_meta = %d pairs but meta is NULL", fn, n_meta);
    for (k = 0; k < n_meta; k++) { /* a JSON object: keys present, once each; values present */
        if (!meta[2 * k] || !meta[2 * k][0] || !meta[2 * k + 1])
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: meta pair %d has %s; expected a non-empty key and a "
                                    "value (\"\" for none)", fn, k, !meta[2 * k] ? "a NULL key" : !meta[2 * k][0] ?
                                    "an empty key" : "a NULL value");
        for (j = 0; j < k; j++)
            if (strcmp(meta[2 * k], meta[2 * j]) == 0)
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: meta key %d \"%s\" repeats key %d", fn, k, meta[2 * k], j);
    }
    for (i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] || strcmp(names[i], "__metadata__") == 0)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: names[%d] is empty or reserved", fn, i);
        DT__TRY(dt__valid(ctx, tensors[i], fn, names[i]));
        for (j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: names[%d] = \"%s\" repeats names[%d]", fn, i, names[i], j);
    }
    start = out->len;
    dt_strbuf_str(out, "{");
    if (n_meta > 0) {
        dt_strbuf_str(out, "\"__metadata__\":{");
        for (k = 0; k < n_meta; k++) {
            if (k) dt_strbuf_str(out, ",");
            dt_strbuf_json(out, meta[2 * k]);
            dt_strbuf_str(out, ":");
            dt_strbuf_json(out, meta[2 * k + 1]);
        }
        dt_strbuf_str(out, "}");
    }
    for (i = 0; i < n; i++) {
        const dt_tensor *t = tensors[i];
        if (i || n_meta > 0) dt_strbuf_str(out, ",");
        dt_strbuf_json(out, names[i]);
        dt_strbuf_printf(out, ":{\"dtype\":\"%s\",\"shape\":[", dt_safetensors_dtype_name(t->dtype));
        for (j = 0; j < t->ndim; j++) dt_strbuf_printf(out, j ? ",%lld" : "%lld", (long long)t->shape[j]);
        dt_strbuf_printf(out, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                         (unsigned long long)(off + dt_tensor_bytes(t)));
        off += dt_tensor_bytes(t);
    }
    dt_strbuf_str(out, "}");
    /* the spec pads the header to 8 bytes: the header's own length, whatever out held before */
    while (!out->failed && (out->len - start) % 8) dt_strbuf_str(out, " ");
    return out->failed ? dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: out of memory building the header", fn) : DT_OK;
}

DT_API dt_status dt_safetensors_prefix(dt_ctx *ctx, dt_strbuf *out, uint64_t *file_bytes,
                                       const dt_tensor *const *tensors, const char *const *names, int n,
                                       const char *const *meta, int n_meta) {
    const char *fn = "dt_safetensors_prefix";
    unsigned char len8[8] = {0};
    uint64_t hl, data = 0, b;
    size_t at;
    dt_status st;
    int i, k;
    if (file_bytes) *file_bytes = 0;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out is NULL", fn);
    at = out->len;
    dt_strbuf_add(out, (const char *)len8, 8); /* filled in once the header's length is known */
    st = dt_safetensors_header(ctx, out, tensors, names, n, meta, n_meta);
    for (i = 0; !st && i < n; i++) { /* the data section's size, as the header's data_offsets end */
        b = dt_tensor_bytes(tensors[i]);
        if (b > UINT64_MAX - data)
            st = dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the tensors hold more than 2^64 bytes together", fn);
        data += b;
    }
    if (st) { /* *out as it was */
        if (!out->failed && out->text) { out->len = at; out->text[at] = 0; }
        return st;
    }
    hl = (uint64_t)(out->len - at - 8);
    for (k = 0; k < 8; k++) out->text[at + (size_t)k] = (char)(unsigned char)(hl >> (8 * k));
    if (data > UINT64_MAX - 8 - hl)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the file would hold more than 2^64 bytes", fn);
    if (file_bytes) *file_bytes = 8 + hl + data;
    return DT_OK;
}

/* Writes `bytes` of t to fp, through a host copy when t is on the GPU. */
static dt_status dt__write_tensor(dt_ctx *ctx, FILE *fp, const dt_tensor *t, const char *path) {
    size_t bytes = dt_tensor_bytes(t);
    if (bytes == 0) return DT_OK;
    if (t->device == DT_CUDA_DEVICE) {
        dt_tensor h;
        dt_status st;
        DT__TRY(dt_tensor_create_like(ctx, &h, t, DT_DTYPE_DEFAULT, DT_CPU));
        st = dt_tensor_copy(ctx, &h, t);
        if (!st && fwrite(h.data, 1, bytes, fp) != bytes)
            st = dt_ctx_set_error(ctx, DT_ERR_IO, "dt_safetensors_save: writing %s failed", path);
        dt_tensor_free(ctx, &h);
        return st;
    }
    if (fwrite(t->data, 1, bytes, fp) != bytes)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_safetensors_save: writing %zu bytes to %s failed", bytes, path);
    return DT_OK;
}

DT_API dt_status dt_safetensors_save(dt_ctx *ctx, const char *path, const dt_tensor *const *tensors,
                                     const char *const *names, int n, const char *const *meta, int n_meta) {
    const char *fn = "dt_safetensors_save";
    dt_strbuf hb;
    char *tmp;
    FILE *fp;
    dt_status st;
    int i;
    if (!ctx) return DT_ERR_ARG;
    if (!path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: path is NULL", fn);
    memset(&hb, 0, sizeof hb);
    hb.ctx = ctx;
    st = dt_safetensors_prefix(ctx, &hb, NULL, tensors, names, n, meta, n_meta);
    if (st) { dt_strbuf_free(&hb); return st; }
    tmp = (char *)dt_alloc(ctx, strlen(path) + 5);
    if (!tmp) { dt_strbuf_free(&hb); return DT_ERR_OOM; }
    snprintf(tmp, strlen(path) + 5, "%s.tmp", path);
    fp = fopen(tmp, "wb");
    if (!fp) {
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s for writing", fn, tmp);
    } else {
        if (fwrite(hb.text, 1, hb.len, fp) != hb.len)
            st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: writing the header of %s failed", fn, tmp);
        for (i = 0; !st && i < n; i++) st = dt__write_tensor(ctx, fp, tensors[i], tmp);
        /* flush + fsync before rename: the new name must never point at unwritten blocks */
        if (!st && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
            st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: flushing %s failed", fn, tmp);
        if (fclose(fp) != 0 && !st) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: closing %s failed", fn, tmp);
        if (!st && rename(tmp, path) != 0)
            st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: renaming %s to %s failed", fn, tmp, path);
        if (st) remove(tmp);
    }
    dt_release(ctx, tmp);
    dt_strbuf_free(&hb);
    return st;
}

static void dt__st_free(dt_ctx *ctx, dt_st_file *f) {
    int i;
    if (f->fp) fclose((FILE *)f->fp);
    for (i = 0; i < f->n_entries; i++) dt_release(ctx, f->entries[i].name);
    dt_release(ctx, f->entries);
    for (i = 0; i < f->n_meta; i++) { dt_release(ctx, f->meta_keys[i]); dt_release(ctx, f->meta_values[i]); }
    dt_release(ctx, f->meta_keys);
    dt_release(ctx, f->meta_values);
    memset(f, 0, sizeof *f);
}

static char *dt__strdup(dt_ctx *ctx, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)dt_alloc(ctx, n);
    if (d) memcpy(d, s, n);
    return d;
}

DT_API int dt_json_count(const dt_json *j, int64_t *out) {
    /* 2^53: every integer up to it is exact in a double, so the cast below is defined and exact */
    if (!j || j->type != DT_JSON_NUMBER || !(j->number >= 0) || j->number > 9007199254740992.0 ||
        j->number != floor(j->number))
        return 0;
    if (out) *out = (int64_t)j->number;
    return 1;
}

static int dt__is_count(const dt_json *j) { return dt_json_count(j, NULL); }

/* Fills entry e from the header value v (name last, so a failed entry holds nothing);
   FORMAT errors name the file and the entry. */
static dt_status dt__st_entry(dt_ctx *ctx, uint64_t data_len, dt_st_entry *e, const dt_json *v, const char *path,
                              const char *fn) {
    const dt_json *dt = dt_json_get(v, "dtype"), *sh = dt_json_get(v, "shape"), *off = dt_json_get(v, "data_offsets");
    int64_t numel = 1;
    size_t bytes = 0;
    int d;
    if (v->type != DT_JSON_OBJECT || !dt || dt->type != DT_JSON_STRING || !sh || sh->type != DT_JSON_ARRAY ||
        !off || off->type != DT_JSON_ARRAY || off->count != 2 || !dt__is_count(&off->items[0]) ||
        !dt__is_count(&off->items[1]))
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\" lacks a valid dtype, shape or "
                                "data_offsets", fn, path, v->key);
    e->dtype = dt_safetensors_dtype_from(dt->string);
    if (e->dtype == DT_DTYPE_COUNT)
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: %s: entry \"%s\" has dtype %s; dt reads F32, BF16, "
                                "F16, I32, I64, U8", fn, path, v->key, dt->string);
    if (sh->count > DT_MAX_DIMS)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\" has %d dims; dt allows %d", fn, path,
                                v->key, sh->count, DT_MAX_DIMS);
    e->ndim = sh->count;
    for (d = 0; d < sh->count; d++) {
        if (!dt__is_count(&sh->items[d]) || sh->items[d].number > 4e15)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\" shape[%d] is not a count", fn, path,
                                    v->key, d);
        e->shape[d] = (int64_t)sh->items[d].number;
        if (!dt_mul_ok(numel, e->shape[d], &numel) || !dt__bytes_ok(numel, e->dtype, &bytes))
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\": the product of its dims up to "
                                    "shape[%d] overflows", fn, path, v->key, d);
    }
    if (!dt__bytes_ok(numel, e->dtype, &bytes)) bytes = 0; /* 0 dims: one element, always fits */
    e->begin = (uint64_t)off->items[0].number;
    e->end = (uint64_t)off->items[1].number;
    if (e->end < e->begin || e->end - e->begin != (uint64_t)bytes)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\" data_offsets [%llu, %llu] do not hold "
                                "%lld %s elements", fn, path, v->key, (unsigned long long)e->begin,
                                (unsigned long long)e->end, (long long)numel, dt_dtype_name(e->dtype));
    if (e->end > data_len)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entry \"%s\" ends at byte %llu of the data, which has "
                                "only %llu bytes (truncated file?)", fn, path, v->key,
                                (unsigned long long)e->end, (unsigned long long)data_len);
    e->name = dt__strdup(ctx, v->key);
    return e->name ? DT_OK : DT_ERR_OOM;
}

static int dt__st_cmp(const void *a, const void *b) {
    const dt_st_entry *x = (const dt_st_entry *)a, *y = (const dt_st_entry *)b;
    /* by (begin, end), as the reference implementation: an empty entry at the start of a full
       one sorts first and does not overlap it */
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
}


DT_API dt_status dt_safetensors_header_len(dt_ctx *ctx, uint64_t *len, const unsigned char first8[8],
                                           uint64_t file_size, const char *path) {
    uint64_t hl = 0;
    int k;
    if (len) *len = 0;
    if (!ctx) return DT_ERR_ARG;
    if (!len || !first8) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_safetensors_header_len: %s is NULL",
                                                 len ? "first8" : "len");
    if (!path) path = "(memory)";
    if (file_size < 8)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s is %llu bytes, shorter than the 8-byte header length "
                                "(truncated or not a safetensors file)", path, (unsigned long long)file_size);
    for (k = 7; k >= 0; k--) hl = (hl << 8) | first8[k];
    if (hl > DT_SAFETENSORS_MAX_HEADER || hl > file_size - 8 || hl < 2)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s declares a %llu-byte header, but the file has %llu bytes "
                                "after the length and the limit is %llu (truncated or not a safetensors file)",
                                path, (unsigned long long)hl, (unsigned long long)(file_size - 8),
                                (unsigned long long)DT_SAFETENSORS_MAX_HEADER);
    *len = hl;
    return DT_OK;
}

/* Fills the entries and metadata of f from a parsed header; f->fp is not touched. */
static dt_status dt__st_fill(dt_ctx *ctx, dt_st_file *f, const dt_json *root, const char *path, const char *fn) {
    const dt_json *meta = dt_json_get(root, "__metadata__");
    int i, ne, nm;
    dt_status st = DT_OK;
    if (root->type != DT_JSON_OBJECT)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: the header is not a JSON object (not a safetensors "
                                "file)", fn, path);
    if (meta && meta->type != DT_JSON_OBJECT)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: __metadata__ is not an object", fn, path);
    ne = root->count - (meta ? 1 : 0);
    nm = meta ? meta->count : 0;
    f->entries = (dt_st_entry *)dt_alloc(ctx, (size_t)(ne ? ne : 1) * sizeof(dt_st_entry));
    f->meta_keys = (char **)dt_alloc(ctx, (size_t)(nm ? nm : 1) * sizeof(char *));
    f->meta_values = (char **)dt_alloc(ctx, (size_t)(nm ? nm : 1) * sizeof(char *));
    if (!f->entries || !f->meta_keys || !f->meta_values) return DT_ERR_OOM;
    for (i = 0; !st && i < nm; i++) {
        const dt_json *m = &meta->items[i];
        if (m->type != DT_JSON_STRING)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: __metadata__ value \"%s\" is not a string", fn, path,
                                    m->key);
        f->meta_keys[i] = dt__strdup(ctx, m->key);
        f->meta_values[i] = dt__strdup(ctx, m->string);
        f->n_meta = i + 1;
        if (!f->meta_keys[i] || !f->meta_values[i]) return DT_ERR_OOM;
    }
    for (i = 0; !st && i < root->count; i++) {
        if (&root->items[i] == meta) continue;
        memset(&f->entries[f->n_entries], 0, sizeof(dt_st_entry));
        st = dt__st_entry(ctx, f->data_len, &f->entries[f->n_entries], &root->items[i], path, fn);
        if (!st) f->n_entries++;
    }
    if (!st && f->n_entries > 1) {
        qsort(f->entries, (size_t)f->n_entries, sizeof(dt_st_entry), dt__st_cmp);
        for (i = 1; i < f->n_entries && !st; i++)
            if (f->entries[i].begin < f->entries[i - 1].end)
                st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: entries \"%s\" and \"%s\" overlap", fn, path,
                                      f->entries[i - 1].name, f->entries[i].name);
    }
    return st;
}

static dt_status dt__st_parse(dt_ctx *ctx, dt_st_file *f, const char *text, size_t len, uint64_t data_len,
                              const char *path, const char *fn) {
    dt_json *root = NULL;
    dt_status st;
    memset(f, 0, sizeof *f);
    f->header_len = len;
    f->data_len = data_len;
    if (len == 0 || text[0] != '{')
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: the header is not a JSON object (not a safetensors "
                                "file)", fn, path);
    if (dt_json_parse(ctx, &root, text, len)) {
        char why[DT_ERROR_MAX];
        memcpy(why, ctx->last_error, sizeof why);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: header is not valid JSON (%s)", fn, path, why);
    }
    st = dt__st_fill(ctx, f, root, path, fn);
    dt_json_free(ctx, root);
    if (st) dt__st_free(ctx, f);
    return st;
}

DT_API dt_status dt_safetensors_parse(dt_ctx *ctx, dt_st_file *f, const char *text, size_t len, uint64_t data_len,
                                      const char *path) {
    if (!ctx) return DT_ERR_ARG;
    if (!f || !text) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_safetensors_parse: %s is NULL", f ? "text" : "f");
    return dt__st_parse(ctx, f, text, len, data_len, path ? path : "(memory)", "dt_safetensors_parse");
}

DT_API dt_status dt_safetensors_open(dt_ctx *ctx, dt_st_file *f, const char *path) {
    const char *fn = "dt_safetensors_open";
    unsigned char len8[8];
    char *text;
    long size;
    uint64_t hl = 0;
    dt_status st = DT_OK;
    FILE *fp;
    if (!ctx) return DT_ERR_ARG;
    if (!f || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, f ? "path" : "f");
    memset(f, 0, sizeof *f);
    fp = fopen(path, "rb");
    if (!fp) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s", fn, path);
    if (fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot size %s", fn, path);
    }
    if (size >= 8 && fread(len8, 1, 8, fp) != 8) { /* a directory opens, and sizes as LONG_MAX, on Linux */
        int e = errno;
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot read %s: %s", fn, path, strerror(e));
    }
    if (size < 8) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is %ld bytes, shorter than the 8-byte header length "
                                "(truncated or not a safetensors file)", fn, path, size);
    }
    if ((st = dt_safetensors_header_len(ctx, &hl, len8, (uint64_t)size, path))) { fclose(fp); return st; }
    text = (char *)dt_alloc(ctx, (size_t)hl);
    if (!text) { fclose(fp); return DT_ERR_OOM; }
    if (fread(text, 1, (size_t)hl, fp) != hl)
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: reading the header of %s failed", fn, path);
    if (!st) st = dt__st_parse(ctx, f, text, (size_t)hl, (uint64_t)size - 8 - hl, path, fn);
    dt_release(ctx, text);
    if (st) { fclose(fp); return st; }
    f->fp = fp;
    return DT_OK;
}

DT_API const dt_st_entry *dt_safetensors_find(const dt_st_file *f, const char *name) {
    int i;
    if (!f || !name) return NULL;
    for (i = 0; i < f->n_entries; i++)
        if (strcmp(f->entries[i].name, name) == 0) return &f->entries[i];
    return NULL;
}

DT_API const char *dt_safetensors_meta(const dt_st_file *f, const char *key) {
    int i;
    if (!f || !key) return NULL;
    for (i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

DT_API dt_status dt_safetensors_read(dt_ctx *ctx, dt_st_file *f, dt_tensor *dst, const char *name) {
    const char *fn = "dt_safetensors_read";
    const dt_st_entry *e;
    size_t bytes;
    int d;
    dt_status st = DT_OK;
    if (!ctx) return DT_ERR_ARG;
    if (!f || !f->fp || !name)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: f (open) and name must be non-NULL", fn);
    DT__TRY(dt__valid(ctx, dst, fn, "dst"));
    e = dt_safetensors_find(f, name);
    if (!e) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: no tensor named \"%s\" in the file", fn, name);
    if (e->dtype != dst->dtype)
        return dt_ctx_set_error(ctx, DT_ERR_DTYPE, "%s: \"%s\" is %s in the file, dst is %s", fn, name,
                                dt_dtype_name(e->dtype), dt_dtype_name(dst->dtype));
    for (d = 0; d < e->ndim; d++)
        if (e->ndim != dst->ndim || e->shape[d] != dst->shape[d]) {
            char s[96];
            return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" has %d dims (dim %d = %lld) in the file, dst "
                                    "shape is %s", fn, name, e->ndim, d, (long long)e->shape[d],
                                    dt_shape_str(dst, s, sizeof s));
        }
    if (e->ndim != dst->ndim)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: \"%s\" has %d dims in the file, dst %d", fn, name, e->ndim,
                                dst->ndim);
    bytes = (size_t)(e->end - e->begin);
    if (fseek((FILE *)f->fp, (long)(8 + f->header_len + e->begin), SEEK_SET) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: seek to \"%s\" failed", fn, name);
    if (dst->device == DT_CUDA_DEVICE) {
        dt_tensor h;
        DT__TRY(dt_tensor_create_like(ctx, &h, dst, DT_DTYPE_DEFAULT, DT_CPU));
        if (fread(h.data, 1, bytes, (FILE *)f->fp) != bytes)
            st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: \"%s\" is cut short (truncated file)", fn, name);
        if (!st) st = dt_tensor_copy(ctx, dst, &h);
        dt_tensor_free(ctx, &h);
        return st;
    }
    if (fread(dst->data, 1, bytes, (FILE *)f->fp) != bytes)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: \"%s\" is cut short (truncated file)", fn, name);
    return DT_OK;
}

DT_API void dt_safetensors_close(dt_ctx *ctx, dt_st_file *f) {
    if (ctx && f) dt__st_free(ctx, f);
}

DT_API dt_status dt_params_save(dt_ctx *ctx, const dt_params *ps, const char *path) {
    const dt_tensor **ts;
    const char **names;
    const char *meta[2] = {"format", "dt-params"};
    dt_status st;
    int i;
    if (!ctx) return DT_ERR_ARG;
    if (!ps) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_params_save: ps is NULL");
    ts = (const dt_tensor **)dt_alloc(ctx, (size_t)(ps->count + 1) * sizeof(void *));
    names = (const char **)dt_alloc(ctx, (size_t)(ps->count + 1) * sizeof(void *));
    if (!ts || !names) { dt_release(ctx, ts); dt_release(ctx, names); return DT_ERR_OOM; }
    for (i = 0; i < ps->count; i++) { ts[i] = &ps->items[i]->value; names[i] = ps->items[i]->name; }
    st = dt_safetensors_save(ctx, path, ts, names, ps->count, meta, 1);
    dt_release(ctx, ts);
    dt_release(ctx, names);
    return st;
}

/* Checks every parameter against the file before reading any, so a mismatched file leaves the
   parameters as they were. */
DT_API dt_status dt_params_load(dt_ctx *ctx, dt_params *ps, const char *path) {
    const char *fn = "dt_params_load";
    dt_st_file f;
    dt_status st = DT_OK;
    int i, d;
    if (!ctx) return DT_ERR_ARG;
    if (!ps) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: ps is NULL", fn);
    DT__TRY(dt_safetensors_open(ctx, &f, path));
    for (i = 0; i < ps->count && !st; i++) {
        const dt_param *p = ps->items[i];
        const dt_st_entry *e = dt_safetensors_find(&f, p->name);
        if (!e) { st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s has no tensor \"%s\"", fn, path, p->name); break; }
        if (e->dtype != p->value.dtype || e->ndim != p->value.ndim)
            st = dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s: \"%s\" is %s with %d dims in the file; the parameter "
                                  "is %s with %d dims", fn, path, p->name, dt_dtype_name(e->dtype), e->ndim,
                                  dt_dtype_name(p->value.dtype), p->value.ndim);
        for (d = 0; !st && d < e->ndim; d++)
            if (e->shape[d] != p->value.shape[d])
                st = dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: %s: \"%s\" dim %d is %lld in the file, %lld in the "
                                      "parameter", fn, path, p->name, d, (long long)e->shape[d],
                                      (long long)p->value.shape[d]);
    }
    for (i = 0; i < ps->count && !st; i++) st = dt_safetensors_read(ctx, &f, &ps->items[i]->value, ps->items[i]->name);
    dt_safetensors_close(ctx, &f);
    return st;
}

#ifdef __cplusplus
}
#endif
#endif /* DT_TENSOR_IMPLEMENTATION_DONE */
#endif /* DT_TENSOR_IMPLEMENTATION */

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
