"""The predictor behind a table's predictor block: fit from every stored trial, validated by
leaving one problem out, and the coverage a model preset gets from the tables.

- `fit_block(spec, trials)`: the block export writes into each table (`_fit.py`): per tuned
  problem, each measured config's time ÷ that problem's best. The runtime reads it
  (omnitune/runtime/_predictor.py) and predicts from it for problems no entry is close to.
- `leave_one_out(db, kernel)`: per tuned problem, the measured time ratio of the config the
  predictor would have chosen had that problem not been tuned, beside the default's and the
  nearest rung's (`_loo.py`; `benchmarks/predictor_loo.py` prints it for a database).
- `coverage(preset, kernels, dtype, device_name)`: a preset's problems, ranked by how poorly the
  tables cover them, with the search that would close each gap (`coverage.py`; `omnitune plan
  --coverage`).

pandas is imported here (the fit reads the results database): the runtime never imports this.
"""

from omnitune.predict._fit import KEEP, NEIGHBOURS, Measured, fit_block, measured_problems, merge_blocks
from omnitune.predict._loo import HeldOut, leave_one_out, leave_one_out_trials, summary
from omnitune.predict.coverage import CoverageRow, coverage

__all__ = [
    "KEEP",
    "NEIGHBOURS",
    "CoverageRow",
    "HeldOut",
    "Measured",
    "coverage",
    "fit_block",
    "leave_one_out",
    "leave_one_out_trials",
    "measured_problems",
    "merge_blocks",
    "summary",
]
