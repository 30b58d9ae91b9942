/* kernels/dt_kernels.h - the C ABI of dt's CUDA kernels (the .cu files in kernels/). No CUDA
   types: the dt headers call these under DT_CUDA, and a user builds them with
       nvcc -O2 -c kernels/dt_*.cu           (then links the objects with -lcudart -lcublasLt -lcublas)
   MIT licence (see the end of dt_tensor.h).
   The lesson. A CUDA op is a C call in three layers, so no CUDA type reaches a dt header:
        dt_layernorm_fwd(ctx, &out, ...)          dt_tensor.h: checks shapes, devices and sizes,
              |                                   takes the ctx's stream
              v
        dt_k_layernorm_fwd(out, mean, rstd, x, w, b, eps, rows, C, stream)        (this header)
              |                                   device pointers, sizes, the stream last
              v
        kernels/dt_reduce.cu: kernel<<<rows, threads, 0, stream>>>, returns 0 or the cudaError_t
   Every launcher has the name stem of the CPU op it mirrors (dt_layernorm_fwd ->
   dt_k_layernorm_fwd), takes the stream (a cudaStream_t passed as void *, NULL = the default
   stream) last, and returns 0 or the cudaError_t of the failing launch (dt_k_error_string names
   it). Gradients accumulate (+=), as in dt_tensor.h. The CPU op is the reference: each comment
   says how the kernel's sums are ordered against it, and tests/cuda_emu runs these files on the
   CPU to compare them without a GPU.

   Contents (each marker finds this line and its section; the kernels are in the .cu file named):
       >>elementwise   bias, relu, gelu, add, axpy, mul, casts              dt_elementwise.cu
       >>reduce        layernorm                                            dt_reduce.cu
       >>xent          softmax + cross entropy, bce, sums (device losses)   dt_softmax.cu
       >>attention     causal attention, plain and flash; on tensor cores   dt_attention.cu, dt_flash.cu
       >>embedding     embedding, sharded tables, GPU hash map, dot         dt_embed.cu, dt_hash.cu
       >>opt           grads' pass, step decisions, multi-tensor updates    dt_opt.cu
       >>embcopies     the owner side of dt_embed's CUDA forward: copies    dt_embed_copies.cu
       >>gemm          matmul through cuBLAS                                dt_gemm.cu
       >>tp            vocab-parallel embedding and cross entropy, concat   dt_parallel.cu
       >>moe           router top-k, capacity, dispatch / combine copies    dt_moe.cu
*/
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The message of a status these functions return ("cudaErrorInvalidValue: invalid argument"); it
   stays valid for the calling thread's next 3 calls. */
const char *dt_k_error_string(int status);

/* ==== >>elementwise: elementwise and casts (dt_elementwise.cu) ================================ */

/* Each as its dt_tensor.h op, on n (or rows x C) floats; out may alias an input where the CPU op
   allows it. The elementwise ones and the casts load and store 16 bytes at a time when every
   pointer is 16-byte aligned (8 for a 16-bit side), one element at a time otherwise: the same
   bits either way. bias_add_bwd sums each column in two stages (chunks of rows into float
   partials, then the partials in chunk order): the same bits every run, within
   ((64 - 1) + (chunks - 1) + 1) u sum|dout| of the exact sum (u = 2^-24), not the CPU's (a double
   sum). It needs dt_k_bias_add_bwd_scratch(rows, C) bytes of device scratch (0: scratch may be
   NULL), free from the launch until the kernels have run (stream order). A pointer the launch
   reads or writes may not be NULL when n (rows x C) > 0: cudaErrorInvalidValue. */
int dt_k_bias_add_fwd(float *out, const float *bias, int64_t rows, int64_t C, void *stream);
size_t dt_k_bias_add_bwd_scratch(int64_t rows, int64_t C);
int dt_k_bias_add_bwd(float *dbias, const float *dout, int64_t rows, int64_t C, void *scratch, void *stream);
int dt_k_relu_fwd(float *out, const float *x, int64_t n, void *stream);
int dt_k_relu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream);
int dt_k_gelu_fwd(float *out, const float *x, int64_t n, void *stream);
int dt_k_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream);
/* The same GELU with x, out, dx and dout each f32 or bf16 (their _dtype: 1 or 2): the f32
   result rounded once where its destination is bf16 (the backward adds into dx in f32). */
int dt_k_gelu_fwd_t(void *out, int out_dtype, const void *x, int x_dtype, int64_t n, void *stream);
int dt_k_gelu_bwd_t(void *dx, int dx_dtype, const void *dout, int dout_dtype, const void *x, int x_dtype, int64_t n,
                    void *stream);
int dt_k_add(float *out, const float *a, const float *b, int64_t n, void *stream);
int dt_k_axpy(float *y, float alpha, const float *x, int64_t n, void *stream);
int dt_k_mul_fwd(float *out, const float *a, const float *b, int64_t n, void *stream);
/* da or db may be NULL; da == db (a == b, x * x) gets both terms, da's first, as on the CPU. */
int dt_k_mul_bwd(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n, void *stream);
/* dst = (dst_dtype) src for n elements; dtypes are dt_dtype values: DT_F32 = 1, DT_BF16 = 2,
   DT_F16 = 3 (bf16 <-> f16 goes through f32); round to nearest even, NaN stays NaN, as
   dt_tensor_cast. Other dtypes: cudaErrorInvalidValue. */
int dt_k_tensor_cast(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n, void *stream);
/* p[i] = the elem-byte pattern bits (elem 1, 2, 4, 8) for i < n: dt_tensor_fill on the device. */
int dt_k_fill(void *p, uint64_t bits, int elem, int64_t n, void *stream);
/* The device-side range check of ids (i32, or i64 when ids_i64) against [lo, hi), skip allowed
   when has_skip: the smallest failing index i writes word[0..4] = site, i, ids[i], lo, hi, unless
   word[0] is already set (the first failure is kept). One block; dt_tensor.h reads the word
   where the step synchronises anyway (dt_ctx_sync, a loss read). site > 0. */
int dt_k_check_range(int64_t *word, const void *ids, int ids_i64, int64_t n, int64_t lo, int64_t hi, int has_skip,
                     int64_t skip, int64_t site, void *stream);

/* ==== >>reduce: reductions and layernorm (dt_reduce.cu) ======================================= */

/* LayerNorm over rows of C, as dt_layernorm_fwd (its corrected two-pass statistics in float, the
   sums in another order); mean, rstd and b may be NULL, out, x and w not (rows x C > 0). eps
   finite and > 0, as dt_layernorm_fwd takes it (else cudaErrorInvalidValue). A warp per row, 8 rows a block,
   w and b cached in shared memory per block where C floats (2C with b) fit in 48 KiB (C <= 12288,
   6144 with b; past that read from global memory); four columns a thread by 16-byte loads where C
   is a multiple of 4 and every pointer aligned, one otherwise. */
