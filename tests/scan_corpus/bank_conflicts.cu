// Shared-memory access patterns with known bank behaviour: the ground truth for `gpuadvisor scan`.
//
// Every kernel is extern "C", takes (const float* in, float* out) and is launched by
// benchmarks/bank_conflicts_ncu.py with the block shape of its `gpuadvisor: blockDim=` hint, 64 blocks,
// and the dynamic shared memory of its `dynamicShared=` hint (bytes). `in` and `out` hold at least
// 64 blocks x 1024 threads x 16 bytes. Stores fill shared memory conflict-free; the load after
// __syncthreads() carries the pattern under test (the reductions and the transpose store are the exceptions
// noted on them). Loads read a neighbour's element ((tid + 1) % n) where a plain s[tid] would let the compiler
// reuse the value it just stored.
//
// Expected load degree (wavefronts / ideal wavefronts, 32 banks of 4 bytes) is on each kernel's first line.

#define TILE 32
#define BLOCK_ROWS 8
#define THREADS 256

// Load 32-way: a warp reads a column of an unpadded 32x32 float tile (every lane hits bank ty + j).
// gpuadvisor: blockDim=32,8
extern "C" __global__ void transpose_naive_32x32(const float* in, float* out) {
    __shared__ float tile[TILE][TILE];
    int x = blockIdx.x * TILE + threadIdx.x;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        tile[threadIdx.y + j][threadIdx.x] = in[(blockIdx.x * TILE + threadIdx.y + j) * TILE + threadIdx.x];
    __syncthreads();
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        out[(blockIdx.x * TILE + threadIdx.y + j) * TILE + threadIdx.x] = tile[threadIdx.x][threadIdx.y + j];
    (void)x;
}

// Load 1-way: the same transpose with each row padded by one float ([32][33]).
// gpuadvisor: blockDim=32,8
extern "C" __global__ void transpose_padded_32x33(const float* in, float* out) {
    __shared__ float tile[TILE][TILE + 1];
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        tile[threadIdx.y + j][threadIdx.x] = in[(blockIdx.x * TILE + threadIdx.y + j) * TILE + threadIdx.x];
    __syncthreads();
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        out[(blockIdx.x * TILE + threadIdx.y + j) * TILE + threadIdx.x] = tile[threadIdx.x][threadIdx.y + j];
}

// Load 1-way: the unpadded tile with the column XOR-swizzled by the row on both the store and the load.
// gpuadvisor: blockDim=32,8
extern "C" __global__ void transpose_swizzled_32x32(const float* in, float* out) {
    __shared__ float tile[TILE][TILE];
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        int row = threadIdx.y + j;
        tile[row][threadIdx.x ^ row] = in[(blockIdx.x * TILE + row) * TILE + threadIdx.x];
    }
    __syncthreads();
    for (int j = 0; j < TILE; j += BLOCK_ROWS) {
        int col = threadIdx.y + j;
        out[(blockIdx.x * TILE + col) * TILE + threadIdx.x] = tile[threadIdx.x][col ^ threadIdx.x];
    }
}

// Load 1-way: every lane reads the same word (a broadcast).
// gpuadvisor: blockDim=256
extern "C" __global__ void broadcast_float(const float* in, float* out) {
    __shared__ float s[THREADS];
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = in[gid];
    __syncthreads();
    out[gid] = s[0] * 2.0f;
}

// Load 2-way: float stride 2 (lanes l and l + 16 share a bank).
// gpuadvisor: blockDim=256
extern "C" __global__ void stride2_float(const float* in, float* out) {
    __shared__ float s[2 * THREADS];
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = in[gid];
    s[tid + THREADS] = in[gid] + 1.0f;
    __syncthreads();
    out[gid] = s[2 * tid];
}

// Load 4-way: float stride 4; the fill is a block-strided loop.
// gpuadvisor: blockDim=256
extern "C" __global__ void stride4_float(const float* in, float* out) {
    __shared__ float s[4 * THREADS];
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    for (int i = tid; i < 4 * THREADS; i += blockDim.x)
        s[i] = in[blockIdx.x * 4 * THREADS + i];
    __syncthreads();
    out[gid] = s[4 * tid];
}

// Load 32-way: float stride 32, every lane in bank 0.
// gpuadvisor: blockDim=256
extern "C" __global__ void stride32_float(const float* in, float* out) {
    __shared__ float s[32 * THREADS];
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    for (int i = tid; i < 32 * THREADS; i += blockDim.x)
        s[i] = in[(blockIdx.x * 1024 + i) & 0xFFFFF];
    __syncthreads();
    out[gid] = s[32 * tid];
}

// Load 1-way (2 wavefronts, the ideal for 8-byte accesses): contiguous doubles.
// gpuadvisor: blockDim=256
extern "C" __global__ void double_contiguous(const float* in, float* out) {
    __shared__ double s[THREADS];
    const double* din = reinterpret_cast<const double*>(in);
    double* dout = reinterpret_cast<double*>(out);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = din[gid];
    __syncthreads();
    dout[gid] = s[(tid + 1) % THREADS];
}

