//! Every field the driver passes by keyword to vLLM's request metadata
//! (`ReqMeta(...)`, `RemoteMeta(...)`, built by the direct path) is a row
//! of vllm-driver/api_check.py's `FIELDS`, so that a vLLM that renamed or
//! dropped one is refused with its name before any case runs. Python-free:
//! it reads the driver's files (test files left out).

use std::path::PathBuf;

/// vLLM's request-metadata classes the driver builds.
const CLASSES: [&str; 2] = ["ReqMeta", "RemoteMeta"];

/// (file, class, keyword) for every keyword argument of a call of one of
/// `CLASSES` in `sources`: the identifiers followed by one `=` at the call's
/// own nesting level (a nested call's keywords are its own).
fn keywords(sources: &[(String, String)]) -> Vec<(String, String, String)> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (file, text) in sources {
        let chars: Vec<char> = text.chars().collect();
        for class in CLASSES {
            let call: Vec<char> = format!("{class}(").chars().collect();
            let mut i = 0;
            while i + call.len() <= chars.len() {
                let starts =
                    chars[i..i + call.len()] == call[..] && (i == 0 || !ident(chars[i - 1]));
                if !starts {
                    i += 1;
                    continue;
                }
                let mut depth = 1;
                let mut j = i + call.len();
                while j < chars.len() && depth > 0 {
                    match chars[j] {
                        '(' | '[' | '{' => depth += 1,
                        ')' | ']' | '}' => depth -= 1,
                        c if depth == 1 && ident(c) && !ident(chars[j - 1]) => {
                            let word: String =
                                chars[j..].iter().take_while(|c| ident(**c)).collect();
                            let after = j + word.len();
                            let rest: String = chars[after..].iter().take(3).collect();
                            let rest = rest.trim_start();
                            if rest.starts_with('=') && !rest.starts_with("==") {
                                let row = (file.clone(), class.to_string(), word.clone());
                                if !out.contains(&row) {
                                    out.push(row);
                                }
                            }
                            j = after;
                            continue;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                i = j;
            }
        }
    }
    out
}

/// The keywords of `keywords` that `api_check` (its text) has no `FIELDS`
/// row for (`"CLASS", "FIELD"`).
fn unchecked(sources: &[(String, String)], api_check: &str) -> Vec<String> {
    keywords(sources)
        .into_iter()
        .filter(|(_, class, field)| !api_check.contains(&format!("\"{class}\", \"{field}\"")))
        .map(|(file, class, field)| format!("{file}: {class}.{field}"))
        .collect()
}

#[test]
fn api_check_lists_every_request_metadata_field_the_driver_passes() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vllm-driver");
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".py") && !name.starts_with("test_") && name != "api_check.py" {
            sources.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
    sources.sort();
    let check = std::fs::read_to_string(dir.join("api_check.py")).unwrap();
    let found: Vec<String> = keywords(&sources)
        .into_iter()
        .map(|(_, class, field)| format!("{class}.{field}"))
        .collect();
    // The scan finds the fields of both classes, and nothing of a call's
    // values (the nested RemoteMeta's keywords are RemoteMeta's).
    for expected in [
        "ReqMeta.local_block_ids",
        "ReqMeta.remote",
        "ReqMeta.awaiting_kvs",
        "RemoteMeta.num_tokens",
    ] {
        assert!(found.iter().any(|f| f == expected), "{expected}: {found:?}");
    }
    assert!(
        !found.iter().any(|f| f == "ReqMeta.num_tokens"),
        "{found:?}"
    );
    let missing = unchecked(&sources, &check);
    assert!(
        missing.is_empty(),
        "vllm-driver/api_check.py's FIELDS lacks: {missing:?}"
    );
    // A check without one row fails, naming it.
    for (class, field) in [("ReqMeta", "tp_size"), ("RemoteMeta", "engine_id")] {
        let row = format!("\"{class}\", \"{field}\"");
        assert!(check.contains(&row), "{row}");
        let without = check.replace(&row, &format!("\"{class}\", \"removed\""));
        let missing = unchecked(&sources, &without);
        assert!(
            missing
                .iter()
                .any(|m| m.ends_with(&format!("{class}.{field}"))),
            "{field}: {missing:?}"
        );
    }
}

#[test]
fn the_scan_reads_keywords_at_the_calls_own_level() {
    let src = "x = ReqMeta(a=1, b=f(c=2), remote=RemoteMeta(d=3), e == 4)\nMyReqMeta(z=1)\n";
    let found = keywords(&[("f.py".to_string(), src.to_string())]);
    let names: Vec<String> = found.iter().map(|(_, c, f)| format!("{c}.{f}")).collect();
    assert_eq!(
        names,
        ["ReqMeta.a", "ReqMeta.b", "ReqMeta.remote", "RemoteMeta.d"]
    );
}
