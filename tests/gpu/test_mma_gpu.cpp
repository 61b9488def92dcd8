// The real mma.sync and ldmatrix instructions behind engine/mma.h against the PTX fragment layout:
// the cases of the emulated test (tests/emu/mma_cases.h), compiled by nvcc (tests/CMakeLists.txt
// makes this file CUDA) since its kernels are in the test itself.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/mma_cases.h"
