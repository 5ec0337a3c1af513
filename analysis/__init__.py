"""From stored trial records to time-to-train and cost tables, and the winner ready to launch: a
library that the commands (cli/report.py, cli/predict.py) and the leaderboard both call.

One module per concern:

- `load`: the one reader of a results folder: every trial file under a path, read once, into
  checked records and one pandas frame (bad files skipped by name); `estimates.estimated_results`
  adds the estimates, the one pipeline every report starts from.
- `prices`: the editable price tables in `conf/prices/` and the GPU profiles they are keyed by.
- `estimates`: the one owner of the formulas: days, GPU-hours, cloud and owned cost, the
  FLOPs-only (analytic) estimate and the MFU a published time implies.
- `published`: Khandelwal et al. 2024's published time-to-train figures and the MFU each implies.
- `published_runs`: the GPU predictor against training runs other teams published, scored out of
  sample, and the sustained fraction fitted to them (`suite-predict published-accuracy`).
- `tables`: the report tables as frames (best per budget with its ties, across budgets, speed-ups
  of the best configuration and of each memory method, whether the largest micro-batch that fits is
  the fastest, misfits).
- `report_table`: the tables as Markdown, CSV and LaTeX (booktabs).
- `figures`: the figures for a paper, their data taken from the tables' frames, written with
  their CSV and caption; `plotting` draws them (matplotlib, Agg).
- `export`: the winner of a (model, budget) as DeepSpeed JSON, `TrainingArguments` and a launch command.
- `predicted`: predicted rows (`suite-predict`, `--predict`), every figure labelled predicted; the one
  policy both answer with (`predict_budget`).
- `plan`: suite-plan's answer for a model: every GPU type with a price and count, bought or rented, measured
  or predicted; the cheapest within the deadline, the fastest within the budget, the Pareto front.
- `accuracy`: predicted against measured for every stored ok or oom record.
"""


class ReportError(ValueError):
    """A problem the user can fix (a bad path, argument or price table): printed, never a traceback."""
