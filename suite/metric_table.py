"""The one table of a trial's metrics: each one's name, unit, type, how a trial's runs summarise it,
and what it means.

Producers write a metric under its name (suite.metrics, suite.worker, suite.engines, suite.launch;
suite.record for the figures of the runs together); everything else reads this table:

- `suite.record.summary_of_runs` summarises the runs of a trial by each row's `over_runs`;
- `analysis.load` checks an `ok` record's `required` metrics and puts the `frame` ones in its frame,
  typed by `type`;
- the leaderboard (`leaderboard.page`, page.js) labels, formats and lists the metrics with a `label`;
- docs/results-format.md holds `markdown()` (`python -m suite.metric_table` writes it, a test checks it).

Adding a metric is its producer plus one row. A "token" is the task's unit (`Trial.unit`): a text
token, or a whole image for an image task (the page says images there). Imports nothing heavy: the
record, the store and the reports read it without torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# How a trial's runs summarise a metric (`Metric.over_runs`).
MEDIAN_RUN = "median run"
"""The median run's (the run of the median step time; the lower of two)."""
MEDIAN = "median"
"""The median of the runs' values (each run's own kept in the run)."""
MAX = "max"
"""The largest of any run: a configuration must fit every time."""
ANY = "any"
"""True when any run's is."""
AT_MEDIAN = "at median step"
"""Computed again at the median step time (`suite.metrics.rates`)."""
OF_RUNS = "of the runs"
"""Made from every run's step time (`suite.stats`): in the summary only."""
PER_RUN = "per run"
"""Each run's own: kept in its run, not in the summary."""
SUMMARIES = (MEDIAN_RUN, MEDIAN, MAX, ANY, AT_MEDIAN, OF_RUNS, PER_RUN)

TYPES = ("float", "int", "bool", "str", "list", "dict")
FORMATS = ("s", "int", "pct", "gib", "sci", "yesno", "text")
"""How the page shows a value (page.js `FMT`): seconds, a whole number, a percentage, GiB,
3 significant digits, yes/no, text as it is."""


@dataclass(frozen=True)
class Metric:
    name: str
    """The key in a run's and a record's `metrics`, and the frame's column."""
    unit: str
    """Of its value ("" for a count or a label); "fraction" for a share of 1."""
    type: str
    """One of TYPES (JSON's: an int is a whole number)."""
    over_runs: str
    """How a trial's runs summarise it: one of SUMMARIES."""
    description: str
    optional: bool = False
    """May be null or absent where it does not apply (a CPU has no MFU); else in every `ok` run."""
    label: str = ""
    """The page's name for it; a metric with a label is listed in a row's details."""
    format: str = ""
    """How the page shows it: one of FORMATS (needed with a label)."""
    required: bool = False
    """An `ok` record without it as a number is left out of the reports (`analysis.load`)."""
    frame: bool = False
    """A column of the reports' frame (`analysis.load`) and of the page's rows."""

    def __post_init__(self) -> None:
        wrong = []
        if self.type not in TYPES:
            wrong.append(f"type {self.type!r} is not one of {', '.join(TYPES)}")
        if self.over_runs not in SUMMARIES:
            wrong.append(f"over_runs {self.over_runs!r} is not one of {', '.join(SUMMARIES)}")
        if bool(self.label) != bool(self.format) or (self.format and self.format not in FORMATS):
            wrong.append(f"label {self.label!r} needs a format of {', '.join(FORMATS)} (and a format a label)")
        if self.unit == "GiB" and self.over_runs != MAX:
            wrong.append("a memory figure (GiB) is the largest of the runs (over_runs=MAX)")
        if (self.required or self.frame) and self.over_runs == PER_RUN:
            wrong.append("a metric of each run alone is not in the summary the reports read")
        if wrong:
            raise ValueError(f"metric {self.name}: " + "; ".join(wrong))

    @property
    def numeric(self) -> bool:
        return self.type in ("float", "int")


