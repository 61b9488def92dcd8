// Token + learned position embedding.  idx, pos: (N) int32,  wte: (V, C),  wpe: (maxT, C) or none
//   y[n] = wte[idx[n]] + wpe[pos[n]]
// Positions are explicit so that a sequence-parallel slice uses global positions and a packed
// document can restart them. Backward: dwte[idx[n]] += dy[n], dwpe[pos[n]] += dy[n]; the CPU
// backward is deterministic (rows are summed in order of n for each vocabulary row).
// Token ids are checked against V: an id out of range is an error naming the id and V.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace ul {
namespace cpu {
template <class T>
void embedding_forward(T* y, const int32_t* idx, const int32_t* pos, const T* wte, const T* wpe, int N, int C);
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dy, const int32_t* idx, const int32_t* pos, int N, int C);
}  // namespace cpu

// idx, pos: i32 (B, T);  wte: (V, C);  wpe: (maxT, C) or an undefined Tensor (Llama: no wpe)
// -> (B, T, C)
Tensor embedding(const Tensor& idx, const Tensor& pos, const Tensor& wte, const Tensor& wpe);

}  // namespace ul
