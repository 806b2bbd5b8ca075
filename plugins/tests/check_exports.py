#!/usr/bin/env python3
"""ctest: the dynamic symbols a shared library defines are exactly those its version script allows.

check_exports.py LIB REGEX      exit 0 when every defined dynamic symbol matches REGEX (and one does),
                                1 with the offenders, 77 (skipped) when `nm` is not installed
"""

import os
import re
import shutil
import subprocess
import sys


def main() -> int:
    lib, pattern = sys.argv[1], re.compile(sys.argv[2])
    if not os.path.isfile(lib):
        print(f"{lib} is not built; build it first (cmake --build ... --target all)")
        return 1
    if shutil.which("nm") is None:
        print("nm is not installed (binutils); cannot list the exports")
        return 77
    out = subprocess.run(
        ["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True
    ).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    names = [n.split("@")[0] for n in names if not n.startswith(("_init", "_fini"))]
    bad = sorted(n for n in names if not pattern.match(n))
    if bad or not names:
        print(
            f"{lib} exports {len(bad)} symbol(s) outside {pattern.pattern}: {', '.join(bad[:20]) or 'none at all'}"
        )
        return 1
    print(f"{lib}: {len(names)} exports, all matching {pattern.pattern}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
