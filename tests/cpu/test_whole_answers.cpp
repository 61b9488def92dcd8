// An eval's whole answers on the CPU: tests/whole_answers_cases.h.
#include "whole_answers_cases.h"

TEST_CASE("an eval's whole answers: right only with every target right, also across sp slices and dp ranks",
          "[eval][sp]") {
  whole_answers::check_whole_answers("");
}
