// The Ulysses pack/unpack permutes and the all-to-all ops (ranks as threads, the local
// communicator staging device buffers through host memory) on a real GPU, compared with the CPU
// backend: the cases of the emulated test (tests/emu/ulysses_cuda_cases.h).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/ulysses_cuda_cases.h"
