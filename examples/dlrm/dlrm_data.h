/* examples/dlrm/dlrm_data.h - the data side of the DLRM example: Criteo-shaped synthetic
   samples, the Criteo TSV reader, a memory-mapped binary form, the batch the trainer consumes,
   and exact AUC / logloss.                                              v0.1, MIT licence

   Part of examples/dlrm, not a library header, but written like one. Do this:
       #define DT_DLRM_DATA_IMPLEMENTATION   (or DT_IMPLEMENTATION)
   before you include this file in *one* C or C++ file, after dt_tensor.h. Other files include
   it without the define. Options (implementation file only):
       DT_DLRM_NO_MMAP   dt_dlrm_bin_open reads the file into memory instead of mapping it
                         (what it also does when mmap fails, and on non-POSIX systems).

   API in one breath:
       dt_dlrm_split                  a rank's slice of a global batch (below)
       dt_dlrm_batch_free             the batch: dense, labels, KeyedJaggedTensor sparse part
       dt_dlrm_synth_init / _batch / _range / _logits      built-in synthetic data
       dt_dlrm_tsv_open / _open_stream / _open_mem / _next / _close    Criteo TSV reader
       dt_dlrm_bin_convert / dt_dlrm_bin_open / _batch / _range / _close   binary form
       dt_dlrm_auc / dt_dlrm_logloss  evaluation
       dt_dlrm_hash_id, dt_dlrm_default_cardinality, dt_dlrm_kaggle_cardinality

   The batch (dt_dlrm_batch), B samples:
       dense    f32 [B, 13]   log(1 + max(x, 0)) of the 13 integer features
       labels   f32 [B]       0 or 1
       lengths  i32 [26 * B]  lengths[f*B + b] = number of ids of feature f in sample b
       offsets  i64 [26*B+1]  exclusive prefix sums of lengths (offsets[0] = 0)
       ids      i64 [nnz]     feature-major: feature 0's ids of samples 0..B-1, then feature 1...
   This is TorchRec's KeyedJaggedTensor layout (keys = the 26 features, lengths per key and
   sample). Criteo data has exactly one id per feature per sample (every length 1, nnz = 26B);
   the synthetic generator can emit multi-hot bags, empty ones included. The tensors are views
   into storage the batch owns and regrows as needed: they change at every fill, so take them
   from the batch after each call. An empty batch (B = 0) is valid: every tensor has a 0 dim
   (offsets holds the one 0), nnz = 0.

   The distributed split (dt_dlrm_split): global batch g of size B is samples [g*B, g*B + B).
   Rank r of W gets [g*B + floor(r*B/W), g*B + floor((r+1)*B/W)): local sizes differ by at most
   one, a rank may get none (B < W), and the slices of ranks 0..W-1, concatenated in rank order,
   are the global batch in order. Every sample is a pure function of (seed, global index) for
   the synthetic data, and of its index for a binary file, so every world size sees exactly
   the same global batches, and a gather of per-rank results in rank order is the 1-rank array.
   A binary file of N samples ends with a partial batch: its slices are clipped at N.

   Synthetic data: 13 dense and 26 categorical features. Sample i draws its values from Philox
   blocks of dt_tensor.h keyed by the seed, counter (i, block): nothing depends on what was
   generated before, so any range can be made on its own. Dense feature j is a heavy-tailed
   count x = floor(scale_j * (u^(-1/1.2) - 1)) (a Lomax law), missing (0) with probability
   miss_j, stored as log(1 + x). Categorical feature f draws a rank k in [0, N_f) from a
   continuous power law (density of k+1 proportional to (k+1)^-s, s = zipf) and maps it to an
   id through a per-feature bijection id = (k * a_f + c_f) mod N_f (so the hot ids are spread
   over the table, as hashed Criteo ids are); ordered_ids = 1 keeps id = k. The click is drawn
   from a hidden logistic teacher:
       logit = bias + sum_j w_j * (dense_j - m_j) over dense 0..3
                    + sum_f e_f(id) over categorical 0..3 (mean over the bag; empty bag: 0)
   where e_f(id) is a latent effect per id (std 0.9) from a hash of (seed, f, id), which an
   embedding can learn. The bias makes ~25% of samples clicks (Criteo's rate).
   dt_dlrm_synth_logits gives the teacher's logits of a batch (the best any model can do).
   Values use libm's logf/expf, so they are bitwise identical on one machine and libm.

   Criteo TSV: "label \t I1..I13 \t C1..C26", newline-terminated (the last line may lack one,
   a trailing \r is dropped). label is 0 or 1. I* are decimal integers (optional '-'), empty =
   0; dense = (float)log1p(max(x, 0)), as the MLPerf reference. C* are hexadecimal (1 to 16
   digits), hashed into feature f's table of N_f rows:
       empty (missing)  -> id 0, the row reserved for "missing"
       value v          -> id 1 + dt_dlrm_hash_id(v) % (N_f - 1)     (N_f = 1: id 0)
       dt_dlrm_hash_id(v) = splitmix64's finalizer: z = v + 0x9E3779B97F4A7C15;
           z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
           z ^ (z >> 31)                                   (all mod 2^64)
   A malformed line (wrong field count, bad integer, bad hex, label not 0/1, line longer than
   max_line) is DT_ERR_FORMAT naming the file, the line, the field and its text, or, with
   skip_bad = 1, is skipped and counted (dt_dlrm_tsv.skipped; the first reason is kept).

   Binary form (dt_dlrm_bin_convert writes it from a TSV once; dt_dlrm_bin_open maps it).
   Little-endian, offsets in bytes:
       0    char[8]  magic "DTDLRMB\0"
       8    u32      version (1)
       12   u32      header bytes (256)
       16   u64      N, the number of samples
       24   u32      dense features (13)
       28   u32      sparse features (26)
       32   u32      label bytes: 1 (u8 0/1) or 4 (f32 0.0/1.0)
       36   u32      id bytes: 4 (i32) or 8 (i64)
       40   u64      lines the conversion skipped (information only)
       48   u64[26]  table sizes N_f (every id of feature f is in [0, N_f))
       256           labels [N]; then, each starting at the next multiple of 64:
                     dense f32 [N, 13]; ids [N, 26] (sample-major)
   The file size must be exactly the end of the ids: a truncated or foreign file is
   DT_ERR_FORMAT at open, never a crash. Labels, ids and dense values are checked as a batch
   is filled (a corrupt value is DT_ERR_FORMAT naming the sample and feature).

   Evaluation: dt_dlrm_auc is the exact ROC AUC (Mann-Whitney U; tied scores count 1/2),
   computed with integer counts after a sort, so it does not depend on the order of the
   samples (a gather in any order gives the same bits). dt_dlrm_logloss sums in double in
   index order: gathered in rank order (the split above) it equals the 1-rank value bitwise.
   The gather itself (MPI_Gatherv of the local scores and labels) is the trainer's.

   Errors: every function that can fail returns dt_status and sets the ctx message (naming the
   argument, the value, what was expected). Memory: from the ctx allocator (dt_alloc), counted.
   Threads: a dt_dlrm_synth is read-only after init and may be shared by threads that fill
   their own batches with their own ctx; readers, files and batches belong to one thread.

   The licence (MIT) is at the end of this file. */
#ifndef DT_DLRM_DATA_H
#define DT_DLRM_DATA_H

#include <stdint.h>
#include <stdio.h>

#ifndef DT_TENSOR_H
#error "include dt_tensor.h before examples/dlrm/dlrm_data.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DT_DLRM_DENSE 13
#define DT_DLRM_SPARSE 26
#define DT_DLRM_MAX_LINE 4096        /* default longest TSV line, bytes without the newline */
#define DT_DLRM_MAX_BAG 1024         /* longest multi-hot bag */
#define DT_DLRM_BIN_HEADER 256
#define DT_DLRM_TEACHER_KEY 0x7EAC4E5C11C4ull

/* ---------------------------------------------------------------- batch and split */

typedef struct dt_dlrm_batch {
    int64_t size;      /* B, the samples in this batch (may be 0) */
    int64_t start;     /* global index of its first sample */
    int64_t nnz;       /* ids.numel */
    dt_tensor dense;   /* f32 [B, 13] */
    dt_tensor labels;  /* f32 [B] */
    dt_tensor lengths; /* i32 [26 * B], lengths[f*B + b] */
    dt_tensor offsets; /* i64 [26 * B + 1] */
    dt_tensor ids;     /* i64 [nnz], feature-major */
    /* storage behind the views, grown on demand (dt_grow); not for the caller */
    void *store[5];
    int64_t store_cap[5];
} dt_dlrm_batch;

/* Releases the batch's storage and zeroes it; a zeroed batch is ready to be filled again. */
DT_API void dt_dlrm_batch_free(dt_ctx *ctx, dt_dlrm_batch *batch);

/* *start, *count = rank's slice of global batch `global_batch` of `batch_size` samples, in a
   data set of n_total samples (-1 = unbounded, the synthetic stream); see the top comment. */
DT_API dt_status dt_dlrm_split(dt_ctx *ctx, int64_t *start, int64_t *count, int64_t global_batch,
                               int64_t batch_size, int rank, int world, int64_t n_total);

/* Rows of feature f in the scaled default tables (Criteo Kaggle's, capped at 16384 rows, so a
   demo trains on 2 cores in minutes), and Criteo Kaggle's own counts. f outside 0..25: 0. */
DT_API int64_t dt_dlrm_default_cardinality(int f);
DT_API int64_t dt_dlrm_kaggle_cardinality(int f);
DT_API uint64_t dt_dlrm_hash_id(uint64_t value);

