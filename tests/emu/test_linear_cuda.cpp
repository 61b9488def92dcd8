// The linear layer's CUDA code (GEMMs through the emulated twin, the db reduction kernels) and op,
// run by the SIMT emulator and compared with the CPU backend. The cases are shared with the
// real-GPU test (tests/gpu/test_linear_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/linear_cuda_cases.h"
