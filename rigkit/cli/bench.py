"""`rigkit bench-render`, `bench-report` and `tune`: the drafter bench's report, table and tuning."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from rigkit.paths import BENCH_REPORTS, BENCH_SCHEMA, HOST_VARS


def bench_render(args: argparse.Namespace) -> int:
    """Raw steps (the bench role's JSON on stdin) -> <out>/<host>/<run id>.json (schema-checked) and .png."""
    import jsonschema

    from rigkit.bench.plot import plot_report
    from rigkit.bench.report import ReportError, build_report

    raw = json.load(sys.stdin)
    try:
        report = build_report(
            host=raw["host"],
            run_id=raw["run_id"],
            started_at=raw["started_at"],
            finished_at=raw["finished_at"],
            wall_s=float(raw["wall_s"]),
            rig=raw["rig"],
            settings=raw["settings"],
            steps=raw["steps"],
        )
        schema = json.loads(BENCH_SCHEMA.read_text(encoding="utf-8"))
        jsonschema.validate(report, schema)
    except (ReportError, KeyError) as exc:
        print(f"rigkit bench-render: cannot build the report: {exc}", file=sys.stderr)
        return 1
    except jsonschema.ValidationError as exc:
        where = "/".join(str(part) for part in exc.path)
        print(f"rigkit bench-render: the report breaks {BENCH_SCHEMA.name} at {where}: {exc.message}", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out_dir) / report["host"]
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{report['run_id']}.json"
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    png_path = plot_report(report, out / f"{report['run_id']}.png")
    summary = report["summary"]
    print(f"report: {json_path}")
    print(f"plot:   {png_path}")
    for row in summary["scores"]:
        label = "off" if row["draft_n_max"] == 0 else f"n_max {row['draft_n_max']}"
        print(f"  {label:>8}: {row['score']:8.2f} tokens/s (passes: {', '.join(f'{v:.2f}' for v in row['per_pass'])})")
    speedup = summary["speedup_best_vs_off"]
    print(f"best for the workload: {summary['best_draft_n_max']} ({speedup:.2f}x vs off)" if speedup else "")
    return 0


def bench_report_table(args: argparse.Namespace) -> int:
    from rigkit.bench.report import table_row

    root = pathlib.Path(args.reports_dir)
    paths = sorted(root.glob(f"{args.host or '*'}/*.json"))
    rows = []
    for path in paths:
        try:
            rows.append(table_row(json.loads(path.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            print(f"rigkit bench-report: skipping {path}: {exc}", file=sys.stderr)
    if not rows:
        print(f"no bench reports under {root}{'/' + args.host if args.host else ''}: run `make bench host=NAME`")
        return 0
    columns = list(rows[0])
    widths = {column: max(len(column), *(len(row[column]) for row in rows)) for column in columns}
    print("  ".join(column.ljust(widths[column]) for column in columns))
    for row in rows:
        print("  ".join(row[column].ljust(widths[column]) for column in columns))
    return 0


def tune_host(args: argparse.Namespace) -> int:
    from rigkit.bench.report import ReportError
    from rigkit.bench.tune import latest_report, tune

    try:
        report = pathlib.Path(args.report) if args.report else latest_report(pathlib.Path(args.reports_dir), args.name)
        host_vars = pathlib.Path(args.host_vars) if args.host_vars else HOST_VARS / f"{args.name}.yml"
        decision, changed = tune(report, host_vars)
    except ReportError as exc:
        print(f"rigkit tune: {exc}", file=sys.stderr)
        return 1
    print(f"{args.name}: {decision.reason}")
    print(f"  report: {report}")
    if changed:
        print(f"  wrote {host_vars}: run `make provision host={args.name}` to apply it")
    else:
        print(f"  {host_vars} unchanged")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    render = commands.add_parser("bench-render", help="report + plot from the bench role's raw steps (stdin)")
    render.set_defaults(func=bench_render)
    render.add_argument("--out-dir", default=str(BENCH_REPORTS), help="reports directory (default: %(default)s)")
    table = commands.add_parser("bench-report", help="a table of past bench runs")
    table.set_defaults(func=bench_report_table)
    table.add_argument("--host", help="only this rig")
    table.add_argument("--reports-dir", default=str(BENCH_REPORTS), help="reports directory (default: %(default)s)")
    tune_cmd = commands.add_parser("tune", help="apply the best measured draft length to the host's variables")
    tune_cmd.set_defaults(func=tune_host)
    tune_cmd.add_argument("name", help="rig name")
    tune_cmd.add_argument("--report", help="report to use (default: the rig's latest)")
    tune_cmd.add_argument("--reports-dir", default=str(BENCH_REPORTS), help="reports directory (default: %(default)s)")
    tune_cmd.add_argument("--host-vars", help="host variables file (default: inventory/host_vars/NAME.yml)")