int dt_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       float eps, int64_t rows, int64_t C, void *stream);
/* The same with out in bf16 (each value rounded once from the f32 the forward computes; 8-byte
   stores of four where C % 4 == 0 and every pointer aligned): a GEMM's bf16 input. */
int dt_k_layernorm_fwd_bf16(uint16_t *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                            float eps, int64_t rows, int64_t C, void *stream);
/* dx, dw, db += (each may be NULL); mean and rstd from the forward; dx a warp per row as the
   forward (w in shared memory where C <= 12288). dw and db are summed over the rows in two stages
   (each block sums a chunk of 64 rows for its columns into partials, then the partials in chunk
   order), by 16-byte loads where C is a multiple of 4 and every pointer aligned, in the same order
   on either path: the same bits every run and thread order, within ((64 - 1) + (chunks - 1) + 1)
   u sum|terms| of the exact sum (u = 2^-24), not the CPU's row-order bits. They need
   dt_k_layernorm_bwd_scratch(rows, C) bytes of device scratch (0: scratch may be NULL), free
   from the launch until the kernels have run (stream order). dout and x may not be NULL (w
   neither, with dx) when a gradient is asked for. */
size_t dt_k_layernorm_bwd_scratch(int64_t rows, int64_t C);
int dt_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int64_t rows, int64_t C, void *scratch, void *stream);

/* ==== >>xent: softmax and cross entropy (dt_softmax.cu) ======================================= */

/* The losses never come back to the host by themselves: a loss launcher writes loss_slot[0] =
   the mean loss and loss_slot[1] = its count (doubles: dt_cuda_loss_slot, read by
   dt_cuda_read_loss only on a logging step), through a two-stage fixed-order reduction (the same
   bits every run; not the CPU's serial sum, within fp32 reassociation of it). scratch: device
   memory of dt_k_loss_scratch_bytes(rows) bytes (rows: 0 for bce and the sums), 256-aligned.
   Ids / targets are not checked here: dt_tensor.h queues dt_k_check_range first. A pointer the
   launch reads may not be NULL where the sizes say there is data (a NULL probs or dlogits: not
   written), and rows past 2^61 are refused (scratch size 0): cudaErrorInvalidValue. */
size_t dt_k_loss_scratch_bytes(int64_t rows);
/* Softmax + cross entropy, forward: logits [rows, V], targets i32 [rows]. One block per row (its
   passes by 16-byte loads and stores where V is a multiple of 4 and logits, probs aligned):
   lse = logsumexp(row) in float, the row's loss lse - logits[r, t] (NaN for a target outside
   [0, V), not counted as ignored), and probs[r, :] = exp(logits[r, :] - lse) (probs may be NULL,
   or logits: in place); then the mean over the rows whose target is not ignore_index, and that
   count, into loss_slot (0 and 0 when every row is ignored). */
int dt_k_softmax_xent_fwd(double *loss_slot, float *probs, const float *logits, const int32_t *targets,
                          int ignore_index, int64_t rows, int64_t V, void *scratch, void *stream);
/* Its backward from the probabilities: n_valid counted on the device (never read back), then
   one block per row: dlogits += dloss / n_valid * (probs - onehot(target)) on the rows not
   ignored, the CPU op's operations (dlogits may be probs; 16-byte accesses as the forward). */
int dt_k_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int ignore_index, float dloss,
                          int64_t rows, int64_t V, void *scratch, void *stream);
/* Binary cross entropy with logits over n elements, as dt_bce_logits_fwd / _bwd: the stable
   element loss in double, its mean (and n) into loss_slot; bwd: dlogits += dloss / n *
   (sigmoid(z) - y), the CPU's float operations (bwd: by 16-byte loads and stores where every
   pointer is aligned). */
int dt_k_bce_logits_fwd(double *loss_slot, const float *logits, const float *labels, int64_t n, void *scratch,
                        void *stream);
int dt_k_bce_logits_bwd(float *dlogits, const float *logits, const float *labels, float dloss, int64_t n,
                        void *stream);
/* dt_sum / dt_sumsq: out[0] = the sum of x (of x * x when sq) in double, out[1] = n; the same
   two stages. dt_scale: x *= alpha. */
int dt_k_sum(double *out, const float *x, int64_t n, int sq, void *scratch, void *stream);
int dt_k_scale(float *x, float alpha, int64_t n, void *stream);

/* ==== >>attention: attention (dt_attention.cu, dt_flash.cu) =================================== */

/* Causal multi-head self-attention, as dt_attention_fwd / _bwd: qkv [B,T,3C] packed q|k|v,
   out [B,T,C], att [B,H,T,T] the softmaxed scores (zeros above the diagonal), H = n_head
   dividing C. The baseline: one block per score row (dot products, masked softmax through
   block reductions), then one thread per output element for the weighted sum of v.
   bwd: dqkv += the gradient (accumulates); scratch: B*H*T*T device floats of the caller's
   (dt_cuda_scratch, ordered by the stream), so the launcher neither allocates nor waits. In
   these and the launchers below, a NULL pointer the launch would read or write where the sizes
   say there is data is cudaErrorInvalidValue (the optional ones, said NULL-able, excepted). */
int dt_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int n_head,
                       void *stream);
int dt_k_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int64_t B, int64_t T,
                       int64_t C, int n_head, float *scratch, void *stream);
/* The fused forward (flash attention's online softmax): one block per (b, h, 32 queries); q, k,
   v tiles of 32 rows in shared memory; never stores att. lse [B,H,T] (may be NULL) receives each
   row's log-sum-exp of the scaled scores (max + log(sum)), what a fused backward would need.
   cudaErrorInvalidValue when C / n_head > 96 (the tiles would pass 48 KiB of shared memory). */
int dt_k_attention_fwd_flash(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t C,
                             int n_head, void *stream);
/* Its backward (FlashAttention-2): dqkv += the gradient, from dout, qkv and the fused forward's
   out and lse; the probabilities recomputed per tile, never stored. D = rowsum(dout * out) first
   (into scratch: B*H*T device floats of the caller's), then one pass per key tile (dk, dv)
   and one per query tile (dq): each output element summed by one thread in a fixed order, no
   atomics, the same bits every run. Tiles of 32 rows (16 when C / n_head > 64); C / n_head >
   128: cudaErrorInvalidValue. Equals dt_k_attention_bwd to fp32 reassociation (~1e-6). */
int dt_k_attention_bwd_flash(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                             int64_t B, int64_t T, int64_t C, int n_head, float *scratch, void *stream);

/* One (query block, key block) pair of the online softmax with its logsumexp, as dt_tensor.h's
   dt_attention_block_fwd / _bwd (context parallelism's ring step): q rows of Wq floats (the
   first H hs used), kv rows of 2 Hkv hs (keys then values), out [B, Tq, H hs] and lse [B, H, Tq]
   merged in place; query row q_row + i at position q_pos + i sees key row k_row + j at
   k_pos + j when k_pos + j <= q_pos + i. bwd: dq (q's layout) and dkv (kv's) += the block's
   part of the gradients, from the final out and lse; either may be NULL. One thread per row,
   scores recomputed: simple, deterministic, not fast. Bad sizes: cudaErrorInvalidValue. */
