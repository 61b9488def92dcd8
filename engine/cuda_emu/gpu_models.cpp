// The emulated GPU models and CUDA's kernel-image compatibility rule (gpu_models.h).
#include "engine/cuda_emu/gpu_models.h"

#include <cstdlib>
#include <stdexcept>

namespace ul_emu {
namespace {

constexpr size_t KiB = 1024, GiB = size_t(1) << 30;

// Published properties (shared memory: the CUDA programming guide's per-capability table).
const GpuModel kModels[] = {
    {"h100", "NVIDIA H100 80GB HBM3 (emulated)", 9, 0, 227 * KiB, 132, 80 * GiB},
    {"h200", "NVIDIA H200 (emulated)", 9, 0, 227 * KiB, 132, 139 * GiB},
    {"b200", "NVIDIA B200 (emulated)", 10, 0, 227 * KiB, 148, 178 * GiB},
    {"a100", "NVIDIA A100-SXM4-80GB (emulated)", 8, 0, 163 * KiB, 108, 80 * GiB},
    {"a10", "NVIDIA A10 (emulated)", 8, 6, 99 * KiB, 72, 22 * GiB},
    {"rtx3090", "NVIDIA GeForce RTX 3090 (emulated)", 8, 6, 99 * KiB, 82, 24 * GiB},
    {"l40s", "NVIDIA L40S (emulated)", 8, 9, 99 * KiB, 142, 44 * GiB},
    {"rtx4090", "NVIDIA GeForce RTX 4090 (emulated)", 8, 9, 99 * KiB, 128, 24 * GiB},
    {"rtx5090", "NVIDIA GeForce RTX 5090 (emulated)", 12, 0, 99 * KiB, 170, 32 * GiB},
    {"v100", "Tesla V100-SXM2-32GB (emulated)", 7, 0, 96 * KiB, 80, 32 * GiB},
    {"t4", "Tesla T4 (emulated)", 7, 5, 64 * KiB, 40, 15 * GiB},
};

}  // namespace

const GpuModel& emulated_gpu() {
  const char* v = std::getenv("ULYSSES_EMU_GPU");
  if (!v || !*v) return kModels[0];
  std::string known;
  for (const GpuModel& m : kModels) {
    if (m.key == std::string(v)) return m;
    known += std::string(known.empty() ? "" : ", ") + m.key;
  }
  throw std::runtime_error(std::string("ULYSSES_EMU_GPU=") + v + ": no such emulated GPU (one of " + known + ")");
}

std::string kernel_archs() {
  const char* v = std::getenv("ULYSSES_EMU_KERNEL_ARCHS");
  return v ? v : "";
}

bool has_kernel_image(const std::string& archs, int major, int minor) {
  if (archs.empty()) return true;
  const int cc = 10 * major + minor;
  size_t at = 0;
  while (at <= archs.size()) {
    const size_t end = std::min(archs.find_first_of(";,", at), archs.size());
    const std::string item = archs.substr(at, end - at);
    size_t digits = 0;
    while (digits < item.size() && item[digits] >= '0' && item[digits] <= '9') digits++;
    const char variant = digits < item.size() && (item[digits] == 'a' || item[digits] == 'f') ? item[digits] : 0;
    const std::string kind = item.substr(digits + (variant ? 1 : 0));
    if (digits == 0 || digits > 3 || (kind != "" && kind != "-real" && kind != "-virtual"))
      throw std::runtime_error("ULYSSES_EMU_KERNEL_ARCHS=" + archs + ": cannot read '" + item +
                               "' (a list of NN, NNa or NNf, each optionally -real or -virtual)");
    const int arch = std::stoi(item.substr(0, digits));
    const bool sass = kind != "-virtual", ptx = kind != "-real";
    const bool family = arch / 10 == major && arch % 10 <= minor;
    if (variant == 'a' && arch == cc) return true;  // SASS or PTX: this capability alone
    if (variant == 'f' && family) return true;
    if (!variant && sass && family) return true;
    if (!variant && ptx && arch <= cc) return true;
    at = end + 1;
  }
  return false;
}

}  // namespace ul_emu
