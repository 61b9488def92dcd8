// All parameters of a model in ONE contiguous buffer, their gradients in a twin buffer.
// One all-reduce covers every gradient, one file write every weight, one shard map ZeRO.
// A parameter may be "stacked" over layers (llm.c's layout: e.g. qkvw is (L, 3C, C) in the
// buffer); each layer's slice is then its own tensor with its own gradient slot on the tape.
#pragma once
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/tensor.h"

namespace ul {

struct ParamSpec {
  std::string name;
  Shape shape;       // the full shape in the buffer, e.g. (L, 3C, C)
  bool stacked;      // first dim is the layer index
  bool decay;        // AdamW weight decay applies (matrices; not biases, norms)
  size_t offset = 0; // element offset in the buffer
};

class Params {
 public:
  Params() = default;
  ~Params();
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;

  void add(const std::string& name, Shape shape, bool stacked, bool decay);
  // Allocates both buffers (zeroed) on `dev` and gives each tensor a gradient slot on `tape`.
  void allocate(Device dev, Tape& tape);

  // The tensor of `name` (layer `l` of a stacked parameter).
  const Tensor& get(const std::string& name, int l = -1) const;
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(const std::string& name) const;

  float* data() const { return data_; }
  float* grad() const { return grad_; }
  size_t numel() const { return numel_; }
  Device device() const { return dev_; }
  void zero_grad();

 private:
  std::vector<ParamSpec> specs_;
  std::vector<std::vector<Tensor>> parts_;  // per spec: one tensor, or one per layer
  float* data_ = nullptr;
  float* grad_ = nullptr;
  size_t numel_ = 0;
  Device dev_ = Device::cpu;
};

}  // namespace ul
