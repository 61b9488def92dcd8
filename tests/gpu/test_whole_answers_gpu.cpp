// An eval's whole answers on a GPU, fp32 (tests/whole_answers_cases.h).
#include "whole_answers_cases.h"

TEST_CASE("an eval's whole answers on the GPU: right only with every target right, across sp and dp", "[gpu]") {
  whole_answers::check_whole_answers(" --device cuda --precision fp32");
}
