// --offload on the CUDA backend (engine/offload.h): one non-blocking side stream for the copies,
// one event per layer and direction, pinned host slots reused from step to step.
#include "engine/offload.h"

#include <stdexcept>
#include <string>

#include "engine/cuda_launch.h"

namespace ul {

struct BlockOffload::Impl {
  cudaStream_t side = nullptr;
  cudaEvent_t main_mark = nullptr;            // "the main stream got this far": the side stream waits on it
  std::vector<cudaEvent_t> saved, fetched;    // per layer: its D2H copy done, its H2D copy done
  char* host = nullptr;                        // pinned: slot l holds y_l, l < layers - 2
  size_t host_cap = 0, slot = 0;

  // The side stream's next operation comes after everything the main stream has issued so far.
  void side_after_main() {
    UL_CUDA_CHECK(cudaEventRecord(main_mark, nullptr));
    UL_CUDA_CHECK(cudaStreamWaitEvent(side, main_mark, 0));
  }
  void grow_events(int layers) {
    while (int(saved.size()) < layers) {
      cudaEvent_t a = nullptr, b = nullptr;
      UL_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
      UL_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
      saved.push_back(a);
      fetched.push_back(b);
    }
  }
};

BlockOffload::BlockOffload() : impl_(new Impl) {
  // Non-blocking: the legacy default stream, where the kernels run, must not serialise with it.
  UL_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->side, cudaStreamNonBlocking));
  UL_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->main_mark, cudaEventDisableTiming));
}

BlockOffload::~BlockOffload() {
  Impl& m = *impl_;
  // Destructors must not throw: errors here (a dying context at exit) are ignored on purpose.
  cudaStreamSynchronize(m.side);
  for (cudaEvent_t e : m.saved) cudaEventDestroy(e);
  for (cudaEvent_t e : m.fetched) cudaEventDestroy(e);
  cudaEventDestroy(m.main_mark);
  cudaStreamDestroy(m.side);
  if (m.host) cudaFreeHost(m.host);
  delete impl_;
}

void BlockOffload::begin(Arena& arena, const Tensor& like, int layers) {
  Impl& m = *impl_;
  if (arena.device() != Device::cuda) throw std::runtime_error("--offload: the arena is not on the cuda device");
  // Copies of the previous micro-batch (or of a step that failed midway) have all landed: the
  // forward waited for the side stream before its first arena write (Transformer::forward).
  layers_ = layers;
  for (Tensor& b : buf_) b = arena.tensor(like.shape, like.dtype);
  m.slot = like.nbytes();
  const size_t need = offload_host_bytes(layers, m.slot);
  if (need > m.host_cap) {
    if (m.host) UL_CUDA_CHECK(cudaFreeHost(m.host));
    m.host = nullptr;
    m.host_cap = 0;
    const cudaError_t e = cudaMallocHost(&m.host, need);
    if (e != cudaSuccess)
      throw std::runtime_error("--offload: cudaMallocHost of " + std::to_string(need >> 20) +
                               " MiB of pinned host memory failed: " + cudaGetErrorString(e));
    m.host_cap = need;
  }
  m.grow_events(layers);
}

Tensor BlockOffload::output(int l) {
  Impl& m = *impl_;
  if (l >= 2) UL_CUDA_CHECK(cudaStreamWaitEvent(nullptr, m.saved[l - 2], 0));  // y_{l-2} is out
  return buf_[l % 2];
}

void BlockOffload::stored(int l) {
  Impl& m = *impl_;
  if (l >= layers_ - 2) return;  // never overwritten: stays on the device
  m.side_after_main();
  UL_CUDA_CHECK(cudaMemcpyAsync(m.host + size_t(l) * m.slot, buf_[l % 2].ptr, m.slot, cudaMemcpyDeviceToHost, m.side));
  UL_CUDA_CHECK(cudaEventRecord(m.saved[l], m.side));
}

void BlockOffload::before_backward(int l) {
  Impl& m = *impl_;
  if (l >= 2) {  // y_{l-2} (block l-1's input) back into buf[l % 2], whose y_l nobody reads any more
    m.side_after_main();
    UL_CUDA_CHECK(cudaMemcpyAsync(buf_[l % 2].ptr, m.host + size_t(l - 2) * m.slot, m.slot, cudaMemcpyHostToDevice,
                                  m.side));
    UL_CUDA_CHECK(cudaEventRecord(m.fetched[l - 2], m.side));
  }
  if (l >= 1 && l - 1 < layers_ - 2) UL_CUDA_CHECK(cudaStreamWaitEvent(nullptr, m.fetched[l - 1], 0));
}

void BlockOffload::wait_side() { UL_CUDA_CHECK(cudaStreamSynchronize(impl_->side)); }

}  // namespace ul
