// --check-state: one forward and backward of an llm.c debug state (B, T, inputs, targets, logits,
// loss, every gradient) on a model loaded from the matching llm.c checkpoint, under any dp × sp
// layout: the state's batch is split across dp, each sequence across sp; each rank compares its
// slice of the logits, the loss and the gradients are summed over the world, then compared.
// Prints `NAME max_abs_diff X max_abs_ref Y` per tensor and `check-state: PASS|FAIL`.
#pragma once
#include "engine/options.h"

namespace ul {
class Comm;
int check_state_rank(const Options& o, Comm& world);
}  // namespace ul
