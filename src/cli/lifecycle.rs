//! `kvgeom lifecycle`: many requests at once on one P/D pair, scenario by
//! scenario through the chosen connector's lifecycle half
//! ([`super::pipeline::PipelineConnector::lifecycle`]), judged by the
//! lifecycle oracles; `--replay SEED` prints one scenario as a timeline;
//! `kvgeom bench lifecycle` times kvgeom's connector on them.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::pipeline::PipelineConnector;
use super::{default_paths, ConnectorArg, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::lifecycle::sweep::{self, GeometryResult, SweepOptions, VariantResult};
use crate::lifecycle::timeline;
use crate::lifecycle::{KvgeomScenarios, LifecycleError, ScenarioConnector};
use crate::lifecycle::{LifecycleDefect, LifecycleShape, LIFECYCLE_VARIANTS};
use crate::sweep::plan;

/// The JSON report's schema.
pub const LIFECYCLE_SCHEMA: &str = "kvgeom-lifecycle/1";

/// Longest run `--scenarios` takes per geometry.
const MAX_SCENARIOS: u32 = 1_000_000;
/// Most requests per scenario.
const MAX_REQUESTS: u32 = 64;

/// How `kvgeom lifecycle` prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LifecycleFormat {
    /// A table (or the timeline, with `--replay`).
    #[default]
    Text,
    /// The JSON report (schema `kvgeom-lifecycle/1`).
    Json,
}

/// The command line of `kvgeom lifecycle`.
#[derive(Clone, Debug, clap::Args)]
pub struct LifecycleArgs {
    /// Geometry files or folders (default: geometries/).
    pub paths: Vec<PathBuf>,
    /// Scenarios per geometry.
    #[arg(long, default_value_t = 100)]
    pub scenarios: u32,
    /// Requests per scenario (several in flight at once).
    #[arg(long, default_value_t = 4)]
    pub requests: u32,
    /// The run's seed; each scenario's own seed is drawn from it.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The connector under test: its half that runs several requests at
    /// once on shared pools (kvgeom's; the others say why they have none).
    #[arg(long, value_enum, default_value_t)]
    pub connector: ConnectorArg,
    /// Run kvgeom's connector with one lifecycle defect variant (see `kvgeom defects`).
    #[arg(long)]
    pub variant: Option<String>,
    /// Print the scenario of this seed (a failure's `scenario_seed`) as a
    /// timeline, shrunk if it fails; one geometry file.
    #[arg(long, value_name = "SCENARIO_SEED")]
    pub replay: Option<u64>,
    /// With --replay: print the failing scenario whole, not shrunk.
    #[arg(long)]
    pub no_shrink: bool,
    /// Output: text or json (schema `kvgeom-lifecycle/1`).
    #[arg(long, value_enum, default_value_t)]
    pub format: LifecycleFormat,
}

fn variant(name: Option<&str>) -> Result<Option<LifecycleDefect>, u8> {
    let Some(name) = name else {
        return Ok(None);
    };
    match LifecycleDefect::from_name(name) {
        Some(d) => Ok(Some(d)),
        None => {
            let known: Vec<_> = LIFECYCLE_VARIANTS.iter().map(|v| v.name).collect();
            eprintln!(
                "error: --variant {name}: unknown lifecycle variant; known: {}",
                known.join(", ")
            );
            Err(EXIT_BAD_INPUT)
        }
    }
}

/// A geometry file loaded and its lifecycle shape, or why it has none.
pub(crate) struct Loaded {
    pub file: Option<PathBuf>,
    pub shape: Result<LifecycleShape, LifecycleError>,
}

pub(crate) fn load_shapes(paths: &[PathBuf]) -> Result<Vec<Loaded>, u8> {
    let sources = plan::load_sources(paths).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    Ok(sources
        .iter()
        .map(|s| Loaded {
            file: s.file.clone(),
            shape: LifecycleShape::of(&s.geometry),
        })
        .collect())
}

fn file_text(file: Option<&Path>, name: &str) -> String {
    file.map_or_else(|| name.to_string(), |f| f.display().to_string())
}