/* ---------------------------------------------------------------- synthetic data */

typedef struct dt_dlrm_synth_desc {
    uint64_t seed;
    int64_t cardinality[DT_DLRM_SPARSE]; /* rows per feature, 1..2^31; 0 = default */
    double zipf;                         /* power-law exponent s, 0..4; 0 = 1.05 */
    int ordered_ids;                     /* flag: 1 = id k is the k-th most frequent */
    double multi_hot_mean;               /* mean bag length (geometric, empty bags included),
                                            0 = one id per feature (Criteo), else (0, 256] */
    int max_bag;                         /* longest bag (cap), 0 = DT_DLRM_MAX_BAG */
} dt_dlrm_synth_desc;

typedef struct dt_dlrm_synth {
    uint64_t seed;
    int64_t card[DT_DLRM_SPARSE];
    uint64_t mult[DT_DLRM_SPARSE], add[DT_DLRM_SPARSE]; /* the id bijection */
    double inv_card[DT_DLRM_SPARSE];
    float zipf_a[DT_DLRM_SPARSE];  /* (N+1)^(1-s) - 1, or ln(N+1) when s = 1 */
    float zipf_inv;                /* 1 / (1 - s) */
    int zipf_one;                  /* s == 1 */
    int multi_hot, max_bag;
    float log_q;                   /* ln(1 - p) of the geometric bag length, p = 1/(1+mean) */
    int ready;
} dt_dlrm_synth;

DT_API dt_status dt_dlrm_synth_init(dt_ctx *ctx, dt_dlrm_synth *gen, const dt_dlrm_synth_desc *desc);
/* The rank's slice of global batch g (dt_dlrm_split, unbounded stream). */
DT_API dt_status dt_dlrm_synth_batch(dt_ctx *ctx, const dt_dlrm_synth *gen, dt_dlrm_batch *batch,
                                     int64_t global_batch, int64_t batch_size, int rank, int world);
/* Samples [start, start + count), count >= 0. */
DT_API dt_status dt_dlrm_synth_range(dt_ctx *ctx, const dt_dlrm_synth *gen, dt_dlrm_batch *batch,
                                     int64_t start, int64_t count);
/* logits[b] = the hidden teacher's logit of sample b of the batch (from its features). */
DT_API dt_status dt_dlrm_synth_logits(dt_ctx *ctx, const dt_dlrm_synth *gen, float *logits,
                                      const dt_dlrm_batch *batch);

/* ---------------------------------------------------------------- Criteo TSV */

typedef struct dt_dlrm_tsv_desc {
    int64_t table_size[DT_DLRM_SPARSE]; /* N_f, 1..2^62; 0 = dt_dlrm_default_cardinality(f) */
    int skip_bad;                       /* flag: 1 = skip malformed lines and count them */
    int64_t max_line;                   /* bytes, 0 = DT_DLRM_MAX_LINE, at most 2^30 */
    int64_t read_chunk;                 /* bytes read at a time, 0 = 1 MiB (tests make it tiny) */
} dt_dlrm_tsv_desc;

typedef struct dt_dlrm_sample {
    float label;
    float dense[DT_DLRM_DENSE];
    int64_t ids[DT_DLRM_SPARSE];
} dt_dlrm_sample;

typedef struct dt_dlrm_tsv {
    char name[256];         /* for messages: the path, or the name given to _open_mem/_stream */
    int64_t line;           /* lines read so far (the last one returned or rejected) */
    int64_t samples;        /* samples returned */
    int64_t skipped;        /* malformed lines skipped (skip_bad = 1) */
    char first_skip[DT_ERROR_MAX]; /* why the first skipped line was skipped */
    /* state */
    dt_dlrm_tsv_desc d;
    FILE *file;
    int own_file, eof, open;
    const char *data;       /* the bytes [lo, hi) not yet consumed */
    char *buf;
    int64_t lo, hi, cap;
} dt_dlrm_tsv;

DT_API dt_status dt_dlrm_tsv_open(dt_ctx *ctx, dt_dlrm_tsv *r, const char *path, const dt_dlrm_tsv_desc *desc);
/* Reads from an open stream (not closed by _close); name is for messages. */
DT_API dt_status dt_dlrm_tsv_open_stream(dt_ctx *ctx, dt_dlrm_tsv *r, FILE *f, const char *name,
                                         const dt_dlrm_tsv_desc *desc);
/* Reads len bytes at data (not copied: they must outlive the reader). */
DT_API dt_status dt_dlrm_tsv_open_mem(dt_ctx *ctx, dt_dlrm_tsv *r, const void *data, size_t len,
                                      const char *name, const dt_dlrm_tsv_desc *desc);
/* The next sample: *got = 1 and *sample filled, or *got = 0 at the end of the data. */
DT_API dt_status dt_dlrm_tsv_next(dt_ctx *ctx, dt_dlrm_tsv *r, dt_dlrm_sample *sample, int *got);
DT_API void dt_dlrm_tsv_close(dt_ctx *ctx, dt_dlrm_tsv *r);

/* ---------------------------------------------------------------- binary form */

typedef struct dt_dlrm_bin_desc {
    dt_dlrm_tsv_desc tsv; /* how the TSV is read (table sizes, skip_bad) */
    int label_f32;        /* flag: labels as f32 (1) or u8 (0) */
    int ids_i64;          /* flag: ids as i64 (1) or i32 (0, needs every table <= 2^31 rows) */
} dt_dlrm_bin_desc;

typedef struct dt_dlrm_tsv_stats {
    int64_t samples, lines, skipped;
} dt_dlrm_tsv_stats;

/* Reads tsv_path twice (count, then write) and writes out_path through a temporary file and a
   rename, so a crash leaves no half file under the name. stats may be NULL. */
DT_API dt_status dt_dlrm_bin_convert(dt_ctx *ctx, const char *out_path, dt_dlrm_tsv_stats *stats,
                                     const char *tsv_path, const dt_dlrm_bin_desc *desc);

typedef struct dt_dlrm_bin_open_desc {
    int no_mmap; /* flag: read the file into memory instead of mapping it */
} dt_dlrm_bin_open_desc;

typedef struct dt_dlrm_bin {
    int64_t n;                           /* samples */
    int64_t table_size[DT_DLRM_SPARSE];
    int64_t skipped;
    int label_bytes, id_bytes;
    const unsigned char *labels, *dense, *ids; /* into the mapping */
    /* state */
    void *map;
    size_t map_bytes;
    int mapped; /* 1: munmap, 0: dt_release */
    char name[256];
} dt_dlrm_bin;

DT_API dt_status dt_dlrm_bin_open(dt_ctx *ctx, dt_dlrm_bin *f, const char *path, const dt_dlrm_bin_open_desc *desc);
DT_API void dt_dlrm_bin_close(dt_ctx *ctx, dt_dlrm_bin *f);
/* The rank's slice of global batch g (dt_dlrm_split, clipped at f->n). */
DT_API dt_status dt_dlrm_bin_batch(dt_ctx *ctx, const dt_dlrm_bin *f, dt_dlrm_batch *batch,
                                   int64_t global_batch, int64_t batch_size, int rank, int world);
DT_API dt_status dt_dlrm_bin_range(dt_ctx *ctx, const dt_dlrm_bin *f, dt_dlrm_batch *batch, int64_t start,
                                   int64_t count);

/* ---------------------------------------------------------------- evaluation */

/* Exact ROC AUC of scores (any finite or infinite floats; NaN is an error) against labels
   (0 or 1). Both classes must occur; n < 2^32. */
DT_API dt_status dt_dlrm_auc(dt_ctx *ctx, double *auc, const float *scores, const float *labels, int64_t n);
/* Mean binary cross entropy of probabilities clamped to [eps, 1 - eps]; eps 0 = 1e-7, else in
   (0, 0.5). n >= 1. */
DT_API dt_status dt_dlrm_logloss(dt_ctx *ctx, double *loss, const float *probs, const float *labels, int64_t n,
                                 double eps);

#ifdef __cplusplus
}
#endif
#endif /* DT_DLRM_DATA_H */

/* ============================================================================================
   Implementation
   ============================================================================================ */
#if defined(DT_IMPLEMENTATION) && !defined(DT_DLRM_DATA_IMPLEMENTATION)
#define DT_DLRM_DATA_IMPLEMENTATION
#endif
#ifdef DT_DLRM_DATA_IMPLEMENTATION
#ifndef DT_DLRM_DATA_IMPLEMENTATION_DONE
#define DT_DLRM_DATA_IMPLEMENTATION_DONE

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if (defined(__unix__) || defined(__APPLE__)) && !defined(DT_DLRM_NO_MMAP)
#define DT__DLRM_MMAP 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif
#if !defined(__cplusplus) && (defined(__unix__) || defined(__APPLE__))
extern int fsync(int fd); /* POSIX; strict -std=c99 hides both in the system headers */
extern int fileno(FILE *stream);
#define DT__DLRM_FSYNC 1
#elif defined(__cplusplus) && (defined(__unix__) || defined(__APPLE__))
#include <unistd.h>
#define DT__DLRM_FSYNC 1
#endif

