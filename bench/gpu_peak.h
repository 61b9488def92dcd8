// The dense bf16 tensor-core peak (fp32 accumulate, no sparsity) of the GPU a benchmark runs on,
// the denominator of its MFU: from the device's name, for the data-centre GPUs whose figure NVIDIA
// publishes and this table holds; 0 for any other (a benchmark then asks for --peak-tflops rather
// than guess).
#pragma once
#include <string>

#include "engine/cuda_runtime.h"
#include "engine/cuda_launch.h"

struct GpuPeak {
  std::string name;
  double tflops;  // 0: not known
};

inline double dense_bf16_peak_tflops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("GB200")) return 2500;
  if (has("H100") || has("H200")) return has("PCIe") ? 756 : has("NVL") ? 835 : 989;  // SXM, GH200: 989
  if (has("B200")) return 2250;
  if (has("A100")) return 312;
  if (has("L40S")) return 362;
  return 0;
}

// The current device's name and peak; `given` (> 0: --peak-tflops) overrides the table.
inline GpuPeak gpu_peak(double given) {
  int d = 0;
  UL_CUDA_CHECK(cudaGetDevice(&d));
  cudaDeviceProp p;
  UL_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return {p.name, given > 0 ? given : dense_bf16_peak_tflops(p.name)};
}
