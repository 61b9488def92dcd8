#include "engine/tensor.h"

#include <sstream>
#include <stdexcept>

namespace ul {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::f64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::f64: return "f64";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Shape::Shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > 4) throw std::runtime_error("tensor: at most 4 dimensions");
  for (int64_t v : dims) d[ndim++] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= d[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; i++)
    if (d[i] != o.d[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < ndim; i++) s << (i ? ", " : "") << d[i];
  s << ")";
  return s.str();
}

float* Tensor::f32() const {
  if (dtype != DType::f32) throw std::runtime_error("tensor: expected f32, got " + std::string(dtype_name(dtype)));
  return static_cast<float*>(ptr);
}

int32_t* Tensor::i32() const {
  if (dtype != DType::i32) throw std::runtime_error("tensor: expected i32, got " + std::string(dtype_name(dtype)));
  return static_cast<int32_t*>(ptr);
}

Tensor Tensor::view(Shape s) const {
  if (s.numel() != numel())
    throw std::runtime_error("tensor: cannot view " + shape.str() + " as " + s.str());
  Tensor t = *this;
  t.shape = s;
  return t;
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype)) + shape.str() + "@" + device_name(device);
}

void check_shape(const Tensor& t, Shape want, const char* what) {
  if (t.shape != want)
    throw std::runtime_error(std::string(what) + ": expected shape " + want.str() + ", got " + t.shape.str());
}

}  // namespace ul
