//! The bench report: `backends.md` (tables with the machine, the load and
//! the fsync rate) and SVG charts (plotters), from one or more runs.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::probe::Pattern;
use super::workload::Workload;
use super::{Case, Run, ms};
use rheo_cli::error::CliError;

/// What makes two cases the same case (rounds aside).
type Key = (String, Workload, usize, usize, usize, usize, usize, u32, u32);

fn key(c: &Case) -> Key {
    (
        c.backend.clone(),
        c.workload,
        c.processes,
        c.producers,
        c.consumers,
        c.batch,
        c.payload_bytes,
        c.partitions,
        c.streams,
    )
}

/// One case per configuration: of its rounds, the one with the median
/// events/s (the lower middle of an even count), in first-seen order.
pub fn medians(cases: &[Case]) -> Vec<Case> {
    let mut keys: Vec<Key> = Vec::new();
    for c in cases {
        let k = key(c);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .filter_map(|k| {
            let mut same: Vec<&Case> = cases.iter().filter(|c| key(c) == k).collect();
            same.sort_by(|a, b| a.events_per_sec.total_cmp(&b.events_per_sec));
            same.get((same.len() - 1) / 2).map(|c| (*c).clone())
        })
        .collect()
}

fn chart_error(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::new(format!("cannot draw {}: {e}", path.display()))
}

/// Writes the report into `dir`; returns the files written.
pub fn write(dir: &Path, run: &Run) -> Result<Vec<PathBuf>, CliError> {
    std::fs::create_dir_all(dir).map_err(|e| CliError::new(format!("cannot create {}: {e}", dir.display())))?;
    let cases = medians(&run.cases);
    let backends: Vec<String> = {
        let mut seen = Vec::new();
        for c in &cases {
            if !seen.contains(&c.backend) {
                seen.push(c.backend.clone());
            }
        }
        seen
    };
    let mut written = Vec::new();
    let mut charts = Vec::new();
    let head = headline(&cases);
    if !head.is_empty() {
        let path = dir.join("throughput.svg");
        bars(&path, "events/s per backend and workload (higher is better)", "events/s", &backends, &head, |c| {
            (c.events_per_sec, None)
        })?;
        charts.push(("Throughput", "throughput.svg"));
        written.push(path);
        let path = dir.join("latency.svg");
        bars(&path, "p99 latency, with p50 as a dot (lower is better)", "ms", &backends, &head, |c| {
            (c.latency.p99_us as f64 / 1000.0, Some(c.latency.p50_us as f64 / 1000.0))
        })?;
        charts.push(("Latency", "latency.svg"));
        written.push(path);
    }
    let mut scales = Vec::new();
    for w in Workload::CASES {
        for dim in [Dim::Producers, Dim::Consumers, Dim::Processes] {
            let points: Vec<&Case> = scale_points(&cases, w, dim);
            let xs: BTreeSet<usize> = points.iter().map(|c| dim.of(c)).collect();
            if xs.len() < 2 {
                continue;
            }
            let name = format!("scale-{}-{}.svg", w.name(), dim.name());
            let path = dir.join(&name);
            scale(&path, w, dim, &backends, &points)?;
            scales.push((w, dim, name));
            written.push(path);
        }
    }
    let md = dir.join("backends.md");
    std::fs::write(&md, markdown(run, &cases, &charts, &scales))
        .map_err(|e| CliError::new(format!("cannot write {}: {e}", md.display())))?;
    written.push(md);
    Ok(written)
}

/// The headline cases: per workload, the configuration every backend ran
/// with the fewest processes, producers and consumers.
fn headline(cases: &[Case]) -> Vec<Case> {
    let mut out = Vec::new();
    for w in Workload::CASES {
        let of: Vec<&Case> = cases.iter().filter(|c| c.workload == w).collect();
        let Some(min) = of.iter().map(|c| (c.processes, c.producers, c.consumers)).min() else { continue };
        out.extend(of.into_iter().filter(|c| (c.processes, c.producers, c.consumers) == min).cloned());
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dim {
    Producers,
    Consumers,
    Processes,
}

impl Dim {
    fn name(self) -> &'static str {
        match self {
            Dim::Producers => "producers",
            Dim::Consumers => "consumers",
            Dim::Processes => "processes",
        }
    }
    fn of(self, c: &Case) -> usize {
        match self {
            Dim::Producers => c.producers,
            Dim::Consumers => c.consumers,
            Dim::Processes => c.processes,
        }
    }
}

/// The cases of `w` that vary along `dim` with the other two counts at
/// their smallest.
fn scale_points(cases: &[Case], w: Workload, dim: Dim) -> Vec<&Case> {
    let of: Vec<&Case> = cases.iter().filter(|c| c.workload == w).collect();
    let others = |c: &Case| -> (usize, usize) {
        match dim {
            Dim::Producers => (c.processes, c.consumers),
            Dim::Consumers => (c.processes, c.producers),
            Dim::Processes => (c.producers, c.consumers),
        }
    };
    let Some(min) = of.iter().map(|c| others(c)).min() else { return Vec::new() };
    of.into_iter().filter(|c| others(c) == min).collect()
}

fn color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 10] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x7f, 0x7f, 0x7f),
        RGBColor(0xbc, 0xbd, 0x22),
        RGBColor(0x17, 0xbe, 0xcf),
    ];
    COLORS[i % COLORS.len()]
}

