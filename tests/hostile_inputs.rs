//! Hostile and absurd inputs: each is refused with exit 2 and a message
//! naming the option or the file and field, the limit and the value, or it
//! runs bounded. Every command runs under an address-space limit of 4 GiB
//! (so an attempt to allocate what the input asks for fails the test
//! instead of the machine) and a generous time-out that only guards against
//! a hang.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Address space each command may use, in KiB (`ulimit -v`).
const ADDRESS_SPACE_KIB: u64 = 4 << 20;
/// Far longer than any of these commands needs: it only catches a hang.
const HANG_GUARD: Duration = Duration::from_secs(120);

struct Run {
    code: Option<i32>,
    text: String,
}

/// Run kvgeom with `args` from the project root, capped and guarded.
fn kvgeom(args: &[&str]) -> Run {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {ADDRESS_SPACE_KIB} && exec \"$0\" \"$@\""
        ))
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
    let run = kvgeom(args);
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

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    refused(
        &["explain", G1, "--prompt", "4294967295"],
        &["--prompt 4294967295", "1 to 1048576 tokens"],
    );
    refused(&["sweep", G1, "--random", "0"], &["--random 0", "1 to"]);
    refused(
        &["sweep", G1, "--random", "1000000000"],
        &["--random 1000000000", "10000000"],
    );
    refused(&["sweep", G1, "--threads", "0"], &["--threads 0"]);
    refused(
        &["sweep", G1, "--prompts", "3,3"],
        &["--prompts", "prompt length 3 is listed twice"],
    );
    refused(
        &["sweep", G1, "--prompts", "1..=4294967295"],
        &["--prompts", "above the limit of 1048576 tokens"],
    );
    refused(
        &["sweep", G1, "--prompts", "1..=200000"],
        &["--prompts", "more than the limit of 100000 prompt lengths"],
    );
    refused(
        &["sweep", G1, "--max-memory", "lots"],
        &["--max-memory", "not a size"],
    );
    refused(
        &["sweep", G1, "--shard", "3/2"],
        &["--shard", "1 <= K <= N"],
    );
    refused(&["bench", "vram", "--prompt", "0"], &["--prompt 0"]);
    refused(
        &["bench", "transport", "--paths", "copy"],
        &["apply to `kvgeom bench vram` only"],
    );
    // One case, one mode: `both` is refused rather than silently one of them.
    refused(
        &["explain", G1, "--prompt", "3", "--mode", "both"],
        &["both"],
    );
    refused(
        &["explain", G1, "--prompt", "3", "--alloc", "both"],
        &["both"],
    );
}

#[test]
fn a_huge_thread_count_is_capped_and_runs() {
    let run = kvgeom(&["sweep", G1, "--prompts", "2", "--threads", "100000"]);
    assert_eq!(run.code, Some(0), "{}", run.text);
    assert!(
        run.text.contains("note: --threads 100000 capped at"),
        "{}",
        run.text
    );
}

#[test]
fn geometry_files_are_bounded() {
    let dir = scratch("geometry");
    let slots = write(
        &dir,
        "slots.toml",
        &mla("", "", "", "prompts = [1]").replace("layer_slots = 2", "layer_slots = 1000000"),
    );
    refused(
        &["sweep", &slots],
        &[
            "slots.toml",
            "model.layer_slots",
            "1000000 is above the limit of 4096",
        ],
    );
    let tp = write(
        &dir,
        "tp.toml",
        &mla("", "", "", "prompts = [1]").replacen("tp_size = 1", "tp_size = 4294967295", 1),
    );
    refused(
        &["sweep", &tp],
        &["tp.toml", "prefill.tp_size", "above the limit of 1024"],
    );
    let pool = write(
        &dir,
        "pool.toml",
        &mla("", "num_logical_blocks = 4294967295", "", "prompts = [1]"),
    );
    refused(
        &["sweep", &pool],
        &["pool.toml", "prefill.num_logical_blocks", "above the limit"],
    );
    let padding = write(
        &dir,
        "padding.toml",
        &mla("", "block_padding_bytes = 2147483648", "", "prompts = [1]"),
    );
    refused(
        &["sweep", &padding],
        &[
            "padding.toml",
            "prefill.block_padding_bytes",
            "exceeds the limit of 1073741824 bytes",
        ],
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
    refused(
        &["sweep", &big],
        &[
            "big-page.toml",
            "without a `prompts` list",
            "more than the limit of 100000",
        ],
    );
    // The same file with one explicit length fits the page rule but not memory.
    refused(
        &["sweep", &big, "--prompts", "1", "--max-memory", "1G"],
        &[
            "needs about",
            "more than --max-memory 1.0 GiB",
            "shorter prompt",
        ],
    );
    // A pool too small for the request names the field and the length.
    let small = write(
        &dir,
        "small-pool.toml",
        &mla("", "num_logical_blocks = 1", "", "prompts = [100]"),
    );
    refused(
        &["sweep", &small],
        &[
            "small-pool.toml",
            "prefill.num_logical_blocks = 1",
            "at 100 tokens",
        ],
    );
}

#[test]
fn files_that_are_not_regular_or_too_large_are_refused() {
    refused(
        &["sweep", "/dev/zero"],
        &["/dev/zero", "not a regular file"],
    );
    let dir = scratch("files");
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
        refused(
            &["sweep", fifo.to_str().unwrap()],
            &["fifo.toml", "not a regular file"],
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
    refused(
        &["check-trace", bomb.to_str().unwrap()],
        &[
            "bomb.jsonl.gz",
            "larger than the input limit of 67108864 bytes",
        ],
    );
}

#[test]
fn the_report_never_overwrites_an_input() {
    refused(
        &["sweep", G1, "--prompts", "2", "--out", G1],
        &["--out", "that is an input of this sweep"],
    );
}
