"""``scripts/fuzz_readers.py`` keeps working: every kind, a few seeded cases, in a process of
its own as a user runs it (its disagreements exit 1; here there must be none)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_kind_of_the_fuzzer_runs_and_agrees():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_readers.py"), "all",
                        "--cases", "25", "--seed", "2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = [ln.split(":")[0] for ln in r.stdout.splitlines() if "cases," in ln]
    assert kinds == ["edges", "csv", "mtx", "inputs", "project", "outputs", "frames", "infer",
                     "network", "cli", "truth", "hdf5",
                     "cli-project"]
    assert all(ln.endswith(" 0 disagreements") for ln in r.stdout.splitlines() if "cases," in ln)
