// The floating-point environment every thread of a run computes in.
#pragma once

namespace ul {

// Flush subnormal floats to zero, as results (FTZ) and as inputs (DAZ), in the calling thread and
// every thread it starts later (threads copy their creator's control register: OpenMP's workers,
// --comm local's ranks). Called first in main, before any thread exists. Why: softmax
// probabilities and their gradients fall below 1.2e-38 once a model is confident (a logit gap
// past ~87), and each such value costs the CPU a microcode assist, 50-100x an ordinary multiply:
// the classifier's and attention's backward ran 5-60x slower in that regime. What it changes:
// values that small become 0 (nothing a training step can see). x86-64 (MXCSR) and AArch64 (FPCR);
// elsewhere nothing.
void flush_subnormals();

// Whether the calling thread flushes them (a test's check that the setting reached it).
bool flushes_subnormals();

}  // namespace ul
