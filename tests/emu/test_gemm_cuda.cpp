// ul::cuda::gemm's emulated twin (Eigen on the emulated device memory) against float64 loops.
// The same cases run on a GPU against cuBLASLt (tests/gpu/test_cublaslt_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/gemm_cases.h"
