// Runs f, which must throw an exception whose message contains every one of `parts` (the file name,
// the problem, the value...): bad input is refused with a message that says what is wrong.
#pragma once
#include <catch2/catch.hpp>

#include <exception>
#include <string>
#include <vector>

namespace ul_test {

template <class F>
void require_error(F&& f, std::vector<std::string> parts) {
  try {
    f();
  } catch (const std::exception& e) {
    std::string msg = e.what();
    INFO("message: " << msg);
    for (auto& p : parts) CHECK(msg.find(p) != std::string::npos);
    return;
  }
  FAIL("no exception; expected one mentioning " << parts[0]);
}

}  // namespace ul_test