fn replay_command(
    file: &str,
    seed: u64,
    requests: u32,
    variant: Option<LifecycleDefect>,
    connector: Option<&str>,
) -> String {
    let mut c = format!("kvgeom lifecycle {file} --replay {seed}");
    if let Some(name) = connector.filter(|&n| n != "kvgeom") {
        c.push_str(&format!(" --connector {name}"));
    }
    if requests != 4 {
        c.push_str(&format!(" --requests {requests}"));
    }
    if let Some(v) = variant {
        c.push_str(&format!(" --variant {}", v.name()));
    }
    c
}

/// `kvgeom lifecycle [PATH...]` on `pipeline`, the connector `--connector`
/// names (`named`).
pub(crate) fn lifecycle(
    pipeline: Box<dyn PipelineConnector>,
    named: ConnectorArg,
    args: LifecycleArgs,
) -> u8 {
    if args.scenarios == 0 || args.scenarios > MAX_SCENARIOS {
        eprintln!(
            "error: --scenarios {}: give 1 to {MAX_SCENARIOS}",
            args.scenarios
        );
        return EXIT_BAD_INPUT;
    }
    if args.requests == 0 || args.requests > MAX_REQUESTS {
        eprintln!(
            "error: --requests {}: give 1 to {MAX_REQUESTS}",
            args.requests
        );
        return EXIT_BAD_INPUT;
    }
    if args.no_shrink && args.replay.is_none() {
        eprintln!("error: --no-shrink applies to --replay only");
        return EXIT_BAD_INPUT;
    }
    let defect = match variant(args.variant.as_deref()) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let connector = match pipeline.lifecycle(defect) {
        Ok(c) => c,
        Err(why) => {
            let name = clap::ValueEnum::to_possible_value(&named)
                .map_or_else(|| format!("{named:?}"), |v| v.get_name().to_string());
            eprintln!("error: --connector {name}: {why}");
            return EXIT_BAD_INPUT;
        }
    };
    let connector = connector.as_ref();
    let paths = match default_paths(args.paths.clone()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let loaded = match load_shapes(&paths) {
        Ok(l) => l,
        Err(code) => return code,
    };
    if let Some(seed) = args.replay {
        return replay(&args, &loaded, seed, connector);
    }
    let opts = SweepOptions {
        scenarios: args.scenarios,
        requests: args.requests,
        seed: args.seed,
    };
    let runnable: Vec<(&Loaded, &LifecycleShape)> = loaded
        .iter()
        .filter_map(|l| l.shape.as_ref().ok().map(|s| (l, s)))
        .collect();
    let total = runnable.len() as u64 * u64::from(args.scenarios);
    let bar = if std::io::stderr().is_terminal() && total > 1 {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} scenarios, {per_sec}, eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let results: Vec<_> = runnable
        .par_iter()
        .map(|(_, shape)| sweep::sweep_geometry(shape, &opts, connector, false, || bar.inc(1)))
        .collect();
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let mut done = Vec::new();
    for ((l, _), r) in runnable.iter().zip(results) {
        match r {
            Ok(r) => done.push((*l, r)),
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        }
    }
    if done.is_empty() {
        eprintln!("error: no geometry given has a lifecycle kvgeom models");
        for l in &loaded {
            if let Err(why) = &l.shape {
                eprintln!("  {why}");
            }
        }
        return EXIT_BAD_INPUT;
    }
    let failed = done.iter().any(|(_, r)| r.failed > 0);
    match args.format {
        LifecycleFormat::Text => print_table(&done, &loaded, &args, connector, seconds),
        LifecycleFormat::Json => {
            if let Err(code) = print_json(&done, &loaded, &args, connector) {
                return code;
            }
        }
    }
    if failed {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

fn print_table(
    done: &[(&Loaded, GeometryResult)],
    loaded: &[Loaded],
    args: &LifecycleArgs,
    connector: &dyn ScenarioConnector,
    seconds: f64,
) {
    let defect = connector.variant();
    outln!(
        "{:<48} {:>9} {:>7} {:>10}  oracles failed",
        "geometry",
        "scenarios",
        "failed",
        "operations"
    );
    let (mut scenarios, mut failed, mut operations) = (0u64, 0u64, 0u64);
    for (_, r) in done {
        let oracles = if r.oracles.is_empty() {
            "-".to_string()
        } else {
            r.oracles
                .iter()
                .map(|(o, n)| format!("{o} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        outln!(
            "{:<48} {:>9} {:>7} {:>10}  {oracles}",
            r.geometry,
            r.scenarios,
            r.failed,
            r.operations
        );
        scenarios += u64::from(r.scenarios);
        failed += u64::from(r.failed);
        operations += r.operations;
    }
    for l in loaded {
        if let Err(why) = &l.shape {
            outln!("not run: {why}");
        }
    }
    for (l, r) in done {
        let Some(f) = &r.first_failure else { continue };
        let file = file_text(l.file.as_deref(), &r.geometry);
        outln!(
            "\n{}: scenario {} fails; shrunk from {} to {} operation(s):",
            r.geometry,
            f.scenario_seed,
            f.operations,
            f.shrunk.operations.len()
        );
        for op in &f.shrunk.operations {
            outln!("    {op}");
        }
        for finding in &f.findings {
            outln!("  {}: {}", finding.oracle, finding.message);
        }
        outln!(
            "  replay: {}",
            replay_command(
                &file,
                f.scenario_seed,
                args.requests,
                defect,
                Some(connector.name())
            )
        );
    }
    let rate = operations as f64 / seconds.max(1e-9);
    outln!(
        "\n{} geometries, {scenarios} scenarios through {}'s connector, {operations} operations ({rate:.0}/s), {failed} failed (seed {}{})",
        done.len(),
        connector.name(),
        args.seed,
        defect.map_or(String::new(), |d| format!(", variant {}", d.name()))
    );
}

fn print_json(
    done: &[(&Loaded, GeometryResult)],
    loaded: &[Loaded],
    args: &LifecycleArgs,
    connector: &dyn ScenarioConnector,
) -> Result<(), u8> {
    let defect = connector.variant();
    let geometries: Vec<_> = done
        .iter()
        .map(|(l, r)| {
            let file = file_text(l.file.as_deref(), &r.geometry);
            serde_json::json!({
                "geometry": r.geometry,
                "file": l.file.as_ref().map(|f| f.display().to_string()),
                "scenarios": r.scenarios,
                "failed": r.failed,
                "operations": r.operations,
                "oracles": r.oracles.iter().map(|(o, n)| serde_json::json!({"oracle": o, "scenarios": n})).collect::<Vec<_>>(),
                "first_failure": r.first_failure.as_ref().map(|f| serde_json::json!({
                    "scenario_seed": f.scenario_seed,
                    "operations": f.operations,
                    "shrunk": f.shrunk.operations,
                    "findings": f.findings,
                    "replay": replay_command(&file, f.scenario_seed, args.requests, defect, Some(connector.name())),
                })),
            })
        })
        .collect();
    let not_run: Vec<_> = loaded
        .iter()
        .filter_map(|l| {
            l.shape.as_ref().err().map(|why| {
                serde_json::json!({
                    "file": l.file.as_ref().map(|f| f.display().to_string()),
                    "reason": why.to_string(),
                })
            })
        })
        .collect();
    let report = serde_json::json!({
        "schema": LIFECYCLE_SCHEMA,
        "connector": connector.name(),
        "seed": args.seed,
        "scenarios_per_geometry": args.scenarios,
        "requests": args.requests,
        "variant": defect.map(LifecycleDefect::name),
        "summary": {
            "geometries": done.len(),
            "scenarios": done.iter().map(|(_, r)| u64::from(r.scenarios)).sum::<u64>(),
            "failed": done.iter().map(|(_, r)| u64::from(r.failed)).sum::<u64>(),
            "operations": done.iter().map(|(_, r)| r.operations).sum::<u64>(),
        },
        "geometries": geometries,
        "not_run": not_run,
    });
    super::output::print_json_value(&report)
}

fn replay(
    args: &LifecycleArgs,
    loaded: &[Loaded],
    seed: u64,
    connector: &dyn ScenarioConnector,
) -> u8 {
    let defect = connector.variant();
    let [one] = loaded else {
        eprintln!(
            "error: --replay takes one geometry file ({} given)",
            loaded.len()
        );
        return EXIT_BAD_INPUT;
    };
    let shape = match &one.shape {
        Ok(s) => s,
        Err(why) => {
            eprintln!("error: {why}");
            return EXIT_BAD_INPUT;
        }
    };
    let scenario = sweep::scenario(shape, args.requests, seed);
    let result = connector.run(shape, &scenario).and_then(|run| {
        if run.failed() && !args.no_shrink {
            let oracle = run.findings[0].oracle;
            sweep::shrink_failure(shape, &scenario, connector, oracle).map(|(s, r)| (s, r, true))
        } else {
            Ok((scenario.clone(), run, false))
        }
    });
    let (shown, run, shrunk) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    match args.format {
        LifecycleFormat::Text => {
            outln!(
                "{}: scenario {seed} through {}'s connector, {} request(s), {} operation(s){}{}",
                shape.name,
                connector.name(),
                shown.requests,
                shown.operations.len(),
                if shrunk {
                    format!(" (shrunk from {})", scenario.operations.len())
                } else {
                    String::new()
                },
                defect.map_or(String::new(), |d| format!(", variant {}", d.name()))
            );
            out!("{}", timeline::render(&run));
            if run.failed() {
                outln!("\n{} finding(s):", run.findings.len());
                for f in &run.findings {
                    outln!("  step {}: {}: {}", f.step, f.oracle, f.message);
                }
            } else {
                outln!("\nevery oracle passed");
            }
        }
        LifecycleFormat::Json => {
            let report = serde_json::json!({
                "schema": LIFECYCLE_SCHEMA,
                "connector": connector.name(),
                "replay": {
                    "geometry": shape.name,
                    "scenario_seed": seed,
                    "requests": shown.requests,
                    "variant": defect.map(LifecycleDefect::name),
                    "shrunk": shrunk,
                    "operations": shown.operations,
                    "steps": run.steps,
                    "owners": timeline::owners_after_each_step(&run)
                        .into_iter()
                        .map(|owned| owned
                            .into_iter()
                            .map(|(block, request)| serde_json::json!({"block": block, "request": request}))
                            .collect::<Vec<_>>())
                        .collect::<Vec<_>>(),
                    "findings": run.findings,
                },
            });
            if let Err(code) = super::output::print_json_value(&report) {
                return code;
            }
        }
    }
    if run.failed() {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

/// Scenarios per geometry `kvgeom mutants` runs each lifecycle variant on,
/// at most (it stops at the first failing scenario).
pub const MUTANT_SCENARIOS: u32 = 300;

/// Every lifecycle variant over `paths`' geometries (`kvgeom mutants`).
pub(crate) fn lifecycle_mutants(paths: &[PathBuf]) -> Result<Vec<VariantResult>, u8> {
    let loaded = load_shapes(paths)?;
    let shapes: Vec<LifecycleShape> = loaded
        .iter()
        .filter_map(|l| l.shape.as_ref().ok().cloned())
        .collect();
    let file_of = |name: &str| {
        loaded.iter().find_map(|l| match &l.shape {
            Ok(s) if s.name == name => Some(file_text(l.file.as_deref(), name)),
            _ => None,
        })
    };
    let opts = SweepOptions {
        scenarios: MUTANT_SCENARIOS,
        requests: 4,
        seed: 0,
    };
    // One variant after another, on this thread: a few seconds, within
    // whatever --threads the connector's defects ran under.
    LifecycleDefect::ALL
        .iter()
        .map(|&d| {
            sweep::run_variant(&shapes, &opts, d).map(|mut r| {
                r.file = r.caught_by.as_ref().and_then(|(g, _)| file_of(g));
                r
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })
}

/// Scenarios per geometry `kvgeom bench lifecycle` times.
pub const BENCH_SCENARIOS: u32 = 200;

/// `kvgeom bench lifecycle`: scenario operations per second on one thread
/// over the geometry files directly in geometries/.
pub fn bench_lifecycle() -> u8 {
    let dir = match super::checkout::checkout_path("geometries") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        Err(e) => {
            eprintln!("error: {}: {e}", dir.display());
            return EXIT_BAD_INPUT;
        }
    };
    files.sort();
    let loaded = match load_shapes(&files) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let shapes: Vec<_> = loaded.into_iter().filter_map(|l| l.shape.ok()).collect();
    let opts = SweepOptions {
        scenarios: BENCH_SCENARIOS,
        requests: 4,
        seed: 0,
    };
    let started = Instant::now();
    let (mut operations, mut scenarios, mut failed) = (0u64, 0u64, 0u64);
    for shape in &shapes {
        match sweep::sweep_geometry(shape, &opts, &KvgeomScenarios::new(None), false, || {}) {
            Ok(r) => {
                operations += r.operations;
                scenarios += u64::from(r.scenarios);
                failed += u64::from(r.failed);
            }
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    outln!(
        "lifecycle: {} geometries of {}, {scenarios} scenarios of 4 requests, {operations} operations \
         in {seconds:.2} s on one thread: {:.0} operations/s, {:.0} scenarios/s, {failed} failed",
        shapes.len(),
        dir.display(),
        operations as f64 / seconds.max(1e-9),
        scenarios as f64 / seconds.max(1e-9),
    );
    if failed > 0 {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

/// The lifecycle variants, for `kvgeom defects`.
pub(crate) fn print_variants() {
    outln!("\nlifecycle variants (kvgeom lifecycle --variant NAME):");
    for v in &LIFECYCLE_VARIANTS {
        outln!("{:<40} {}", v.name, v.description);
        outln!("{:<40} models: {}", "", v.cites);
    }
}

/// The lifecycle variants' table of `kvgeom mutants`.
pub(crate) fn print_variant_results(results: &[VariantResult]) {
    outln!(
        "\nlifecycle variants (kvgeom lifecycle, up to {MUTANT_SCENARIOS} scenarios per geometry, seed 0)"
    );
    outln!(
        "{:<40} {:<7} {:>9}  oracles failed; first failing scenario",
        "variant",
        "result",
        "scenarios"
    );
    for r in results {
        let (verdict, first) = match &r.caught_by {
            Some((geometry, seed)) => (
                "caught",
                format!(
                    "{}; {geometry} scenario {seed}\n{:<60}replay: kvgeom lifecycle {} --replay {seed} --variant {}",
                    r.oracles.join(", "),
                    "",
                    r.file.as_deref().unwrap_or(geometry),
                    r.variant
                ),
            ),
            None => ("MISSED", "-".to_string()),
        };
        outln!("{:<40} {verdict:<7} {:>9}  {first}", r.variant, r.scenarios);
    }
    let missed = results.iter().filter(|r| r.caught_by.is_none()).count();
    outln!("\n{} caught, {missed} missed", results.len() - missed);
}

/// The lifecycle variants' part of `kvgeom mutants --format json`.
pub(crate) fn variant_results_json(results: &[VariantResult]) -> serde_json::Value {
    serde_json::json!(results
        .iter()
        .map(|r| serde_json::json!({
            "variant": r.variant,
            "cites": r.cites,
            "caught": r.caught_by.is_some(),
            "scenarios": r.scenarios,
            "oracles": r.oracles,
            "first_failing_scenario": r.caught_by.as_ref().map(|(g, s)| serde_json::json!({
                "geometry": g,
                "file": r.file,
                "scenario_seed": s,
                "replay": format!(
                    "kvgeom lifecycle {} --replay {s} --variant {}",
                    r.file.as_deref().unwrap_or(g),
                    r.variant
                ),
            })),
        }))
        .collect::<Vec<_>>())
}
