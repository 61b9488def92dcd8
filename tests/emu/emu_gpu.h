// The GPU the emulator pretends to be (ULYSSES_EMU_GPU) and the architectures its "build" has
// kernels for (ULYSSES_EMU_KERNEL_ARCHS), for a test's scope: engine/cuda_emu/gpu_models.h.
#pragma once
#include <cstdlib>

#include "launcher_env.h"

namespace ul_test {

struct EmuGpu : ClearEnv {
  // "" leaves a variable unset (an H100; kernels for every GPU).
  EmuGpu(const char* gpu, const char* archs) : ClearEnv({"ULYSSES_EMU_GPU", "ULYSSES_EMU_KERNEL_ARCHS"}) {
    if (*gpu) ::setenv("ULYSSES_EMU_GPU", gpu, 1);
    if (*archs) ::setenv("ULYSSES_EMU_KERNEL_ARCHS", archs, 1);
  }
};

}  // namespace ul_test
