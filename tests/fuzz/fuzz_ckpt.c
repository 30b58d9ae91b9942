/* tests/fuzz/fuzz_ckpt.c - libFuzzer target for dt_opt.h's checkpoint reader, dt_checkpoint_load.

   Build and run (tests/fuzz/run.sh 240 ckpt does both):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_ckpt.c -o build/fuzz/fuzz_ckpt -lm -lpthread
       build/fuzz/fuzz_ckpt -max_total_time=240 build/fuzz/corpus_ckpt tests/fuzz/corpus_ckpt
   tests/test_fuzz_files_replay.c runs every file of tests/fuzz/corpus_ckpt through the same
   function without libFuzzer (gcc, plain and ASan+UBSan), as a normal test.

   Input: byte 0 picks what loads it (bits below), then the step directory's manifest.json,
   then up to four rank files rank_00000.safetensors .. rank_00003.safetensors, each after the
   separator "@@FILE@@". In the manifest "@HASHk@" and "@SIZEk@" stand for rank file k's XXH64
   (16 hex digits) and size, so that inputs get past the checksum to the safetensors header and
   the tensors (an input without them tests the checksum). `latest` names the step directory.

   What loads it: "w", f32, global shape [4, 3], whole or (bit 1) rows 1 .. 2 of it; "b", bf16
   [3] (bit 2: f32); "z", f32 [2, 0] (no elements); with an AdamW optimizer (bit 0) or none, the
   train state (bit 3: not asked for), through `latest` or (bit 4) desc.step_dir, the
   optimizer's loss scale none or (bit 5) dynamic. Beyond "no crash, no sanitizer report", it checks what must hold
   for any input:
     - a failed load returns a status with a message that starts with "dt_checkpoint_load:" and
       names the checkpoint (its directory, or the tensor "in the checkpoint"), changes nothing
       (every parameter, master and state byte, the optimizer's step and scaler, the train
       state) and keeps no memory;
     - a successful load keeps no memory, gives a train state and optimizer step >= 0 and a
       finite positive loss scale, and writes every element: loaded again over other bytes
       it gives the same values, bit for bit. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#endif
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "tests/fuzz/fuzz_files.h"
#include <math.h>
#include <sys/stat.h>

enum { DT_FUZZ_CK_FILES = 4, DT_FUZZ_CK_TENSORS = 12 }; /* 3 values, 1 master, 6 states */

/* What a load may change, copied out: every tensor's bytes, the optimizer's scalars, the state. */
typedef struct dt_fuzz_ck_snap {
    unsigned char *bytes[DT_FUZZ_CK_TENSORS];
    size_t n[DT_FUZZ_CK_TENSORS];
    int count;
    int64_t step;
    dt_loss_scaler scaler;
    dt_train_state ts;
} dt_fuzz_ck_snap;

/* the tensors a load fills, in a fixed order */
static int dt_fuzz_ck_tensors(dt_params *ps, dt_optimizer *o, dt_tensor **out) {
    int i, k, n = 0;
    for (i = 0; i < ps->count; i++) out[n++] = &ps->items[i]->value;
    for (i = 0; o && i < o->n_slots; i++) {
        if (o->slots[i].master.data) out[n++] = &o->slots[i].master;
        for (k = 0; k < 2; k++)
            if (o->slots[i].state[k].data) out[n++] = &o->slots[i].state[k];
    }
    return n;
}

static void dt_fuzz_ck_fill(dt_params *ps, dt_optimizer *o, int byte) {
    dt_tensor *t[DT_FUZZ_CK_TENSORS];
    int i, n = dt_fuzz_ck_tensors(ps, o, t);
    for (i = 0; i < n; i++)
        if (dt_tensor_bytes(t[i])) memset(t[i]->data, byte, dt_tensor_bytes(t[i]));
}

static void dt_fuzz_ck_take(dt_fuzz_ck_snap *s, dt_params *ps, dt_optimizer *o, const dt_train_state *ts) {
    dt_tensor *t[DT_FUZZ_CK_TENSORS];
    int i;
    memset(s, 0, sizeof *s);
    s->count = dt_fuzz_ck_tensors(ps, o, t);
    for (i = 0; i < s->count; i++) {
        s->n[i] = dt_tensor_bytes(t[i]);
        s->bytes[i] = (unsigned char *)malloc(s->n[i] + 1);
        if (s->n[i]) memcpy(s->bytes[i], t[i]->data, s->n[i]);
    }
    if (o) {
        s->step = o->step;
        s->scaler = o->scaler;
    }
    s->ts = *ts;
}