#ifdef __cplusplus
extern "C" {
#endif


/* Criteo Kaggle (Display Advertising Challenge) distinct values per categorical feature, as
   the DLRM reference counts them. */
static const int64_t dt__dlrm_kaggle[DT_DLRM_SPARSE] = {
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572};

DT_API int64_t dt_dlrm_kaggle_cardinality(int f) {
    return f >= 0 && f < DT_DLRM_SPARSE ? dt__dlrm_kaggle[f] : 0;
}

DT_API int64_t dt_dlrm_default_cardinality(int f) {
    int64_t k = dt_dlrm_kaggle_cardinality(f);
    return k > 16384 ? 16384 : k;
}

DT_API uint64_t dt_dlrm_hash_id(uint64_t v) {
    uint64_t z = v + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* fopen opens a directory and only its first read fails (EISDIR): the opens ask first, where
   stat exists. */
static int dt__dlrm_is_dir(const char *path) {
#ifdef DT__DLRM_MMAP
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
#else
    (void)path;
    return 0;
#endif
}

static int dt__dlrm_flag(dt_ctx *ctx, const char *fn, const char *field, int v) {
    if (v == 0 || v == 1) return 0;
    dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s = %d; expected 0 or 1", fn, field, v);
    return 1;
}

/* ---------------------------------------------------------------- batch and split */

DT_API void dt_dlrm_batch_free(dt_ctx *ctx, dt_dlrm_batch *batch) {
    int k;
    if (!ctx || !batch) return;
    for (k = 0; k < 5; k++) dt_release(ctx, batch->store[k]);
    memset(batch, 0, sizeof *batch);
}

static dt_tensor dt__dlrm_view(void *data, dt_dtype dtype, int ndim, int64_t d0, int64_t d1) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = DT_CPU;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = ndim > 1 ? d1 : 0;
    t.numel = ndim > 1 ? d0 * d1 : d0; /* the caller checked the product */
    t.owns = 0;
    return t;
}

/* Sizes the batch for B samples and nnz ids and sets its views. Storage is never empty, so a
   view of 0 elements still points at live memory (dt_tensor's "live tensor" rule). */
static dt_status dt__dlrm_batch_size(dt_ctx *ctx, dt_dlrm_batch *b, int64_t start, int64_t B, int64_t nnz,
                                     const char *fn) {
    static const size_t elem[5] = {4, 4, 4, 8, 8};
    static const char *const what[5] = {"batch dense", "batch labels", "batch lengths", "batch offsets",
                                        "batch ids"};
    int64_t need[5], k;
    if (!dt_mul_ok(B, DT_DLRM_DENSE, &need[0]) || !dt_mul_ok(B, DT_DLRM_SPARSE, &need[2]) || nnz < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: a batch of %lld samples (%lld ids) is too large", fn,
                                (long long)B, (long long)nnz);
    need[1] = B;
    need[3] = need[2] + 1;
    need[4] = nnz;
    for (k = 0; k < 5; k++) {
        int64_t n = need[k] > 0 ? need[k] : 1;
        if (!b->store[k]) b->store_cap[k] = 0;
        DT__TRY(dt_grow(ctx, &b->store[k], &b->store_cap[k], n, elem[k], what[k]));
    }
    b->size = B;
    b->start = start;
    b->nnz = nnz;
    b->dense = dt__dlrm_view(b->store[0], DT_F32, 2, B, DT_DLRM_DENSE);
    b->labels = dt__dlrm_view(b->store[1], DT_F32, 1, B, 0);
    b->lengths = dt__dlrm_view(b->store[2], DT_I32, 1, need[2], 0);
    b->offsets = dt__dlrm_view(b->store[3], DT_I64, 1, need[3], 0);
    b->ids = dt__dlrm_view(b->store[4], DT_I64, 1, nnz, 0);
    return DT_OK;
}

static dt_status dt__dlrm_range_args(dt_ctx *ctx, const char *fn, const void *obj, const char *obj_name,
                                     const dt_dlrm_batch *batch, int64_t start, int64_t count, int64_t n) {
    if (!ctx) return DT_ERR_ARG;
    if (!obj) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, obj_name);
    if (!batch) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch is NULL", fn);
    if (start < 0 || count < 0 || (n >= 0 && (start > n || count > n - start)) || count > INT64_MAX - start)
        return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: samples [%lld, %lld + %lld) are outside [0, %lld)", fn,
                                (long long)start, (long long)start, (long long)count,
                                (long long)(n >= 0 ? n : INT64_MAX));
    return DT_OK;
}

DT_API dt_status dt_dlrm_split(dt_ctx *ctx, int64_t *start, int64_t *count, int64_t global_batch,
                               int64_t batch_size, int rank, int world, int64_t n_total) {
    const char *fn = "dt_dlrm_split";
    int64_t base, lo, hi, r_lo, r_hi;
    if (!ctx) return DT_ERR_ARG;
    if (!start || !count) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !start ? "start" : "count");
    if (world < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: world = %d; expected >= 1", fn, world);
    if (rank < 0 || rank >= world)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: rank = %d; expected 0..%d (world %d)", fn, rank, world - 1, world);
    if (batch_size < 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: batch_size = %lld; expected >= 1", fn, (long long)batch_size);
    if (global_batch < 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: global_batch = %lld; expected >= 0", fn, (long long)global_batch);
    if (n_total < -1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n_total = %lld; expected >= 0 or -1 (unbounded)", fn,
                                (long long)n_total);
    if (!dt_mul_ok(global_batch, batch_size, &base) || base > INT64_MAX - batch_size ||
        !dt_mul_ok(batch_size, (int64_t)rank, &r_lo) || !dt_mul_ok(batch_size, (int64_t)rank + 1, &r_hi))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: global_batch %lld x batch_size %lld overflows int64", fn,
                                (long long)global_batch, (long long)batch_size);
    if (n_total >= 0 && base >= n_total)
        return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: global_batch = %lld starts at sample %lld; the data has %lld "
                                "samples (%lld batches of %lld)", fn, (long long)global_batch, (long long)base,
                                (long long)n_total, (long long)((n_total + batch_size - 1) / batch_size),
                                (long long)batch_size);
    lo = base + r_lo / world;
    hi = base + r_hi / world;
    if (n_total >= 0) {
        if (lo > n_total) lo = n_total;
        if (hi > n_total) hi = n_total;
    }
    *start = lo;
    *count = hi - lo;
    return DT_OK;
}

/* ---------------------------------------------------------------- synthetic data */

/* Per dense feature: count scale and missing probability, loosely Criteo's I1..I13 (I5 has
   large counts, several are often missing); the teacher's weights and centres for dense 0..3. */
static const float dt__dlrm_scale[DT_DLRM_DENSE] = {2, 60, 12, 5, 3000, 80, 10, 10, 60, 1, 2, 1, 6};
static const float dt__dlrm_miss[DT_DLRM_DENSE] = {0.45f, 0.0f, 0.2f, 0.2f, 0.03f, 0.2f, 0.05f, 0.0f, 0.05f,
                                                   0.45f, 0.05f, 0.75f, 0.2f};
static const float dt__dlrm_w[4] = {0.55f, -0.35f, 0.45f, 0.35f};
static const float dt__dlrm_m[4] = {0.5f, 2.5f, 1.3f, 1.0f};
#define DT__DLRM_BIAS (-1.5f)   /* tuned for a click rate of ~25% */
#define DT__DLRM_EFFECT 0.9f    /* std of the per-id latent effects */
#define DT__DLRM_TAG 0x444C524Du /* "DLRM": the counter word that marks this generator's blocks */
#define DT__DLRM_TEACH 4        /* the teacher reads dense 0..3 and categorical 0..3 */

static uint64_t dt__dlrm_gcd(uint64_t a, uint64_t b) {
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}

DT_API dt_status dt_dlrm_synth_init(dt_ctx *ctx, dt_dlrm_synth *gen, const dt_dlrm_synth_desc *desc) {
    const char *fn = "dt_dlrm_synth_init";
    dt_dlrm_synth_desc d;
    double s;
    int f;
    if (!ctx) return DT_ERR_ARG;
    if (!gen) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: gen is NULL", fn);
    memset(gen, 0, sizeof *gen);
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    s = d.zipf == 0.0 ? 1.05 : d.zipf;
    if (!(s > 0.0 && s <= 4.0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.zipf = %g; expected (0, 4] (0 = 1.05)", fn, d.zipf);
    if (dt__dlrm_flag(ctx, fn, "desc.ordered_ids", d.ordered_ids)) return DT_ERR_ARG;
    if (!(d.multi_hot_mean >= 0.0 && d.multi_hot_mean <= 256.0))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.multi_hot_mean = %g; expected 0 (one-hot) or (0, 256]",
                                fn, d.multi_hot_mean);
    if (d.max_bag < 0 || d.max_bag > DT_DLRM_MAX_BAG)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.max_bag = %d; expected 1..%d (0 = %d)", fn, d.max_bag,
                                DT_DLRM_MAX_BAG, DT_DLRM_MAX_BAG);
    gen->seed = d.seed;
    /* near s = 1 the general form divides by 1 - s and loses the float precision of 1 + u*A:
       there the s = 1 law (log-uniform), within 0.1% of it, is used */
    gen->zipf_one = fabs(s - 1.0) < 1e-3;
    gen->zipf_inv = gen->zipf_one ? 0.0f : (float)(1.0 / (1.0 - s));
    for (f = 0; f < DT_DLRM_SPARSE; f++) {
        int64_t n = d.cardinality[f] ? d.cardinality[f] : dt_dlrm_default_cardinality(f);
        uint64_t a;
        if (n < 1 || n > ((int64_t)1 << 31))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.cardinality[%d] = %lld; expected 1..2^31 (0 = default)",
                                    fn, f, (long long)d.cardinality[f]);
        gen->card[f] = n;
        gen->inv_card[f] = 1.0 / (double)n;
        gen->zipf_a[f] = gen->zipf_one ? (float)log((double)n + 1.0) : (float)(pow((double)n + 1.0, 1.0 - s) - 1.0);
        /* a multiplier near n / golden ratio, coprime with n: k -> k*a + c mod n is a bijection
           that scatters neighbouring ranks */
        a = (uint64_t)((double)n * 0.6180339887498949) | 1u;
        while (n > 1 && dt__dlrm_gcd(a, (uint64_t)n) != 1) a += 2;
        gen->mult[f] = d.ordered_ids ? 1 : a % (uint64_t)n;
        gen->add[f] = d.ordered_ids ? 0 : dt_dlrm_hash_id(d.seed ^ ((uint64_t)f << 40)) % (uint64_t)n;
    }
    gen->multi_hot = d.multi_hot_mean > 0.0;
    gen->max_bag = d.max_bag ? d.max_bag : DT_DLRM_MAX_BAG;
    gen->log_q = gen->multi_hot ? (float)log(d.multi_hot_mean / (1.0 + d.multi_hot_mean)) : 0.0f;
    gen->ready = 1;
    return DT_OK;
}