M = Metric
# fmt: off
TABLE: tuple[Metric, ...] = (
    # ---- the step time (suite.metrics.step_metrics) and its summary over runs (suite.record) ----
    M("step_time_s", "s", "float", MEDIAN, "one optimizer step at the recipe's global batch: a run's mean over its "
      "timed steps, the trial's the median of its runs", label="step time", format="s", required=True, frame=True),
    M("step_time_ci_lo_s", "s", "float", OF_RUNS, "the interval of the median step time: its lower end (the median "
      "itself for a single run)", frame=True),
    M("step_time_ci_hi_s", "s", "float", OF_RUNS, "the interval of the median step time: its upper end", frame=True),
    M("step_time_ci_level", "fraction", "float", OF_RUNS, "the confidence that interval really has (0 for a single "
      "run, which has none)", frame=True),
    M("runs", "", "int", OF_RUNS, "how many runs, each in fresh processes", frame=True),
    M("step_time_between_std_s", "s", "float", OF_RUNS, "the spread between runs: standard deviation of their step "
      "times (null for one run)", optional=True, frame=True),
    M("step_time_within_std_s", "s", "float", OF_RUNS, "the spread of the timed steps inside each run, pooled",
      optional=True, frame=True),
    M("step_time_std_s", "s", "float", PER_RUN, "standard deviation of a run's timed steps", label="within-run std",
      format="s"),
    M("step_time_min_s", "s", "float", PER_RUN, "a run's fastest timed step"),
    M("step_time_max_s", "s", "float", PER_RUN, "a run's slowest timed step"),
    M("timed_steps", "", "int", MEDIAN_RUN, "timed optimizer steps per run", label="timed steps per run",
      format="int"),
    M("noisy", "", "bool", ANY, "a run's timed steps vary more than 5% (suite.metrics.NOISY_CV)", label="noisy",
      format="yesno", frame=True),
    M("gas", "", "int", MEDIAN_RUN, "accumulation steps of the recipe's global batch", label="accumulation steps",
      format="int", required=True, frame=True),
    M("gas_measured", "", "int", MEDIAN_RUN, "accumulation steps run per timed step", label="accumulation steps run",
      format="int", frame=True),
    M("extrapolated", "", "bool", MEDIAN_RUN, "the step composed from its measured parts: fewer accumulation steps "
      "run than the recipe's", label="extrapolated", format="yesno", frame=True),
    M("micro_time_s", "s", "float", MEDIAN, "one micro-step without the optimizer boundary (t_micro; null when none "
      "ran)", optional=True, label="micro-step", format="s"),
    M("boundary_time_s", "s", "float", MEDIAN, "the micro-step at the boundary (t_boundary)", label="boundary step",
      format="s"),
    M("optimizer_time_s", "s", "float", MEDIAN, "the optimizer step (t_optimizer)", label="optimizer step",
      format="s"),
    M("tokens_per_step", "tokens", "int", MEDIAN_RUN, "the recipe's global batch in tokens (images)",
      label="tokens per step", format="int", required=True, frame=True),
    M("model_flops_per_token", "FLOP", "float", MEDIAN_RUN, "model FLOPs per token, forward and backward, without "
      "recomputation", label="model FLOPs/token", format="sci", required=True, frame=True),
    M("hardware_flops_per_token", "FLOP", "float", MEDIAN_RUN, "FLOPs per token as run, recomputation included"),
    # ---- throughput and utilization at the step time (suite.metrics.rates) ----
    M("tokens_per_s", "tokens/s", "float", AT_MEDIAN, "throughput of all devices", label="tokens/s", format="int",
      required=True, frame=True),
    M("tokens_per_s_per_device", "tokens/s", "float", AT_MEDIAN, "throughput per device",
      label="tokens/s per device", format="int", frame=True),
    M("samples_per_s", "samples/s", "float", AT_MEDIAN, "samples of the global batch per second"),
    M("mfu", "fraction", "float", AT_MEDIAN, "model FLOPs utilization against the devices' dense peak (null without "
      "a peak: CPU)", optional=True, label="MFU", format="pct", frame=True),
    M("hfu", "fraction", "float", AT_MEDIAN, "hardware FLOPs utilization: MFU with recomputation counted",
      optional=True, label="HFU", format="pct", frame=True),
    M("precision", "", "str", MEDIAN_RUN, "the precision that ran (fp32 for a bf16 recipe on CPU)"),
    M("attention", "", "str", MEDIAN_RUN, "the attention kernel that ran (none for a model without attention)"),
    # ---- memory (suite.metrics.memory) ----
    M("peak_mem_gib", "GiB", "float", MAX, "peak of the timed window on the largest device: allocated (GPU) or "
      "resident above the runtime (CPU worker)", label="peak memory", format="gib", required=True, frame=True),
    M("peak_reserved_gib", "GiB", "float", MAX, "peak reserved by the allocator in the timed window (null on CPU)",
      optional=True, label="peak reserved", format="gib", frame=True),
    M("build_peak_mem_gib", "GiB", "float", MAX, "peak of building and initializing the model and engine",
      label="build peak memory", format="gib"),
    M("build_peak_reserved_gib", "GiB", "float", MAX, "reserved peak of the build (null on CPU)", optional=True),
    M("host_peak_gib", "GiB", "float", MAX, "largest resident host memory of any rank in the timed window, runtime "
      "included (what offload raises)", label="host peak", format="gib"),
    M("nvme_read_bytes_per_step", "B", "float", MEDIAN_RUN, "bytes the ranks read from the NVMe tier's swap per "
      "timed step, summed over the ranks (their /proc/self/io; NVMe tier only)", optional=True,
      label="NVMe read per step", format="sci"),
    M("nvme_write_bytes_per_step", "B", "float", MEDIAN_RUN, "bytes the ranks wrote to the NVMe tier's swap per "
      "timed step, summed over the ranks", optional=True, label="NVMe written per step", format="sci"),
    M("nvme_read_gbps", "GB/s", "float", MEDIAN_RUN, "the NVMe read bytes over the timed window's seconds: the "
      "drive's load averaged over training, not its peak", optional=True, label="NVMe read", format="sci"),
    M("nvme_write_gbps", "GB/s", "float", MEDIAN_RUN, "the NVMe written bytes over the timed window's seconds",
      optional=True, label="NVMe write", format="sci"),
    M("memory_per_rank", "", "list", MEDIAN_RUN, "each rank's peaks (and GPU name): what the figures above are "
      "the largest of"),
    # ---- what ran and how the run went (suite.worker, suite.engines, suite.launch) ----
    M("n_params", "", "int", MEDIAN_RUN, "parameters of the model", label="parameters", format="int", frame=True),
    M("engine", "", "str", MEDIAN_RUN, "the engine that ran: deepspeed or fsdp2"),
    M("optimizer", "", "str", MEDIAN_RUN, "the optimizer that ran", label="optimizer", format="text"),
    M("optimizer_wrapper", "", "str", MEDIAN_RUN, "DeepSpeed's optimizer wrapper (DeepSpeed only)", optional=True),
    M("grad_scaler", "", "bool", MEDIAN_RUN, "a gradient scaler ran (FSDP2 only)", optional=True),
    M("kernel_path", "", "str", MEDIAN_RUN, "the fused kernels that ran, where a model has them (Mamba)",
      optional=True, label="kernels", format="text", frame=True),
    M("first_loss", "", "float", MEDIAN_RUN, "the first warm-up step's loss", optional=True),
    M("loss_per_step", "", "list", MEDIAN_RUN, "the timed steps' losses"),
    M("warmup_steps_run", "", "int", MEDIAN_RUN, "warm-up steps run (more than asked until nothing recompiles)"),
    M("skipped_steps_warmup", "", "int", MEDIAN_RUN, "warm-up steps whose update an fp16 overflow skipped"),
    M("skipped_steps_discarded", "", "int", MEDIAN_RUN, "timed steps an fp16 overflow skipped, discarded and run "
      "again"),
    M("recompiles_timed", "", "int", MEDIAN_RUN, "graphs torch.compile made in the timed window"),
    M("probe_flops", "FLOP/s", "float", MEDIAN, "the machine's speed just after the timed window: one fixed matrix "
      "multiply (suite.metrics.speed_probe)", optional=True, label="speed probe", format="sci"),
    M("param_stats", "", "dict", MEDIAN_RUN, "each parameter's element count, mean and std as built "
      "(measure.param_stats)", optional=True),
    M("profile_mismatch", "", "dict", MEDIAN_RUN, "the GPUs that ran are not the hardware profile's "
      "(suite.detect.mismatch; GPU only)", optional=True),
)
# fmt: on
BY_NAME = {m.name: m for m in TABLE}
if len(BY_NAME) != len(TABLE):
    raise ValueError("a metric is named twice in suite.metric_table.TABLE")