static int dt_fuzz_ck_same(const dt_fuzz_ck_snap *a, const dt_fuzz_ck_snap *b) {
    int i, same = a->count == b->count && a->step == b->step && !memcmp(&a->scaler, &b->scaler, sizeof a->scaler) &&
                  !memcmp(&a->ts, &b->ts, sizeof a->ts);
    for (i = 0; same && i < a->count; i++) same = a->n[i] == b->n[i] && !memcmp(a->bytes[i], b->bytes[i], a->n[i]);
    return same;
}

static void dt_fuzz_ck_drop(dt_fuzz_ck_snap *s) {
    int i;
    for (i = 0; i < s->count; i++) free(s->bytes[i]);
}

/* The parameters and optimizer of the option bits; 0 when they could not be made. */
static int dt_fuzz_ck_model(dt_ctx *ctx, dt_params *ps, dt_optimizer **o, dt_comm *world, unsigned opt) {
    dt_param_desc d;
    dt_opt_desc od;
    memset(ps, 0, sizeof *ps);
    *o = NULL;
    memset(&d, 0, sizeof d);
    d.name = "w";
    d.global_shape[0] = 4; d.global_shape[1] = 3;
    d.shape[0] = opt & 2 ? 2 : 4; d.shape[1] = 3;
    d.start[0] = opt & 2 ? 1 : 0;
    if (dt_params_add(ctx, ps, NULL, &d)) return 0;
    memset(&d, 0, sizeof d);
    d.name = "b";
    d.dtype = opt & 4 ? DT_F32 : DT_BF16;
    d.shape[0] = 3;
    if (dt_params_add(ctx, ps, NULL, &d)) return 0;
    memset(&d, 0, sizeof d);
    d.name = "z"; /* [2, 0]: no elements */
    d.ndim = 2;
    d.shape[0] = 2;
    if (dt_params_add(ctx, ps, NULL, &d)) return 0;
    if (!(opt & 1)) return 1;
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_ADAMW;
    od.norm.shard_comm = world; /* "w" may be a slice: the comm it is split over (one rank here) */
    od.loss_scale.mode = opt & 32 ? DT_LOSS_SCALE_DYNAMIC : DT_LOSS_SCALE_NONE;
    return dt_opt_create(ctx, o, ps, &od) == DT_OK;
}

/* The manifest with the placeholders of files[0 .. n) filled in (malloc'd, NUL-terminated). */
static char *dt_fuzz_ck_manifest(const char *text, size_t len, const char *const *file, const size_t *flen,
                                 size_t *out_len) {
    char *out = (char *)malloc(len * 4 + 64), val[32]; /* "@SIZEk@" (7) becomes at most 20 digits */
    size_t i = 0, k = 0;
    while (i < len) {
        int f = i + 7 <= len && text[i] == '@' && text[i + 6] == '@' && text[i + 5] >= '0' &&
                        text[i + 5] < '0' + DT_FUZZ_CK_FILES ? text[i + 5] - '0' : -1;
        if (f >= 0 && !memcmp(text + i, "@HASH", 5)) {
            snprintf(val, sizeof val, "%016llx", (unsigned long long)dt_xxh64(file[f], flen[f]));
        } else if (f >= 0 && !memcmp(text + i, "@SIZE", 5)) {
            snprintf(val, sizeof val, "%llu", (unsigned long long)flen[f]);
        } else {
            out[k++] = text[i++];
            continue;
        }
        memcpy(out + k, val, strlen(val));
        k += strlen(val);
        i += 7;
    }
    out[k] = 0;
    *out_len = k;
    return out;
}

/* Writes the checkpoint directory of the input; returns its root in dir[n]. */
static void dt_fuzz_ck_write(const uint8_t *data, size_t size, char *dir, size_t n) {
    static const char sep[] = "@@FILE@@";
    const char *file[DT_FUZZ_CK_FILES] = {"", "", "", ""}, *text = (const char *)data, *end = text + size, *at;
    size_t flen[DT_FUZZ_CK_FILES] = {0, 0, 0, 0}, mlen = size, man_len;
    char path[1200], name[64], *man;
    int f, nf = 0;
    /* split at the separators: the manifest, then the files */
    for (at = text; at + 8 <= end; at++)
        if (!memcmp(at, sep, 8)) break;
    if (at + 8 <= end) {
        mlen = (size_t)(at - text);
        while (at + 8 <= end && !memcmp(at, sep, 8) && nf < DT_FUZZ_CK_FILES) {
            const char *start = at + 8, *next;
            for (next = start; next + 8 <= end; next++)
                if (!memcmp(next, sep, 8)) break;
            if (next + 8 > end) next = end;
            file[nf] = start;
            flen[nf++] = (size_t)(next - start);
            at = next;
        }
    }
    dt_fuzz_path(dir, n, "ckpt");
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/step_00000007", dir);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/latest", dir);
    dt_fuzz_write(path, "step_00000007\n", 14);
    man = dt_fuzz_ck_manifest(text, mlen, file, flen, &man_len);
    snprintf(path, sizeof path, "%s/step_00000007/manifest.json", dir);
    dt_fuzz_write(path, man, man_len);
    free(man);
    for (f = 0; f < DT_FUZZ_CK_FILES; f++) { /* the files of the last input go */
        snprintf(name, sizeof name, "rank_%05d.safetensors", f);
        snprintf(path, sizeof path, "%s/step_00000007/%s", dir, name);
        if (f < nf) dt_fuzz_write(path, file[f], flen[f]);
        else remove(path);
    }
}

