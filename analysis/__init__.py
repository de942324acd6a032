"""analysis wing of stare_lab: plots and a report from run directories (never imports simulators or trainer).

Notebook use::

    import analysis
    runs = analysis.load_runs("runs/sweep")            # list[RunData], numpy columns per metric key
    cmp = analysis.compare("runs/sweep")               # groups by method (split when settings differ; split=False
                                                       # merges), seed mean + 95% band
    cmp.summary_rows(); cmp.prediction_fits()
    fig = analysis.plots.plot_dynamics(cmp)            # matplotlib Figure

The whole report in one call: ``analysis.analyze.analyze(paths, out)`` (figures, report.md/html/json; what
``stare-lab analyze`` and ``stare-lab simulate`` run; it imports matplotlib, so ``import analysis`` does not load it).
CLI: ``stare-lab analyze RUN_OR_SWEEP_DIR... [--out DIR]`` (see :mod:`analysis.cli`).
"""

from . import plots, stats
from .compare import Comparison, Group, compare
from .load import RunData, load_run, load_runs
from .report import write_report

__all__ = ["load_runs", "load_run", "RunData", "compare", "Comparison", "Group", "plots", "stats", "write_report"]
