// An eval's whole answers on the emulated device, fp32 (tests/whole_answers_cases.h).
#include "whole_answers_cases.h"

TEST_CASE("an eval's whole answers on the device: right only with every target right, across sp and dp", "[emu]") {
  whole_answers::check_whole_answers(" --device cuda --precision fp32");
}
