#include "engine/params.h"

#include <stdexcept>

#include "engine/device.h"

namespace ul {

Params::~Params() {
  if (data_) device_free(dev_, data_);
  if (grad_) device_free(dev_, grad_);
}

void Params::add(const std::string& name, Shape shape, bool stacked, bool decay) {
  if (data_) throw std::runtime_error("params: add after allocate");
  ParamSpec s{name, shape, stacked, decay, numel_};
  numel_ += size_t(shape.numel());
  specs_.push_back(s);
}

void Params::allocate(Device dev, Tape& tape) {
  dev_ = dev;
  size_t bytes = numel_ * sizeof(float);
  data_ = static_cast<float*>(device_alloc(dev, bytes));
  grad_ = static_cast<float*>(device_alloc(dev, bytes));
  device_zero(dev, data_, bytes);
  device_zero(dev, grad_, bytes);
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
      t.ptr = data_ + s.offset + l * each;
      t.shape = one;
      t.device = dev;
      t.gid = tape.param_slot(grad_ + s.offset + l * each);
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

void Params::zero_grad() { device_zero(dev_, grad_, numel_ * sizeof(float)); }

}  // namespace ul
