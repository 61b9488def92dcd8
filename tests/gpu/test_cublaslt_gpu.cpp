// The cuBLASLt wrapper ul::cuda::gemm on a real GPU against float64 loops, for every type,
// transpose and epilogue combination the layers use: the cases of tests/emu/gemm_cases.h (which
// the emulated build runs against the Eigen twin), built with -DULYSSES_CUDA=ON.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/gemm_cases.h"
