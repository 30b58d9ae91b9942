/* bench/gpu/device.c - what `./build.sh gpu` records about the GPU, and whether the CUDA runtime
   can use it at all: nvidia-smi may list a GPU whose driver is older than this toolkit, and then
   every CUDA call fails. Prints "key: value" lines (bench/gpu/run.sh copies them into the
   summary), including the card's dense datasheet peaks, the denominators of MFU.
   Exit 0; 3 when cudaGetDeviceCount fails or finds no device (the reason printed). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

/* Dense (no sparsity) datasheet TFLOP/s, by name: bf16 tensor cores, tf32 tensor cores, fp32 FMA.
   0 = not known here (MFU is then not printed). The H200 has the H100 SXM's arithmetic. */
static void peaks(const char *name, double *bf16, double *tf32, double *fp32) {
    *bf16 = *tf32 = *fp32 = 0;
    if (strstr(name, "H100") && (strstr(name, "PCIe") || strstr(name, "PCIE"))) *bf16 = 756, *tf32 = 378, *fp32 = 51;
    else if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H800") || strstr(name, "GH200"))
        *bf16 = 989, *tf32 = 495, *fp32 = 67;
    else if (strstr(name, "A100")) *bf16 = 312, *tf32 = 156, *fp32 = 19.5;
}

static int attr(enum cudaDeviceAttr a, int dev) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) v = -1;
    return v;
}

int main(void) {
    struct cudaDeviceProp p;
    int n = 0, dev = 0, rt = 0, drv = 0;
    double bf16, tf32, fp32;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || n < 1) {
        printf("no usable CUDA device: cudaGetDeviceCount %s (%s); runtime %d, driver %d%s\n",
               e == cudaSuccess ? "found 0 devices" : "failed", e == cudaSuccess ? "no device" : cudaGetErrorString(e),
               rt, drv, drv && drv < rt ? " (the driver is older than the runtime)" : "");
        return 3;
    }
    e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess) {
        printf("no usable CUDA device: cudaGetDeviceProperties(0) failed (%s)\n", cudaGetErrorString(e));
        return 3;
    }
    peaks(p.name, &bf16, &tf32, &fp32);
    printf("devices: %d\n", n);
    printf("name: %s\n", p.name);
    printf("compute_capability: %d.%d\n", p.major, p.minor);
    printf("arch: sm_%d%d\n", p.major, p.minor);
    printf("multiprocessors: %d\n", p.multiProcessorCount);
    printf("memory_gib: %.1f\n", (double)p.totalGlobalMem / 1073741824.0);
    printf("l2_mib: %.1f\n", p.l2CacheSize / 1048576.0);
    printf("sm_clock_max_mhz: %d\n", attr(cudaDevAttrClockRate, dev) / 1000);
    printf("mem_clock_max_mhz: %d\n", attr(cudaDevAttrMemoryClockRate, dev) / 1000);
    printf("mem_bus_bits: %d\n", attr(cudaDevAttrGlobalMemoryBusWidth, dev));
    printf("cuda_runtime: %d.%d\n", rt / 1000, rt % 1000 / 10);
    printf("cuda_driver_api: %d.%d\n", drv / 1000, drv % 1000 / 10);
    printf("peak_bf16_tflops: %g\n", bf16);
    printf("peak_tf32_tflops: %g\n", tf32);
    printf("peak_fp32_tflops: %g\n", fp32);
    return 0;
}