/* 4 x u32 of block `word` of sample i: counter (i, word, TAG), key = seed. */
static void dt__dlrm_block(uint64_t seed, uint64_t i, uint32_t word, uint32_t out[4]) {
    uint32_t ctr[4], key[2];
    ctr[0] = (uint32_t)i; ctr[1] = (uint32_t)(i >> 32);
    ctr[2] = word; ctr[3] = DT__DLRM_TAG;
    key[0] = (uint32_t)seed; key[1] = (uint32_t)(seed >> 32);
    dt_philox4x32(ctr, key, out);
}

/* u in [0, 1) and (0, 1] from the top 24 bits: exact in a float. */
static float dt__dlrm_u0(uint32_t r) { return (float)(r >> 8) * (1.0f / 16777216.0f); }
static float dt__dlrm_u1(uint32_t r) { return ((float)(r >> 8) + 1.0f) * (1.0f / 16777216.0f); }

/* x mod n for x < n^2, 1 <= n <= 2^31, through a double reciprocal: the quotient is off by at
   most one (x < n^2 here, so its error is below n * 2^-52 <= 2^-20), fixed by one compare. 26 of these per
   sample: a hardware 64-bit divide each cost ~15% of the generator's time. */
static uint64_t dt__dlrm_mod(uint64_t x, uint64_t n, double inv_n) {
    uint64_t q = (uint64_t)((double)(int64_t)x * inv_n), r; /* x < 2^62: a signed convert is one instruction */
    r = x - q * n; /* mod 2^64: "negative" when q was one too big */
    if (r >= ((uint64_t)1 << 63)) r += n;
    else if (r >= n) r -= n;
    return r;
}

/* The id of categorical feature f for the uniform word r: power-law rank, then the bijection. */
static int64_t dt__dlrm_id(const dt_dlrm_synth *g, int f, uint32_t r) {
    float u = dt__dlrm_u0(r), y;
    int64_t n = g->card[f], k;
    if (g->zipf_one) y = expf(u * g->zipf_a[f]);
    else y = expf(logf(1.0f + u * g->zipf_a[f]) * g->zipf_inv);
    /* y in [1, n+1) up to float rounding; the cast is range-checked */
    k = y >= 1.0f && y < (float)n + 1.0f ? (int64_t)y - 1 : (y < 1.0f ? 0 : n - 1);
    if (k >= n) k = n - 1;
    return (int64_t)dt__dlrm_mod(((uint64_t)k * g->mult[f] + g->add[f]), (uint64_t)n, g->inv_card[f]);
}

/* The latent effect of id of feature f: a hash of (seed, f, id), two 32-bit halves summed into a
   triangular law on (-1, 1) (std sqrt(1/6)), scaled. A hash, not dt_rng_normal: it costs 1/30 as
   much and the generator must make ~1M samples/s on one core. */
static float dt__dlrm_effect(const dt_dlrm_synth *g, int f, int64_t id) {
    uint64_t h = dt_dlrm_hash_id((g->seed ^ DT_DLRM_TEACHER_KEY) + ((uint64_t)f << 56) + (uint64_t)id * 0x9E3779B97F4A7C15ull);
    float t = (float)(h >> 40) * (1.0f / 16777216.0f) + (float)(h & 0xFFFFFF) * (1.0f / 16777216.0f) - 1.0f;
    return DT__DLRM_EFFECT * 2.449489743f * t; /* sqrt(6): unit variance before the scale */
}

/* 40 words per sample: dense 0..12, categorical 13..38 (the id, or the bag length), label 39. */
static void dt__dlrm_words(const dt_dlrm_synth *g, uint64_t i, uint32_t w[40]) {
    uint32_t k;
    for (k = 0; k < 10; k++) dt__dlrm_block(g->seed, i, k, w + 4 * k);
}

static int dt__dlrm_bag_len(const dt_dlrm_synth *g, uint32_t r) {
    float len = logf(dt__dlrm_u1(r)) / g->log_q; /* geometric: P(L >= k) = q^k */
    return len >= (float)g->max_bag ? g->max_bag : (int)len;
}

/* The n ids of the bag of feature f of sample i (multi-hot): blocks of their own, 4 ids each. */
static void dt__dlrm_bag_ids(const dt_dlrm_synth *g, uint64_t i, int f, int n, int64_t *ids) {
    uint32_t r[4];
    int j;
    for (j = 0; j < n; j++) {
        if (j % 4 == 0) dt__dlrm_block(g->seed, i, 16u + (uint32_t)f * (DT_DLRM_MAX_BAG / 4) + (uint32_t)j / 4, r);
        ids[j] = dt__dlrm_id(g, f, r[j % 4]);
    }
}

static void dt__dlrm_dense(const uint32_t w[40], float *dense) {
    int j;
    for (j = 0; j < DT_DLRM_DENSE; j++) {
        float x = 0.0f;
        if ((float)(w[j] & 0xFF) >= dt__dlrm_miss[j] * 256.0f) { /* low 8 bits: missing or not */
            float t = expf(-logf(dt__dlrm_u1(w[j])) * (1.0f / 1.2f)) - 1.0f;
            x = floorf(dt__dlrm_scale[j] * t);
            if (x > 16777215.0f) x = 16777215.0f; /* counts stop at 2^24 - 1: 1 + x stays exact */
        }
        dense[j] = logf(1.0f + x); /* = log1pf(x) for these x, 3x faster */
    }
}

static float dt__dlrm_sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

static float dt__dlrm_teacher_dense(const float *dense) {
    float z = DT__DLRM_BIAS;
    int j;
    for (j = 0; j < DT__DLRM_TEACH; j++) z += dt__dlrm_w[j] * (dense[j] - dt__dlrm_m[j]);
    return z;
}

DT_API dt_status dt_dlrm_synth_range(dt_ctx *ctx, const dt_dlrm_synth *gen, dt_dlrm_batch *batch, int64_t start,
                                     int64_t count) {
    const char *fn = "dt_dlrm_synth_range";
    int64_t b, B = count, nnz, f;
    float *dense, *labels;
    int32_t *len;
    int64_t *off, *ids;
    uint32_t w[40];
    DT__TRY(dt__dlrm_range_args(ctx, fn, gen, "gen", batch, start, count, -1));
    if (!gen->ready) return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: gen was not made by dt_dlrm_synth_init", fn);
    if (!gen->multi_hot) {
        if (!dt_mul_ok(B, DT_DLRM_SPARSE, &nnz))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: count = %lld is too large", fn, (long long)count);
    } else { /* pass 1: the bag lengths, to size the ids */
        DT__TRY(dt__dlrm_batch_size(ctx, batch, start, B, 0, fn));
        len = (int32_t *)batch->store[2];
        nnz = 0;
        for (b = 0; b < B; b++) {
            dt__dlrm_words(gen, (uint64_t)(start + b), w);
            for (f = 0; f < DT_DLRM_SPARSE; f++) {
                len[f * B + b] = dt__dlrm_bag_len(gen, w[13 + f]);
                nnz += len[f * B + b];
            }
        }
    }
    DT__TRY(dt__dlrm_batch_size(ctx, batch, start, B, nnz, fn));
    dense = (float *)batch->store[0];
    labels = (float *)batch->store[1];
    len = (int32_t *)batch->store[2];
    off = (int64_t *)batch->store[3];
    ids = (int64_t *)batch->store[4];
    if (!gen->multi_hot)
        for (b = 0; b < B * DT_DLRM_SPARSE; b++) len[b] = 1;
    off[0] = 0;
    for (b = 0; b < B * DT_DLRM_SPARSE; b++) off[b + 1] = off[b] + len[b];
    for (b = 0; b < B; b++) {
        uint64_t i = (uint64_t)(start + b);
        float z;
        dt__dlrm_words(gen, i, w);
        dt__dlrm_dense(w, dense + b * DT_DLRM_DENSE);
        z = dt__dlrm_teacher_dense(dense + b * DT_DLRM_DENSE);
        for (f = 0; f < DT_DLRM_SPARSE; f++) {
            int64_t o = off[f * B + b];
            int n = len[f * B + b], j;
            float e = 0.0f;
            if (!gen->multi_hot) ids[o] = dt__dlrm_id(gen, (int)f, w[13 + f]);
            else dt__dlrm_bag_ids(gen, i, (int)f, n, ids + o);
            if (f < DT__DLRM_TEACH && n > 0) {
                for (j = 0; j < n; j++) e += dt__dlrm_effect(gen, (int)f, ids[o + j]);
                z += e / (float)n;
            }
        }
        labels[b] = dt__dlrm_u0(w[39]) < dt__dlrm_sigmoid(z) ? 1.0f : 0.0f;
    }
    return DT_OK;
}

