"""Per-step A/B of igemm.Fixed (on) against igemm's own call (off): the same engine switched between alternate runs.

``python bench/results/session34/ab_fixed.py FORMAT RUNS [MODEL]`` from the checkout: each step whose median moved by
more than 3 us, the sums of the step medians, and the unpatched runs' medians, off and on. Session 35's ab.py with
``Fixed.team_applies`` switched between a refusal and itself.
"""
import runpy, sys
from pathlib import Path
fmt, runs = sys.argv[1], sys.argv[2]; name = sys.argv[3] if len(sys.argv) > 3 else "mobilenet_v2"
sys.argv = [sys.argv[0], fmt, runs, name, "minfer_ops_numba.igemm", "Fixed.team_applies", "lambda self, n, t: False",
            "Fixed.team_applies"]
runpy.run_path(str(Path(__file__).resolve().parents[1] / "session35" / "ab.py"), run_name="__main__")
