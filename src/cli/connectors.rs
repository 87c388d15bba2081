//! `kvgeom sweep` and `kvgeom explain` for the chosen connector under test:
//! the options that do not apply to it refused, then its command.

use super::{ConnectorArg, ExplainArgs, SweepArgs, EXIT_BAD_INPUT};

/// `kvgeom sweep`: the chosen connector's sweep, once the options that do
/// not apply to it are refused.
pub fn sweep(args: SweepArgs) -> u8 {
    if let Some(why) = args.run.refused_for_kvgeom() {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    if args.run.connector != ConnectorArg::Vllm {
        for (given, option) in [
            (args.plan_differences.is_some(), "--plan-differences"),
            (args.compare_policy.is_some(), "--compare-policy"),
        ] {
            if given {
                eprintln!(
                    "error: {option}: applies to the plans of vLLM's connector; add --connector vllm"
                );
                return EXIT_BAD_INPUT;
            }
        }
    }
    match args.run.connector {
        ConnectorArg::Vllm => super::live_sweep(args),
        ConnectorArg::Replay => super::replay_sweep(args),
        ConnectorArg::Kvgeom => super::sweep::kvgeom_sweep(args),
        ConnectorArg::Sglang => super::sglang::sglang_sweep(args),
    }
}

/// `kvgeom explain`: the chosen connector's case, once the options that do
/// not apply to it are refused.
pub fn explain(args: ExplainArgs) -> u8 {
    if let Some(why) = args.run.refused_for_kvgeom() {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    match args.run.connector {
        ConnectorArg::Vllm => super::live_explain(args),
        ConnectorArg::Replay => super::replay_explain(args),
        ConnectorArg::Kvgeom => super::explain::kvgeom_explain(args),
        ConnectorArg::Sglang => super::sglang::sglang_explain(args),
    }
}
