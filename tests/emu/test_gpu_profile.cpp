// The per-op GPU profile on the SIMT emulator. The cases are shared with the real-GPU test
// (tests/gpu/test_gpu_profile_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/gpu_profile_cases.h"