/// A log-scale range that holds every value.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.filter(|v| *v > 0.0).fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi <= 0.0 {
        return 0.1..10.0;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    lo..hi
}

/// Grouped bars: one group per workload, one bar per backend, log scale.
fn bars(
    path: &Path,
    title: &str,
    unit: &str,
    backends: &[String],
    cases: &[Case],
    value: impl Fn(&Case) -> (f64, Option<f64>),
) -> Result<(), CliError> {
    let workloads: Vec<Workload> =
        Workload::CASES.into_iter().filter(|w| cases.iter().any(|c| c.workload == *w)).collect();
    let whole = SVGBackend::new(path, (1180, 520)).into_drawing_area();
    whole.fill(&WHITE).map_err(|e| chart_error(path, e))?;
    let (root, side) = whole.split_horizontally(920);
    let all: Vec<(String, usize)> = backends.iter().cloned().zip(0..).collect();
    legend(path, &side, &all, false)?;
    let range = log_range(cases.iter().flat_map(|c| {
        let (v, dot) = value(c);
        std::iter::once(v).chain(dot)
    }));
    let floor = range.start;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..workloads.len() as f64, range.log_scale())
        .map_err(|e| chart_error(path, e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .light_line_style(TRANSPARENT)
        .y_desc(unit)
        .y_label_formatter(&|v| human(*v))
        .draw()
        .map_err(|e| chart_error(path, e))?;
    let width = 0.8 / backends.len().max(1) as f64;
    for (b, backend) in backends.iter().enumerate() {
        let c = color(b);
        let mine: Vec<(f64, f64, Option<f64>)> = workloads
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                cases.iter().find(|x| x.workload == *w && &x.backend == backend).map(|x| {
                    let (v, dot) = value(x);
                    (0.1 + i as f64 + b as f64 * width, v.max(floor), dot)
                })
            })
            .collect();
        chart
            .draw_series(mine.iter().map(|&(x, v, _)| Rectangle::new([(x, floor), (x + width * 0.9, v)], c.filled())))
            .map_err(|e| chart_error(path, e))?;
        chart
            .draw_series(mine.iter().filter_map(|&(x, _, dot)| {
                dot.map(|d| Circle::new((x + width * 0.45, d.max(floor)), 3, BLACK.filled()))
            }))
            .map_err(|e| chart_error(path, e))?;
    }
    for (i, w) in workloads.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, floor));
        root.draw(&Text::new(
            w.name(),
            (px - 4 * i32::try_from(w.name().len()).unwrap_or(0), py + 10),
            ("sans-serif", 15),
        ))
        .map_err(|e| chart_error(path, e))?;
    }
    whole.present().map_err(|e| chart_error(path, e))?;
    Ok(())
}

