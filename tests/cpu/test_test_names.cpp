// Every TEST_CASE name must reach ctest whole (tests/CMakeLists.txt: catch_discover_tests makes each
// one a ctest test): a ';' splits it into two entries that each match no test (CMake's list
// separator), a backslash escapes what follows in the name Catch receives, a name starting with '-'
// reaches Catch as an option and one starting with '~' as an exclusion. Either way the case never runs as itself, and no other test would say so.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_cmd.h"

namespace fs = std::filesystem;

TEST_CASE("test case names hold no semicolon nor backslash and do not start with a dash or a tilde", "[tests]") {
  // The whole name: a long one is written as adjacent literals ("a ... " "b"), joined by the compiler.
  const std::regex test_case(R"re(TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+))re");
  const std::regex literal(R"re("((?:[^"\\]|\\.)*)")re");
  int names = 0;
  std::vector<std::string> bad;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(ul_test::source_path("tests"))) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (std::sregex_iterator it(s.begin(), s.end(), test_case), end; it != end; ++it) {
      const std::string literals = (*it)[1];
      std::string name;
      for (std::sregex_iterator l(literals.begin(), literals.end(), literal), none; l != none; ++l) name += (*l)[1];
      names++;
      // (a backslash: Catch reads it as an escape in the name ctest passes, which then matches nothing)
      if (name.find(';') != std::string::npos || name.find('\\') != std::string::npos ||
          (!name.empty() && (name[0] == '-' || name[0] == '~')))
        bad.push_back(e.path().filename().string() + ": " + name);
    }
  }
  INFO(bad.size() << " bad names, the first: " << (bad.empty() ? "" : bad[0]));
  CHECK(bad.empty());
  CHECK(names > 200);  // the scan found the suite
  // A name in two literals is read whole (only its first was checked).
  std::string joined;
  const std::string two = "TEST_CASE(\"a name in two, \"\n          \"with a semicolon; here\", \"[x]\")";
  std::smatch m;
  REQUIRE(std::regex_search(two, m, test_case));
  const std::string literals = m[1];
  for (std::sregex_iterator l(literals.begin(), literals.end(), literal), none; l != none; ++l) joined += (*l)[1];
  CHECK(joined == "a name in two, with a semicolon; here");
}
