#include "engine/params.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "engine/device.h"
#include "engine/file_io.h"

namespace ul {

namespace {

// f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN).
uint16_t bf16_bits_nearest(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace

Params::~Params() {
  if (data_) device_free(dev_, data_);
  if (master_) device_free(dev_, master_);
  if (grad_) device_free(dev_, grad_);
}

float* Params::data() const {
  if (dtype_ != DType::f32)
    throw std::runtime_error(std::string("params: data() is the f32 view, but the parameters are ") + dtype_name(dtype_) +
                             " (use raw(), or master() for the f32 values)");
  return static_cast<float*>(data_);
}

float* Params::master() const {
  if (!has_masters())
    throw std::logic_error("params: this bf16 model keeps no f32 master weights (a --steps 0 run that exports, samples "
                           "and probes nothing)");
  if (masters_sharded())
    throw std::runtime_error("params: this process keeps the f32 master weights of elements [" + std::to_string(mlo_) +
                             ", " + std::to_string(mhi_) + ") only (--zero 1), not all " + std::to_string(numel_));
  return dtype_ == DType::f32 ? static_cast<float*>(data_) : master_;
}

float* Params::master_at(size_t i) const {
  if (!has_masters() || i < mlo_ || i > mhi_)
    throw std::runtime_error("params: element " + std::to_string(i) + " is outside the master weights kept here [" +
                             std::to_string(mlo_) + ", " + std::to_string(mhi_) + ")");
  return dtype_ == DType::f32 ? static_cast<float*>(data_) + i : master_ + (i - mlo_);
}

void Params::load_host(const float* host) {
  if (mhi_ > mlo_) device_copy(master_at(mlo_), dev_, host + mlo_, Device::cpu, (mhi_ - mlo_) * sizeof(float));
  if (dtype_ != DType::bf16) return;
  std::vector<uint16_t> h(numel_);
  for (size_t i = 0; i < numel_; i++) h[i] = bf16_bits_nearest(host[i]);
  device_copy(data_, dev_, h.data(), Device::cpu, numel_ * sizeof(uint16_t));
}

std::vector<float> Params::to_host() const {
  std::vector<float> h(numel_);
  device_copy(h.data(), Device::cpu, master(), dev_, numel_ * sizeof(float));
  return h;
}

uint32_t Params::fingerprint() const {
  const size_t span = std::min<size_t>(64, numel_), spans = span ? std::min<size_t>(256, (numel_ + span - 1) / span) : 0;
  const size_t e = dtype_size(dtype_);
  std::vector<unsigned char> sample(spans * span * e);
  for (size_t i = 0; i < spans; i++) {
    // Evenly spread from the first element to the last (the first span at 0, the last ending at numel).
    const size_t at = spans > 1 ? (numel_ - span) * i / (spans - 1) : 0;
    device_copy(sample.data() + i * span * e, Device::cpu, static_cast<const unsigned char*>(data_) + at * e, dev_,
                span * e);
  }
  return crc32(0, sample.data(), sample.size());
}

void Params::add(const std::string& name, Shape shape, bool stacked, bool decay) {
  if (data_) throw std::runtime_error("params: add after allocate");
  ParamSpec s{name, shape, stacked, decay, numel_};
  numel_ += size_t(shape.numel());
  specs_.push_back(s);
}

void Params::allocate(Device dev, Tape& tape, DType dtype, MasterRange masters, bool grads) {
  if (data_) throw std::runtime_error("params: allocated twice");
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw std::runtime_error(std::string("params: parameters are f32 or bf16, not ") + dtype_name(dtype));
  dev_ = dev;
  dtype_ = dtype;
  const size_t bytes = numel_ * sizeof(float), pbytes = numel_ * dtype_size(dtype);
  data_ = device_alloc(dev, pbytes);
  device_zero(dev, data_, pbytes);
  if (grads) {
    grad_ = static_cast<float*>(device_alloc(dev, bytes));
    device_zero(dev, grad_, bytes);
  }
  mlo_ = 0, mhi_ = numel_;
  if (dtype == DType::bf16) {
    mhi_ = std::min(masters.hi, numel_), mlo_ = std::min(masters.lo, mhi_);
    const size_t mbytes = (mhi_ - mlo_) * sizeof(float);
    if (mbytes) {
      master_ = static_cast<float*>(device_alloc(dev, mbytes));
      device_zero(dev, master_, mbytes);
    }
  }
  parts_.clear();
  for (const ParamSpec& s : specs_) {
    std::vector<Tensor> parts;
    int n = s.stacked ? int(s.shape[0]) : 1;
    Shape one = s.shape;
    if (s.stacked) {  // drop the layer dim
      one.ndim = s.shape.ndim - 1;
      for (int i = 0; i < one.ndim; i++) one.d[i] = s.shape.d[i + 1];
      one.d[one.ndim] = 0;
    }
    size_t each = size_t(one.numel());
    for (int l = 0; l < n; l++) {
      Tensor t;
      t.ptr = static_cast<char*>(data_) + (s.offset + l * each) * dtype_size(dtype);
      t.shape = one;
      t.dtype = dtype;
      t.device = dev;
      t.gid = grads ? tape.param_slot(grad_ + s.offset + l * each) : -1;
      parts.push_back(t);
    }
    parts_.push_back(parts);
  }
}

const ParamSpec& Params::spec(const std::string& name) const {
  for (const ParamSpec& s : specs_)
    if (s.name == name) return s;
  throw std::runtime_error("params: no parameter named '" + name + "'");
}

const Tensor& Params::get(const std::string& name, int l) const {
  for (size_t i = 0; i < specs_.size(); i++) {
    if (specs_[i].name != name) continue;
    if (specs_[i].stacked != (l >= 0) || (l >= 0 && size_t(l) >= parts_[i].size()))
      throw std::runtime_error("params: bad layer index for '" + name + "'");
    return parts_[i][l >= 0 ? l : 0];
  }
  throw std::runtime_error("params: no parameter named '" + name + "'");
}

void Params::zero_grad() {
  if (!grad_) throw std::runtime_error("params: allocated without gradients (a model only evaluated)");
  device_zero(dev_, grad_, numel_ * sizeof(float));
}

}  // namespace ul
