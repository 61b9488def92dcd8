// The Ulysses pack/unpack permutes on a real GPU, compared with the CPU backend: the kernel cases
// of the emulated test (tests/emu/ulysses_cuda_cases.h; its op cases need the emulator's
// host-addressable device memory for the local communicator, so they are left out here).
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/ulysses_cuda_cases.h"
