/* examples/gpt/gpt_data.h - the data side of the GPT example: a text file as bytes (vocab 256)
   or llm.c token shards (GPT-2 vocab), and training windows drawn as a pure function of
   (seed, global sample index).                                          v0.1, MIT licence

   Part of examples/gpt, not a library header, but written like one. Do this:
       #define DT_GPT_DATA_IMPLEMENTATION    (or DT_IMPLEMENTATION)
   before you include this file in *one* C or C++ file, after dt_tensor.h. Other files include
   it without the define.

   API in one breath:
       dt_gpt_data_open / _close     a text file or a list of llm.c shards, validated, in memory
       dt_gpt_data_window            the (inputs, targets) window of global sample i
       dt_gpt_data_check_shard       one llm.c shard file's header and tokens, validated

   Text: every byte is a token (vocab 256, padded vocab 256). The whole file is one stream.

   llm.c shards (the .bin files of llm.c's dev/data, written by llm.c's data scripts): a header of 256 little-endian
   int32, header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = number of tokens n,
   then n uint16 tokens; the file is exactly 1024 + 2n bytes. Tokens are GPT-2's (vocab 50257),
   the model's vocab is padded to 50304 (a multiple of 128, as llm.c pads it). Each of these is a
   named error: a short header or body (DT_ERR_FORMAT "truncated"), trailing bytes, a wrong magic
   or version (DT_ERR_FORMAT naming the value and the expected one), a token >= 50257
   (DT_ERR_RANGE naming file, position and token).

   Windows: sample i of a run with seed s is the window starting at a position drawn from
   dt_rng_uniform(s, DT_GPT_DATA_STREAM, 2i) and (.., 2i + 1) (two 24-bit draws, so streams of
   billions of tokens are covered), inputs = tokens [p, p + T), targets = [p + 1, p + T + 1). A
   window never crosses from one shard into the next. Nothing depends on which rank asks, so
   every data-parallel layout sees the same global batch. The trainer uses i = step * B + b.

   Memory: the tokens are held in memory (from the ctx allocator), as int32-ready uint16 for
   shards and bytes for text. Errors: statuses with a message, as everywhere in dt.
   The licence (MIT) is at the end of this file. */
#ifndef DT_GPT_DATA_H
#define DT_GPT_DATA_H

#ifndef DT_TENSOR_H
#error "gpt_data.h needs dt_tensor.h included before it"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DT_GPT_SHARD_MAGIC 20240520
#define DT_GPT_SHARD_VERSION 1
#define DT_GPT2_VOCAB 50257
#define DT_GPT2_VOCAB_PADDED 50304
#define DT_GPT_DATA_STREAM 0x67707464617461ull /* "gptdata": the RNG stream of the window draws */

typedef struct dt_gpt_data_desc {
    const char *text;                 /* a text file, read as bytes; or NULL */
    const char *const *shards;        /* llm.c .bin files, in this order; or NULL */
    int n_shards;
} dt_gpt_data_desc;

typedef struct dt_gpt_data {
    int64_t vocab, vocab_padded;      /* 256, 256 (text) or 50257, 50304 (shards) */
    int n_files;
    int64_t n_tokens;                 /* all files */
    uint8_t *bytes;                   /* text: n_tokens bytes */
    uint16_t *tokens;                 /* shards: n_tokens tokens, file after file */
    int64_t *file_first;              /* per file: index of its first token; [n_files] = n_tokens */
} dt_gpt_data;

/* Reads and validates every file (exactly one of desc->text, desc->shards). */
DT_API dt_status dt_gpt_data_open(dt_ctx *ctx, dt_gpt_data *d, const dt_gpt_data_desc *desc);
DT_API void dt_gpt_data_close(dt_ctx *ctx, dt_gpt_data *d);
/* inputs, targets: i32 [T] each (T = inputs->numel). A stream (or every shard) shorter than
   T + 1 tokens is DT_ERR_ARG naming the length and T. */
DT_API dt_status dt_gpt_data_window(dt_ctx *ctx, dt_tensor *inputs, dt_tensor *targets, const dt_gpt_data *d,
                                    uint64_t seed, int64_t sample);
