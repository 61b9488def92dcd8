// A kernel's fault on the GPU, through tests/gpu/fault_probe.cu (a process of its own: the fault
// leaves its CUDA context unusable). Without CUDA_LAUNCH_BLOCKING the fault is found by a later
// call, which must not blame itself but say how to find the kernel; with it, ul::launch reports
// the fault as its own kernel's. Either way the error reaches the user: the device buffer freed as
// the stack unwinds (that free fails too) does not end the program first.
#include <catch2/catch.hpp>

#include <string>

#include "run_cmd.h"

TEST_CASE("a kernel's fault found later says how to find the kernel, and the error reaches the user", "[gpu]") {
  const ul_test::CmdResult r = ul_test::run_cmd(std::string(ULYSSES_FAULT_PROBE_BIN) + " later");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("caught: ") != std::string::npos);
  CHECK(r.out.find("a kernel launched before this point faulted: rerun with CUDA_LAUNCH_BLOCKING=1") !=
        std::string::npos);
  CHECK(r.out.find("terminate called") == std::string::npos);
}

TEST_CASE("under CUDA_LAUNCH_BLOCKING=1 a kernel's fault is reported as that kernel's", "[gpu]") {
  const ul_test::CmdResult r = ul_test::run_cmd(std::string(ULYSSES_FAULT_PROBE_BIN) + " blocking");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("caught: kernel 'fault' (grid 1x1x1, block 32x1x1, 0 bytes shared) faulted: ") != std::string::npos);
  CHECK(r.out.find("after_the_fault") == std::string::npos);
  CHECK(r.out.find("terminate called") == std::string::npos);
}