DT_API dt_status dt_dlrm_synth_batch(dt_ctx *ctx, const dt_dlrm_synth *gen, dt_dlrm_batch *batch,
                                     int64_t global_batch, int64_t batch_size, int rank, int world) {
    int64_t start, count;
    if (!ctx) return DT_ERR_ARG;
    DT__TRY(dt_dlrm_split(ctx, &start, &count, global_batch, batch_size, rank, world, -1));
    return dt_dlrm_synth_range(ctx, gen, batch, start, count);
}

DT_API dt_status dt_dlrm_synth_logits(dt_ctx *ctx, const dt_dlrm_synth *gen, float *logits,
                                      const dt_dlrm_batch *batch) {
    const char *fn = "dt_dlrm_synth_logits";
    const float *dense;
    const int32_t *len;
    const int64_t *off, *ids;
    int64_t b, B, f;
    if (!ctx) return DT_ERR_ARG;
    if (!gen || !logits || !batch)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !gen ? "gen" : !logits ? "logits" : "batch");
    B = batch->size;
    if (B > 0 && (!batch->store[0] || !batch->store[4]))
        return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: batch holds %lld samples but no data", fn, (long long)B);
    dense = (const float *)batch->dense.data;
    len = (const int32_t *)batch->lengths.data;
    off = (const int64_t *)batch->offsets.data;
    ids = (const int64_t *)batch->ids.data;
    for (b = 0; b < B; b++) {
        float z = dt__dlrm_teacher_dense(dense + b * DT_DLRM_DENSE);
        for (f = 0; f < DT__DLRM_TEACH; f++) {
            int64_t o = off[f * B + b], j, n = len[f * B + b];
            float e = 0.0f;
            if (n <= 0) continue;
            for (j = 0; j < n; j++) {
                if (ids[o + j] < 0 || ids[o + j] >= gen->card[f])
                    return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: sample %lld feature %d: id %lld outside [0, %lld)",
                                            fn, (long long)b, (int)f, (long long)ids[o + j], (long long)gen->card[f]);
                e += dt__dlrm_effect(gen, (int)f, ids[o + j]);
            }
            z += e / (float)n;
        }
        logits[b] = z;
    }
    return DT_OK;
}

/* ---------------------------------------------------------------- Criteo TSV */

static dt_status dt__dlrm_tsv_start(dt_ctx *ctx, dt_dlrm_tsv *r, const char *name, const dt_dlrm_tsv_desc *desc,
                                    const char *fn) {
    int f;
    if (!ctx) return DT_ERR_ARG;
    if (!r) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: r is NULL", fn);
    memset(r, 0, sizeof *r);
    if (desc) r->d = *desc;
    if (dt__dlrm_flag(ctx, fn, "desc.skip_bad", r->d.skip_bad)) return DT_ERR_ARG;
    if (r->d.max_line < 0 || r->d.max_line > ((int64_t)1 << 30))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.max_line = %lld; expected 1..2^30 (0 = %d)", fn,
                                (long long)r->d.max_line, DT_DLRM_MAX_LINE);
    if (r->d.read_chunk < 0 || r->d.read_chunk > ((int64_t)1 << 30))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.read_chunk = %lld; expected 1..2^30 (0 = 1 MiB)", fn,
                                (long long)r->d.read_chunk);
    if (!r->d.max_line) r->d.max_line = DT_DLRM_MAX_LINE;
    if (!r->d.read_chunk) r->d.read_chunk = (int64_t)1 << 20;
    for (f = 0; f < DT_DLRM_SPARSE; f++) {
        if (!r->d.table_size[f]) r->d.table_size[f] = dt_dlrm_default_cardinality(f);
        if (r->d.table_size[f] < 1 || r->d.table_size[f] > ((int64_t)1 << 62))
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.table_size[%d] = %lld; expected 1..2^62 (0 = default)",
                                    fn, f, (long long)r->d.table_size[f]);
    }
    snprintf(r->name, sizeof r->name, "%s", name ? name : "(tsv)");
    r->open = 1;
    return DT_OK;
}

DT_API dt_status dt_dlrm_tsv_open_mem(dt_ctx *ctx, dt_dlrm_tsv *r, const void *data, size_t len, const char *name,
                                      const dt_dlrm_tsv_desc *desc) {
    DT__TRY(dt__dlrm_tsv_start(ctx, r, name ? name : "(memory)", desc, "dt_dlrm_tsv_open_mem"));
    if (!data && len) {
        r->open = 0;
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_dlrm_tsv_open_mem: data is NULL with len %zu", len);
    }
    if ((uint64_t)len > (uint64_t)INT64_MAX) {
        r->open = 0;
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_dlrm_tsv_open_mem: len %zu is too large", len);
    }
    r->data = data ? (const char *)data : ""; /* no arithmetic on NULL, even + 0 */
    r->lo = 0;
    r->hi = (int64_t)len;
    r->eof = 1;
    return DT_OK;
}

DT_API dt_status dt_dlrm_tsv_open_stream(dt_ctx *ctx, dt_dlrm_tsv *r, FILE *f, const char *name,
                                         const dt_dlrm_tsv_desc *desc) {
    const char *fn = "dt_dlrm_tsv_open_stream";
    DT__TRY(dt__dlrm_tsv_start(ctx, r, name ? name : "(stream)", desc, fn));
    if (!f) {
        r->open = 0;
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: f is NULL", fn);
    }
    /* room for a whole line of max_line bytes, its \r\n, and one chunk read behind it */
    r->cap = r->d.max_line + 2 + r->d.read_chunk;
    r->buf = (char *)dt_alloc(ctx, (size_t)r->cap);
    if (!r->buf) {
        r->open = 0;
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: out of memory for a %lld-byte read buffer", fn, (long long)r->cap);
    }
    r->data = r->buf;
    r->file = f;
    return DT_OK;
}

DT_API dt_status dt_dlrm_tsv_open(dt_ctx *ctx, dt_dlrm_tsv *r, const char *path, const dt_dlrm_tsv_desc *desc) {
    const char *fn = "dt_dlrm_tsv_open";
    FILE *f;
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    if (!path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: path is NULL", fn);
    if (dt__dlrm_is_dir(path)) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: %s is a directory, not a file", fn, path);
    if (!(f = fopen(path, "rb")))
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
    if ((st = dt_dlrm_tsv_open_stream(ctx, r, f, path, desc)) != DT_OK) {
        fclose(f);
        return st;
    }
    r->own_file = 1;
    return DT_OK;
}

DT_API void dt_dlrm_tsv_close(dt_ctx *ctx, dt_dlrm_tsv *r) {
    if (!ctx || !r) return;
    if (r->own_file && r->file) fclose(r->file);
    dt_release(ctx, r->buf);
    memset(r, 0, sizeof *r);
}

/* Reads more of the stream behind [lo, hi), moving what is left to the front first. */
static dt_status dt__dlrm_tsv_fill(dt_ctx *ctx, dt_dlrm_tsv *r) {
    size_t got, want;
    if (r->lo > 0) {
        memmove(r->buf, r->buf + r->lo, (size_t)(r->hi - r->lo));
        r->hi -= r->lo;
        r->lo = 0;
    }
    want = (size_t)(r->cap - r->hi);
    if (want > (size_t)r->d.read_chunk) want = (size_t)r->d.read_chunk;
    got = fread(r->buf + r->hi, 1, want, r->file);
    r->hi += (int64_t)got;
    if (got < want) {
        if (ferror(r->file))
            return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_dlrm_tsv_next: %s: read error after line %lld: %s", r->name,
                                    (long long)r->line, strerror(errno));
        r->eof = 1;
    }
    return DT_OK;
}

/* The next line in [*s, *s + *n) (without \n or \r\n); 0 at the end; -1 when it is longer than
   max_line (then it has been consumed). */
static int dt__dlrm_tsv_line(dt_ctx *ctx, dt_dlrm_tsv *r, const char **s, int64_t *n, dt_status *st) {
    int64_t scanned = 0, limit = r->d.max_line + 1; /* a line, and its \r */
    int discard = 0;
    *st = DT_OK;
    for (;;) {
        const char *p = r->data + r->lo, *nl;
        int64_t avail = r->hi - r->lo;
        nl = avail > scanned ? (const char *)memchr(p + scanned, '\n', (size_t)(avail - scanned)) : NULL;
        if (nl || (r->eof && avail > 0)) {
            int64_t len = nl ? nl - p : avail;
            r->lo += nl ? len + 1 : len;
            r->line++;
            if (discard || len > limit) return -1;
            if (len > 0 && p[len - 1] == '\r') len--;
            if (len > r->d.max_line) return -1;
            *s = p;
            *n = len;
            return 1;
        }
        if (r->eof) { /* avail == 0 */
            if (discard) { r->line++; return -1; }
            return 0;
        }
        if (avail > limit) { /* overlong: drop what we have and keep looking for its end */
            discard = 1;
            r->lo = r->hi;
            avail = 0;
        }
        scanned = avail;
        if ((*st = dt__dlrm_tsv_fill(ctx, r)) != DT_OK) return 0;
    }
}

static const char *dt__dlrm_field_name(int k, char *buf, size_t n) {
    if (k == 0) snprintf(buf, n, "label");
    else if (k <= DT_DLRM_DENSE) snprintf(buf, n, "I%d", k);
    else snprintf(buf, n, "C%d", k - DT_DLRM_DENSE);
    return buf;
}

