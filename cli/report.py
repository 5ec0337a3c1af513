"""`suite-report`: time-to-train and cost tables, and the winning configuration ready to launch.

    suite-report tables results/                  # Markdown to the terminal; .md, .csv, .tex files written
    suite-report export results/ model=pythia-1b hardware=a6000-x4
    suite-report leaderboard results/ -o leaderboard/index.html   # one HTML file with data and plots inlined, the
                                                                  # figures in leaderboard/figures/ (--no-figures)
    suite-report figures results/ [--out reports/figures]           # PDF, PNG, CSV and caption of each figure
    suite-report tables results/ --predict pythia-1b@a6000-x4     # (tables, figures, leaderboard) predictions, apart
    suite-report tables results/ --plan pythia-1b,plan.max_days=30  # (tables, leaderboard) suite-plan's answer, apart
    suite-report accuracy results/runs [--publish]  # predicted against measured (suite.predict), accuracy.json written

Each subcommand is one entry of COMMANDS: a name, a help line, a function adding its
arguments and a function running it. Each reads its results folder once (`analysis.load`) and
passes what it read along. A bad path, argument or price table exits 2 with a message saying what
to change; files skipped while loading are listed on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import ReportError, plan, report_table
from analysis.accuracy import run
from analysis.estimates import ANALYTIC_MFU, estimated_results
from analysis.export import export_winner, measured, write_export
from analysis.figures import Inputs, describe, scored, select, write_figures
from analysis.load import Results, read_results
from analysis.plan import PLAN_HELP
from analysis.predicted import PREDICT_HELP, asked, predicted_frame, predicted_table
from analysis.prices import PRICES_DIR, load_prices
from analysis.published import published_estimates
from analysis.tables import report
from leaderboard.page import write_leaderboard

SELECTORS = ("model", "hardware", "nodes", "trial")


def loaded(args: argparse.Namespace) -> Results:
    """The results under args.path, read once, after reporting any file skipped."""
    results = read_results(args.path)
    for message in results.messages:
        print(message, file=sys.stderr)
    return results


def analysed(args: argparse.Namespace, results: Results) -> pd.DataFrame:
    """The frame of `results` with its estimates."""
    return estimated_results(results, load_prices(args.prices), args.analytic_mfu)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, help="results folder (searched recursively) or one result file")
    p.add_argument("--prices", type=Path, default=PRICES_DIR, help="folder with cloud.yaml and owned.yaml")
    p.add_argument(
        "--analytic-mfu", type=float, default=ANALYTIC_MFU, help="MFU of the FLOPs-only estimate (default %(default)s)"
    )


def add_predict(p: argparse.ArgumentParser) -> None:

    p.add_argument("--predict", action="append", default=[], metavar="MODEL@HARDWARE", help=PREDICT_HELP)


def add_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", action="append", default=[], metavar="MODEL[,KEY=VALUE]", help=PLAN_HELP)


def add_tables(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--out", type=Path, default=Path("reports/tables"), help="where the tables are written")
    add_predict(p)
    add_plan(p)


def run_tables(args: argparse.Namespace) -> None:

    prices = load_prices(args.prices)
    chosen = asked(args.predict)  # every --predict and --plan checked before the results load: a typo fails at once
    plans = plan.asked(args.plan)
    results = loaded(args)
    tables = report(analysed(args, results), published_estimates(prices), prices)
    for t in tables:
        if t.name != "trials":  # every trial is in the files, too long for a terminal
            print(report_table.to_markdown(t))
    if chosen:
        predicted = predicted_table(predicted_frame(chosen, prices))
        print("=" * 40 + " predicted, not measured " + "=" * 40 + "\n")
        print(report_table.to_markdown(predicted))
        tables.append(predicted)
    if plans:
        planned = plan.plan_table([plan.make_plan(overrides, prices, results) for overrides in plans])
        print("=" * 40 + " the plan: measured and predicted options, apart " + "=" * 40 + "\n")
        print(report_table.to_markdown(planned))
        tables.append(planned)
    paths = report_table.write(tables, args.out)
    print(f"wrote {len(paths)} files to {args.out}: " + ", ".join(p.name for p in paths))


def add_figures(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--out", type=Path, default=Path("reports/figures"), help="where the figures are written")
    add_predict(p)
    p.add_argument("--model", action="append", default=[], help="draw this model only (repeatable)")
    p.add_argument("--budget", action="append", default=[], help="draw this budget only, e.g. a6000-x4 (repeatable)")


def run_figures(args: argparse.Namespace) -> None:

    chosen = asked(args.predict)
    results = loaded(args)
    df = analysed(args, results)
    predicted = predicted_frame(chosen, load_prices(args.prices)) if chosen else None
    figures = select(Inputs(df, str(args.path), predicted, scored(results)), args.model, args.budget)
    print("\n".join(describe(write_figures(figures, args.out))))


def add_export(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument(
        "select",
        nargs="+",
        metavar="KEY=VALUE",
        help="model=NAME hardware=NAME [nodes=N] (the winner), or trial=ID (that trial)",
    )
    p.add_argument("--out", type=Path, help="where the files are written (default: reports/export/MODEL-HARDWARE)")
    p.add_argument("--script", help="Trainer script to launch (default: the Hugging Face example for the model)")


def selection(items: list[str]) -> dict[str, str]:
    chosen, problems = {}, []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in SELECTORS or not value:
            problems.append(f"{item!r} is not KEY=VALUE with KEY one of {', '.join(SELECTORS)}")
        else:
            chosen[key] = value
    if "trial" not in chosen and not {"model", "hardware"} <= chosen.keys():
        problems.append("give model=NAME and hardware=NAME (or trial=ID)")
    if not chosen.get("nodes", "1").isdigit() or int(chosen.get("nodes", "1")) < 1:
        problems.append(f"nodes={chosen['nodes']} must be a whole number >= 1")
    if problems:
        raise ReportError("; ".join(problems))
    return chosen


def run_export(args: argparse.Namespace) -> None:

    chosen = selection(args.select)
    df = analysed(args, loaded(args))
    nodes = int(chosen.get("nodes", "1"))
    w = export_winner(df, chosen.get("model"), chosen.get("hardware"), nodes, chosen.get("trial"), args.script)
    r = w.row
    name = f"{r['model']}-{r['hardware']}" + (f"-{r['n_nodes']}nodes" if r["n_nodes"] > 1 else "")
    out = args.out or Path("reports/export") / name
    paths = write_export(w, out)
    print(f"Winner for {r['model']} on {r['budget']}: {r['config']}")
    print(f"  measured {measured(r)}")
    print(f"  trial {r['trial_id']} ({r['file']})")
    title, name, settings = w.engine_file
    print(f"\n{title} ({out / name}):\n{json.dumps(settings, indent=2)}")
    print(f"\nTrainingArguments:\n{json.dumps(w.training_args, indent=2)}")
    print(f"\nLaunch (from {out}; add the script's data arguments):\n{w.launch_command}")
    print(f"\nwrote {', '.join(str(p) for p in paths)}")


def add_leaderboard(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("-o", "--out", type=Path, default=Path("reports/leaderboard/index.html"), help="the HTML file")
    add_predict(p)
    add_plan(p)
    p.add_argument(
        "--figures",
        type=Path,
        help="where the figures for a paper are written, shown on the page (default: figures/ beside it)",
    )
    p.add_argument("--no-figures", action="store_true", help="write the page without the figures")


def run_leaderboard(args: argparse.Namespace) -> None:
    chosen, plans = asked(args.predict), plan.asked(args.plan)
    figures = None if args.no_figures else args.figures or args.out.parent / "figures"
    path, written = write_leaderboard(loaded(args), args.out, args.prices, args.analytic_mfu, chosen, figures, plans)
    if written:
        print("\n".join(describe(written)))
    print(f"wrote the leaderboard: {path.resolve()} (open it in a browser)")


def add_accuracy(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, help="results folder (searched recursively) or one result file")
    p.add_argument(
        "--out", type=Path, default=Path("reports/accuracy"), help="where accuracy.json and .csv are written"
    )
    p.add_argument(
        "--publish",
        action="store_true",
        help="also write the summary per device kind to results/accuracy/, shown by suite-predict with each figure",
    )
    p.add_argument("--note", default="", help="recorded with the published summary (machine, load, date)")


def run_accuracy(args: argparse.Namespace) -> None:

    run(args.path, args.out, args.publish, args.note)
    print(f"wrote {args.out / 'accuracy.json'} and {args.out / 'accuracy.csv'}")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


COMMANDS = (
    Command("tables", "time-to-train and cost tables (Markdown, CSV, LaTeX)", add_tables, run_tables),
    Command("figures", "the figures for a paper: PDF, PNG, their data as CSV and a caption", add_figures, run_figures),
    Command(
        "export",
        "the winning configuration as DeepSpeed JSON or FSDP config, TrainingArguments and a launch command",
        add_export,
        run_export,
    ),
    Command("leaderboard", "the HTML leaderboard: sortable table, plots, provenance", add_leaderboard, run_leaderboard),
    Command(
        "accuracy", "predicted against measured for every ok or oom record (suite.predict)", add_accuracy, run_accuracy
    ),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="suite-report", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for c in COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        c.add_arguments(sp)
        sp.set_defaults(chosen=c)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command: Command = args.chosen
    try:
        command.run(args)
    except ReportError as e:
        print(f"suite-report {command.name}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