/// The backends' colors, one per line, in `area` (beside a chart).
fn legend<DB: DrawingBackend>(
    path: &Path,
    area: &DrawingArea<DB, plotters::coord::Shift>,
    backends: &[(String, usize)],
    lines: bool,
) -> Result<(), CliError> {
    for (i, (b, color_index)) in backends.iter().enumerate() {
        let y = 60 + 22 * i32::try_from(i).unwrap_or(0);
        let c = color(*color_index);
        if lines {
            area.draw(&PathElement::new(vec![(4, y), (22, y)], c.stroke_width(3))).map_err(|e| chart_error(path, e))?;
        } else {
            area.draw(&Rectangle::new([(4, y - 6), (18, y + 6)], c.filled())).map_err(|e| chart_error(path, e))?;
        }
        area.draw(&Text::new(b.as_str(), (28, y - 7), ("sans-serif", 13))).map_err(|e| chart_error(path, e))?;
    }
    Ok(())
}

/// A scale curve: events/s (left) and p99 (right) against a count, one
/// line per backend, both axes log scale.
fn scale(path: &Path, w: Workload, dim: Dim, backends: &[String], points: &[&Case]) -> Result<(), CliError> {
    let whole = SVGBackend::new(path, (1360, 460)).into_drawing_area();
    whole.fill(&WHITE).map_err(|e| chart_error(path, e))?;
    let (root, side) = whole.split_horizontally(1100);
    // Colors stay those of the backend's place in the whole report.
    let shown: Vec<(String, usize)> =
        backends.iter().cloned().zip(0..).filter(|(b, _)| points.iter().any(|c| &c.backend == b)).collect();
    legend(path, &side, &shown, true)?;
    let panels = root.split_evenly((1, 2));
    // x is log2 of the count, labelled with the counts.
    let top = points.iter().map(|c| dim.of(c)).max().unwrap_or(1).max(2);
    let xmax = (top as f64).log2();
    for (panel, (title, unit)) in panels.iter().zip([("events/s", "events/s"), ("p99 latency", "ms")]) {
        let ys = points.iter().map(|c| if unit == "ms" { c.latency.p99_us as f64 / 1000.0 } else { c.events_per_sec });
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{} {title} by {}", w.name(), dim.name()), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.25f64..xmax + 0.25, log_range(ys).log_scale())
            .map_err(|e| chart_error(path, e))?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            .x_desc(dim.name())
            .y_desc(unit)
            .x_labels(top.ilog2() as usize + 3)
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 0.01 && *v >= 0.0 {
                    format!("{}", 2f64.powf(v.round()))
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| human(*v))
            .draw()
            .map_err(|e| chart_error(path, e))?;
        for (backend, b) in &shown {
            let mut line: Vec<(f64, f64)> = points
                .iter()
                .filter(|c| &c.backend == backend)
                .map(|c| {
                    let y = if unit == "ms" { c.latency.p99_us as f64 / 1000.0 } else { c.events_per_sec };
                    ((dim.of(c) as f64).log2(), y)
                })
                .collect();
            if line.is_empty() {
                continue;
            }
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let c = color(*b);
            chart.draw_series(LineSeries::new(line.clone(), c.stroke_width(2))).map_err(|e| chart_error(path, e))?;
            chart
                .draw_series(line.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(|e| chart_error(path, e))?;
        }
    }
    whole.present().map_err(|e| chart_error(path, e))?;
    Ok(())
}

/// 12345 → `12.3k`, 0.5 → `0.5`.
fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn markdown(run: &Run, cases: &[Case], charts: &[(&str, &str)], scales: &[(Workload, Dim, String)]) -> String {
    let mut s = String::new();
    let m = &run.machine;
    let _ = writeln!(s, "# Backends and peers side by side\n");
    let _ = writeln!(
        s,
        "Written by `rheo-bench --report` (`scripts/bench-peers` runs it: see\n[docs/benchmarks.md](../benchmarks.md)). Every figure is one case of\n`rheo-bench` (or of `pgbench` / `redis-benchmark` where the tool column\nsays so); where a case ran several rounds, the round with the median\nevents/s is shown.\n\nA row marked (peer) is not a Rheo backend: bare Redis Streams (`XADD`;\n`XREADGROUP` + `XACK`), a hand-written PostgreSQL `FOR UPDATE SKIP LOCKED`\nqueue (it inserts payloads the client sends, one or 100 a statement;\nclaims up to 100 with a lease, receiving their payloads, then `DELETE`s\nthem), `XADD` from `redis-benchmark`.\nThey keep no leases to fence, no retries, dead letters or contiguous\nfrontier: what a user would build by hand instead. \"vs native\" is the\nrow's events/s over native's in the same configuration.\n"
    );
    let _ = writeln!(s, "## Machine\n");
    let _ = writeln!(s, "- {} × {}, {} GiB, Linux {}", m.cpus, m.cpu, m.memory_gib, m.kernel);
    let _ = writeln!(s, "- rheo {}; run started {}", m.rheo, m.started_at);
    let loads: Vec<f64> = run.cases.iter().map(|c| c.load).collect();
    if !loads.is_empty() {
        let (lo, hi) = loads.iter().fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let _ = writeln!(s, "- 1-minute load average at the end of the cases: {lo:.2}–{hi:.2}");
    }
    let _ = writeln!(s, "\n## Raw fsync rate of the disk, in the same run\n");
    let _ = writeln!(
        s,
        "256-byte write + `fdatasync`, one probe (1 s by default) before each durable backend's cases, on\nthe disk under it, each shown in its cases' fsync/s column; the spread of all of them:\n"
    );
    let _ = writeln!(
        s,
        "| pattern | probes | from | to | fdatasync/s (min / median / max) | p99 (median) |\n|---|---:|---|---|---|---:|"
    );
    for pattern in [Pattern::Overwrite, Pattern::Append] {
        let mut of: Vec<&super::probe::FsyncProbe> = run.fsync.iter().filter(|p| p.pattern == pattern).collect();
        if of.is_empty() {
            continue;
        }
        of.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
        let mut p99: Vec<u64> = of.iter().map(|p| p.latency.p99_us).collect();
        p99.sort_unstable();
        let from = of.iter().map(|p| p.at.as_str()).min().unwrap_or("");
        let to = of.iter().map(|p| p.at.as_str()).max().unwrap_or("");
        let name = if pattern == Pattern::Overwrite { "overwrite" } else { "append" };
        let _ = writeln!(
            s,
            "| {name} | {} | {from} | {to} | {:.0} / {:.0} / {:.0} | {} |",
            of.len(),
            of[0].per_sec,
            of[(of.len() - 1) / 2].per_sec,
            of[of.len() - 1].per_sec,
            ms(p99[(p99.len() - 1) / 2])
        );
    }
    for (title, file) in charts {
        let _ = writeln!(s, "\n## {title}\n\n![{title}]({file})");
    }
    for w in Workload::CASES {
        let of: Vec<&Case> = cases.iter().filter(|c| c.workload == w).collect();
        if of.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n## `{}`\n\nLatency: {}.\n", w.name(), w.latency_of());
        let _ = writeln!(
            s,
            "| backend | tool | proc | prod | cons | batch | events | events/s | vs native | p50 | p99 | max | fsync/s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for c in &of {
            let native = of.iter().find(|n| {
                n.backend == "native"
                    && (n.processes, n.producers, n.consumers, n.batch, n.partitions, n.streams, n.payload_bytes)
                        == (c.processes, c.producers, c.consumers, c.batch, c.partitions, c.streams, c.payload_bytes)
            });
            let ratio = native
                .map_or_else(|| "".to_owned(), |n| format!("{:.2}×", c.events_per_sec / n.events_per_sec.max(1e-9)));
            let _ = writeln!(
                s,
                "| {}{} | {} | {} | {} | {} | {} | {} | {:.0} | {ratio} | {} | {} | {} | {} |",
                c.backend,
                if c.peer { " (peer)" } else { "" },
                c.tool,
                c.processes,
                c.producers,
                c.consumers,
                c.batch,
                c.events,
                c.events_per_sec,
                ms(c.latency.p50_us),
                ms(c.latency.p99_us),
                ms(c.latency.max_us),
                c.fsync_per_sec.map_or_else(|| "-".to_owned(), |f| format!("{f:.0}")),
            );
        }
        for (sw, dim, file) in scales {
            if *sw == w {
                let _ = writeln!(s, "\n![{} by {}]({file})", w.name(), dim.name());
            }
        }
    }
    if !run.skipped.is_empty() {
        let _ = writeln!(s, "\n## Not run\n");
        for k in &run.skipped {
            let _ = writeln!(s, "- {k}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::stats::Summary;
    use super::*;

    fn case(backend: &str, w: Workload, producers: usize, rate: f64, round: usize) -> Case {
        Case {
            backend: backend.to_owned(),
            url: format!("{backend}:"),
            stream: "s".to_owned(),
            peer: false,
            tool: "rheo-bench".to_owned(),
            workload: w,
            processes: 1,
            producers,
            consumers: 1,
            batch: 100,
            payload_bytes: 200,
            partitions: 4,
            streams: 1,
            events: 1000,
            ops: 10,
            secs: 1000.0 / rate,
            events_per_sec: rate,
            latency_of: w.latency_of().to_owned(),
            latency: Summary { p50_us: 1000, p99_us: 5000, max_us: 9000 },
            fsync_per_sec: Some(5000.0),
            durable: true,
            load: 1.0,
            round,
            round_trips: None,
        }
    }

    #[test]
    fn medians_pick_the_middle_round_per_configuration() {
        let cases = vec![
            case("native", Workload::Append, 1, 30.0, 0),
            case("native", Workload::Append, 1, 10.0, 1),
            case("native", Workload::Append, 1, 20.0, 2),
            case("native", Workload::Append, 8, 99.0, 0),
        ];
        let m = medians(&cases);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].events_per_sec, m[0].round), (20.0, 2));
        assert_eq!(m[1].producers, 8);
    }

    #[test]
    fn a_report_has_its_tables_and_charts() {
        let mut cases = Vec::new();
        for (b, f) in [("native", 1.0), ("sqlite", 0.25)] {
            for p in [1, 16] {
                cases.push(case(b, Workload::Append, p, 1000.0 * f * p as f64, 0));
            }
            cases.push(case(b, Workload::Consume, 0, 5000.0 * f, 0));
        }
        let run = Run {
            machine: super::super::probe::Machine::read(),
            fsync: Vec::new(),
            cases,
            skipped: vec!["query on x: not supported".to_owned()],
        };
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path(), &run).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["throughput.svg", "latency.svg", "scale-append-producers.svg", "backends.md"]);
        let md = std::fs::read_to_string(dir.path().join("backends.md")).unwrap();
        assert!(md.contains("| sqlite | rheo-bench | 1 | 16 | 1 | 100 | 1000 | 4000 | 0.25× |"), "{md}");
        assert!(md.contains("- query on x: not supported"));
        let svg = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("sqlite") && svg.contains("append"), "{svg}");
    }
}
