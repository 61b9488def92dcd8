// --offload in a build without the CUDA backend: there is no GPU memory to offload from. The
// options refuse --offload without --device cuda first; this is the backstop for library users.
#include "engine/offload.h"

#if !ULYSSES_HAVE_CUDA
#include <stdexcept>

namespace ul {

BlockOffload::BlockOffload() : impl_(nullptr) {
  throw std::runtime_error("--offload: this build has no CUDA backend (configure with -DULYSSES_CUDA=ON)");
}
BlockOffload::~BlockOffload() = default;
void BlockOffload::begin(Arena&, const Tensor&, int) {}
Tensor BlockOffload::output(int) { return {}; }
void BlockOffload::stored(int) {}
void BlockOffload::before_backward(int) {}
void BlockOffload::wait_side() {}

}  // namespace ul
#endif