typedef struct dt_k_attn_block {
    int64_t B, Tq, Wq, Tk, Wkv, hs;
    int H, Hkv;
    int64_t q_row, q_rows, q_pos, k_row, k_rows, k_pos;
} dt_k_attn_block;
int dt_k_attention_block_fwd(float *out, float *lse, const float *q, const float *kv, const dt_k_attn_block *a,
                             void *stream);
int dt_k_attention_block_bwd(float *dq, float *dkv, const float *dout, const float *q, const float *kv,
                             const float *out, const float *lse, const dt_k_attn_block *a, void *stream);

/* Causal attention on the tensor cores (dt_flash.cu, FlashAttention-2 on mma.sync m16n8k16): q,
   k, v in bf16 (uint16_t bits), f32 accumulation, softmax statistics and outputs. Row (b, t) of
   q is at q + (b T + t) q_stride, head h at + h hs; k and v alike (kv_stride) with H_kv heads,
   query head h reading K/V head h / (H / H_kv) (grouped-query attention; H_kv = H: multi-head).
   hs is 16, 32, 64, 96 or 128; strides are multiples of 8 and q, k, v 16-byte aligned (16-byte
   loads); the f32 pointers (out, lse, dout, dq, dk, dv) 4-byte aligned and the bf16 ones (out16,
   dq16, dk16, dv16) 2-byte. fwd: out (f32, out_stride per row) = softmax(q k^T / sqrt(hs), causal) v, and lse
   [B, H, T] the natural log-sum-exp of each row's scaled scores. bwd: dq, dk, dv += the
   gradient (f32, or bf16 in dq16, dk16, dv16 rounded once; dq_stride / dkv_stride per row) from
   dout (f32, out_stride), out and lse as
   the forward left them; scratch: dt_k_flash_bwd_scratch(B, T, H, hs) device bytes of the
   caller's. No atomics: the same bits every run. Compute capability < 8.0:
   cudaErrorNotSupported; a shape or pointer outside the above: cudaErrorInvalidValue.
   block = 1 (context parallelism's ring, one block of the online softmax): T is the rows a
   sequence has in q, out, lse, dout, dq and the scratch, Tk in k, v, dk, dv; the call covers query
   rows [q_row, q_row + q_rows) at positions q_pos.. and key rows [k_row, k_row + k_rows) at
   positions k_pos.., a query seeing the keys at positions up to its own. fwd merges the block into
   out and lse (lse -inf: nothing yet; a row that sees no key of the block keeps what it had), so
   blocks merge in any order; bwd adds the block's part of dq, dk, dv from out and lse as the
   merge of every block left them. dt_k_flash_bwd_prep fills the scratch for the query rows once
   (dout in bf16, D = rowsum(dout out); it reads dout, out and scratch only); bwd with prepped = 1
   then skips it. */
typedef struct dt_k_flash {
    int64_t B, T;
    int H, H_kv, hs;
    const uint16_t *q, *k, *v;
    int64_t q_stride, kv_stride;
    float *out, *lse;
    int64_t out_stride;
    uint16_t *out16;                   /* fwd outside block mode: out in bf16 here instead (out NULL),
                                          each value the f32 one rounded once */
    const float *dout;                 /* bwd only, from here to scratch */
    float *dq, *dk, *dv;
    uint16_t *dq16, *dk16, *dv16;      /* bwd outside block mode: bf16 gradients here instead (dq, dk,
                                          dv NULL), each element's f32 sum added to it, rounded once */
    int64_t dq_stride, dkv_stride;
    void *scratch;
    int block, prepped;                /* block mode, from here down (0: the whole [B, T], causal) */
    int64_t Tk, q_row, q_rows, q_pos, k_row, k_rows, k_pos;
} dt_k_flash;
int dt_k_flash_fwd(const dt_k_flash *a, void *stream);
size_t dt_k_flash_bwd_scratch(int64_t B, int64_t T, int H, int hs);
int dt_k_flash_bwd_prep(const dt_k_flash *a, void *stream);
int dt_k_flash_bwd(const dt_k_flash *a, void *stream);

/* ==== >>embedding: embedding (dt_embed.cu, dt_hash.cu) ======================================== */

/* dt_embedding_fwd / _bwd: out[n,:] = table[ids[n],:]; dtable[ids[n],:] += dout[n,:]. ids are
   int32 (ids_i64 = 0) or int64 (1). An id outside [0, V) gathers zeros, is skipped in the
   backward and sets *bad_id = 1 (bad_id, a device int, may be NULL): dt_tensor.h checks the ids
   on the device first (dt_k_check_range). The backward needs no sort and no float atomics: a
   block owns a chunk of columns and the table rows id % S == s, and each of its threads walks
   all N ids in order, adding the rows of its ids to its column: every (id, column) is summed by
   one thread in id order, the CPU op's order, so the same bits as the CPU, every run.
   Here and below (>>embedding): a NULL array the host sizes say holds data (those said NULL-able
   excepted; one sized by offsets on the device is not the launcher's to judge), and sizes whose
   products pass int64, are cudaErrorInvalidValue. */
int dt_k_embedding_fwd(float *out, const float *table, const void *ids, int ids_i64, int64_t N, int64_t V,
                       int64_t D, int *bad_id, void *stream);
int dt_k_embedding_bwd(float *dtable, const float *dout, const void *ids, int ids_i64, int64_t N, int64_t V,
                       int64_t D, int *bad_id, void *stream);

/* Pooling of bags, as dt_embed.h's forward: bag b is ids [offsets[b], offsets[b+1]) (rows are
   row indices into table [*, ld] of dtype table_dtype = 1 f32, 2 bf16, 3 f16 (dt_dtype), D <=
   ld columns read); out[b, :D] = ((0 + w_0 row_0) + w_1 row_1) + ... in f32, in bag order
   (w = 1 when weights is NULL), divided by the bag length last when mean = 1 (an empty bag
   gives 0). The same sum order as the CPU, so the same bits. A row < 0 (a dynamic id not
   admitted) adds nothing. */
int dt_k_embed_pool_fwd(float *out, const void *table, int table_dtype, const int64_t *rows, const float *weights,
                        const int64_t *offsets, int64_t n_bags, int64_t D, int64_t ld, int mean, void *stream);
/* The same, bag b written at out + out_offsets[b] (NULL: b * D): pooled vectors straight into
   their columns of a wider output. */
int dt_k_embed_pool_fwd_at(float *out, const int64_t *out_offsets, const void *table, int table_dtype,
                           const int64_t *rows, const float *weights, const int64_t *offsets, int64_t n_bags,
                           int64_t D, int64_t ld, int mean, void *stream);
