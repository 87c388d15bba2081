//! `kvgeom sweep`, `kvgeom explain` and `kvgeom lifecycle` for the chosen
//! connector under test: the options that do not apply to it refused, then
//! its command.

use super::lifecycle::LifecycleArgs;
use super::pipeline::PipelineConnector;
use super::{ConnectorArg, ExplainArgs, SweepArgs, EXIT_BAD_INPUT};

/// The connector `--connector` names, for the one sweep: the only place
/// that names the connectors.
pub(crate) fn build(connector: ConnectorArg) -> Box<dyn PipelineConnector> {
    match connector {
        ConnectorArg::Replay => Box::new(super::replay::ReplayPipeline::new()),
        ConnectorArg::Sglang => Box::new(super::sglang::SglangPipeline::new()),
        ConnectorArg::Vllm => Box::new(super::live::VllmPipeline::new()),
        ConnectorArg::Kvgeom => Box::new(super::kvgeom::KvgeomPipeline::new()),
    }
}

/// `kvgeom sweep`: the one sweep over the chosen connector, once the
/// options of another connector are refused.
pub fn sweep(args: SweepArgs) -> u8 {
    if let Some(why) = args.run.refused_for_kvgeom() {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    super::pipeline::sweep(build(args.run.connector), args)
}

/// `kvgeom explain`: the chosen connector's case, once the options that do
/// not apply to it are refused.
pub fn explain(args: ExplainArgs) -> u8 {
    if let Some(why) = args.run.refused_for_kvgeom() {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    super::pipeline::explain(build(args.run.connector), args)
}

/// `kvgeom lifecycle`: the chosen connector's scenarios, through its
/// lifecycle half.
pub fn lifecycle(args: LifecycleArgs) -> u8 {
    let connector = args.connector;
    super::lifecycle::lifecycle(build(connector), connector, args)
}
