//! Hostile and absurd inputs: each is refused with exit 2 and one message
//! naming the option or the file and field, the rule (the limit, or what is
//! allowed) and the value, each once, or it runs bounded. Where the message
//! is fixed, the test holds it whole. Every command runs under an address-space limit of 4 GiB
//! (so an attempt to allocate what the input asks for fails the test
//! instead of the machine) and a generous time-out that only guards against
//! a hang.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{scratch, skip, Run};

/// Address space each command may use, in KiB (`ulimit -v`).
const ADDRESS_SPACE_KIB: u64 = 4 << 20;
/// Far longer than any of these commands needs: it only catches a hang.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Run kvgeom with `args` from the project root, capped and guarded.
fn capped(args: &[&str]) -> Run {
    kvgeom_within(ADDRESS_SPACE_KIB, args)
}

/// [`capped`] under an address-space limit of `kib` KiB.
fn kvgeom_within(kib: u64, args: &[&str]) -> Run {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_kvgeom"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh runs");
    let started = Instant::now();
    loop {
        if let Some(_status) = child.try_wait().expect("wait") {
            break;
        }
        if started.elapsed() > HANG_GUARD {
            let _ = child.kill();
            panic!("kvgeom {args:?} hung (killed after {HANG_GUARD:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    Run {
        code: out.status.code(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn refused(args: &[&str], needles: &[&str]) {
    let run = capped(args);
    assert_eq!(run.code, Some(2), "kvgeom {args:?}:\n{}", run.text);
    for needle in needles {
        assert!(
            run.text.contains(needle),
            "kvgeom {args:?}: no `{needle}` in:\n{}",
            run.text
        );
    }
    assert!(
        !run.text.contains("panicked"),
        "kvgeom {args:?} panicked:\n{}",
        run.text
    );
}

/// Refused with exactly `error: {message}` and nothing else: the option or
/// file, the field, the rule and the value appear once each, as written.
fn refused_with(args: &[&str], message: &str) {
    let run = capped(args);
    assert_eq!(run.code, Some(2), "kvgeom {args:?}:\n{}", run.text);
    assert_eq!(
        run.text.trim_end(),
        format!("error: {message}"),
        "kvgeom {args:?}"
    );
}

/// `needle` occurs exactly once in `text`.
fn once(text: &str, needle: &str) {
    assert_eq!(
        text.matches(needle).count(),
        1,
        "`{needle}` is not in this message exactly once:\n{text}"
    );
}

/// A small valid MLA geometry with `extra` lines spliced into its tables.
fn mla(model: &str, prefill: &str, decode: &str, top: &str) -> String {
    format!(
        "description = \"hostile\"\n{top}\n[model]\nlayer_slots = 2\ngroups = [\"attention\"]\n{model}\n\
         [model.attention]\nkind = \"mla\"\nhead_size = 8\ndtype_bytes = 2\n\
         [prefill]\ntp_size = 1\nkernel_block = 4\nlogical_block = 4\n{prefill}\n\
         [decode]\ntp_size = 1\nkernel_block = 4\nlogical_block = 4\n{decode}\n"
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const G1: &str = "geometries/g1-mla-kda-ppl3-vs-2.toml";

#[test]
fn command_line_values_are_bounded() {
    refused_with(
        &["explain", G1, "--prompt", "4294967295"],
        "--prompt 4294967295: a prompt length must be 1 to 1048576 tokens",
    );
    refused_with(
        &["sweep", G1, "--random", "0"],
        "--random 0: the number of cases to draw must be 1 to 10000000",
    );
    refused_with(
        &["sweep", G1, "--random", "1000000000"],
        "--random 1000000000: the number of cases to draw must be 1 to 10000000",
    );
    // Every command with --threads holds it to the same rule.
    for command in [&["sweep", G1][..], &["mutants", G1], &["bench", "sweep"]] {
        let mut args = command.to_vec();
        args.extend_from_slice(&["--threads", "0"]);
        refused_with(
            &args,
            "--threads 0: give at least 1 (or leave it out to use every core)",
        );
    }
    refused_with(
        &["sweep", G1, "--max-memory", "lots"],
        "--max-memory `lots`: not a size (e.g. 1.5G, 800M, 4096)",
    );
    refused_with(
        &["sweep", G1, "--max-memory", "0"],
        "--max-memory `0`: must be at least one byte",
    );
    refused_with(
        &["sweep", G1, "--max-memory", "99999999999T"],
        "--max-memory `99999999999T`: above the largest size, 16 EiB",
    );
    refused_with(
        &["explain", G1, "--prompt", "3", "--max-memory", "1.5X"],
        "--max-memory `1.5X`: unknown unit `x` (use K, M, G or T)",
    );
    refused_with(
        &["sweep", G1, "--shard", "3/2"],
        "--shard `3/2`: expected K/N with 1 <= K <= N, e.g. 2/4",
    );
    refused_with(
        &["sweep", G1, "--policy", "vllm"],
        "--policy vllm: unknown policy; known: kvgeom, vllm-0.33.0, vllm-0.34.0",
    );
    let run = capped(&["sweep", G1, "--defect", "no-such-bug"]);
    assert_eq!(run.code, Some(2), "{}", run.text);
    assert!(
        run.text.starts_with(
            "error: --defect no-such-bug: unknown defect; known: strict-prefix-tolerance, "
        ) && run
            .text
            .trim_end()
            .ends_with("(`kvgeom defects` describes them)")
            && run.text.lines().count() == 1,
        "{}",
        run.text
    );
    refused_with(
        &["bench", "vram", "--prompt", "0"],
        "--prompt 0: a prompt length must be 1 to 1048576 tokens",
    );
    refused_with(
        &["bench", "vram", "--memory", "host", "--iterations", "0"],
        "--iterations 0: give at least 1 timed iteration per path",
    );
    refused_with(
        &[
            "bench",
            "vram",
            "--memory",
            "host",
            "--paths",
            "copy,teleport",
        ],
        "--paths teleport: unknown path; known: copy, copy-per-pair, loopback, nixl, nixl-peer",
    );
    // `bench transport` takes --paths (its own names) and no other vram option.
    refused(
        &["bench", "transport", "--paths", "memcpy,copy"],
        &["unknown path \"copy\"", "known: memcpy, loopback, nixl-ucx"],
    );
    refused_with(
        &["bench", "transport", "--prompt", "5"],
        "--prompt: only `kvgeom bench vram` takes it",
    );
    refused(
        &["bench", "sweep", "--paths", "memcpy"],
        &["--paths applies to `kvgeom bench vram` and `kvgeom bench transport` only"],
    );
    refused_with(
        &["bench", "sweep", "--prompt", "3", "--op", "write"],
        "--prompt, --op: only `kvgeom bench vram` takes them",
    );
    // One case, one mode: `both` is refused rather than silently one of them.
    refused(
        &["explain", G1, "--prompt", "3", "--mode", "both"],
        &["invalid value 'both' for '--mode <MODE>'", "pull, push"],
    );
    refused(
        &["explain", G1, "--prompt", "3", "--alloc", "both"],
        &[
            "invalid value 'both' for '--alloc <ALLOC>'",
            "mainline, with-last-token",
        ],
    );
}

#[test]
fn prompt_lists_name_the_list_and_the_item_at_fault() {
    let list = |text: &str, rule: &str| {
        refused_with(
            &["sweep", G1, "--prompts", text],
            &format!("--prompts `{text}`: {rule} (expected e.g. `2..=39,41`)"),
        );
    };
    list("3,3", "prompt length 3 is listed twice");
    // A one-item list is named once; in a longer list the item is named too.
    list("abc", "not a prompt length");
    list("2,abc", "`abc` is not a prompt length");
    list("9..=2", "an empty range");
    list("2,9..=2", "`9..=2` is an empty range");
    list("0", "prompt lengths start at 1");
    list("2000000", "above the limit of 1048576 tokens");
    list(
        "1..=4294967295",
        "prompt length 4294967295 is above the limit of 1048576 tokens",
    );
    list("1..=200000", "more than the limit of 100000 prompt lengths");
}

#[test]
fn a_prefix_hit_names_the_option_the_file_and_the_field() {
    refused_with(
        &["explain", G1, "--prompt", "5", "--prefix-hit", "4"],
        &format!("--prefix-hit 4: {G1}: decode.prefix_caching is off, so the only prefix hit is 0"),
    );
    let cached = "geometries/llama-gqa-prefix-cache.toml";
    refused_with(
        &["explain", cached, "--prompt", "40", "--prefix-hit", "5"],
        &format!(
            "--prefix-hit 5: {cached}: must be a multiple of decode.logical_block (16) and \
             below the 40 transferred tokens"
        ),
    );
}

#[test]
fn derive_names_the_option_of_each_engine() {
    const LLAMA: &str = "tests/fixtures/models/llama-3.1-8b-test.json";
    let pair = |extra: &[&str], message: &str| {
        let mut args = vec![
            "derive",
            LLAMA,
            "--prefill-tp",
            "1",
            "--prefill-backend",
            "FLASH_ATTN",
            "--decode-tp",
            "1",
            "--decode-backend",
            "FLASH_ATTN",
        ];
        args.extend_from_slice(extra);
        refused_with(&args, message);
    };
    refused_with(
        &["derive", LLAMA, "--tp", "0", "--backend", "FLASH_ATTN"],
        "--tp 0: must be at least 1",
    );
    // The pair's own option is named, not the single-engine one.
    refused_with(
        &[
            "derive",
            LLAMA,
            "--prefill-tp",
            "1",
            "--prefill-backend",
            "FLASH_ATTN",
            "--decode-tp",
            "0",
            "--decode-backend",
            "FLASH_ATTN",
        ],
        "--decode-tp 0: must be at least 1",
    );
    pair(
        &["--decode-block-size", "0"],
        "--decode-block-size 0: must be at least 1",
    );
    pair(
        &["--decode-gpu", "sm80"],
        "--decode-gpu: unknown GPU `sm80`; supported: sm90 (Hopper), sm100 (Blackwell)",
    );
    refused_with(
        &["derive", LLAMA, "--tp", "1", "--backend", "XFORMERS"],
        "--backend: unknown attention backend `XFORMERS`; supported backends: FLASH_ATTN, \
         FLASHINFER, TRITON_ATTN, FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, FLASH_ATTN_MLA",
    );
    pair(
        &["--layer-slots", "100000"],
        "--layer-slots 100000: above the limit of 4096 layer slots",
    );
    pair(
        &["--layer-slots", "0"],
        "--layer-slots 0: must be at least 1",
    );
    pair(
        &["--prompts", "2,abc"],
        "--prompts `2,abc`: `abc` is not a prompt length (expected e.g. `2..=39,41`), or \
         `boundaries`",
    );
    pair(
        &["--name", "a b"],
        "--name `a b`: a geometry name is ASCII letters, digits, '-', '_' and '.'",
    );
    pair(
        &["--expect-rejection", "two\nlines"],
        "--expect-rejection \"two\\nlines\": must be one line",
    );
    let dir = scratch(module_path!(), "derive");
    let out = dir.join("no such dir").join("pair.toml");
    let out = out.to_str().unwrap();
    pair(
        &["--out", out],
        &format!("--out {out}: cannot write: No such file or directory (os error 2)"),
    );
    let stem = dir.join("two words.toml");
    let stem = stem.to_str().unwrap();
    pair(
        &["--out", stem],
        &format!(
            "--out {stem}: the geometry's name would be the file stem `two words`, but a \
             geometry name is ASCII letters, digits, '-', '_' and '.'; give --name"
        ),
    );
}

#[test]
fn a_huge_thread_count_is_capped_and_runs() {
    let run = capped(&["sweep", G1, "--prompts", "2", "--threads", "100000"]);
    assert_eq!(run.code, Some(0), "{}", run.text);
    assert!(
        run.text.contains("note: --threads 100000 capped at"),
        "{}",
        run.text
    );
}

#[test]
fn geometry_files_are_bounded() {
    let dir = scratch(module_path!(), "geometry");
    let slots = write(
        &dir,
        "slots.toml",
        &mla("", "", "", "prompts = [1]").replace("layer_slots = 2", "layer_slots = 1000000"),
    );
    refused_with(
        &["sweep", &slots],
        &format!("{slots}: model.layer_slots: 1000000 is above the limit of 4096"),
    );
    let tp = write(
        &dir,
        "tp.toml",
        &mla("", "", "", "prompts = [1]").replacen("tp_size = 1", "tp_size = 4294967295", 1),
    );
    refused_with(
        &["sweep", &tp],
        &format!("{tp}: prefill.tp_size: 4294967295 is above the limit of 1024"),
    );
    let pool = write(
        &dir,
        "pool.toml",
        &mla("", "num_logical_blocks = 4294967295", "", "prompts = [1]"),
    );
    refused_with(
        &["sweep", &pool],
        &format!("{pool}: prefill.num_logical_blocks: 4294967295 is above the limit of 16777216"),
    );
    let padding = write(
        &dir,
        "padding.toml",
        &mla("", "block_padding_bytes = 2147483648", "", "prompts = [1]"),
    );
    refused_with(
        &["sweep", &padding],
        &format!(
            "{padding}: prefill.block_padding_bytes: one rank's page of 2147483712 bytes \
             (logical block x attention bytes per token, with every kernel page's padding) \
             exceeds the limit of 1073741824 bytes"
        ),
    );
    // A page just under 1 GiB: valid, but its default sweep would be ~67
    // million prompt lengths.
    let big = write(
        &dir,
        "big-page.toml",
        &mla("", "", "", "").replace(
            "kernel_block = 4\nlogical_block = 4",
            "kernel_block = 67108864\nlogical_block = 67108864",
        ),
    );
    refused_with(
        &["sweep", &big],
        &format!(
            "{big}: without a `prompts` list the default sweep runs every length from 1 to \
             134217729 (one past the largest logical plus kernel block), more than the limit \
             of 100000 prompt lengths; list the lengths to run in `prompts` or give --prompts"
        ),
    );
    // The same file with one explicit length fits the page rule but not
    // memory: the case, its estimate, the option and its value, what to do.
    let run = capped(&["sweep", &big, "--prompts", "1", "--max-memory", "1G"]);
    assert_eq!(run.code, Some(2), "{}", run.text);
    assert!(
        run.text
            .starts_with("error: big-page N=1 h=0 pull mainline: needs about ")
            && run.text.lines().count() == 1,
        "{}",
        run.text
    );
    for needle in [
        "more than --max-memory 1.0 GiB;",
        "run a shorter prompt",
        "or raise --max-memory",
    ] {
        once(&run.text, needle);
    }
    // A pool too small for the request names the field and the length, in
    // a sweep and in explain alike.
    let small = write(
        &dir,
        "small-pool.toml",
        &mla("", "num_logical_blocks = 1", "", "prompts = [100]"),
    );
    let message = format!(
        "{small}: prefill.num_logical_blocks = 1 cannot hold the request's 25 logical blocks \
         at 100 tokens; raise prefill.num_logical_blocks to at least 25, leave it out to size \
         the pool from the request, or run shorter prompts"
    );
    refused_with(&["sweep", &small], &message);
    refused_with(&["explain", &small, "--prompt", "100"], &message);
    // A TOML error points at the line, names the field and the file once.
    let typo = write(
        &dir,
        "typo.toml",
        &mla("", "", "", "prompts = [1]").replace("layer_slots", "layer_slotz"),
    );
    let run = capped(&["sweep", &typo]);
    assert_eq!(run.code, Some(2), "{}", run.text);
    assert!(run
        .text
        .starts_with(&format!("error: {typo}: TOML parse error at line ")));
    once(&run.text, &typo);
    once(
        &run.text,
        "unknown field `layer_slotz`, expected one of `layer_slots`, `state_slots`, `groups`, `attention`, `mamba`",
    );
}

#[test]
fn files_that_are_not_regular_or_too_large_are_refused() {
    refused_with(
        &["sweep", "/dev/zero"],
        "/dev/zero: not a regular file (a folder, FIFO, device or socket); give a file",
    );
    refused_with(
        &["sweep", G1, "--prompts", "2", "--expect", "/dev/zero"],
        "/dev/zero: not a regular file (a folder, FIFO, device or socket); give a file",
    );
    let dir = scratch(module_path!(), "files");
    let missing = dir.join("missing.toml").display().to_string();
    refused_with(
        &["sweep", &missing],
        &format!("{missing}: cannot read: No such file or directory (os error 2)"),
    );
    refused_with(
        &["sweep", G1, "--prompts", "2", "--expect", &missing],
        &format!("{missing}: cannot read: No such file or directory (os error 2)"),
    );
    // A trace's error names the file once, with the line where there is one.
    let trace = dir.join("missing.jsonl").display().to_string();
    refused_with(
        &["check-trace", &trace],
        &format!("{trace}: cannot read: No such file or directory (os error 2)"),
    );
    let not_json = write(&dir, "text.jsonl", "hello\n");
    refused_with(
        &["diff-trace", &not_json],
        &format!("{not_json}:1: not valid JSON: expected value at line 1 column 1"),
    );
    let empty = scratch(module_path!(), "files-empty");
    refused_with(
        &["check-trace", empty.to_str().unwrap()],
        &format!(
            "{}: no *.jsonl or *.jsonl.gz trace files in this folder or its subfolders",
            empty.display()
        ),
    );
    refused_with(
        &["sweep", empty.to_str().unwrap()],
        &format!(
            "{}: no *.toml geometry files in this folder",
            empty.display()
        ),
    );
    // An expectations file that is not one: the parser's message, the file
    // once, and no trailing blank line.
    let run = capped(&["sweep", G1, "--prompts", "2", "--expect", G1]);
    assert_eq!(run.code, Some(2), "{}", run.text);
    assert!(
        run.text
            .starts_with(&format!("error: {G1}: TOML parse error at line "))
            && !run.text.ends_with("\n\n"),
        "{:?}",
        run.text
    );
    once(&run.text, G1);
    once(&run.text, "unknown field `description`, expected `failure`");
    // What report merge is given must be a report, of a bounded size.
    refused_with(
        &["report", "merge", G1],
        &format!(
            "{G1}: neither a JSON nor a JUnit sweep report: it starts with `#`; a JSON report \
             starts with `{{`, a JUnit report with `<`"
        ),
    );
    refused_with(
        &["report", "merge", "/dev/zero"],
        "/dev/zero: not a regular file (a folder, FIFO, device or socket); give a file",
    );
    // A symlink loop named like a geometry file is reported, not skipped.
    let looped = dir.join("loop.toml");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    refused(&["sweep", dir.to_str().unwrap()], &["loop.toml"]);
    std::fs::remove_file(&looped).unwrap();
    // A folder link back up the tree: the recursive search ends.
    let up = dir.join("up");
    std::os::unix::fs::symlink(&dir, &up).unwrap();
    refused(
        &["sweep", dir.to_str().unwrap()],
        &["no *.toml geometry files in this folder"],
    );
    std::fs::remove_file(&up).unwrap();
    // A FIFO: refused at once, never read (a read would block).
    let fifo = dir.join("fifo.toml");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        refused_with(
            &["sweep", fifo.to_str().unwrap()],
            &format!(
                "{}: not a regular file (a folder, FIFO, device or socket); give a file",
                fifo.display()
            ),
        );
    } else {
        println!("skipped the FIFO case: mkfifo is not available");
    }
    // A gzip bomb: 100 MiB of zeros in a few hundred KiB.
    let bomb = dir.join("bomb.jsonl.gz");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&bomb).unwrap(),
        flate2::Compression::best(),
    );
    let zeros = vec![b'\n'; 1 << 20];
    for _ in 0..100 {
        gz.write_all(&zeros).unwrap();
    }
    gz.finish().unwrap();
    refused_with(
        &["check-trace", bomb.to_str().unwrap()],
        &format!(
            "{}: larger than the input limit of 67108864 bytes once decompressed",
            bomb.display()
        ),
    );
}

#[test]
fn the_report_never_overwrites_an_input() {
    refused_with(
        &["sweep", G1, "--prompts", "2", "--out", G1],
        &format!("--out {G1}: that is an input of this sweep; write the report elsewhere"),
    );
    // Named another way, the input is named as well.
    let other = format!("./{G1}");
    refused_with(
        &["sweep", G1, "--prompts", "2", "--out", &other],
        &format!(
            "--out {other}: that is an input of this sweep ({G1}); write the report elsewhere"
        ),
    );
}

#[test]
fn an_unwritable_output_names_its_option() {
    let dir = scratch(module_path!(), "outputs");
    let out = dir.join("no such dir").join("report.xml");
    let out = out.to_str().unwrap();
    let why = "cannot write: No such file or directory (os error 2)";
    refused_with(
        &[
            "sweep",
            G1,
            "--prompts",
            "2",
            "--format",
            "junit",
            "--out",
            out,
        ],
        &format!("--out {out}: {why}"),
    );
    refused_with(
        &["explain", G1, "--prompt", "2", "--svg", out],
        &format!("--svg {out}: {why}"),
    );
}

/// Exit 2 under an address-space limit of `kib` KiB, with one `error:` line
/// holding every needle: never a signal (an aborted allocation) nor a
/// panic.
fn refused_within(kib: u64, args: &[&str], needles: &[&str]) {
    let run = kvgeom_within(kib, args);
    assert_eq!(
        run.code,
        Some(2),
        "kvgeom {args:?} (ulimit -v {kib}):\n{}",
        run.text
    );
    let errors: Vec<&str> = run
        .text
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "kvgeom {args:?}: one error line:\n{}",
        run.text
    );
    for needle in needles {
        assert!(
            errors[0].contains(needle),
            "kvgeom {args:?}: no `{needle}` in:\n{}",
            run.text
        );
    }
    assert!(!run.text.contains("panicked"), "{}", run.text);
    assert!(!run.text.contains("Traceback"), "{}", run.text);
}

/// 3 GiB of address space, in KiB.
const THREE_GIB_KIB: u64 = 3 << 20;

/// Every command that allocates KV memory goes through the estimate and
/// the budget under an address-space limit: a case the limit cannot hold
/// is exit 2 naming the case, the bytes and what to raise, before anything
/// of its size is allocated (the geometries need gigabytes by arithmetic;
/// none is really allocated).
#[test]
fn every_allocating_command_keeps_within_an_address_space_limit() {
    let dir = scratch(module_path!(), "address-space");
    // Pages of 64 Mi tokens x 16 bytes = 1 GiB: a valid geometry whose
    // smallest case needs tens of GiB.
    let big = write(
        &dir,
        "big-page.toml",
        &mla("", "", "", "prompts = [1]").replace(
            "kernel_block = 4\nlogical_block = 4",
            "kernel_block = 67108864\nlogical_block = 67108864",
        ),
    );
    let limit = [
        "needs about ",
        "address-space limit leaves (ulimit -v 3.0 GiB",
        "raise the address-space limit",
    ];
    let mut case = limit.to_vec();
    case.push("big-page N=1 h=0 pull mainline: ");
    refused_within(THREE_GIB_KIB, &["sweep", &big], &case);
    refused_within(THREE_GIB_KIB, &["mutants", &big], &case);
    refused_within(THREE_GIB_KIB, &["explain", &big, "--prompt", "1"], &case);
    let mut long = limit.to_vec();
    long.push("big-page N=100000 h=0 pull mainline: ");
    refused_within(
        THREE_GIB_KIB,
        &["explain", &big, "--prompt", "100000"],
        &long,
    );
    // A smaller --max-memory is the budget, and named.
    refused_within(
        THREE_GIB_KIB,
        &["mutants", &big, "--max-memory", "1G"],
        &[
            "big-page N=1 h=0 pull mainline: ",
            "more than --max-memory 1.0 GiB;",
        ],
    );
    // bench vram: a 256 MiB SSM state per page; the copy path alone needs
    // gigabytes. Refused naming the benchmark, its request and the bytes.
    let ssm = write(
        &dir,
        "ssm.toml",
        "description = \"a 256 MiB SSM state\"\n[model]\nlayer_slots = 2\n\
         groups = [\"attention\", \"mamba\"]\n[model.attention]\nkind = \"mla\"\n\
         head_size = 576\ndtype_bytes = 2\n[model.mamba]\nkind = \"kda\"\n\
         conv_dims = [4096, 4096, 4096]\nconv_rows = 3\nconv_dtype_bytes = 2\n\
         ssm_state_bytes = 268435456\n[prefill]\ntp_size = 1\nkernel_block = 64\n\
         logical_block = 262144\n[decode]\ntp_size = 1\nkernel_block = 64\n\
         logical_block = 262144\n",
    );
    let vram = [
        "bench",
        "vram",
        "--geometry",
        &ssm,
        "--memory",
        "host",
        "--paths",
        "copy",
        "--prompt",
        "64",
    ];
    let bench = format!("error: bench vram {ssm} --prompt 64: needs about ");
    refused_within(
        THREE_GIB_KIB,
        &vram,
        &[&bench, "address-space limit leaves"],
    );
    let mut small = vram.to_vec();
    small.extend(["--max-memory", "100M"]);
    refused_within(
        THREE_GIB_KIB,
        &small,
        &[&bench, "more than --max-memory 100.0 MiB;"],
    );
    // 512 MiB pages of one-token kernel blocks: planning the request alone
    // holds 64 Mi descriptor rows (3 GiB); counted and refused before any
    // row is written.
    let rows = write(
        &dir,
        "rows.toml",
        &std::fs::read_to_string(&ssm)
            .unwrap()
            .replace("layer_slots = 2", "layer_slots = 8")
            .replace("head_size = 576", "head_size = 512")
            .replace("kernel_block = 64", "kernel_block = 1")
            .replace("logical_block = 262144", "logical_block = 524288"),
    );
    let mut planned = vram.to_vec();
    planned[3] = rows.as_str();
    refused_within(
        THREE_GIB_KIB,
        &planned,
        &[
            "cannot plan a 64-token request of rows: its 67109376 descriptor rows: needs about 3.0 GiB",
            "address-space limit leaves",
            "use a larger kernel block",
        ],
    );
    refused_within(
        THREE_GIB_KIB,
        &["bench", "transport", "--max-memory", "1G"],
        &["bench transport: needs about 2.0 GiB, more than --max-memory 1.0 GiB;"],
    );
    refused_within(
        THREE_GIB_KIB,
        &["bench", "sweep", "--max-memory", "1K"],
        &[
            "g1-mla-kda-ppl3-vs-2 N=2 h=0 pull with-last-token: ",
            "more than --max-memory 1.0 KiB;",
        ],
    );
    refused_within(
        THREE_GIB_KIB,
        &["bench", "scale"],
        &[
            "deepseek-v3-p8-d2-16k N=16384 ",
            "address-space limit leaves",
        ],
    );
    // A recorded trace rebuilds its case within the budget too.
    let trace = "tests/fixtures/live-traces-vllm-0.33.0/\
                 mamba2-replicated-groups-p4-d2-pull-n13-hit0-mainline-s0.trace.json.gz";
    for command in ["check-trace", "diff-trace"] {
        refused_within(
            THREE_GIB_KIB,
            &[command, trace, "--max-memory", "1K"],
            &[
                "rebuilding the case: mamba2-replicated-groups-p4-d2 N=13 h=0 pull mainline: ",
                "more than --max-memory 1.0 KiB;",
            ],
        );
    }
}

/// The prefill ranks no transfer touches get no memory, so a case whose
/// every rank would not fit the address space runs when the ranks it
/// touches do: P TP16 -> D TP1 on MLA reads one prefill rank, 2 of 17
/// ranks of 64 MiB (every rank's arenas would be 1.06 GiB, more than the
/// 1 GiB limit).
#[test]
fn untouched_ranks_take_no_address_space() {
    let dir = scratch(module_path!(), "untouched");
    let wide = write(
        &dir,
        "wide.toml",
        &mla(
            "",
            "num_logical_blocks = 262144",
            "num_logical_blocks = 262144",
            "prompts = [8]",
        )
        .replace("layer_slots = 2", "layer_slots = 1")
        .replacen("tp_size = 1", "tp_size = 16", 1)
        .replace("head_size = 8", "head_size = 32"),
    );
    let run = kvgeom_within(
        1 << 20,
        &["sweep", &wide, "--mode", "pull", "--alloc", "mainline"],
    );
    assert_eq!(run.code, Some(0), "{}", run.text);
    // Real NIXL and device memory need every rank: refused, naming them.
    refused_within(
        1 << 20,
        &["sweep", &wide, "--mode", "pull", "--memory", "vram"],
        &[
            "the arenas of every rank: prefill 16 ranks x 64.0 MiB",
            "address-space limit leaves",
        ],
    );
}

/// A vLLM driver that cannot start under an address-space limit (torch
/// cannot map its libraries) is one line and exit 2, never a traceback;
/// skipped where the project's vLLM venv is not installed.
#[test]
fn a_live_driver_short_of_address_space_is_one_line() {
    let python = std::env::var_os("KVGEOM_VLLM_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".vllm-venv/bin/python"));
    if !python.is_file() {
        skip(
            "a_live_driver_short_of_address_space_is_one_line",
            format_args!(
                "no vLLM interpreter at {} (scripts/install-vllm.sh)",
                python.display()
            ),
        );
        return;
    }
    refused_within(
        1 << 20,
        &[
            "sweep",
            G1,
            "--prompts",
            "3",
            "--mode",
            "pull",
            "--alloc",
            "mainline",
            "--connector",
            "vllm",
        ],
        &[
            "cannot run within the memory this process may use: ",
            "raise the address-space limit",
        ],
    );
    // kvgeom's own preparation is held to --max-memory before a driver starts.
    refused_within(
        ADDRESS_SPACE_KIB,
        &[
            "sweep",
            G1,
            "--prompts",
            "3",
            "--mode",
            "pull",
            "--alloc",
            "mainline",
            "--connector",
            "vllm",
            "--max-memory",
            "1K",
        ],
        &[
            "g1-mla-kda-ppl3-vs-2 N=3 h=0 pull mainline: ",
            "more than --max-memory 1.0 KiB;",
        ],
    );
}

/// A reader that goes away after the first line (`kvgeom check-trace DIR |
/// head -1`) ends the command quietly with a closed pipe's status, 141,
/// never a panic.
#[test]
fn a_closed_output_pipe_ends_the_command_without_a_panic() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let mut child = crate::support::kvgeom_command()
        .args(["check-trace", "tests/fixtures"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvgeom starts");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("one line");
    // The reader is gone: every later line meets a closed pipe.
    let out = child.wait_with_output().expect("kvgeom ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(first.contains("trace"), "{first}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}

/// SGLang's `[model.state]` is bounded as vLLM's fields are, and an SGLang
/// case's memory (the driver's pools included) goes through the estimate
/// and the budget: enormous state tensors are exit 2 naming the fields or
/// the case, for `sweep` and `explain`, under a 3 GiB address-space limit,
/// before any interpreter is looked for.
#[test]
fn sglang_state_is_bounded_and_within_the_budget() {
    let dir = scratch(module_path!(), "sglang-state");
    let read = |name: &str| {
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("geometries/sglang")
                .join(name),
        )
        .unwrap()
    };
    let mamba2 = read("hybrid-mamba2-1group-p1-d2.toml");
    let kda = read("hybrid-kda-mla-p1-d2.toml");
    let huge_mamba2 = write(
        &dir,
        "huge-mamba2.toml",
        &mamba2
            .replace("conv_kernel = 4\n", "conv_kernel = 4000000\n")
            .replace("ssm_state_size = 8\n", "ssm_state_size = 8000000\n")
            .replace("head_dim = 4\n", "head_dim = 4000\n"),
    );
    let huge_kda = write(
        &dir,
        "huge-kda.toml",
        &kda.replace("num_heads = 4\n", "num_heads = 4000000\n")
            .replace("head_dim = 4\n", "head_dim = 4000\n"),
    );
    // Within every per-layer bound, but 5 slots x 3 layers of a 4-million
    // step conv window on three ranks: tens of GiB.
    let long_window = write(
        &dir,
        "long-window.toml",
        &mamba2.replace("conv_kernel = 4\n", "conv_kernel = 4000000\n"),
    );
    for (file, needles) in [
        (
            &huge_mamba2,
            vec![
                "huge-mamba2.toml: model.state: one layer's conv channels \
                 (num_heads x head_dim + 2 x n_groups x ssm_state_size) is 16032000, \
                 more than the limit of 1048576",
            ],
        ),
        (
            &huge_kda,
            vec![
                "huge-kda.toml: model.state: one layer's conv channels \
                 (num_heads x head_dim + 2 x num_k_heads x head_k_dim) is 48000000000, \
                 more than the limit of 1048576",
            ],
        ),
        (
            &long_window,
            vec![
                "long-window N=5 h=0 push mainline: needs about 32.2 GiB",
                "for SGLang's pools in the driver",
                "address-space limit leaves (ulimit -v 3.0 GiB",
            ],
        ),
    ] {
        refused_within(
            THREE_GIB_KIB,
            &["sweep", "--connector", "sglang", file, "--prompts", "5"],
            &needles,
        );
        refused_within(
            THREE_GIB_KIB,
            &["explain", "--connector", "sglang", file, "--prompt", "5"],
            &needles,
        );
    }
    // A smaller --max-memory is the budget, and named.
    refused_within(
        THREE_GIB_KIB,
        &[
            "explain",
            "--connector",
            "sglang",
            &long_window,
            "--prompt",
            "5",
            "--max-memory",
            "1G",
        ],
        &[
            "long-window N=5 h=0 push mainline: ",
            "more than --max-memory 1.0 GiB;",
        ],
    );
}