/* Its backward as per-id gradient rows: grads[i, :] = w_i * dout[dout_offsets[bag(i)] + :]
   (dout_offsets NULL: bag(i) * D; / length for mean), bag(i) read from offsets (one block per
   bag). dt_embed.h's CUDA backward: the owner's rows before dedup + sparse update. */
int dt_k_embed_pool_bwd(float *grads, const float *dout, const int64_t *dout_offsets, const float *weights,
                        const int64_t *offsets, int64_t n_bags, int64_t D, int mean, void *stream);
/* Not called by dt_embed.h (its sums are ordered: pool_bwd + dedup + sparse update).
   The same backward scattered into a dense f32 gradient table: dtable[rows[i], :] += grads
   (atomicAdd, so the order of a row's adds varies; rows < 0 skipped). */
int dt_k_embed_pool_bwd_dense(float *dtable, const float *dout, const int64_t *rows, const float *weights,
                              const int64_t *offsets, int64_t n_bags, int64_t D, int mean, void *stream);
/* Sums of column slices in a fixed order, dt_embed.h's scatter of returned rows into the pooled
   output (and of the pooled gradient into the requests): runs[3 r + 0..2] = (dst, len, first
   segment) of run r, segs[3 s + 0..2] = (src, c0, nc); the segments of run r are [first_r,
   first_(r+1)) (the last run's end: n_segs). out[dst + c] for c < len = (accum ? out[dst + c] :
   0) + src[src_s + c - c0_s] of each segment s covering c, in segment order, then / div[r]
   (div NULL: no division). max_len >= every len (sizes the block). Device arrays. */
int dt_k_embed_gather_sum(float *out, const float *src, const int64_t *runs, const int64_t *segs, const float *div,
                          int64_t n_runs, int64_t n_segs, int64_t max_len, int accum, void *stream);

/* dt_embed.h's batch on the device (its data-parallel tables read the uploaded dt_kjt, so only
   the batch crosses PCIe). dt_k_embed_kjt_offsets: in_offs[0..n] = exclusive prefix sums of
   lengths[n] (the kjt's bags). dt_k_embed_bags: the m B bags of a group of m features (desc[2 k],
   desc[2 k + 1] = feature k's kjt input and its column in the pooled output; device array), in
   (sample, feature) order: offs[m B + 1] (prefix sums of the bag lengths; *total = offs[m B]
   when total is not NULL), each id's row (rows: the id, or dt_embed_hash_id(id) mod hash_rows
   when hash_rows > 0; minus row0), its weight (weights_out, when not NULL: weights[id] or 1),
   and each bag's place in the pooled output (dout_offs, when not NULL: b ldo + desc[2 k + 1]).
   ids are i64 (ids_i64 = 1) or i32. Ids are checked on the host, where the batch is read. */
int dt_k_embed_kjt_offsets(int64_t *in_offs, const int64_t *lengths, int64_t n, void *stream);
int dt_k_embed_bags(int64_t *rows, float *weights_out, int64_t *offs, int64_t *dout_offs, int64_t *total,
                    const int64_t *in_offs, const void *ids, int ids_i64, const float *weights, const int64_t *desc,
                    int m, int64_t B, int64_t row0, int64_t hash_rows, int64_t ldo, void *stream);
/* The copies that put a data-parallel backward's received contributions table-major (one
   thread): blocks = the received ints, rank r's block [T counts][its rows, table by table];
   dims[T] the tables' dims. desc[6 W T] = rows dst, src, len, then floats dst, src, len (W T
   each, entry r T + t), for dt_k_embed_copies. */
int dt_k_embed_dp_copies(int64_t *desc, const int64_t *blocks, const int64_t *dims, int W, int T, void *stream);
/* dt_embed.h's sharded tables on the device. A feature's descriptor, DT_K_EMBED_FD int64: [0]
   sharding (0 data-parallel, 1 table, 2 row, 3 table-row, 4 column), [1] owner (table) or first
   rank of the group (table-row), [2] group size, [3] rows, [4] dim, [5] 1: ids hashed mod rows,
   [6] kjt input, [7] pooled column, [8] 1: mean, [9] 1: weighted, [10] table, and this rank's
   shard of the table: [11] columns, [12] first row.
   dt_k_embed_requests (the requester, one block; dt_embed.h's dt__em_generate rule for rule):
   every request of the batch, destination-major, each destination's in generation order
   (sample-major bags; a row-wise bag one request per id, a column-wise one per column block):
   headers send_hdr[4 per request] = (feature, g0 + sample, position, ids), rows send_rows[ids],
   weights send_w (NULL: none); the forward scatter's runs[3 F B] (feature-major bags: pooled
   place, dim, first segment) and segments fsegs[3 S] (result offset, c0, nc), the backward's
   bruns / bsegs [3 S], div[F B + S] (mean: the bag's length, else 1; data-parallel bags 1).
   dt_k_embed_serve_layout (the owner, one block): from the received headers and rows (and
   weights, or NULL), per table in table order: rows - first row [n], bag offsets [nb + 1], the
   results' places in the response [nb] (meta, n + 2 nb + 1 a table), weights [n]
   (weights_out); scratch 2 n_requests int64. Nothing allocated or waited for. */
#define DT_K_EMBED_FD 16
int dt_k_embed_requests(int64_t *send_hdr, int64_t *send_rows, float *send_w, int64_t *runs, int64_t *fsegs,
                        int64_t *bruns, int64_t *bsegs, float *div, const int64_t *in_offs, const void *ids, int ids_i64,
                        const float *weights, const int64_t *fdesc, int F, int64_t B, int W, int64_t g0, int64_t ldo,
                        void *stream);
int dt_k_embed_serve_layout(int64_t *meta, float *weights_out, int64_t *scratch, const int64_t *recv_hdr,
                            const int64_t *recv_rows, const float *recv_w, const int64_t *fdesc, int64_t n_requests,
                            int T, void *stream);
/* *acc += *x on the device (int64, one thread). */
int dt_k_embed_add_i64(int64_t *acc, const int64_t *x, void *stream);

/* Bucketization by owner (row-wise sharding of `rows` rows over W ranks, as dt_embed.h: R =
   q*W + m, the first m ranks one row more): counts[W] = ids per owner, dest[i] = where id i
   goes in the owner-major send buffer (owner's start + the number of earlier ids with that
   owner: stable). ids outside [0, rows) set *bad_id = 1 (may be NULL) and get dest -1.
   Three launches (block counts, one-block scan, stable scatter); nothing allocated, nothing
   waited for: scratch is dt_k_embed_bucketize_scratch(n, W) bytes of device memory. */
size_t dt_k_embed_bucketize_scratch(int64_t n, int W);
int dt_k_embed_bucketize(int64_t *counts, int64_t *dest, const int64_t *ids, int64_t n, int64_t rows, int W,
                         int *bad_id, void *scratch, void *stream);
