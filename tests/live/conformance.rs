//! The conformance test (`tests/support/conformance.rs`) for the driven
//! connectors: vLLM's own (the pinned release, in `.vllm-venv`) and
//! SGLang's (`.sglang-venv`), each skipped, with the reason, without its
//! venv. kvgeom's and the replay connector's are in `tests/cli/conformance.rs`.

use crate::support::conformance::{conformance, vllm_stack_cases, Connector, Lifecycle, OneCase};
use crate::support::{skip, vllm_install_command, vllm_venv_python};

/// The pinned vLLM runs the cases kvgeom's twin of it runs in the CLI's
/// conformance test, held to the same expectations file.
#[test]
fn vllms_connector_conforms() {
    let test = "vllms_connector_conforms";
    let release = kvgeom::under_test::Release::pinned();
    let python = vllm_venv_python(release.version);
    if !python.exists() {
        return skip(
            test,
            format_args!(
                "vLLM {} is not installed at {} (run {})",
                release.version,
                python.display(),
                vllm_install_command(release.version)
            ),
        );
    }
    let expectations = release.expectations;
    let (passing, failing) = vllm_stack_cases();
    conformance(&Connector {
        name: "vllm",
        options: vec!["--vllm-python".into(), python.display().to_string()],
        passing,
        failing,
        expectations,
        replay: "replay: kvgeom explain",
        refused: &["--memory", "vram"],
        lifecycle: Lifecycle::Refused("its driver runs one request per case"),
    });
}

/// SGLang's pinned release on two of geometries/sglang/: replicated heads
/// written twice with identical bytes (a pass), and a V head smaller than
/// K's (a listed failure).
#[test]
fn sglangs_connector_conforms() {
    let test = "sglangs_connector_conforms";
    if let Err(why) = kvgeom::sglang::python::find(None) {
        return skip(
            test,
            format_args!("no SGLang venv ({why}; scripts/install-sglang.sh)"),
        );
    }
    conformance(&Connector {
        name: "sglang",
        options: Vec::new(),
        passing: OneCase::sglang("geometries/sglang/gqa-2heads-p4-d1.toml", 3),
        failing: OneCase::sglang("geometries/sglang/gqa-v-head-size-p1-d2.toml", 1),
        expectations: "expected/sglang-0.5.23.toml",
        replay: "replay: kvgeom explain",
        refused: &["--mode", "pull"],
        lifecycle: Lifecycle::Refused("its driver runs one request per case"),
    });
}
