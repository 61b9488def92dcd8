#!/usr/bin/env python3
"""The instruction mix of every kernel in CUDA object files or executables, from their SASS
(cuobjdump --dump-sass): what answers "are the loads 16 bytes wide, are the tensor-core
instructions there, did an array go to local memory" without a GPU.

  python3 tools/sass_mix.py build-cuda/CMakeFiles/ulysses.dir/layers/layernorm.cu.o [more files]

One line per kernel: instructions in all, then counts by kind. Memory instructions carry their
width: LDG.128 is a 16-byte global load, LDG.U16 a 2-byte one; LDL/STL are local memory (spills or
arrays indexed at run time); HMMA is mma.sync, LDSM ldmatrix, LDGSTS cp.async, MUFU the special
functions (exp, rcp, ...). cuobjdump comes with the CUDA toolkit (or set CUOBJDUMP to its path)."""
import collections
import os
import re
import shutil
import subprocess
import sys

MEMORY = {"LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "ATOMG", "RED", "ATOMS"}
OTHER = {"HMMA", "LDSM", "LDGSTS", "SHFL", "MUFU", "BAR", "FFMA", "F2FP", "BRA"}


def width(ins):
    for w in ("128", "64", "U16", "S16", "U8", "S8"):
        if "." + w in ins:
            return w
    return "32"


def kernel_name(mangled):
    name = subprocess.run(["c++filt"], input=mangled, capture_output=True, text=True).stdout.strip() or mangled
    name = name.replace("(anonymous namespace)::", "").replace("__nv_bfloat16", "bf16")
    return re.sub(r"\(.*", "", name).replace("void ", "")


def main():
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_mix: cuobjdump not found (it comes with the CUDA toolkit; or set CUOBJDUMP)")
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        sass = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True)
        if sass.returncode != 0:
            sys.exit(f"sass_mix: {path}: {sass.stderr.strip()}")
        print(f"## {path}")
        for func in re.split(r"\n\s*Function : ", sass.stdout)[1:]:
            mangled = func.split("\n", 1)[0].strip()
            ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", func)
            mix = collections.Counter()
            for ins in ops:
                op = ins.split(".")[0]
                if op in MEMORY:
                    mix[op + "." + width(ins)] += 1
                elif op in OTHER:
                    mix[op] += 1
            counts = " ".join(f"{k}:{v}" for k, v in sorted(mix.items()))
            print(f"{kernel_name(mangled)[:64]:64s} n={len(ops):5d} {counts}")


if __name__ == "__main__":
    main()
