#!/usr/bin/env python3
"""Fail the build when g++ no longer vectorises the host reduce_copy inner loop.

Compiles vectorize_probe.cpp (float sum, 2 sources, 1 and 2 destinations) at -O2 (what
meson's debugoptimized and release builds use) and at -O3, with -fopt-info-vec-optimized,
and looks for g++'s "loop vectorized" remark on the inner loop of reduce_copy.hpp: the
first `for (` line after the comment that names this script.

usage: check_vectorized.py --source PROBE.cpp --header reduce_copy.hpp --output REPORT
                           -- COMPILER [FLAGS...]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

MARKER = "check_vectorized.py"
CONFIGS = [("-O2", 1), ("-O2", 2), ("-O3", 1), ("-O3", 2)]


def loop_line(header):
    with open(header, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, text in enumerate(lines):
        if MARKER in text:
            for j in range(i + 1, min(i + 6, len(lines))):
                if lines[j].strip().startswith("for ("):
                    return j + 1
    sys.exit(f"check_vectorized.py: no `for (` loop within 5 lines after a comment naming "
             f"{MARKER} in {header}; keep that comment just above the kernel's inner loop")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--header", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("compiler", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    compiler = [a for a in args.compiler if a != "--"]
    if not compiler:
        sys.exit("check_vectorized.py: no compiler command given after --")

    line = loop_line(args.header)
    header_name = os.path.basename(args.header)
    remark = re.compile(re.escape(header_name) + r":" + str(line) +
                        r":\d+: optimized: loop vectorized")
    report = [f"inner loop: {args.header}:{line}"]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for opt, ndst in CONFIGS:
            cmd = compiler + [opt, f"-DPLAIT_PROBE_NDST={ndst}", "-fopt-info-vec-optimized",
                              "-c", args.source, "-o", os.path.join(tmp, "probe.o")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            what = f"float sum, 2 sources, {ndst} destination(s), {opt}"
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout + proc.stderr)
                sys.exit(f"check_vectorized.py: compiling the probe failed ({what}):\n  "
                         + " ".join(cmd))
            remarks = [r for r in proc.stderr.splitlines() if header_name in r]
            if any(remark.search(r) for r in remarks):
                report.append(f"vectorised: {what}")
            else:
                failures.append((what, cmd, remarks))

    if failures:
        sys.stderr.write(
            "\n" + "=" * 78 + "\n"
            f"ERROR: the host reduce_copy inner loop ({args.header}:{line}) is no longer\n"
            "vectorised by this compiler. Every collective on the host runs through it, so\n"
            "this is a large performance regression. Look at what changed in the loop, in\n"
            "the op or in the element conversions (a call, a branch the compiler cannot\n"
            "if-convert, an aliasing store). To see why, rerun a command below with\n"
            "-fopt-info-vec-missed. To build anyway: meson configure -Dvectorize_check=false.\n")
        for what, cmd, remarks in failures:
            sys.stderr.write(f"\n  not vectorised: {what}\n  command: {' '.join(cmd)}\n")
            sys.stderr.write("  remarks on the header: " +
                             ("\n    " + "\n    ".join(remarks) if remarks else "none") + "\n")
        sys.stderr.write("=" * 78 + "\n")
        return 1

    with open(args.output, "w", encoding="utf-8") as f:
        f.write("\n".join(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
