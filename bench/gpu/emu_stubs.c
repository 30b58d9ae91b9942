/* bench/gpu/emu_stubs.c - the emulator's test controls on a real GPU (bench/gpu/emu_stubs.h
   says what each answers, and why). */
#include "emu_stubs.h"

#include <stddef.h>

const char *dt_emu_mode(void) { return "gpu"; }
const char *dt_emu_streams_mode(void) { return "gpu"; }
int dt_emu_report_count(void) { return 0; }
const char *dt_emu_last_report(void) { return ""; }

void dt_emu_get_counters(dt_emu_counters *c) {
    if (!c) return;
    c->syncs = c->allocs = c->frees = -1;
    c->h2d_bytes = c->h2d_calls = c->d2h_bytes = c->d2h_calls = -1;
}
int dt_emu_set_mode(const char *mode) { (void)mode; return 0; }
long long dt_emu_vector_accesses(void) { return -1; }
long dt_emu_lt_count(int index) { (void)index; return -1; }
void dt_emu_lt_refuse(unsigned mask) { (void)mask; }
