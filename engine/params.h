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
  // Allocates the buffers (zeroed) on `dev`, the parameters in `dtype` (f32 or bf16), and gives
  // each tensor a gradient slot on `tape`.
  void allocate(Device dev, Tape& tape, DType dtype = DType::f32);

  // The tensor of `name` (layer `l` of a stacked parameter).
  const Tensor& get(const std::string& name, int l = -1) const;
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(const std::string& name) const;

  DType dtype() const { return dtype_; }
  void* raw() const { return data_; }     // the parameter buffer, numel() elements of dtype()
  float* data() const;                    // the same as f32; throws for a bf16 model
  float* master() const;                  // the f32 values: data() for f32, the master copy for bf16
  float* grad() const { return grad_; }   // always f32
  // numel() host f32 values -> master() (and, bf16, the buffer rounded to nearest even), or back.
  void load_host(const float* host);
  std::vector<float> to_host() const;
  size_t numel() const { return numel_; }
  Device device() const { return dev_; }
  void zero_grad();

 private:
  std::vector<ParamSpec> specs_;
  std::vector<std::vector<Tensor>> parts_;  // per spec: one tensor, or one per layer
  void* data_ = nullptr;
  float* master_ = nullptr;  // bf16 only
  float* grad_ = nullptr;
  DType dtype_ = DType::f32;
  size_t numel_ = 0;
  Device dev_ = Device::cpu;
};

}  // namespace ul