/* Gradient dedup by a stable LSD radix sort (8-bit digits, counting passes as above) of rows[n]
   (each in [0, n_rows), or negative: a row to skip, sorted last): order[n] = the indices of rows
   in sorted order (equal rows keep their input order), seg[n + 1] = the start of each run of
   equal rows in order[] (seg[u] for u < *n_uniq, then seg[*n_uniq] = n), *n_uniq (a device
   int64). scratch: dt_k_embed_dedup_scratch(n) bytes of device memory; nothing allocated or
   waited for. */
size_t dt_k_embed_dedup_scratch(int64_t n);
int dt_k_embed_dedup(int64_t *order, int64_t *seg, int64_t *n_uniq, const int64_t *rows, int64_t n,
                     int64_t n_rows, void *scratch, void *stream);
/* The fused sparse update of the deduplicated rows (dt_embed.h's formulas; a run of rows < 0 is
   skipped): for each unique row,
   g = sum of grads[order[j], :] over its run, in run order from 0; then table row
   rows[order[seg[u]]] (dtype as in pool: f32, or bf16 / f16 widened, updated, rounded back):
     kind 1 SGD: w -= lr g; kind 2 Adagrad: s += g g, w -= lr g / (sqrt(s) + eps) (state [*, ld]);
     kind 3 row-wise Adagrad: s[row] += (sum g^2 in double) / D, w -= (lr / (sqrt(s) + eps)) g. */
int dt_k_embed_sparse_update(void *table, int table_dtype, float *state, const float *grads, const int64_t *rows,
                             const int64_t *order, const int64_t *seg, const int64_t *n_uniq, int64_t n,
                             int64_t D, int64_t ld, int kind, double lr, double eps, void *stream);

/* Lazy Adam (dt_embed.h's DT_EMBED_ADAM, torch.optim.SparseAdam) on the same deduplicated rows:
   g summed per run as above; m, v [*, ld] f32; t >= 1 the table's step. dt_adam_update's scalar
   loop op for op (the per-step scalars in double on the host, rounded once). */
int dt_k_embed_sparse_adam(void *table, int table_dtype, float *m, float *v, const float *grads, const int64_t *rows,
                           const int64_t *order, const int64_t *seg, const int64_t *n_uniq, int64_t n, int64_t D,
                           int64_t ld, double lr, double beta1, double beta2, double eps, int64_t t, void *stream);

/* The id -> slot table of one dynamic-table shard on the GPU (kernels/dt_hash.cu), with the host
   map's semantics (dt_embed.h, "dynamic tables"): capacity slots, an LRU list over them, ids
   admitted at their admit_after-th sighting. Device arrays; map_cap = the power of two >= 2 x
   capacity, seen_cap (a power of two, below 2^60) bounds the ids seen and not admitted yet. hdr:
   used, head, tail, last stamp, map entries, seen entries. */
typedef struct dt_k_hash {
    int64_t capacity, map_cap, seen_cap;
    int64_t *map_key, *map_val, *seen_key, *seen_val; /* [map_cap], [seen_cap] */
    int *map_full, *seen_full;
    int64_t *slot_id, *slot_stamp, *prev, *next;      /* [capacity]; stamp 0 = empty */
    int64_t *hdr;                                      /* [8] */
} dt_k_hash;
int dt_k_hash_create(dt_k_hash *h, int64_t capacity, int64_t seen_cap);
void dt_k_hash_free(dt_k_hash *h);
/* One batch of n ids (device int64, in the host map's order): slots[i] = the slot of ids[i] or
   -1 (rejected: looks up zeros); counts[3] (device int64) += admitted, evicted, rejected;
   *overflow (device int) = 1 when a table ran out of cells (seen_cap too small: the result is
   then not the host map's). admitted (device int64 [2 n], may be NULL): the (slot, id) pairs
   this batch admitted, in order (as many as it adds to counts[0]), so the caller initialises
   those rows without reading the slot table back. A probe launch (one thread per id) then a
   commit launch (one thread: the decisions in batch order, each depends on the earlier ones). */
int dt_k_hash_lookup(const dt_k_hash *h, int64_t *slots, int64_t *counts, int *overflow, int64_t *admitted,
                     const int64_t *ids, int64_t n, int admit_after, void *stream);

/* DLRM dot interaction, as dt_dot_interaction_fwd / _bwd: dense [B,D], emb [B,F,D], out / dout
   [B, D + (F+1)F/2] (the dense vector, then the pairs i > j in row order). Batched GEMMs:
   X_b = [dense_b; emb_b] packed into scratch, Z_b = X_b X_b^T (cublasSgemmStridedBatched), its
   strictly lower triangle gathered; backward dX_b = (dZ_b + dZ_b^T) X_b, then split. Sums in
   cuBLAS's order, not the CPU's (within f32 reassociation of a D-term dot product).
   cublas: a cublasHandle_t (dt_ctx.cublas); its stream is set to `stream` when it is another.
   scratch: dt_k_dot_interaction_scratch(B, F, D, bwd) device bytes, 256-byte aligned (0 for
   B = 0, and for sizes that fit no memory, which the launchers refuse with
   cudaErrorInvalidValue, as B, F + 1 or D past an int). bwd accumulates; ddense or demb may be NULL. Returns 1000 + the
   cublasStatus_t of a failing cuBLAS call. */
size_t dt_k_dot_interaction_scratch(int64_t B, int64_t F, int64_t D, int bwd);
int dt_k_dot_interaction_fwd(void *cublas, float *out, const float *dense, const float *emb, int64_t B, int64_t F,
                             int64_t D, void *scratch, void *stream);
int dt_k_dot_interaction_bwd(void *cublas, float *ddense, float *demb, const float *dout, const float *dense,
                             const float *emb, int64_t B, int64_t F, int64_t D, void *scratch, void *stream);

/* ==== >>opt: optimizer (dt_opt.cu) ============================================================ */

/* The optimizer of dt_opt.h over all parameters at once (kernels/dt_opt.cu): no host round trip
   in a step. The parameters are a device array of dt_k_opt_seg, built once (dt_opt_create, or
   when a grad moves): one flat index space, parameter s covering [seg[s].start, seg[s + 1].start)
   (the last one up to n). Values: w_dtype 1 f32, 2 bf16, 3 f16 (as dt_dtype); master the f32
   master weights or NULL. With master: the update runs on master and w = master rounded (nearest
   even); without, a bf16 / f16 w is widened, updated and rounded back. cls: the parameter's norm
   class, 0 <= cls < n_cls (0: summed here only; k > 0: summed over the k-th comm of dt_opt.h). */
