// --offload (CUDA, with --recompute): the block inputs that recompute keeps go to pinned host
// memory during the forward and come back, one block ahead, during the backward, on a side stream
// so the copies overlap the compute of the neighbouring blocks.
//
// Device memory: the block outputs of a recorded forward rotate through TWO buffers of (B, Tl, C)
// instead of one per layer. Block l writes buffer l % 2; block l+1 reads it; block l+2 overwrites
// it, so y_l is copied out (device -> host) while block l+1 runs, and block l+2 waits for that copy.
// The last two outputs are never overwritten and stay on the device. In backward, block l's replay
// needs y_{l-1}: the node of block l+1 has started fetching it back into the very buffer it left
// (so the tape's tensors still point at the right memory), and block l waits for that fetch.
//
//   forward  block l:  wait D2H(y_{l-2}) | compute into buf[l%2] | D2H(y_l) on the side stream
//   backward block l:  H2D(y_{l-2} -> buf[l%2]) on the side stream | wait H2D(y_{l-1}) | replay l
//
// Every hand-over between the two streams is an event; the emulator (engine/cuda_emu) defers the
// side stream's copies until an event makes them observable, so a missing wait fails its tests.
#pragma once
#include <cstddef>
#include <vector>

#include "engine/arena.h"
#include "engine/tensor.h"

namespace ul {

class BlockOffload {
 public:
  BlockOffload();   // the side stream; throws without a CUDA backend
  ~BlockOffload();
  BlockOffload(const BlockOffload&) = delete;
  BlockOffload& operator=(const BlockOffload&) = delete;

  // A recorded forward starts: the two rotating buffers shaped like `like` come from the arena
  // (they live for the step), and the host holds room for `layers` - 2 outputs.
  void begin(Arena& arena, const Tensor& like, int layers);
  Tensor output(int l);          // where block l writes its output (once the buffer is free)
  void stored(int l);            // block l's output is complete: copy it out if it will be overwritten
  void before_backward(int l);   // block l's backward is next: fetch block l-1's input, await block l's
  void wait_side();              // every copy queued on the side stream has landed

 private:
  struct Impl;
  Impl* impl_;
  Tensor buf_[2];
  int layers_ = 0;
};

// Pinned host bytes --offload holds for one rank: the outputs of every block but the last two.
inline size_t offload_host_bytes(int layers, size_t block_output_bytes) {
  return layers > 2 ? size_t(layers - 2) * block_output_bytes : 0;
}

}  // namespace ul
