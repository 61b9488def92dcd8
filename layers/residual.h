// Residual add.  y = a + b (same shape).  Backward: da += dy, db += dy.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ul {
namespace cpu {
template <class T> void residual_forward(T* y, const T* a, const T* b, int64_t n);
template <class T> void residual_backward(T* da, T* db, const T* dy, int64_t n);
}  // namespace cpu

Tensor add(const Tensor& a, const Tensor& b);

}  // namespace ul