#define DT_K_OPT_MAX_CLS 8
typedef struct dt_k_opt_seg {
    void *w;
    float *master;
    float *g;          /* f32 grad */
    float *s0, *s1;    /* state: momentum_buffer / exp_avg / sum, exp_avg_sq; NULL when unused */
    int64_t start;
    double wd;         /* weight decay (0: no_decay) */
    double lr_scale;   /* its group's lr scale */
    int w_dtype;
    int cls;
    /* stochastic rounding of a bf16 w (hyper.sr): element i = (i0 * sr_n1 + i1) * sr_n2 + i2 is
       element sr_base + i0 * sr_g0 + i1 * sr_g1 + i2 of the whole tensor (dt_opt_slot's fields) */
    uint64_t sr_stream;
    int64_t sr_base, sr_n1, sr_n2, sr_g0, sr_g1;
} dt_k_opt_seg;

/* What a step decides on the device (one per optimizer, in device memory; the host reads it only
   when it asks: dt_opt.h says when). */
typedef struct dt_k_opt_state {
    double scale;          /* the loss scale (1 without scaling) */
    double sumsq;          /* the global sum of squares of this step's grads */
    double grad_norm;      /* its sqrt; HUGE_VAL when the step was skipped; 0 when not computed */
    int64_t step;          /* updates applied */
    int64_t skipped;       /* steps skipped for inf / NaN */
    int growth_tracker;    /* the scaler's clean steps */
    int skip;              /* 1: this step is skipped (the update reads it) */
    float grad_mul;        /* the clip factor of this step (1: none) */
    float found_inf;       /* 1: an inf / NaN in this rank's grads (f32: dt_comm all-reduces it, MAX) */
    float sumsq_f;         /* phase 1's sum, as f32 for an all-reduce over the pipeline stages */
    int pad;
} dt_k_opt_state;

/* The grads' pass, two launches: block b of dt_k_opt_blocks(n) multiplies its fixed chunk by mul
   when scale is 1 (GradScaler's 1 / scale), flags inf / NaN and sums x * x in double per class
   into partials (scratch of dt_k_opt_blocks(n) * (n_cls + 1) doubles); one block then adds the
   partials in a fixed order: cls[c] (device, n_cls doubles), clsf[c] = (float)cls[c] (what an
   all-reduce over ranks carries: dt_comm has no f64 device tensors) and st->found_inf.
   Deterministic; not the CPU's sum order. */
int dt_k_opt_blocks(int64_t n);
int dt_k_opt_grad_pass(const dt_k_opt_seg *seg, int n_seg, int64_t n, int n_cls, double *partials, double *cls,
                       float *clsf, dt_k_opt_state *st, float mul, int scale, void *stream);

/* The decisions (one device thread): phase 0: norm^2 = the sum over c of cls[c], or of clsf[c]
   where bit c of reduced is set (the caller all-reduced clsf[c] over other ranks); phase 1: only
   st->sumsq_f = that sum (to all-reduce it over pipeline stages), then phase 2 takes st->sumsq_f.
   Then, as dt_opt_step on the host: skip = scaling && found_inf; grad_norm; grad_mul =
   clip_norm / (norm + 1e-6) when clip_norm > 0, the norm finite and that < 1; step++ unless
   skipped; dt_loss_scaler_update on scale / growth_tracker / skipped when scaling. */
typedef struct dt_k_opt_finish_args {
    int scaling, dynamic, want_norm, growth_interval, reduced;
    double clip_norm, growth_factor, backoff_factor;
} dt_k_opt_finish_args;
int dt_k_opt_finish(dt_k_opt_state *st, const double *cls, const float *clsf, int n_cls, int phase,
                    const dt_k_opt_finish_args *args, void *stream);

/* Multi-tensor SGD / Adam / AdamW / Adagrad: one launch over every parameter of seg. kind 1 sgd,
   2 adam, 3 adamw, 4 adagrad (as dt_opt_kind); t the 1-based update number; lr the scheduled lr
   (each parameter multiplies its lr_scale). g is read as g * *grad_mul (grad_mul: device float,
   may be NULL = 1: the clip factor dt_k_opt_finish wrote); when *skip != 0 (device int, may be
   NULL) nothing is written. The math is dt_sgd_update / dt_adam_update / dt_adagrad_update's,
   op for op, with the per-parameter scalars in double rounded to float once. nvcc may contract
   a*b+c into an FMA, so a GPU can differ from the CPU in the last bit; the emulator does not. */
typedef struct dt_k_opt_hyper {
    int kind, nesterov, first;          /* first: 1 on SGD's first update (b = g) */
    int sr;                             /* 1: bf16 values rounded stochastically (dt_opt_desc's) */
    uint64_t sr_seed;
    int64_t t;
    double lr, momentum, dampening, beta1, beta2, eps, lr_decay;
    double bc1, bc2, lr_den;            /* set by the launcher */
} dt_k_opt_hyper;
int dt_k_opt_update(const dt_k_opt_seg *seg, int n_seg, int64_t n, const dt_k_opt_hyper *hyper, const float *grad_mul,
                    const int *skip, void *stream);

/* ==== >>embcopies: embedding response copies (dt_embed_copies.cu) ============================ */

/* dt_embed.h's owner side of a CUDA forward (kernels/dt_embed_copies.cu): the pooled rows of
   every request moved to their places in the response in one launch, not one cudaMemcpyAsync
   each (a forward has thousands of requests, a memcpy call costs microseconds of host time).
   n_copies copies: dst[dst_off[c] + e] = src[src_off[c] + e] for e < len[c] (offsets and lengths
   in elements, device int64 arrays); max_len (host) is the longest len[c], which sizes the grid
   (each thread copies at least 8 elements of a copy). elem_bytes 1, 2, 4 or 8. Copies must not
   overlap. A NULL pointer with n_copies and max_len > 0: cudaErrorInvalidValue. */
int dt_k_embed_copies(void *dst, const void *src, const int64_t *dst_off, const int64_t *src_off, const int64_t *len,
                      int n_copies, int64_t max_len, int elem_bytes, void *stream);

/* ==== >>gemm: gemm (dt_gemm.cu) =============================================================== */

/* dt_matmul_fwd through cuBLAS (row-major, as the CPU op): for each of batch matrices,
   out = alpha op(a) op(b) + beta out, op(a) [M,K], op(b) [K,N], out [M,N] f32; a, b of dtype
   in_dtype (1 f32, 2 bf16, 3 f16: bf16 / f16 accumulate in f32 through cublasGemmEx);
   stride_a / stride_b / stride_out: elements between batches (stride_b 0: b shared).
   tf32 = 1 lets f32 inputs use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32; about 1e-3
   relative). cublas is a cublasHandle_t (dt_ctx.cublas); its stream is set to `stream` when it
   is another (only then: cublasSetStream drops the handle's cublasSetWorkspace workspace, so a
   caller that gives it one sets the stream first, as dt_tensor.h does).
   Returns 1000 + the cublasStatus_t of a failing call, cudaErrorInvalidValue for bad arguments:
   a size or stride < 0, M, N or K > INT_MAX, batch > INT_MAX (cuBLAS counts batches in an int),
   a stride whose (batch - 1) multiple overflows int64, stride_out < M N with batch > 1 (outputs
   that overlap), out NULL for a non-empty product, a or b NULL when K > 0 as well. */
