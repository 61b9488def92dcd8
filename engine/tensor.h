// Tensor: a typed, shaped view of memory that some allocator owns (the parameter buffer or the
// per-step arena). Row-major and contiguous, at most 4 dims: a reshape is free, a transpose is an op.
// `gid` names the tensor's gradient slot on the autograd tape (-1: no gradient flows here).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace ul {

enum class DType : uint8_t { f32, bf16, i32, f64 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* device_name(Device d);

struct Shape {
  int ndim = 0;
  std::array<int64_t, 4> d{};
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int64_t operator[](int i) const { return d[i < 0 ? i + ndim : i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;
};

struct Tensor {
  void* ptr = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int gid = -1;

  int64_t numel() const { return shape.numel(); }
  int64_t size(int i) const { return shape[i]; }
  int ndim() const { return shape.ndim; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool defined() const { return ptr != nullptr; }
  bool requires_grad() const { return gid >= 0; }

  template <class T> T* as() const { return static_cast<T*>(ptr); }
  float* f32() const;      // checks dtype == f32
  int32_t* i32() const;    // checks dtype == i32

  // Same memory and same gradient slot, another shape with the same element count.
  Tensor view(Shape s) const;
  std::string str() const;
};

// Throws std::runtime_error with `what` and the shapes when the condition fails.
void check_shape(const Tensor& t, Shape want, const char* what);

}  // namespace ul