/* Validates one shard: *n_tokens = its count (may be NULL). Reads the whole file. */
DT_API dt_status dt_gpt_data_check_shard(dt_ctx *ctx, int64_t *n_tokens, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* DT_GPT_DATA_H */

#if defined(DT_IMPLEMENTATION) && !defined(DT_GPT_DATA_IMPLEMENTATION)
#define DT_GPT_DATA_IMPLEMENTATION
#endif

#ifdef DT_GPT_DATA_IMPLEMENTATION
#ifndef DT_GPT_DATA_IMPLEMENTATION_DONE
#define DT_GPT_DATA_IMPLEMENTATION_DONE

#include <stdio.h>
#include <string.h>
#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The size of an open file, or -1 (fseek/ftell: C99 only). */
static long long dt__gpt_file_size(FILE *fp) {
    long n;
    if (fseek(fp, 0, SEEK_END) != 0) return -1;
    n = ftell(fp);
    if (n < 0 || fseek(fp, 0, SEEK_SET) != 0) return -1;
    return (long long)n;
}

static uint32_t dt__gpt_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Opens a shard, checks its header and size; *n = its token count. The file is left positioned
   at the first token. fn: the API function the errors name. */
static dt_status dt__gpt_shard_open(dt_ctx *ctx, FILE **out, int64_t *n, const char *path, const char *fn) {
    unsigned char h[1024];
    long long size;
    uint32_t magic, version;
    int32_t count;
    FILE *fp = fopen(path, "rb");
    *out = NULL;
    if (!fp) return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot open shard '%s'", fn, path);
    size = dt__gpt_file_size(fp);
    if (size < 0) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot size shard '%s'", fn, path);
    }
    if (size >= 1024 && fread(h, 1, 1024, fp) != 1024) { /* a directory opens, and sizes huge, on Linux */
        int e = errno;
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: cannot read shard '%s': %s", fn, path, strerror(e));
    }
    if (size < 1024) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: shard '%s' is truncated: %lld bytes, "
                                "the header alone is 1024 (256 x int32)", fn, path, size);
    }
    magic = dt__gpt_le32(h);
    version = dt__gpt_le32(h + 4);
    count = (int32_t)dt__gpt_le32(h + 8);
    if (magic != DT_GPT_SHARD_MAGIC || version != DT_GPT_SHARD_VERSION || count < 0) {
        fclose(fp);
        if (magic != DT_GPT_SHARD_MAGIC)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: shard '%s' has magic %u, expected %d "
                                    "(an llm.c token shard)", fn, path, (unsigned)magic, DT_GPT_SHARD_MAGIC);
        if (version != DT_GPT_SHARD_VERSION)
            return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: shard '%s' has version %u, expected %d "
                                    "(uint16 GPT-2 tokens)", fn, path, (unsigned)version, DT_GPT_SHARD_VERSION);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: shard '%s' header[2] (token count) = %d, "
                                "expected >= 0", fn, path, (int)count);
    }
    if (size != 1024 + 2 * (long long)count) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_FORMAT, "%s: shard '%s' is %s: %lld bytes, header[2] "
                                "= %d tokens needs %lld", fn, path, size < 1024 + 2 * (long long)count ? "truncated"
                                : "longer than its header says", size, (int)count, 1024 + 2 * (long long)count);
    }
    *out = fp;
    *n = count;
    return DT_OK;
}

/* Reads n tokens into dst and checks each against the GPT-2 vocab. */
static dt_status dt__gpt_shard_read(dt_ctx *ctx, uint16_t *dst, int64_t n, FILE *fp, const char *path,
                                    const char *fn) {
    int64_t i;
    unsigned char b[2];
    for (i = 0; i < n; i++) { /* byte by byte: little-endian on any host */
        uint16_t t;
        if (fread(b, 1, 2, fp) != 2)
            return dt_ctx_set_error(ctx, DT_ERR_IO, "%s: shard '%s': read failed at token %lld", fn, path,
                                    (long long)i);
        t = (uint16_t)(b[0] | b[1] << 8);
        if (t >= DT_GPT2_VOCAB)
            return dt_ctx_set_error(ctx, DT_ERR_RANGE, "%s: shard '%s': token %lld is %u, expected "
                                    "< %d (the GPT-2 vocab)", fn, path, (long long)i, (unsigned)t, DT_GPT2_VOCAB);
        if (dst) dst[i] = t;
    }
    return DT_OK;
}

