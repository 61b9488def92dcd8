// Kernels on buffers past 2^31 elements (tests/emu/large_cuda_cases.h), run by the SIMT emulator at
// 2^20 elements, or past 2^31 with ULYSSES_TEST_LARGE=1 (about 13 GB and minutes); the same cases
// run on a real GPU past 2^31 (tests/gpu/test_large_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/large_cuda_cases.h"