int dt_k_matmul_fwd(void *cublas, float *out, const void *a, const void *b, int in_dtype, int64_t batch, int64_t M,
                    int64_t N, int64_t K, int trans_a, int trans_b, int64_t stride_a, int64_t stride_b,
                    int64_t stride_out, float alpha, float beta, int tf32, void *stream);
/* The same with out of out_dtype: 1 (f32, as above) or in_dtype (bf16 / f16: out = alpha op(a)
   op(b) + beta out summed in f32, each value rounded once; dt_linear_bwd's bf16 dx). */
int dt_k_matmul_fwd_t(void *cublas, void *out, int out_dtype, const void *a, const void *b, int in_dtype,
                      int64_t batch, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int64_t stride_a,
                      int64_t stride_b, int64_t stride_out, float alpha, float beta, int tf32, void *stream);
/* dt_matmul_bwd (f32): da += alpha d/da, db += alpha d/db (either may be NULL), from dout and
   the forward's a, b; the CPU op's GEMMs with beta = 1. With stride_b 0 (b shared), db sums the
   batches in batch order. Strides >= 0; dout, a and b non-NULL unless the product is empty (a
   size 0) or neither gradient is asked for. */
int dt_k_matmul_bwd(void *cublas, float *da, float *db, const float *dout, const float *a, const float *b,
                    int64_t batch, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int64_t stride_a,
                    int64_t stride_b, float alpha, int tf32, void *stream);

/* dt_linear's fused GEMMs through cuBLASLt (a cublasLtHandle_t from dt_k_lt_create, dt_ctx.cublaslt;
   the workspace may be the cuBLAS handle's: both run on one stream). x, w, dout of in_dtype (1 f32,
   2 bf16, 3 f16), f32 accumulation, f32 outputs (_fwd: out, pre and bias of out_dtype, 1 f32 or
   in_dtype: each value rounded once from f32, the bias added in f32); tf32 as dt_k_matmul_fwd.
   _fwd:  out[N,Out] = x[N,In] w[Out,In]^T + bias[Out] (bias may be NULL), one GEMM whose epilogue
          adds the bias (CUBLASLT_EPILOGUE_BIAS); with pre non-NULL, pre = that and out = gelu(pre)
          (GELU_AUX_BIAS: GELU as cuBLASLt evaluates it; its header does not say how: the tanh
          form is assumed, its accuracy on a GPU unmeasured, see tests/cuda_emu/k_lt.cpp).
   _dw:   dw[Out,In] += dout[N,Out]^T x[N,In], and dbias[Out] = the column sums of dout, written
          (not added), from the epilogue (BGRADB: the sums of the values the GEMM read, so of
          bf16-rounded dout on a bf16 path and, on the emulator, of TF32-rounded dout under tf32).
   Both return DT_K_NO_ALGO, having written nothing, where the fused GEMM is not for this
   problem: cuBLASLt has no algorithm for it (NOT_SUPPORTED, no heuristic result), the GELU's
   input needs Out % 8 == 0, a bias / aux / dbias vector is not 16-byte aligned, or a size is 0;
   the caller runs the unfused ops instead. */
#define DT_K_NO_ALGO 1015 /* 1000 + CUBLAS_STATUS_NOT_SUPPORTED */
int dt_k_lt_create(void **lt);
int dt_k_lt_destroy(void *lt);
int dt_k_linear_lt_fwd(void *lt, void *out, void *pre, const void *x, const void *w, const void *bias,
                       int in_dtype, int out_dtype, int64_t N, int64_t Out, int64_t In, int tf32, void *workspace,
                       size_t workspace_bytes, void *stream);
int dt_k_linear_lt_dw(void *lt, float *dw, float *dbias, const void *dout, const void *x, int in_dtype, int64_t N,
                      int64_t Out, int64_t In, int tf32, void *workspace, size_t workspace_bytes, void *stream);

/* ==== >>tp: tensor parallel (dt_parallel.cu) =====================================================

   dt_parallel.h's vocab-parallel layers on CUDA tensors. ids (i32, or i64 with ids_i64 = 1) and
   targets are checked on the device by the caller (dt_cuda_check_range); an id or target outside
   the rank's range only contributes nothing here. Nothing waits or allocates: scratch is the
   caller's. A NULL pointer the launch reads or writes where the sizes say there is data (stats of
   tp_xent_loss may be NULL): cudaErrorInvalidValue.
   tp_embedding_fwd: out[n,:] = table[ids[n] - vocab_start, :] for this rank's Vl rows, else 0.
   tp_embedding_bwd: dtable[ids[n] - vocab_start, :] += dout[n,:] for this rank's rows: the ids are
   sorted with their positions (scratch: dt_k_tp_embedding_bwd_scratch(N) bytes, 8-byte aligned;
   0 when N is too large: N < 2^32, Vl < 2^32 - 1), then each row adds its dout rows in position
   order, one thread per column: the CPU's sums bit for bit, no atomics.
   tp_xent_fwd: block per row of logits [N, Vl] (nv <= Vl real columns): mloc[r] = mglob[r] = the
   row max (-inf without a real column), sz[2r] = sum of expf(z - max) (float, a fixed tree),
   sz[2r+1] = the target's logit or 0. Between the launches the caller reduces over tp: mglob by
   max, then (after tp_xent_rescale turned sz[2r] into the sum relative to mglob[r]) sz by sum.
   tp_xent_loss (one block; also for N = 0): stats[2r], stats[2r+1] = max, log-sum-exp (stats may
   be NULL), slot[0] = the mean over the rows not ignored of log s + max - z_target, slot[1] their
   count (doubles, summed in a fixed order: dt_cuda_loss_slot).
   tp_xent_bwd: dlogits = dloss / n_valid (exp(z - lse) - onehot) on real columns of rows not
   ignored and 0 everywhere else (padding columns, ignored rows, n_valid 0): written, not added,
   in one pass, block per row (float4 when Vl % 4 == 0 and both pointers are 16-byte aligned);
   dlogits may be logits (in place); n_valid is counted on the device into *count (scratch, one
   double).
   concat: columns [col0, col0 + C) of whole [R, W] and part [R, C]: to_whole 1 copies part into
   whole, 0 whole into part; accumulate 1 adds instead (dt_concat_fwd / _bwd, dt_split_fwd / _bwd).
   Ulysses' row moves (dt_cp_ulysses_fwd / _bwd on CUDA tensors), each element written by one
   thread (no atomics, the CPU loops' results bit for bit):
   cols_copy: dst[r ds + c] = src[r ss + c] (accumulate 1: +=) for r < R, c < C; dst and src
   must not overlap. cols_copy16: the same for 2-byte elements (bf16 bits; no accumulate): the
   ring's K/V columns of a bf16 qkv (dt_cp_attention_fwd on the tensor cores).
   cp_rows: seq [B, T, w] in position order and shards [cp, B, T / cp, w], block i holding cp
   rank i's local rows (two chunks of T / (2 cp): positions chunk i, then chunk 2 cp - 1 - i,
   dt_cp_position's zigzag; cp 1: one block, the same order): to_seq 1 writes seq from shards,
   0 shards from seq. T a multiple of 2 cp (cp > 1), else cudaErrorInvalidValue. */
