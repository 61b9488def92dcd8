// All parameters of a model in ONE contiguous buffer, their gradients in a twin buffer.
// One all-reduce covers every gradient, one file write every weight, one shard map ZeRO.
// A parameter may be "stacked" over layers (llm.c's layout: e.g. qkvw is (L, 3C, C) in the
// buffer); each layer's slice is then its own tensor with its own gradient slot on the tape.
#pragma once
#include <cstdint>
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

// The elements [lo, hi) of the buffer whose f32 master copy this process keeps, for bf16
// parameters: ZeRO-1 shards the master weights with the AdamW state, so a rank holds 4 bytes per
// parameter of its shard, not of the model. The default: all of them; none() for a bf16 model only
// evaluated (its weights are all it reads).
struct MasterRange {
  size_t lo = 0, hi = SIZE_MAX;
  static MasterRange none() { return {0, 0}; }
};

class Params {
 public:
  Params() = default;
  ~Params();
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;

  void add(const std::string& name, Shape shape, bool stacked, bool decay);
  // Allocates the buffers (zeroed) on `dev`, the parameters in `dtype` (f32 or bf16), and gives
  // each tensor a gradient slot on `tape`. bf16: the master copy covers `masters` only. grads false
  // (a model only evaluated, --steps 0): no gradient buffer, no slots.
  void allocate(Device dev, Tape& tape, DType dtype = DType::f32, MasterRange masters = {}, bool grads = true);

  // The tensor of `name` (layer `l` of a stacked parameter).
  const Tensor& get(const std::string& name, int l = -1) const;
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(const std::string& name) const;

  DType dtype() const { return dtype_; }
  void* raw() const { return data_; }     // the parameter buffer, numel() elements of dtype()
  float* data() const;                    // the same as f32; throws for a bf16 model
  float* master() const;                  // the f32 values: data() for f32, the master copy for bf16
                                          // (throws when this process keeps only a shard of it)
  // The master copy's elements [master_lo(), master_hi()): all for f32 or an unsharded bf16 model.
  size_t master_lo() const { return mlo_; }
  size_t master_hi() const { return mhi_; }
  bool masters_sharded() const { return mhi_ - mlo_ != numel_; }
  bool has_masters() const { return mhi_ > mlo_ || numel_ == 0; }  // false: a bf16 model without them
  // Element i's f32 value, for master_lo() <= i <= master_hi() (throws otherwise).
  float* master_at(size_t i) const;
  float* grad() const { return grad_; }   // always f32; nullptr when allocated without gradients
  // numel() host f32 values -> the masters this process keeps (and, bf16, the whole buffer rounded
  // to nearest even), or back (throws when the masters are sharded: Trainer::host_params gathers).
  void load_host(const float* host);
  std::vector<float> to_host() const;
  // A CRC-32 of a sample of the weights as the forward reads them (dtype()'s bytes: 256 spans of 64
  // elements spread over the buffer, 64 KiB from the device at most): equal on ranks that hold the
  // same weights, different for weights of another checkpoint or seed (they differ everywhere),
  // cheap at any size. Not a checksum of every byte: the files' own CRCs are that.
  uint32_t fingerprint() const;
  size_t numel() const { return numel_; }
  Device device() const { return dev_; }
  void zero_grad();

 private:
  std::vector<ParamSpec> specs_;
  std::vector<std::vector<Tensor>> parts_;  // per spec: one tensor, or one per layer
  void* data_ = nullptr;
  float* master_ = nullptr;  // bf16 only: elements [mlo_, mhi_)
  size_t mlo_ = 0, mhi_ = 0;
  float* grad_ = nullptr;
  DType dtype_ = DType::f32;
  size_t numel_ = 0;
  Device dev_ = Device::cpu;
};

}  // namespace ul
