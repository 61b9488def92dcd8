// The heartbeat's clock (engine/heartbeat.h): lines in a long stretch with no milestone, a phase's
// own status (bytes a save wrote), and silence outside a phase. Its output goes to a temporary file.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "engine/file_io.h"
#include "engine/heartbeat.h"

namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  std::fseek(f, 0, SEEK_END);
  return s;
}

// Polls (up to 10 s: a loaded machine delays the clock's thread) until `want` is in the output.
bool appears(std::FILE* f, const std::string& want) {
  for (int i = 0; i < 1000; i++) {
    if (contents(f).find(want) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("heartbeat clock: a stretch without milestones still prints, and nothing prints after the phase",
          "[heartbeat]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    ul::Heartbeat beat(0.2, f);
    ul::Heartbeat::Phase phase = beat.begin("step 1/1");
    beat.at("forward 1/2 blocks");  // at once: a period has not passed, no line
    CHECK(contents(f).empty());
    // The clock names the last milestone and its age.
    CHECK(appears(f, "  ...   step 1/1 | forward 1/2 blocks done ("));
    phase.end();
    const std::string at_end = contents(f);
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // three periods: the clock is quiet
    CHECK(contents(f) == at_end);
    beat.at("forward 2/2 blocks");  // a milestone outside any phase says nothing either
    CHECK(contents(f) == at_end);
    // A new phase with no milestone yet: its name and time only.
    ul::Heartbeat::Phase next = beat.begin("eval 1");
    CHECK(appears(f, "  ...   eval 1 | "));
    CHECK(contents(f).find("eval 1 | forward") == std::string::npos);
  }
  std::fclose(f);
}

TEST_CASE("heartbeat clock: a save's phase names the bytes written since it began", "[heartbeat]") {
  const auto dir = std::filesystem::temp_directory_path() / ("ul_heartbeat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    ul::AtomicFile before((dir / "before.bin").string());  // written before the phase: not counted
    std::vector<char> mib(size_t(1) << 20, 'x');
    before.write(mib.data(), mib.size());
    before.commit();
    ul::Heartbeat beat(0.1, f);
    ul::Heartbeat::Phase phase = beat.begin("save step_00000001", ul::Heartbeat::bytes_written_from_now());
    ul::AtomicFile file((dir / "model.bin").string());
    for (int i = 0; i < 3; i++) file.write(mib.data(), mib.size());
    CHECK(appears(f, "  ...   save step_00000001 | 3.0 MiB written | "));
    file.commit();
  }
  CHECK(contents(f).find("4.0 MiB") == std::string::npos);
  std::fclose(f);
  std::filesystem::remove_all(dir);
}

TEST_CASE("heartbeat clock: a load's phase names the bytes read since it began, a whole-file read's too", "[heartbeat]") {
  // (a --checkpoint's safetensors file is read whole, an llm.c file in pieces: both counted, so an
  // 8B model's load is not a minute of silence)
  const auto dir = std::filesystem::temp_directory_path() / ("ul_heartbeat_read_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.safetensors").string();
  {
    ul::AtomicFile out(path);
    std::vector<char> mib(size_t(3) << 20, 'x');
    out.write(mib.data(), mib.size());
    out.commit();
  }
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    ul::Heartbeat beat(0.1, f);
    ul::Heartbeat::Phase phase = beat.begin("load model.safetensors", ul::Heartbeat::bytes_read_from_now());
    CHECK(ul::read_whole_file(path).size() == size_t(3) << 20);
    CHECK(appears(f, "  ...   load model.safetensors | 3.0 MiB read | "));
  }
  std::fclose(f);
  std::filesystem::remove_all(dir);
}

TEST_CASE("heartbeat clock: a period of 0 starts no clock and prints nothing", "[heartbeat]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    ul::Heartbeat beat(0, f);
    ul::Heartbeat::Phase phase = beat.begin("step 1/1");
    beat.at("forward 1/2 blocks");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  CHECK(contents(f).empty());
  std::fclose(f);
}
