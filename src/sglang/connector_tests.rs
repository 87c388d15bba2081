//! The SGLang connector's placement and run, with a shell script standing
//! in for the driver (no Python): records reach the judge in the cases'
//! order while the batch folder exists, and the driver's failures are the
//! batch's errors.

use std::path::PathBuf;

use super::*;
use crate::driver::{scratch_for, DriverError, NixlRun};

fn case(prompt_len: u32) -> Case {
    crate::sglang::one_layer_test_case(prompt_len, 3)
}

/// `/bin/sh` running `script` (given the batch folder as `$1`) as the driver.
fn fake_driver(script: &str) -> (SglangPython, PathBuf) {
    let dir = scratch_for("sglang-fake-driver");
    std::fs::create_dir_all(&dir).expect("scratch");
    let driver = dir.join("driver.sh");
    std::fs::write(&driver, script).expect("driver");
    let python = SglangPython {
        python: "/bin/sh".into(),
        driver,
        nixl: NixlRun::StandIn,
    };
    (python, dir)
}

/// What the judge saw of a record: the prompt, whether the case's folder
/// existed, and the driver's status or the ending without a result.
fn seen(record: SglangRecord) -> (u32, bool, String) {
    let prompt = record.case.prompt_len;
    match record.run {
        Ok(run) => (prompt, run.folder.is_dir(), run.result.status),
        Err(outcome) => (prompt, false, outcome.to_outcome().describe()),
    }
}

fn run_with(script: &str, cases: &[Case]) -> Result<Vec<(u32, bool, String)>, BatchError> {
    let (python, dir) = fake_driver(script);
    let connector = SglangConnector {
        python: &python,
        traces: None,
    };
    let placed = connector.place(cases);
    let judged = connector.run(cases, placed, &seen);
    let _ = std::fs::remove_dir_all(dir);
    judged
}

#[test]
fn placement_is_the_batch_preparation_numbered_in_the_cases_order() {
    let cases = [case(5), case(9), case(5)];
    let placed = place(&cases);
    assert_eq!(placed.len(), 3);
    for (i, (c, p)) in cases.iter().zip(&placed).enumerate() {
        let p = p.as_ref().expect("placed");
        let want = batch::prepare(c, i).expect("prepared");
        assert_eq!(p.id, want.id);
        assert!(p.id.starts_with(&format!("{i:04}-")), "{}", p.id);
        assert_eq!(p.placement.prefill_pages, want.placement.prefill_pages);
        assert_eq!(p.placement.decode_pages, want.placement.decode_pages);
    }
    assert_eq!(placed[1].as_ref().expect("placed").placement.prompt_len, 9);
}

#[test]
fn each_record_reaches_the_judge_in_order_while_its_folder_exists() {
    // Results for every case folder, in the reverse of the cases' order.
    let script = format!(
        "for d in $(ls -r \"$1\"); do [ -f \"$1/$d/prefill-0.r0.in\" ] && \
         printf '{{\"format\": \"{RESULT_FORMAT}\", \"status\": \"rejected\", \"message\": \"m\"}}' \
         > \"$1/$d/result.json\"; done; exit 0\n"
    );
    let judged = run_with(&script, &[case(5), case(9), case(1)]).expect("runs");
    assert_eq!(
        judged,
        vec![
            (5, true, "rejected".to_string()),
            (9, true, "rejected".to_string()),
            (1, true, "rejected".to_string()),
        ]
    );
}

#[test]
fn a_case_without_a_readable_result_is_not_run_naming_why() {
    // The first case writes a result of another format, the others none.
    let script = "d=$(ls \"$1\" | grep '^0000-'); \
                  printf '{\"format\": \"other/1\", \"status\": \"done\"}' > \"$1/$d/result.json\"\n";
    let judged = run_with(script, &[case(5), case(9)]).expect("runs");
    assert_eq!(judged.len(), 2);
    assert!(
        !judged[0].1 && judged[0].2.contains("\"other/1\""),
        "{judged:?}"
    );
    assert!(judged[1].2.contains("wrote no"), "{judged:?}");
    assert!(judged[1].2.contains("result.json"), "{judged:?}");
}

#[test]
fn the_drivers_failures_are_the_batchs_errors() {
    let drift = run_with(
        "echo '  - sglang.srt.disaggregation.nixl.conn' >&2; exit 3\n",
        &[case(5)],
    );
    match drift {
        Err(BatchError::Driver(DriverError::ApiDrift { missing, .. })) => {
            assert_eq!(missing, ["sglang.srt.disaggregation.nixl.conn"])
        }
        other => panic!("{other:?}"),
    }
    match run_with("echo 'no module named sglang' >&2; exit 1\n", &[case(5)]) {
        Err(BatchError::Driver(DriverError::Failed {
            status,
            stderr_tail,
            ..
        })) => {
            assert_eq!(status, Some(1));
            assert_eq!(stderr_tail, "no module named sglang");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn judge_record_reports_an_ending_without_a_result_as_the_case_outcome() {
    let c = case(5);
    let judged = judge_record(SglangRecord {
        case: c.clone(),
        run: Err(RunOutcome::Hung {
            message: "stopped".into(),
        }),
    });
    assert_eq!(judged.report.case.prompt_len, 5);
    assert!(
        matches!(judged.report.outcome, crate::scenario::Outcome::Hung { .. }),
        "{:?}",
        judged.report.outcome
    );
    assert_eq!(judged.layout_checked, 0);
    assert!(judged.versions.is_none());
}
