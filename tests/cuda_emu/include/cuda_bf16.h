/* tests/cuda_emu/include/cuda_bf16.h - the CUDA emulator's stand-in for <cuda_bf16.h>: __nv_bfloat16,
   __nv_bfloat162 and the conversions a kernel needs, under the real header's names. Test-only (see
   cuda_runtime.h).

   __float2bfloat16 is cvt.rn.bf16.f32: round to nearest even (overflow past the largest finite
   value to inf), and every NaN to the canonical NaN 0x7fff, as the real header and the hardware do
   (dt_tensor.h's dt_f32_to_bf16 keeps a NaN's sign and payload, quieted: (u >> 16) | 0x40; every
   other input gives the same bits, tests/cuda_emu/k_mma.cpp checks it). Arithmetic operators are
   deleted: the real header rounds each one to bf16, a silent conversion to float here would not;
   convert with __bfloat162float and compute in float. */
#ifndef DT_CUDA_EMU_BF16_H
#define DT_CUDA_EMU_BF16_H

#include "cuda_runtime.h"

struct __nv_bfloat16_raw { unsigned short x; };

static inline unsigned short dt_emu_f32_to_bf16_bits(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu; /* NaN: canonical, as the hardware */
    u += 0x7fffu + ((u >> 16) & 1u);                      /* round to nearest even, then truncate */
    return (unsigned short)(u >> 16);
}

struct __align__(2) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(dt_emu_f32_to_bf16_bits(f)) {}
    __nv_bfloat16(double) = delete; /* one rounding on the GPU, two through float here */
    operator float() const { return __uint_as_float((unsigned int)__x << 16); }
    operator __nv_bfloat16_raw() const { __nv_bfloat16_raw r = {__x}; return r; }
};
struct __align__(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

__nv_bfloat16 operator+(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;
__nv_bfloat16 operator-(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;
__nv_bfloat16 operator*(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;
__nv_bfloat16 operator/(const __nv_bfloat16 &, const __nv_bfloat16 &) = delete;

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16_raw r = {u};
    return __nv_bfloat16(r);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __ushort_as_bfloat16(dt_emu_f32_to_bf16_bits(f)); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned int)h.__x << 16); }
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    __nv_bfloat162 v = {lo, hi};
    return v;
}
static inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __halves2bfloat162(x, y); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __halves2bfloat162(__float2bfloat16(lo), __float2bfloat16(hi));
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
static inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __floats2bfloat162_rn(f, f); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
static inline float __low2float(__nv_bfloat162 h) { return __bfloat162float(h.x); }
static inline float __high2float(__nv_bfloat162 h) { return __bfloat162float(h.y); }
static inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
static inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }

#endif /* DT_CUDA_EMU_BF16_H */
