"""Benchmarks of the suite itself, each run from the checkout's root as a module:

    python -m benchmarks.first_minutes         a newcomer's first minutes, from a fresh clone
    python -m benchmarks.harness_overhead      the suite's step time against a bare PyTorch loop
    python -m benchmarks.engines               DeepSpeed against FSDP2 at equal sharding
    python -m benchmarks.search_vs_grid        the search against the exhaustive grid
    python -m benchmarks.search_replay         the search replayed against recorded runs
    python -m benchmarks.prediction_accuracy   the predictor against CPU trials
    python -m benchmarks.figures_scale         suite-report figures on 5,000 records
    python -m benchmarks.offload_accuracy      the predictor's offload terms against published offload runs
    python -m benchmarks.zero3_hooks           ZeRO-3's host cost per collective, on a GPU

Each but offload_accuracy (which prints) writes one JSON result through `output.write_result`
(its provenance, written atomically); docs/benchmarks.md says what each measures,
results/benchmarks/README.md what they found.
`published/` is data: other teams' published training runs, which `suite-predict
published-accuracy` scores the GPU predictor against.
"""