/* The text of a field for a message: at most 40 bytes, other than printable ASCII as \xNN. */
static const char *dt__dlrm_quote(const char *s, int64_t n, char *buf, size_t cap) {
    size_t o = 0;
    int64_t i;
    for (i = 0; i < n && o + 8 < cap && i < 40; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 32 && c < 127 && c != '"' && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    if (i < n && o + 4 < cap) { buf[o++] = '.'; buf[o++] = '.'; buf[o++] = '.'; }
    buf[o] = '\0';
    return buf;
}

static dt_status dt__dlrm_bad_field(dt_ctx *ctx, dt_dlrm_tsv *r, int k, const char *s, int64_t n, const char *why) {
    char name[16], q[200];
    return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_dlrm_tsv_next: %s: line %lld, field %d (%s): %s \"%s\"", r->name,
                            (long long)r->line, k + 1, dt__dlrm_field_name(k, name, sizeof name), why,
                            dt__dlrm_quote(s, n, q, sizeof q));
}

/* Parses one line into *out; DT_ERR_FORMAT naming what is wrong. */
static dt_status dt__dlrm_tsv_parse(dt_ctx *ctx, dt_dlrm_tsv *r, const char *s, int64_t n, dt_dlrm_sample *out) {
    const int fields = 1 + DT_DLRM_DENSE + DT_DLRM_SPARSE;
    int64_t pos = 0;
    int k;
    for (k = 0; k < fields; k++) {
        const char *t = s + pos, *tab;
        int64_t len, i;
        if (pos > n || n == 0) /* the previous field ended the line */
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_dlrm_tsv_next: %s: line %lld has %d fields; expected %d "
                                    "(label, 13 integers, 26 hex ids, tab-separated)", r->name, (long long)r->line, k,
                                    fields);
        tab = (const char *)memchr(t, '\t', (size_t)(n - pos));
        len = tab ? tab - t : n - pos;
        if (k == fields - 1 && tab) {
            int extra = 1;
            for (i = pos + len + 1; i < n; i++) extra += s[i] == '\t';
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "dt_dlrm_tsv_next: %s: line %lld has %d fields; expected %d "
                                    "(label, 13 integers, 26 hex ids, tab-separated)", r->name, (long long)r->line,
                                    fields + extra, fields);
        }
        if (k == 0) {
            if (len != 1 || (t[0] != '0' && t[0] != '1'))
                return dt__dlrm_bad_field(ctx, r, k, t, len, "label is not 0 or 1:");
            out->label = t[0] == '1' ? 1.0f : 0.0f;
        } else if (k <= DT_DLRM_DENSE) {
            uint64_t v = 0;
            int neg = len > 0 && t[0] == '-';
            if (len == neg && len > 0) return dt__dlrm_bad_field(ctx, r, k, t, len, "bad integer");
            for (i = neg; i < len; i++) {
                unsigned d = (unsigned)(unsigned char)t[i] - '0';
                if (d > 9) return dt__dlrm_bad_field(ctx, r, k, t, len, "bad integer");
                if (v > ((uint64_t)INT64_MAX - d) / 10)
                    return dt__dlrm_bad_field(ctx, r, k, t, len, "integer out of the int64 range");
                v = v * 10 + d;
            }
            /* log(1 + max(x, 0)): negative counts (Criteo's I2) are 0, as in the MLPerf reference */
            out->dense[k - 1] = neg ? 0.0f : (float)log1p((double)v);
        } else {
            int f = k - 1 - DT_DLRM_DENSE;
            uint64_t v = 0;
            int64_t size = r->d.table_size[f];
            if (len > 16) return dt__dlrm_bad_field(ctx, r, k, t, len, "bad hex id (more than 16 digits)");
            for (i = 0; i < len; i++) {
                unsigned c = (unsigned char)t[i], d;
                if (c >= '0' && c <= '9') d = c - '0';
                else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
                else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
                else return dt__dlrm_bad_field(ctx, r, k, t, len, "bad hex id");
                v = (v << 4) | d;
            }
            out->ids[f] = len == 0 || size == 1 ? 0 : 1 + (int64_t)(dt_dlrm_hash_id(v) % (uint64_t)(size - 1));
        }
        pos += len + 1;
    }
    return DT_OK;
}

DT_API dt_status dt_dlrm_tsv_next(dt_ctx *ctx, dt_dlrm_tsv *r, dt_dlrm_sample *sample, int *got) {
    const char *fn = "dt_dlrm_tsv_next";
    if (!ctx) return DT_ERR_ARG;
    if (!r || !sample || !got)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !r ? "r" : !sample ? "sample" : "got");
    *got = 0;
    if (!r->open) return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the reader is not open", fn);
    for (;;) {
        const char *s = NULL;
        int64_t n = 0;
        dt_status st;
        int k = dt__dlrm_tsv_line(ctx, r, &s, &n, &st);
        if (st) return st;
        if (k == 0) return DT_OK;
        if (k < 0)
            st = dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: line %lld is longer than max_line = %lld bytes", fn,
                                  r->name, (long long)r->line, (long long)r->d.max_line);
        else
            st = dt__dlrm_tsv_parse(ctx, r, s, n, sample);
        if (st == DT_OK) {
            r->samples++;
            *got = 1;
            return DT_OK;
        }
        if (!r->d.skip_bad) return st;
        if (r->skipped++ == 0) snprintf(r->first_skip, sizeof r->first_skip, "%s", dt_ctx_error(ctx));
        dt_ctx_clear_error(ctx);
    }
}

/* ---------------------------------------------------------------- binary form */

static void dt__dlrm_put32(unsigned char *p, uint32_t v) {
    int k;
    for (k = 0; k < 4; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static void dt__dlrm_put64(unsigned char *p, uint64_t v) {
    int k;
    for (k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static uint32_t dt__dlrm_get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t dt__dlrm_get64(const unsigned char *p) {
    return (uint64_t)dt__dlrm_get32(p) | (uint64_t)dt__dlrm_get32(p + 4) << 32;
}
static int dt__dlrm_little_endian(void) {
    uint32_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
}

/* Byte offsets of the three arrays and the file size for n samples; 0 when they overflow. */
static int dt__dlrm_layout(uint64_t n, int lb, int ib, uint64_t off[3], uint64_t *total) {
    int64_t a, b, c;
    if (n > (uint64_t)INT64_MAX || !dt_mul_ok((int64_t)n, lb, &a) || !dt_mul_ok((int64_t)n, DT_DLRM_DENSE * 4, &b) ||
        !dt_mul_ok((int64_t)n, (int64_t)DT_DLRM_SPARSE * ib, &c))
        return 0;
    if (a > INT64_MAX / 4 || b > INT64_MAX / 4 || c > INT64_MAX / 4) return 0;
    off[0] = DT_DLRM_BIN_HEADER;
    off[1] = (off[0] + (uint64_t)a + 63) / 64 * 64;
    off[2] = (off[1] + (uint64_t)b + 63) / 64 * 64;
    *total = off[2] + (uint64_t)c;
    return 1;
}

static dt_status dt__dlrm_write_at(dt_ctx *ctx, FILE *out, uint64_t at, const void *p, size_t n, const char *path) {
    if (n == 0) return DT_OK;
    if (at > (uint64_t)LONG_MAX || fseek(out, (long)at, SEEK_SET) != 0 || fwrite(p, 1, n, out) != n)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_dlrm_bin_convert: cannot write %zu bytes at %llu of %s: %s", n,
                                (unsigned long long)at, path, strerror(errno));
    return DT_OK;
}

#define DT__DLRM_CHUNK 4096 /* samples converted at a time */

/* Pass 2: parse again and write the header and the arrays. */
static dt_status dt__dlrm_bin_write(dt_ctx *ctx, FILE *out, const char *tmp, const char *tsv_path,
                                    const dt_dlrm_bin_desc *d, uint64_t n, int64_t skipped, const dt_dlrm_tsv *shape) {
    int lb = d->label_f32 ? 4 : 1, ib = d->ids_i64 ? 8 : 4, f, got = 1;
    uint64_t off[3], total, done = 0;
    unsigned char hdr[DT_DLRM_BIN_HEADER], *buf;
    size_t row = (size_t)(lb + DT_DLRM_DENSE * 4 + DT_DLRM_SPARSE * ib);
    dt_dlrm_tsv r;
    dt_status st;
    if (!dt__dlrm_layout(n, lb, ib, off, &total))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_dlrm_bin_convert: %llu samples do not fit in a file",
                                (unsigned long long)n);
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, "DTDLRMB", 8);
    dt__dlrm_put32(hdr + 8, 1);
    dt__dlrm_put32(hdr + 12, DT_DLRM_BIN_HEADER);
    dt__dlrm_put64(hdr + 16, n);
    dt__dlrm_put32(hdr + 24, DT_DLRM_DENSE);
    dt__dlrm_put32(hdr + 28, DT_DLRM_SPARSE);
    dt__dlrm_put32(hdr + 32, (uint32_t)lb);
    dt__dlrm_put32(hdr + 36, (uint32_t)ib);
    dt__dlrm_put64(hdr + 40, (uint64_t)skipped);
    for (f = 0; f < DT_DLRM_SPARSE; f++) dt__dlrm_put64(hdr + 48 + 8 * f, (uint64_t)shape->d.table_size[f]);
    DT__TRY(dt__dlrm_write_at(ctx, out, 0, hdr, sizeof hdr, tmp));
    if (!(buf = (unsigned char *)dt_alloc(ctx, row * DT__DLRM_CHUNK)))
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "dt_dlrm_bin_convert: out of memory for a conversion buffer");
    st = dt_dlrm_tsv_open(ctx, &r, tsv_path, &d->tsv);
    while (!st && got) {
        unsigned char *lab = buf, *den = buf + (size_t)lb * DT__DLRM_CHUNK, *idb = den + (size_t)DT_DLRM_DENSE * 4 * DT__DLRM_CHUNK;
        size_t m = 0;
        dt_dlrm_sample s;
        while (m < DT__DLRM_CHUNK && !(st = dt_dlrm_tsv_next(ctx, &r, &s, &got)) && got) {
            if (done + m >= n) { /* the file changed between the passes */
                st = dt_ctx_set_error(ctx, DT_ERR_IO, "dt_dlrm_bin_convert: %s changed while it was converted",
                                      tsv_path);
                break;
            }
            if (lb == 1) lab[m] = (unsigned char)(s.label != 0.0f);
            else memcpy(lab + 4 * m, &s.label, 4);
            memcpy(den + m * DT_DLRM_DENSE * 4, s.dense, DT_DLRM_DENSE * 4);
            for (f = 0; f < DT_DLRM_SPARSE; f++) {
                if (ib == 8) memcpy(idb + (m * DT_DLRM_SPARSE + (size_t)f) * 8, &s.ids[f], 8);
                else {
                    int32_t v = (int32_t)s.ids[f]; /* < table size <= 2^31, checked */
                    memcpy(idb + (m * DT_DLRM_SPARSE + (size_t)f) * 4, &v, 4);
                }
            }
            m++;
        }
        if (!st) st = dt__dlrm_write_at(ctx, out, off[0] + done * (uint64_t)lb, lab, m * (size_t)lb, tmp);
        if (!st) st = dt__dlrm_write_at(ctx, out, off[1] + done * DT_DLRM_DENSE * 4, den, m * DT_DLRM_DENSE * 4, tmp);
        if (!st) st = dt__dlrm_write_at(ctx, out, off[2] + done * DT_DLRM_SPARSE * (uint64_t)ib, idb,
                                        m * DT_DLRM_SPARSE * (size_t)ib, tmp);
        done += m;
    }
    dt_dlrm_tsv_close(ctx, &r);
    dt_release(ctx, buf);
    if (!st && done != n)
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "dt_dlrm_bin_convert: %s changed while it was converted", tsv_path);
    return st; /* the ids, written last, end at `total`: the file has its exact size */
}

