"""Run the tvmnorm benchmark suite from a checkout: `python bench/run.py --help`.

Same options as `tvmnorm bench` (tvmnorm/bench.py holds the code).
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tvmnorm.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