int dt_k_tp_embedding_fwd(float *out, const float *table, const void *ids, int ids_i64, int64_t N, int64_t Vl,
                          int64_t C, int64_t vocab_start, void *stream);
size_t dt_k_tp_embedding_bwd_scratch(int64_t N);
int dt_k_tp_embedding_bwd(float *dtable, const float *dout, const void *ids, int ids_i64, int64_t N, int64_t Vl,
                          int64_t C, int64_t vocab_start, void *scratch, void *stream);
int dt_k_tp_xent_fwd(float *mloc, float *mglob, float *sz, const float *logits, const int32_t *targets,
                     int ignore_index, int64_t N, int64_t Vl, int64_t nv, int64_t vocab_start, void *stream);
int dt_k_tp_xent_rescale(float *sz, const float *mloc, const float *mglob, int64_t N, void *stream);
int dt_k_tp_xent_loss(double *slot, float *stats, const float *mglob, const float *sz, const int32_t *targets,
                      int ignore_index, int64_t N, void *stream);
int dt_k_tp_xent_bwd(float *dlogits, const float *logits, const float *stats, const int32_t *targets, int ignore_index,
                     float dloss, double *count, int64_t N, int64_t Vl, int64_t nv, int64_t vocab_start, void *stream);
int dt_k_concat(float *whole, float *part, int64_t R, int64_t W, int64_t col0, int64_t C, int to_whole, int accumulate,
                void *stream);
int dt_k_cols_copy(float *dst, int64_t ds, const float *src, int64_t ss, int64_t R, int64_t C, int accumulate,
                   void *stream);
int dt_k_cols_copy16(uint16_t *dst, int64_t ds, const uint16_t *src, int64_t ss, int64_t R, int64_t C, void *stream);
int dt_k_cp_rows(float *seq, float *shards, int64_t B, int64_t T, int cp, int64_t w, int to_seq, void *stream);

/* ==== >>moe: mixture of experts (dt_moe.cu) ======================================================

   dt_parallel.h's >>moe on CUDA tensors, each kernel in the CPU path's order (one thread per
   token, sequence or expert walking its items in order; no atomics), so the routing, the counts,
   the slots, the copies and the combine are the CPU's bit for bit on the same probabilities (the
   softmax's expf is the device's).
   route: probs [N, E] holds the router's logits, becomes the softmax; idx / gate [N, k] the k
   largest of p (+ bias [E] when not NULL), ties to the lower index, gates p (renorm: / their sum).
   capacity: S sequences of T tokens: slot [N, k] = 0 kept, -1 dropped (GShard's order, cap per
   expert and sequence, 0 = all); seqstat [2 S]: per sequence dropped, and the sum of the dropped
   pairs' 20-bit fingerprints (global token (seq0 + s) T + t, choice j); used: [S, E] scratch.
   counts: stat [3 E] doubles: per expert routed, sum of p (token order), kept.
   slots: the kept slots become send rows, sorted by expert then token (reads stat's kept).
   pack: send[slot] = x[t]; permute: to 1 dst[i] = src[perm[i]], 0 dst[perm[i]] = src[i];
   combine: y[t] = sum_j g ret[slot] (written); combine_bwd: dret[slot] = g dy[t] and dg [N, k] =
   dy[t] . ret[slot] (double over the columns); dispatch_bwd: dx[t] += back[slot] in j order;
   router_bwd: dz [N, E] from dg (and renorm) plus auxd [E], through the softmax.
   Sizes negative or whose products pass int64, and a NULL array the host sizes say holds data
   (all but those sized by the kept rows on the device: send, ret, dret, back, out, g), are
   cudaErrorInvalidValue. */
int dt_k_moe_route(float *probs, int *idx, float *gate, const float *bias, int64_t N, int E, int k, int renorm,
                   void *stream);
/* bias_rows: out[r, :] += bias[e, :] for the rows [eoff[e], eoff[e+1]) of each of El experts
   (eoff on the device); bias_grad: db[e, :] += alpha x (float)(the double sum over those rows of
   g, in row order): the CPU's dt_bias_add_bwd then dt_axpy. */
int dt_k_moe_bias_rows(float *out, const float *bias, const int64_t *eoff, int El, int64_t cols, void *stream);
int dt_k_moe_bias_grad(float *db, const float *g, const int64_t *eoff, int El, int64_t cols, float alpha, void *stream);
/* (dt_gemm.cu) The grouped GEMM of count <= 256 row-major problems C_i[M_i, N_i] = alpha op(A_i)
   op(B_i) + beta C_i, M_i, N_i >= 1 (sizes: host arrays; A, B, C: device arrays of device
   pointers, all six arrays non-NULL when count > 0): cuBLAS's cublasSgemmGroupedBatched, one
   group per problem. */
int dt_k_gemm_grouped(void *cublas, int count, int trans_a, int trans_b, const int64_t *M, const int64_t *N,
                      const int64_t *K, float alpha, float beta, const float *const *A, const float *const *B,
                      float *const *C, void *stream);
int dt_k_moe_capacity(int64_t *slot, int64_t *seqstat, int64_t *used, const int *idx, int64_t S, int64_t T, int E,
                      int k, int64_t cap, int64_t seq0, void *stream);
int dt_k_moe_counts(double *stat, const int *idx, const int64_t *slot, const float *probs, int64_t N, int E, int k,
                    void *stream);
int dt_k_moe_slots(int64_t *slot, const int *idx, const double *stat, int64_t N, int E, int k, void *stream);
int dt_k_moe_pack(float *send, const float *x, const int64_t *slot, int64_t N, int k, int64_t C, void *stream);
int dt_k_moe_permute(float *dst, const float *src, const int64_t *perm, int64_t R, int64_t C, int to, void *stream);
int dt_k_moe_combine(float *y, const float *ret, const int64_t *slot, const float *gate, int64_t N, int k, int64_t C,
                     void *stream);
int dt_k_moe_combine_bwd(float *dret, float *dg, const float *dy, const float *ret, const int64_t *slot,
                         const float *gate, int64_t N, int k, int64_t C, void *stream);
int dt_k_moe_dispatch_bwd(float *dx, const float *back, const int64_t *slot, int64_t N, int k, int64_t C, void *stream);
int dt_k_moe_router_bwd(float *dz, const float *probs, const int *idx, const float *gate, const float *dg,
                        const float *auxd, int64_t N, int E, int k, int renorm, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* DT_KERNELS_H */
