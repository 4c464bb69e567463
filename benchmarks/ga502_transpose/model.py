"""GA502 acceptance workload: a 32x32-tiled transpose with an unpadded tile (the column read is 32-way
bank-conflicted) and its padded twin ([32][33], conflict-free), on a 8192 x 8192 float matrix.

Follows the model.py contract (build() -> (callable, inputs)); cupy compiles the kernels with NVRTC, so no
torch extension build is needed. On the GPU machine:

    PYTHONPATH=$PWD python3 -m gpuadvisor ncu benchmarks/ga502_transpose/model.py --out OUT --format markdown

GA502 must flag transpose_naive_32x32 (loads) and not transpose_padded_32x33.
"""

from __future__ import annotations

import cupy as cp

N = 8192
TILE = 32
BLOCK_ROWS = 8

SOURCE = r"""
#define TILE 32
#define BLOCK_ROWS 8

// gpuadvisor: blockDim=32,8
extern "C" __global__ void transpose_naive_32x32(const float* in, float* out, int n) {
    __shared__ float tile[TILE][TILE];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        out[(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}

// gpuadvisor: blockDim=32,8
extern "C" __global__ void transpose_padded_32x33(const float* in, float* out, int n) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        out[(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}
"""


def build():
    module = cp.RawModule(code=SOURCE)
    naive = module.get_function("transpose_naive_32x32")
    padded = module.get_function("transpose_padded_32x33")
    matrix = cp.random.default_rng(0).random((N, N), dtype=cp.float32) + 0.5
    out_naive = cp.empty_like(matrix)
    out_padded = cp.empty_like(matrix)
    grid = (N // TILE, N // TILE, 1)
    block = (TILE, BLOCK_ROWS, 1)

    def transpose_both(a, b, c):
        naive(grid, block, (a, b, cp.int32(N)))
        padded(grid, block, (a, c, cp.int32(N)))
        return b, c

    return transpose_both, (matrix, out_naive, out_padded)


def step(model, inputs):
    out_naive, out_padded = model(*inputs)
    return out_naive, out_padded
