// The Ulysses pack/unpack permutes (and, emulated, the all-to-all ops on Device::cuda) on CUDA, run
// by the SIMT emulator and compared with the CPU backend. The cases are shared with the real-GPU
// test (tests/gpu/test_ulysses_gpu.cpp).
#define UL_CUDA_TEST_TAG "[emu]"
#include "emu/ulysses_cuda_cases.h"