DT_API dt_status dt_gpt_data_check_shard(dt_ctx *ctx, int64_t *n_tokens, const char *path) {
    FILE *fp;
    int64_t n;
    dt_status s;
    if (!ctx || !path) return ctx ? dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gpt_data_check_shard: path is NULL")
                                  : DT_ERR_ARG;
    s = dt__gpt_shard_open(ctx, &fp, &n, path, "dt_gpt_data_check_shard");
    if (s) return s;
    s = dt__gpt_shard_read(ctx, NULL, n, fp, path, "dt_gpt_data_check_shard");
    fclose(fp);
    if (!s && n_tokens) *n_tokens = n;
    return s;
}

DT_API void dt_gpt_data_close(dt_ctx *ctx, dt_gpt_data *d) {
    if (!d) return;
    dt_release(ctx, d->bytes);
    dt_release(ctx, d->tokens);
    dt_release(ctx, d->file_first);
    memset(d, 0, sizeof *d);
}

static dt_status dt__gpt_open_text(dt_ctx *ctx, dt_gpt_data *d, const char *path) {
    long long size;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_gpt_data_open: cannot open text '%s'", path);
    size = dt__gpt_file_size(fp);
    if (size < 0 || (uint64_t)size > (uint64_t)PTRDIFF_MAX - 64) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_gpt_data_open: cannot size text '%s'", path);
    }
    d->bytes = (uint8_t *)dt_alloc(ctx, (size_t)size + 1);
    d->file_first = (int64_t *)dt_alloc(ctx, 2 * sizeof(int64_t));
    if (!d->bytes || !d->file_first) { fclose(fp); return DT_ERR_OOM; }
    if (fread(d->bytes, 1, (size_t)size, fp) != (size_t)size) {
        fclose(fp);
        return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_gpt_data_open: read of text '%s' failed", path);
    }
    fclose(fp);
    d->vocab = 256;
    d->vocab_padded = 256;
    d->n_files = 1;
    d->n_tokens = size;
    d->file_first[0] = 0;
    d->file_first[1] = size;
    return DT_OK;
}

static dt_status dt__gpt_open_shards(dt_ctx *ctx, dt_gpt_data *d, const char *const *paths, int n) {
    int f;
    int64_t total = 0, count;
    FILE *fp;
    dt_status s;
    d->file_first = (int64_t *)dt_alloc(ctx, ((size_t)n + 1) * sizeof(int64_t));
    if (!d->file_first) return DT_ERR_OOM;
    for (f = 0; f < n; f++) { /* sizes first: one allocation for every token */
        if (!paths[f]) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gpt_data_open: desc.shards[%d] is NULL", f);
        s = dt__gpt_shard_open(ctx, &fp, &count, paths[f], "dt_gpt_data_open");
        if (s) return s;
        fclose(fp);
        d->file_first[f] = total;
        total += count;
    }
    d->file_first[n] = total;
    d->tokens = (uint16_t *)dt_alloc(ctx, (size_t)(total ? total : 1) * sizeof(uint16_t));
    if (!d->tokens) return DT_ERR_OOM;
    for (f = 0; f < n; f++) {
        s = dt__gpt_shard_open(ctx, &fp, &count, paths[f], "dt_gpt_data_open");
        if (s) return s;
        if (count != d->file_first[f + 1] - d->file_first[f]) {
            fclose(fp);
            return dt_ctx_set_error(ctx, DT_ERR_IO, "dt_gpt_data_open: shard '%s' changed while it was read", paths[f]);
        }
        s = dt__gpt_shard_read(ctx, d->tokens + d->file_first[f], count, fp, paths[f], "dt_gpt_data_open");
        fclose(fp);
        if (s) return s;
    }
    d->vocab = DT_GPT2_VOCAB;
    d->vocab_padded = DT_GPT2_VOCAB_PADDED;
    d->n_files = n;
    d->n_tokens = total;
    return DT_OK;
}