// Load 2-way: doubles at stride 2 (4 wavefronts against the ideal 2).
// gpuadvisor: blockDim=256
extern "C" __global__ void double_stride2(const float* in, float* out) {
    __shared__ double s[2 * THREADS];
    const double* din = reinterpret_cast<const double*>(in);
    double* dout = reinterpret_cast<double*>(out);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = din[gid];
    s[tid + THREADS] = din[gid] + 1.0;
    __syncthreads();
    dout[gid] = s[2 * tid];
}

// Load 1-way: contiguous 2-byte elements (two lanes per word).
// gpuadvisor: blockDim=256
extern "C" __global__ void u16_contiguous(const float* in, float* out) {
    __shared__ unsigned short s[THREADS];
    const unsigned short* hin = reinterpret_cast<const unsigned short*>(in);
    unsigned short* hout = reinterpret_cast<unsigned short*>(out);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = hin[gid];
    __syncthreads();
    hout[gid] = s[(tid + 1) % THREADS];
}

// Load 16-way: 2-byte elements at stride 32 (64 bytes): lanes fall in banks 0 and 16 only.
// gpuadvisor: blockDim=256
extern "C" __global__ void u16_stride32(const float* in, float* out) {
    __shared__ unsigned short s[32 * THREADS];
    const unsigned short* hin = reinterpret_cast<const unsigned short*>(in);
    unsigned short* hout = reinterpret_cast<unsigned short*>(out);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    for (int i = tid; i < 32 * THREADS; i += blockDim.x)
        s[i] = hin[(blockIdx.x * 1024 + i) & 0xFFFFF];
    __syncthreads();
    hout[gid] = s[32 * tid];
}

// Load 1-way (4 wavefronts, the ideal for 16-byte accesses): contiguous float4.
// gpuadvisor: blockDim=128
extern "C" __global__ void float4_contiguous(const float* in, float* out) {
    __shared__ float4 s[128];
    const float4* vin = reinterpret_cast<const float4*>(in);
    float4* vout = reinterpret_cast<float4*>(out);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = vin[gid];
    __syncthreads();
    vout[gid] = s[(tid + 1) % 128];
}

// Load 2-way: float4 at stride 2 (8 wavefronts against the ideal 4).
// gpuadvisor: blockDim=128
extern "C" __global__ void float4_stride2(const float* in, float* out) {
    __shared__ float4 s[256];
    const float4* vin = reinterpret_cast<const float4*>(in);
    float4* vout = reinterpret_cast<float4*>(out);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = vin[gid];
    s[tid + 128] = vin[gid + 64 * 128];
    __syncthreads();
    vout[gid] = s[2 * tid];
}

// Loads and stores 1-way: tree reduction with sequential addressing (sdata[tid + s]).
// gpuadvisor: blockDim=256
extern "C" __global__ void reduce_sequential(const float* in, float* out) {
    __shared__ float sdata[THREADS];
    unsigned int tid = threadIdx.x;
    sdata[tid] = in[blockIdx.x * blockDim.x + tid];
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s)
            sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0)
        out[blockIdx.x] = sdata[0];
}

// Loads and stores conflicting: interleaved addressing (index = 2 * s * tid), 2-way at s = 1 up to 8-way
// once a single warp is left; about 3.8 wavefronts per load instruction over the whole loop.
// gpuadvisor: blockDim=256
extern "C" __global__ void reduce_interleaved(const float* in, float* out) {
    __shared__ float sdata[THREADS];
    unsigned int tid = threadIdx.x;
    sdata[tid] = in[blockIdx.x * blockDim.x + tid];
    __syncthreads();
    for (unsigned int s = 1; s < blockDim.x; s *= 2) {
        unsigned int index = 2 * s * tid;
        if (index < blockDim.x)
            sdata[index] += sdata[index + s];
        __syncthreads();
    }
    if (tid == 0)
        out[blockIdx.x] = sdata[0];
}

// Load 2-way: dynamic shared memory (extern, 512 floats = 2048 bytes) read at stride 2.
// gpuadvisor: blockDim=256 dynamicShared=2048
extern "C" __global__ void dynamic_extern_stride2(const float* in, float* out) {
    extern __shared__ float dyn[];
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    dyn[tid] = in[gid];
    dyn[tid + THREADS] = in[gid] * 0.5f;
    __syncthreads();
    out[gid] = dyn[2 * tid];
}

// Load 8-way: a 16x16 tile read by column with a 16x16 block (a warp covers two rows of threads).
// gpuadvisor: blockDim=16,16
extern "C" __global__ void tile16_column(const float* in, float* out) {
    __shared__ float t[16][16];
    int gid = blockIdx.x * 256 + threadIdx.y * 16 + threadIdx.x;
    t[threadIdx.y][threadIdx.x] = in[gid];
    __syncthreads();
    out[gid] = t[threadIdx.x][threadIdx.y];
}

// Load unknown to the scan: the index is read from global memory (data-dependent); the scan must say
// unknown, whatever the device measures for the driver's random input.
// gpuadvisor: blockDim=256
extern "C" __global__ void data_dependent_index(const float* in, float* out) {
    __shared__ float s[THREADS];
    const int* idx = reinterpret_cast<const int*>(in);
    int tid = threadIdx.x;
    int gid = blockIdx.x * blockDim.x + tid;
    s[tid] = in[gid];
    __syncthreads();
    out[gid] = s[idx[gid] & (THREADS - 1)];
}