DT_API dt_status dt_dlrm_bin_convert(dt_ctx *ctx, const char *out_path, dt_dlrm_tsv_stats *stats,
                                     const char *tsv_path, const dt_dlrm_bin_desc *desc) {
    const char *fn = "dt_dlrm_bin_convert";
    dt_dlrm_bin_desc d;
    dt_dlrm_tsv r;
    dt_dlrm_sample s;
    int got = 1, f;
    uint64_t n = 0;
    int64_t skipped, lines;
    char tmp[4096];
    FILE *out;
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    if (!out_path || !tsv_path)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !out_path ? "out_path" : "tsv_path");
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (dt__dlrm_flag(ctx, fn, "desc.label_f32", d.label_f32) || dt__dlrm_flag(ctx, fn, "desc.ids_i64", d.ids_i64))
        return DT_ERR_ARG;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", out_path) >= sizeof tmp)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: out_path is longer than %zu bytes", fn, sizeof tmp - 5);
    /* pass 1: validate and count (the arrays' offsets depend on the count) */
    DT__TRY(dt_dlrm_tsv_open(ctx, &r, tsv_path, &d.tsv));
    for (f = 0; f < DT_DLRM_SPARSE && !d.ids_i64; f++)
        if (r.d.table_size[f] > ((int64_t)1 << 31)) {
            long long size = (long long)r.d.table_size[f];
            dt_dlrm_tsv_close(ctx, &r);
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: desc.tsv.table_size[%d] = %lld does not fit i32 ids; set "
                                    "desc.ids_i64 = 1", fn, f, size);
        }
    while (!(st = dt_dlrm_tsv_next(ctx, &r, &s, &got)) && got) n++;
    skipped = r.skipped;
    lines = r.line;
    if (st) {
        dt_dlrm_tsv_close(ctx, &r);
        return st;
    }
    if (!(out = fopen(tmp, "wb"))) {
        dt_dlrm_tsv_close(ctx, &r);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot create %s: %s", fn, tmp, strerror(errno));
    }
    st = dt__dlrm_bin_write(ctx, out, tmp, tsv_path, &d, n, skipped, &r);
    dt_dlrm_tsv_close(ctx, &r);
    if (!st && fflush(out) != 0) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot write %s: %s", fn, tmp, strerror(errno));
#ifdef DT__DLRM_FSYNC
    if (!st && fsync(fileno(out)) != 0)
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot flush %s to disk: %s", fn, tmp, strerror(errno));
#endif
    if (fclose(out) != 0 && !st) st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot close %s: %s", fn, tmp, strerror(errno));
    if (!st && rename(tmp, out_path) != 0)
        st = dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot rename %s to %s: %s", fn, tmp, out_path, strerror(errno));
    if (st) {
        remove(tmp);
        return st;
    }
    if (stats) {
        stats->samples = (int64_t)n;
        stats->lines = lines;
        stats->skipped = skipped;
    }
    return DT_OK;
}

static dt_status dt__dlrm_bin_load(dt_ctx *ctx, dt_dlrm_bin *f, const char *path, int no_mmap, const char *fn) {
    FILE *in;
    long size;
    size_t got;
    if (dt__dlrm_is_dir(path)) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: %s is a directory, not a file", fn, path);
#ifdef DT__DLRM_MMAP
    if (!no_mmap) {
        struct stat sb;
        int fd = open(path, O_RDONLY);
        if (fd < 0) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
        if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size != (uint64_t)(size_t)sb.st_size) {
            close(fd);
            return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot size %s", fn, path);
        }
        f->map_bytes = (size_t)sb.st_size;
        if (f->map_bytes > 0) {
            void *m = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
            if (m != MAP_FAILED) {
                f->map = m;
                f->mapped = 1;
            }
        }
        close(fd); /* the mapping keeps the file */
        if (f->mapped) return DT_OK;
    }
#else
    (void)no_mmap;
#endif
    /* read it whole: DT_DLRM_NO_MMAP, no_mmap, or mmap failed */
    if (!(in = fopen(path, "rb"))) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(errno));
    if (fseek(in, 0, SEEK_END) != 0 || (size = ftell(in)) < 0 || fseek(in, 0, SEEK_SET) != 0) {
        fclose(in);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot size %s", fn, path);
    }
    f->map_bytes = (size_t)size;
    f->map = dt_alloc(ctx, f->map_bytes ? f->map_bytes : 1);
    if (!f->map) {
        fclose(in);
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: out of memory for the %ld bytes of %s", fn, size, path);
    }
    got = fread(f->map, 1, f->map_bytes, in);
    fclose(in);
    if (got != f->map_bytes)
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: read %zu of the %zu bytes of %s", fn, got, f->map_bytes, path);
    return DT_OK;
}

static dt_status dt__dlrm_bin_check(dt_ctx *ctx, dt_dlrm_bin *f, const char *fn) {
    const unsigned char *h = (const unsigned char *)f->map;
    uint64_t n, off[3], total;
    uint32_t lb, ib;
    int k;
    if (f->map_bytes < DT_DLRM_BIN_HEADER)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is %zu bytes, shorter than the %d-byte header (truncated "
                                "or foreign file)", fn, f->name, f->map_bytes, DT_DLRM_BIN_HEADER);
    if (memcmp(h, "DTDLRMB", 8) != 0)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s does not start with the magic \"DTDLRMB\\0\" (foreign file)",
                                fn, f->name);
    if (dt__dlrm_get32(h + 8) != 1)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is version %u; this reader knows version 1", fn, f->name,
                                dt__dlrm_get32(h + 8));
    if (dt__dlrm_get32(h + 12) != DT_DLRM_BIN_HEADER || dt__dlrm_get32(h + 24) != DT_DLRM_DENSE ||
        dt__dlrm_get32(h + 28) != DT_DLRM_SPARSE)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: header %u bytes, %u dense, %u sparse; expected %d, %d, %d",
                                fn, f->name, dt__dlrm_get32(h + 12), dt__dlrm_get32(h + 24), dt__dlrm_get32(h + 28),
                                DT_DLRM_BIN_HEADER, DT_DLRM_DENSE, DT_DLRM_SPARSE);
    lb = dt__dlrm_get32(h + 32);
    ib = dt__dlrm_get32(h + 36);
    if ((lb != 1 && lb != 4) || (ib != 4 && ib != 8))
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: label bytes %u, id bytes %u; expected 1 or 4, 4 or 8", fn,
                                f->name, lb, ib);
    for (k = 0; k < DT_DLRM_SPARSE; k++) {
        uint64_t t = dt__dlrm_get64(h + 48 + 8 * k);
        if (t < 1 || t > (ib == 4 ? ((uint64_t)1 << 31) : ((uint64_t)1 << 62)))
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: table size %d = %llu; expected 1..2^%d", fn, f->name,
                                    k, (unsigned long long)t, ib == 4 ? 31 : 62);
        f->table_size[k] = (int64_t)t;
    }
    n = dt__dlrm_get64(h + 16);
    if (!dt__dlrm_layout(n, (int)lb, (int)ib, off, &total))
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: its header's %llu samples overflow a file's byte size "
                                "(int64; corrupt file)", fn, f->name, (unsigned long long)n);
    if (total != (uint64_t)f->map_bytes)
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s is %zu bytes; its header (%llu samples) needs %llu "
                                "(truncated or corrupt file)", fn, f->name, f->map_bytes, (unsigned long long)n,
                                (unsigned long long)total);
    f->n = (int64_t)n;
    f->skipped = (int64_t)(dt__dlrm_get64(h + 40) & (uint64_t)INT64_MAX);
    f->label_bytes = (int)lb;
    f->id_bytes = (int)ib;
    f->labels = h + off[0];
    f->dense = h + off[1];
    f->ids = h + off[2];
    return DT_OK;
}

