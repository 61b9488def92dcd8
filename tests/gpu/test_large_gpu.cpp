// Kernels and a cuBLASLt GEMM on buffers past 2^31 elements on a real GPU: the cases of
// tests/emu/large_cuda_cases.h (about 13 GB of device memory; at 2^20, with a WARN, without it).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/large_cuda_cases.h"
