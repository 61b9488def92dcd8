#!/usr/bin/env bash
# Copies the header-only dependencies (Eigen, Catch2) and their CMake package files into .carry/
# (ignored by git), for a GPU machine that has CUDA but no apt: bench/gpu_check.sh builds with
# CMAKE_PREFIX_PATH=.carry. Run it here, where the Debian packages are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where they are not installed (the GPU machine itself), stop before touching a carried .carry/.
for f in /usr/include/eigen3/Eigen/Core /usr/share/eigen3/cmake/Eigen3Config.cmake /usr/include/catch2/catch.hpp \
         /usr/lib/cmake/Catch2/Catch2Config.cmake /usr/lib/libCatch2WithMain.a; do
  [ -e "$f" ] || { echo "carry_deps.sh: $f is missing: run this where libeigen3-dev and catch2 are installed" >&2; exit 1; }
done
rm -rf .carry && mkdir -p .carry/include .carry/share .carry/lib/cmake
cp -r /usr/include/eigen3 .carry/include/
cp -r /usr/share/eigen3 .carry/share/
cp -r /usr/include/catch2 .carry/include/
cp -r /usr/lib/cmake/Catch2 .carry/lib/cmake/
# Catch2's package file checks that the library it exports exists (the tests link their own main,
# tests/catch_main.cpp, not this one; without the file, configuring fails).
cp /usr/lib/libCatch2WithMain.a .carry/lib/
du -sh .carry