REQUIRED = tuple(m.name for m in TABLE if m.required)
"""What an `ok` record must carry as numbers for the reports (days, costs) to be made from it."""
FRAME = tuple(m.name for m in TABLE if m.frame)
"""The reports' frame's metric columns (`analysis.load`)."""


def named(over_runs: str) -> tuple[str, ...]:
    """The names of the metrics that the runs summarise this way."""
    return tuple(m.name for m in TABLE if m.over_runs == over_runs)


# ---- docs/results-format.md ---------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "results-format.md"
BEGIN = "<!-- metrics: generated from suite/metric_table.py by `python -m suite.metric_table`; edit the table there -->"
END = "<!-- end of metrics -->"


def markdown() -> str:
    """The table as Markdown, as docs/results-format.md holds it between BEGIN and END."""
    lines = ["| metric | unit | type | over runs | meaning |", "| --- | --- | --- | --- | --- |"]
    for m in TABLE:
        kind = f"{m.type}, optional" if m.optional else m.type
        lines.append(f"| `{m.name}` | {m.unit} | {kind} | {m.over_runs} | {m.description} |")
    return "\n".join(lines)


def with_table(doc: str) -> str:
    """`doc` with the text between BEGIN and END replaced by `markdown()`."""
    head, begin, rest = doc.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise ValueError(f"the document has no {BEGIN!r} ... {END!r} block")
    return f"{head}{BEGIN}\n{markdown()}\n{END}{tail}"


if __name__ == "__main__":  # writes the table into docs/results-format.md
    DOC.write_text(with_table(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the metrics table into {DOC}", file=sys.stderr)
