#include "engine/float_env.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace ul {

namespace {
#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtzDaz = 0x8000u | 0x0040u;  // MXCSR: flush to zero (bit 15), denormals are zero (bit 6)
#elif defined(__aarch64__)
constexpr uint64_t kFz = uint64_t(1) << 24;  // FPCR.FZ: flush subnormal inputs and results to zero
#endif
}  // namespace

void flush_subnormals() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(_mm_getcsr() | kFtzDaz);
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | kFz));
#endif
}

bool flushes_subnormals() {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & kFtzDaz) == kFtzDaz;
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & kFz) != 0;
#else
  return false;
#endif
}

}  // namespace ul