DT_API dt_status dt_gpt_data_open(dt_ctx *ctx, dt_gpt_data *d, const dt_gpt_data_desc *desc) {
    dt_status s;
    if (!ctx) return DT_ERR_ARG;
    if (!d || !desc) return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gpt_data_open: %s is NULL", d ? "desc" : "d");
    memset(d, 0, sizeof *d);
    if (!desc->text == !desc->shards)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gpt_data_open: give exactly one of desc.text and desc.shards "
                                "(got %s)", desc->text ? "both" : "neither");
    if (desc->shards && desc->n_shards < 1)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "dt_gpt_data_open: desc.n_shards = %d, expected >= 1",
                                desc->n_shards);
    s = desc->text ? dt__gpt_open_text(ctx, d, desc->text) : dt__gpt_open_shards(ctx, d, desc->shards, desc->n_shards);
    if (s) dt_gpt_data_close(ctx, d);
    return s;
}

DT_API dt_status dt_gpt_data_window(dt_ctx *ctx, dt_tensor *inputs, dt_tensor *targets, const dt_gpt_data *d,
                                    uint64_t seed, int64_t sample) {
    const char *fn = "dt_gpt_data_window";
    int64_t T, starts = 0, pick, f, p, t;
    uint64_t hi, lo;
    int32_t *in, *tg;
    dt_status s;
    if (!ctx) return DT_ERR_ARG;
    if (!d || (!d->bytes && !d->tokens)) return dt_ctx_set_error(ctx, DT_ERR_STATE, "%s: the data is not open", fn);
    if ((s = dt_check_tensor(ctx, inputs, DT_I32, fn, "inputs")) || (s = dt_check_tensor(ctx, targets, DT_I32, fn, "targets")))
        return s;
    T = inputs->numel;
    if (targets->numel != T || T < 1)
        return dt_ctx_set_error(ctx, DT_ERR_SHAPE, "%s: inputs has %lld elements, targets %lld: expected the same "
                                "T >= 1", fn, (long long)T, (long long)targets->numel);
    if (sample < 0) return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: sample = %lld, expected >= 0", fn, (long long)sample);
    for (f = 0; f < d->n_files; f++) {
        int64_t len = d->file_first[f + 1] - d->file_first[f];
        if (len > T) starts += len - T; /* windows of T + 1 tokens inside file f */
    }
    if (starts == 0)
        return dt_ctx_set_error(ctx, DT_ERR_ARG, "%s: the data has %lld tokens (longest file), a window needs T + 1 "
                                "= %lld", fn, (long long)d->n_tokens, (long long)T + 1);
    /* two 24-bit draws: u * 2^24 is an exact integer in [0, 2^24) for u in [0, 1) */
    hi = (uint64_t)(dt_rng_uniform(seed, DT_GPT_DATA_STREAM, 2 * (uint64_t)sample) * 16777216.0f);
    lo = (uint64_t)(dt_rng_uniform(seed, DT_GPT_DATA_STREAM, 2 * (uint64_t)sample + 1) * 16777216.0f);
    pick = (int64_t)(((hi << 24) | lo) % (uint64_t)starts);
    for (f = 0; f < d->n_files; f++) {
        int64_t len = d->file_first[f + 1] - d->file_first[f];
        if (len <= T) continue;
        if (pick < len - T) break;
        pick -= len - T;
    }
    p = d->file_first[f] + pick;
    in = (int32_t *)inputs->data;
    tg = (int32_t *)targets->data;
    for (t = 0; t < T; t++) {
        in[t] = d->bytes ? d->bytes[p + t] : d->tokens[p + t];
        tg[t] = d->bytes ? d->bytes[p + t + 1] : d->tokens[p + t + 1];
    }
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* DT_GPT_DATA_IMPLEMENTATION_DONE */
#endif /* DT_GPT_DATA_IMPLEMENTATION */

/*
   ------------------------------------------------------------------------------------------------
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