/* The check of one input; returns the load's status. */
static dt_status dt_fuzz_ckpt_one(const uint8_t *data, size_t size) {
    char dir[1024];
    dt_ctx ctx;
    dt_comm *world = NULL;
    dt_params ps;
    dt_optimizer *o = NULL;
    dt_checkpoint_desc cd;
    dt_train_state ts, *want_ts;
    dt_fuzz_ck_snap before, after, again;
    dt_status st, st2;
    size_t bytes;
    unsigned opt;
    dt_fuzz_input = data;
    dt_fuzz_input_size = size;
    if (size < 1) return DT_ERR_ARG;
    opt = data[0];
    dt_fuzz_ck_write(data + 1, size - 1, dir, sizeof dir);
    dt_ctx_init(&ctx, NULL);
    DT_FUZZ_CHECK(dt_comm_create_world(&ctx, &world, NULL) == DT_OK, "a world of one rank");
    DT_FUZZ_CHECK(dt_fuzz_ck_model(&ctx, &ps, &o, world, opt), "the model is made");
    memset(&ts, 0x5a, sizeof ts);
    want_ts = opt & 8 ? NULL : &ts;
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.step_dir = opt & 16 ? "step_00000007" : NULL;
    dt_fuzz_ck_fill(&ps, o, 0x5a);
    dt_fuzz_ck_take(&before, &ps, o, &ts);
    bytes = ctx.bytes_in_use;
    st = dt_checkpoint_load(&ctx, &ps, o, want_ts, &cd);
    dt_fuzz_ck_take(&after, &ps, o, &ts);
    if (st) {
        dt_fuzz_check_failure(&ctx, st, bytes, "dt_checkpoint_load", dir, "in the checkpoint");
        DT_FUZZ_CHECK(dt_fuzz_ck_same(&before, &after), "a failed load changes nothing");
    } else {
        DT_FUZZ_CHECK(ctx.bytes_in_use == bytes, "a load keeps no memory");
        DT_FUZZ_CHECK(!want_ts || (ts.step >= 0 && ts.data_cursor >= 0 && ts.n_kv >= 0 && ts.n_kv <= DT_CKPT_MAX_KV),
                      "the train state is in range");
        DT_FUZZ_CHECK(!o || (o->step >= 0 && isfinite(o->scaler.scale) && o->scaler.scale > 0 &&
                             o->scaler.growth_tracker >= 0 && o->scaler.skipped >= 0),
                      "the optimizer's step and scaler are in range");
        /* over other bytes: the same values, so every element came from the file */
        dt_fuzz_ck_fill(&ps, o, 0xc3);
        memset(&ts, 0xc3, sizeof ts);
        st2 = dt_checkpoint_load(&ctx, &ps, o, want_ts, &cd);
        DT_FUZZ_CHECK(st2 == DT_OK, "a checkpoint that loaded loads again");
        if (!want_ts) memset(&ts, 0x5a, sizeof ts);
        dt_fuzz_ck_take(&again, &ps, o, &ts);
        DT_FUZZ_CHECK(dt_fuzz_ck_same(&after, &again), "every element is loaded from the file");
        dt_fuzz_ck_drop(&again);
    }
    dt_fuzz_ck_drop(&before);
    dt_fuzz_ck_drop(&after);
    dt_opt_free(o);
    dt_params_free(&ctx, &ps);
    dt_comm_free(world);
    DT_FUZZ_CHECK(ctx.bytes_in_use == 0, "the model gives back its memory");
    dt_ctx_shutdown(&ctx);
    return st;
}

#ifndef DT_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_fuzz_ckpt_one(data, size);
    return 0;
}
#endif
