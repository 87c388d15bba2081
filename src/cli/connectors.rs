//! `kvgeom sweep` and `kvgeom explain` for the chosen connector under test:
//! the options that do not apply to it refused, then its command.

use super::{ConnectorArg, ExplainArgs, SweepArgs, EXIT_BAD_INPUT};

/// `kvgeom sweep`: the chosen connector's sweep, once the options that do
/// not apply to it are refused.
pub fn sweep(args: SweepArgs) -> u8 {
    let refusal = args.run.refused_for_kvgeom().or_else(|| {
        let dir = args.record_traces.as_ref()?;
        (args.run.connector == ConnectorArg::Kvgeom).then(|| {
            format!(
                "--record-traces {}: traces record vLLM's own connector; add --connector vllm",
                dir.display()
            )
        })
    });
    if let Some(why) = refusal {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    match args.run.connector {
        ConnectorArg::Vllm => super::live_sweep(args),
        ConnectorArg::Replay => super::replay_sweep(args),
        ConnectorArg::Kvgeom => super::sweep::kvgeom_sweep(args),
    }
}

/// `kvgeom explain`: the chosen connector's case, once the options that do
/// not apply to it are refused.
pub fn explain(args: ExplainArgs) -> u8 {
    let refusal = args.run.refused_for_kvgeom().or_else(|| {
        let file = args.record_trace.as_ref()?;
        (args.run.connector == ConnectorArg::Kvgeom).then(|| {
            format!(
                "--record-trace {}: traces record vLLM's own connector; add --connector vllm",
                file.display()
            )
        })
    });
    if let Some(why) = refusal {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    match args.run.connector {
        ConnectorArg::Vllm => super::live_explain(args),
        ConnectorArg::Replay => super::replay_explain(args),
        ConnectorArg::Kvgeom => super::explain::kvgeom_explain(args),
    }
}