DT_API dt_status dt_dlrm_bin_open(dt_ctx *ctx, dt_dlrm_bin *f, const char *path, const dt_dlrm_bin_open_desc *desc) {
    const char *fn = "dt_dlrm_bin_open";
    int no_mmap = desc ? desc->no_mmap : 0;
    dt_status st;
    if (!ctx) return DT_ERR_ARG;
    if (!f || !path) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !f ? "f" : "path");
    memset(f, 0, sizeof *f);
    if (dt__dlrm_flag(ctx, fn, "desc.no_mmap", no_mmap)) return DT_ERR_ARG;
    if (!dt__dlrm_little_endian())
        return dt_ctx_set_error(ctx, DT_ERR_UNSUPPORTED, "%s: the binary form is read in place, little-endian hosts only",
                                fn);
    snprintf(f->name, sizeof f->name, "%s", path);
    st = dt__dlrm_bin_load(ctx, f, path, no_mmap, fn);
    if (!st) st = dt__dlrm_bin_check(ctx, f, fn);
    if (st) dt_dlrm_bin_close(ctx, f);
    return st;
}

DT_API void dt_dlrm_bin_close(dt_ctx *ctx, dt_dlrm_bin *f) {
    if (!ctx || !f) return;
#ifdef DT__DLRM_MMAP
    if (f->mapped && f->map) munmap(f->map, f->map_bytes);
    else
#endif
        dt_release(ctx, f->map);
    memset(f, 0, sizeof *f);
}

DT_API dt_status dt_dlrm_bin_range(dt_ctx *ctx, const dt_dlrm_bin *f, dt_dlrm_batch *batch, int64_t start,
                                   int64_t count) {
    const char *fn = "dt_dlrm_bin_range";
    int64_t b, B = count, k;
    float *dense, *labels;
    int32_t *len;
    int64_t *off, *ids;
    DT__TRY(dt__dlrm_range_args(ctx, fn, f, "f", batch, start, count, f ? f->n : 0));
    if (!f->map) return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: f is not open", fn);
    DT__TRY(dt__dlrm_batch_size(ctx, batch, start, B, B * DT_DLRM_SPARSE, fn));
    dense = (float *)batch->store[0];
    labels = (float *)batch->store[1];
    len = (int32_t *)batch->store[2];
    off = (int64_t *)batch->store[3];
    ids = (int64_t *)batch->store[4];
    for (b = 0; b < B; b++) {
        int64_t i = start + b;
        float y;
        if (f->label_bytes == 1) y = f->labels[i] == 1 ? 1.0f : f->labels[i] == 0 ? 0.0f : -1.0f;
        else memcpy(&y, f->labels + 4 * i, 4);
        if (y != 0.0f && y != 1.0f)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: sample %lld has a label that is not 0 or 1 (corrupt "
                                    "file)", fn, f->name, (long long)i);
        labels[b] = y;
        memcpy(dense + b * DT_DLRM_DENSE, f->dense + (size_t)i * DT_DLRM_DENSE * 4, DT_DLRM_DENSE * 4);
        for (k = 0; k < DT_DLRM_DENSE; k++) {
            float v = dense[b * DT_DLRM_DENSE + k];
            if (!(v >= 0.0f && v <= 1e4f)) /* log1p of an int64 is < 44 */
                return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: sample %lld dense %d = %g; expected a log count "
                                        "(corrupt file)", fn, f->name, (long long)i, (int)k, (double)v);
        }
        for (k = 0; k < DT_DLRM_SPARSE; k++) {
            int64_t id;
            if (f->id_bytes == 8) memcpy(&id, f->ids + ((size_t)i * DT_DLRM_SPARSE + (size_t)k) * 8, 8);
            else {
                int32_t v;
                memcpy(&v, f->ids + ((size_t)i * DT_DLRM_SPARSE + (size_t)k) * 4, 4);
                id = v;
            }
            if (id < 0 || id >= f->table_size[k])
                return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: %s: sample %lld feature %d: id %lld outside [0, %lld) "
                                        "(corrupt file)", fn, f->name, (long long)i, (int)k, (long long)id,
                                        (long long)f->table_size[k]);
            ids[k * B + b] = id; /* feature-major */
        }
    }
    for (k = 0; k < B * DT_DLRM_SPARSE; k++) {
        len[k] = 1;
        off[k] = k;
    }
    off[B * DT_DLRM_SPARSE] = B * DT_DLRM_SPARSE;
    return DT_OK;
}

DT_API dt_status dt_dlrm_bin_batch(dt_ctx *ctx, const dt_dlrm_bin *f, dt_dlrm_batch *batch, int64_t global_batch,
                                   int64_t batch_size, int rank, int world) {
    int64_t start, count;
    if (!ctx) return DT_ERR_ARG;
    if (!f) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_dlrm_bin_batch: f is NULL");
    DT__TRY(dt_dlrm_split(ctx, &start, &count, global_batch, batch_size, rank, world, f->n));
    return dt_dlrm_bin_range(ctx, f, batch, start, count);
}

/* ---------------------------------------------------------------- evaluation */

typedef struct dt__dlrm_pair {
    float s;
    int y;
} dt__dlrm_pair;

static int dt__dlrm_pair_cmp(const void *a, const void *b) {
    float x = ((const dt__dlrm_pair *)a)->s, y = ((const dt__dlrm_pair *)b)->s;
    return (x > y) - (x < y);
}

static dt_status dt__dlrm_eval_args(dt_ctx *ctx, const char *fn, const void *out, const float *scores,
                                    const float *labels, int64_t n, int64_t *pos, int check_nan) {
    int64_t i;
    if (!ctx) return DT_ERR_ARG;
    if (!out) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the result pointer is NULL", fn);
    if (n < 1) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n = %lld; expected >= 1", fn, (long long)n);
    if (!scores || !labels) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: %s is NULL", fn, !scores ? "scores" : "labels");
    *pos = 0;
    for (i = 0; i < n; i++) {
        if (labels[i] != 0.0f && labels[i] != 1.0f)
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: labels[%lld] = %g; expected 0 or 1", fn, (long long)i,
                                    (double)labels[i]);
        if (check_nan && scores[i] != scores[i])
            return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: scores[%lld] is NaN", fn, (long long)i);
        *pos += labels[i] == 1.0f;
    }
    return DT_OK;
}

DT_API dt_status dt_dlrm_auc(dt_ctx *ctx, double *auc, const float *scores, const float *labels, int64_t n) {
    const char *fn = "dt_dlrm_auc";
    int64_t pos, i, j;
    uint64_t neg_below = 0, twice_u = 0;
    dt__dlrm_pair *p;
    DT__TRY(dt__dlrm_eval_args(ctx, fn, auc, scores, labels, n, &pos, 1));
    if (n >= ((int64_t)1 << 32))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: n = %lld; expected < 2^32", fn, (long long)n);
    if (pos == 0 || pos == n)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: every one of the %lld labels is %d; the AUC needs both classes",
                                fn, (long long)n, pos == n);
    if (!(p = (dt__dlrm_pair *)dt_alloc(ctx, sizeof *p * (size_t)n)))
        return dt_ctx_set_error(ctx, DT_ERR_OOM, "%s: out of memory for %lld pairs", fn, (long long)n);
    for (i = 0; i < n; i++) {
        p[i].s = scores[i];
        p[i].y = labels[i] == 1.0f;
    }
    qsort(p, (size_t)n, sizeof *p, dt__dlrm_pair_cmp);
    /* U = sum over positives of (negatives with a lower score + 1/2 x negatives with the same):
       2U in integers is exact (< 2 * 2^62), so the order of equal scores does not matter */
    for (i = 0; i < n; i = j) {
        uint64_t gp = 0, gn = 0;
        for (j = i; j < n && p[j].s == p[i].s; j++) {
            gp += (uint64_t)p[j].y;
            gn += (uint64_t)!p[j].y;
        }
        twice_u += 2 * gp * neg_below + gp * gn;
        neg_below += gn;
    }
    dt_release(ctx, p);
    *auc = (double)twice_u / (2.0 * (double)pos * (double)(n - pos));
    return DT_OK;
}

DT_API dt_status dt_dlrm_logloss(dt_ctx *ctx, double *loss, const float *probs, const float *labels, int64_t n,
                                 double eps) {
    const char *fn = "dt_dlrm_logloss";
    int64_t pos, i;
    double sum = 0.0;
    DT__TRY(dt__dlrm_eval_args(ctx, fn, loss, probs, labels, n, &pos, 1));
    if (eps == 0.0) eps = 1e-7;
    if (!(eps > 0.0 && eps < 0.5))
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: eps = %g; expected (0, 0.5) (0 = 1e-7)", fn, eps);
    for (i = 0; i < n; i++) {
        double p = probs[i];
        p = p < eps ? eps : p > 1.0 - eps ? 1.0 - eps : p;
        sum -= labels[i] == 1.0f ? log(p) : log(1.0 - p);
    }
    *loss = sum / (double)n;
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* DT_DLRM_DATA_IMPLEMENTATION_DONE */
#endif /* DT_DLRM_DATA_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the dt authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
