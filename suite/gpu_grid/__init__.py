"""The GPU grid: the suite's own trials on a lent GPU, as ground truth for the predictor. Pythia-160M,
-410M and -1B under DDP, ZeRO-1/2/3 and FSDP2, recomputation and offload, at the out-of-memory
boundary and at timed points, under the GPU's own memory and under 24 and 48 GiB caps (cards of
that size emulated), within a time budget. Run by scripts/gpu-grid.sh, which brings missing
packages along and packs the output as one archive:

    python -m suite.gpu_grid [OUT_DIR]    # the grid (GPU_GRID_BUDGET_S, from GPU_GRID_START)
    python -m suite.gpu_grid --dry-run    # the plan, its estimated seconds and its total; runs nothing

Exit: 0 every planned trial ran to a result (ok or oom); 1 a trial failed (crashed, nan, its own
timeout, another GPU than its profile's) or an op did not build; 2 the environment cannot run it
(a package missing or too old, named); 3 no CUDA GPU here (nothing written); 4 none failed, but the
budget cut planned trials (NOT RUN). The dry run exits 0 when the plan fits the budget.

One concern per module: `plan` (the cells and items in priority order, the estimates, what the
budget holds) and `grid` (the run: boundaries by doubling, the rows, the files). What it shares
with the GPU check comes from `suite.gpu_check`: the budget, the timeline beside DeepSpeed's op
build, the environment and the op build, the rows and their table.
"""
