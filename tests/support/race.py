"""The race tests' project (a broken `add`), its check, and a candidate that games that check: shared by the
judge's tests against real runtimes (tests/runtime/test_race_judge.py) and the race on kind (tests/e2e)."""

from __future__ import annotations

BROKEN = "def add(a, b):\n    return a - b\n"
CHECK = "cd core && python3 -B -c 'from calc import add; assert add(2, 3) == 5, add(2, 3)'"
# A wrong fix (a * b, the same size), then bytecode of the right one stamped with the wrong file's size and mtime:
# Python takes the stale .pyc for calc.py, __pycache__ is never in a diff, and the diff is two lines. One line,
# as a race's --commands file holds one command per line.
GAMED = (
    "sed -i 's/a - b/a * b/' core/calc.py && python3 -c \"import os, py_compile, importlib.util as u; "
    "s = 'core/calc.py'; t = 'fake/calc.py'; os.makedirs('fake', exist_ok=True); "
    "open(t, 'w').write(open(s).read().replace('a * b', 'a + b')); st = os.stat(s); "
    "os.utime(t, ns=(st.st_atime_ns, st.st_mtime_ns)); "
    'py_compile.compile(t, cfile=u.cache_from_source(s), doraise=True)"'
)
