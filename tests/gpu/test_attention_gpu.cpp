// Attention's CUDA kernels (the bf16 ones on the tensor cores, inline PTX mma) and op on a real
// GPU, compared with the CPU backend: the same cases as the emulated test
// (tests/emu/attention_cuda_cases.h), built with -DULYSSES_CUDA=ON.
#define UL_CUDA_TEST_TAG "[gpu]"
#include "emu/attention_cuda_cases.h"
