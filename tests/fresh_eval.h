// The eval of a freshly initialised model, as `train` would run it, on `ranks` local ranks (--ranks
// is set from `ranks`); rank 0's result.
#pragma once
#include <string>

#include "engine/trainer.h"
#include "options_from.h"
#include "parallel/comm_local.h"

namespace ul_test {

inline ul::EvalResult fresh_eval(const std::string& args, int ranks = 1) {
  const ul::Options o = options(args + " --ranks " + std::to_string(ranks));
  ul::EvalResult r;
  ul::run_local(ranks, [&](ul::Comm& world) {
    ul::Trainer tr(o, world);
    const ul::EvalResult e = tr.evaluate();
    if (world.rank() == 0) r = e;
  });
  return r;
}

}  // namespace ul_test
