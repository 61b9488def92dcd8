#!/usr/bin/env bash
# One entry point that sets up what it needs on a fresh Debian 12 machine, builds, and runs.
#   tools/run.sh train [train flags...]   build (Release) and run train (no flags: the default job)
#   tools/run.sh test                     build and run every test ctest knows here
#   tools/run.sh build                    just build
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra configure flags), JOBS (default: nproc).
set -euo pipefail
caller=$PWD  # train runs here, so relative paths in its flags are the caller's
cd "$(dirname "$0")/.."

# The word first: a mistyped one (`tools/run.sh --steps 100`, train forgotten) is said at once, not
# after installing and building for minutes.
case "${1:-train}" in
  train|test|build) ;;
  *) echo "usage: tools/run.sh train|test|build [args] (got '$1'; train's flags follow the word train)" >&2; exit 2 ;;
esac

need_pkgs=()
command -v cmake >/dev/null || need_pkgs+=(cmake)
command -v g++ >/dev/null || need_pkgs+=(g++)
command -v make >/dev/null || need_pkgs+=(make)
[ -f /usr/include/eigen3/Eigen/Core ] || need_pkgs+=(libeigen3-dev)
[ -f /usr/include/catch2/catch.hpp ] || need_pkgs+=(catch2)
command -v mpicxx >/dev/null || need_pkgs+=(libopenmpi-dev)
command -v mpirun >/dev/null || need_pkgs+=(openmpi-bin)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "tools/run.sh: these Debian packages are missing and installing them needs root, but there is no sudo:" >&2
      echo "  run this script as root, or as root: apt-get install ${need_pkgs[*]}" >&2
      exit 1
    fi
    SUDO=sudo
  fi
  $SUDO apt-get update -qq
  # (through env: sudo's env_reset would drop a variable set before it)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# The tests' command lines hold the source and build folders' paths unquoted (CMakeLists.txt builds
# no tests under such a path): said before the build, not as "No tests were found" after it.
if [ "${1:-train}" = test ]; then
  case "$PWD/$BUILD_DIR" in
    *[!A-Za-z0-9_./+,:@%=~-]*)
      echo "tools/run.sh test: the path $PWD/$BUILD_DIR holds a space or another character the shell reads," \
           "which the tests' command lines do not quote: clone under a path of letters, digits and ._-/+,:@%=~" \
           "to run the tests (train runs here)" >&2
      exit 1 ;;
  esac
fi
# Open MPI refuses to run as root without these; ctest's MPI tests and mpirun need them in containers.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenMP threads that sleep at barriers instead of spinning (README, "Sequence and data
# parallelism"): the same speed on idle cores, several times faster on cores another job uses.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

what=${1:-train}
shift || true
case "$what" in
  train) bin=$(cd "$BUILD_DIR" && pwd)/train && cd "$caller" && exec "$bin" "$@" ;;
  # The arena's fresh memory poisoned (NaN), as CI's emulated and sanitizer stages run: an op that
  # reads arena memory it never wrote fails its test instead of reading the zeros a new block holds.
  test) cd "$BUILD_DIR" && ULYSSES_POISON_ARENA=${ULYSSES_POISON_ARENA:-1} exec ctest --output-on-failure --no-tests=error -j "$JOBS" "$@" ;;
  build) ;;
esac
