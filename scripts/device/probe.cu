// Probe kernels for fixtures: a saxpy-like kernel on a full grid and the same on a tiny grid.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
__global__ void probe_full(const float* __restrict__ x, float* __restrict__ y, int n, float a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + y[i];
}
__global__ void probe_small_grid(const float* __restrict__ x, float* __restrict__ y, int n, float a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + y[i];
}
int main(int argc, char** argv) {
    int n = 1 << 24; float *x, *y;
    cudaMalloc(&x, n * 4); cudaMalloc(&y, n * 4);
    cudaMemset(x, 0, n * 4); cudaMemset(y, 0, n * 4);
    for (int it = 0; it < 3; ++it) {
        probe_full<<<4096, 256>>>(x, y, n, 2.0f);
        probe_small_grid<<<2, 128>>>(x, y, n, 2.0f);
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("done %s\n", cudaGetErrorString(e));
    return e != cudaSuccess;
}
