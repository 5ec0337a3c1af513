"""The GPU check: a short set of real trials on one GPU, and a verdict on each figure that a first
GPU run could get wrong. Run by scripts/gpu-check.sh, which brings missing packages along:

    python -m suite.gpu_check OUT_DIR     # the check (GPU_CHECK_BUDGET_S, from GPU_CHECK_START)
    python -m suite.gpu_check --dry-run   # the plan and its estimated seconds; runs nothing

Exit: 0 every verdict passed (or was skipped, saying why); 1 a verdict failed; 2 the environment
cannot run the check (a package missing or too old, named); 3 no CUDA GPU here; 4 none failed,
but the time budget left checks out (NOT RUN). The dry run exits 0 when the plan fits the budget.

One concern per module: `plan` (the checks, their order, estimates and the budget), `environment`
(packages, ninja, the compiler and nvcc; DeepSpeed's ops built once), `verdicts` (the judgements,
the table, the exit code) and `check` (the run). Records: OUT_DIR/records/ (the store: one normal
trial record per check, which `suite-report accuracy --publish` scores; worker logs in
records/logs/), OUT_DIR/ops-*.log, OUT_DIR/verdicts.json and OUT_DIR/table.txt.
"""
