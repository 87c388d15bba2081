//! The fields every stack's geometry file shares (`name`, `description`,
//! `prompts`, `expect_rejection`): how they are read and how they are
//! written back. `file.rs` (vLLM's format) and `sglang_file.rs` (SGLang's)
//! both use them.

use std::collections::HashSet;
use std::fmt::{self, Write as _};

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::error::{Rule, Violation};
use super::model::AttentionSpec;
use super::pair::{ExpectedRejection, Geometry};

/// `expect_rejection`: one text for both modes, or a table naming the modes
/// (`{ pull = "...", push = "..." }`) in which the pair must be refused.
#[derive(Debug)]
pub(super) struct RejectionFile(pub(super) ExpectedRejection);

impl<'de> Deserialize<'de> for RejectionFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RejectionVisitor;
        impl<'de> Visitor<'de> for RejectionVisitor {
            type Value = RejectionFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string (both modes) or a table with `pull` and/or `push` strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RejectionFile, E> {
                Ok(RejectionFile(ExpectedRejection::both(v)))
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RejectionFile, A::Error> {
                let mut modes = ExpectedRejection::default();
                while let Some(key) = map.next_key::<String>()? {
                    let slot = match key.as_str() {
                        "pull" => &mut modes.pull,
                        "push" => &mut modes.push,
                        _ => return Err(de::Error::unknown_field(&key, &["pull", "push"])),
                    };
                    if slot.is_some() {
                        return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
                    }
                    *slot = Some(map.next_value()?);
                }
                Ok(RejectionFile(modes))
            }
        }
        deserializer.deserialize_any(RejectionVisitor)
    }
}

/// One entry of `prompts`: a length, or an inclusive range string `"2..=39"`.
#[derive(Debug)]
pub(super) enum PromptEntry {
    Length(i64),
    Range(String),
}

impl<'de> Deserialize<'de> for PromptEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl Visitor<'_> for EntryVisitor {
            type Value = PromptEntry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a prompt length or a range string like \"2..=39\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PromptEntry, E> {
                Ok(PromptEntry::Length(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PromptEntry, E> {
                Ok(PromptEntry::Length(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PromptEntry, E> {
                Ok(PromptEntry::Range(v.to_string()))
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}
/// Expand lengths and ranges in order; errors name the entry's index in the file.
pub(super) fn expand_prompts(entries: &[PromptEntry]) -> Result<Vec<u32>, Violation> {
    let mut spans = Vec::with_capacity(entries.len());
    let mut count: u64 = 0;
    for (i, entry) in entries.iter().enumerate() {
        let field = || format!("prompts[{i}]");
        let (start, end) = match entry {
            PromptEntry::Length(n) => (*n, *n),
            PromptEntry::Range(text) => parse_range(text)
                .ok_or_else(|| Violation::new(field(), Rule::BadRange { text: text.clone() }))?,
        };
        if start < 1 {
            return Err(Violation::new(field(), Rule::NotPositive { found: start }));
        }
        if end < start {
            return Err(Violation::new(field(), Rule::EmptyRange { start, end }));
        }
        let too_long = |found: i64| Violation::new(field(), Rule::PromptTooLong { found });
        let start = u32::try_from(start).map_err(|_| too_long(start))?;
        let end = u32::try_from(end).map_err(|_| too_long(end))?;
        count += u64::from(end - start) + 1;
        super::validate::prompt_count_within(count)?;
        spans.push((i, start, end));
    }
    let mut seen = HashSet::new();
    let mut lengths = Vec::with_capacity(count as usize);
    for (i, start, end) in spans {
        for length in start..=end {
            if !seen.insert(length) {
                return Err(Violation::new(
                    format!("prompts[{i}]"),
                    Rule::DuplicatePrompt { length },
                ));
            }
            lengths.push(length);
        }
    }
    Ok(lengths)
}

/// `"START..=END"` with optional spaces around the numbers.
pub(super) fn parse_range(text: &str) -> Option<(i64, i64)> {
    let (start, end) = text.split_once("..=")?;
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?))
}

/// Prompt lengths as file entries: runs of 3+ consecutive values become ranges.
pub(super) fn compress_prompts(prompts: &[u32]) -> Vec<String> {
    let mut entries = Vec::new();
    let mut i = 0;
    while i < prompts.len() {
        let mut j = i;
        while j + 1 < prompts.len() && prompts[j].checked_add(1) == Some(prompts[j + 1]) {
            j += 1;
        }
        if j - i >= 2 {
            entries.push(format!("\"{}..={}\"", prompts[i], prompts[j]));
            i = j + 1;
        } else {
            entries.push(prompts[i].to_string());
            i += 1;
        }
    }
    entries
}

pub(super) fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}
pub(super) fn list<T: ToString>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}
/// The fields every stack's file starts with: name (unless the file is
/// `named` by its path), description, prompts and the expected refusal.
pub(super) fn write_header(out: &mut String, g: &Geometry, named: bool) -> fmt::Result {
    if named {
        writeln!(out, "name = {}", quoted(&g.name))?;
    }
    writeln!(out, "description = {}", quoted(&g.description))?;
    if let Some(prompts) = &g.prompts {
        writeln!(out, "prompts = {}", list(compress_prompts(prompts)))?;
    }
    if let Some(expected) = &g.expect_rejection {
        match expected.in_both() {
            Some(text) => writeln!(out, "expect_rejection = {}", quoted(text))?,
            None => {
                let modes: Vec<String> = [("pull", &expected.pull), ("push", &expected.push)]
                    .into_iter()
                    .filter_map(|(mode, text)| Some(format!("{mode} = {}", quoted(text.as_ref()?))))
                    .collect();
                writeln!(out, "expect_rejection = {{ {} }}", modes.join(", "))?;
            }
        }
    }
    Ok(())
}

/// `model.attention.kind`, in both stacks' files.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum AttentionKind {
    Mla,
    Full,
}

/// The attention of a file: MLA takes no KV head count, full attention
/// needs one; each mismatch names `model.attention.total_kv_heads`.
pub(super) fn attention_spec(
    kind: &AttentionKind,
    total_kv_heads: Option<u32>,
    head_size: u32,
    dtype_bytes: u32,
) -> Result<AttentionSpec, Violation> {
    const HEADS: &str = "model.attention.total_kv_heads";
    match (kind, total_kv_heads) {
        (AttentionKind::Mla, None) => Ok(AttentionSpec::Mla {
            head_size,
            dtype_bytes,
        }),
        (AttentionKind::Mla, Some(_)) => Err(Violation::new(HEADS, Rule::KvHeadsOnMla)),
        (AttentionKind::Full, Some(total_kv_heads)) => Ok(AttentionSpec::Full {
            total_kv_heads,
            head_size,
            dtype_bytes,
        }),
        (AttentionKind::Full, None) => Err(Violation::new(HEADS, Rule::MissingKvHeads)),
    }
}

/// `[model.attention]` of either stack's file; `v_head_size` is SGLang's
/// V head size where it differs from K's.
pub(super) fn write_attention(
    out: &mut String,
    attention: Option<&AttentionSpec>,
    v_head_size: Option<u32>,
) -> fmt::Result {
    match attention {
        Some(AttentionSpec::Mla {
            head_size,
            dtype_bytes,
        }) => {
            writeln!(out, "\n[model.attention]\nkind = \"mla\"")?;
            writeln!(out, "head_size = {head_size}\ndtype_bytes = {dtype_bytes}")
        }
        Some(AttentionSpec::Full {
            total_kv_heads,
            head_size,
            dtype_bytes,
        }) => {
            writeln!(out, "\n[model.attention]\nkind = \"full\"")?;
            writeln!(out, "total_kv_heads = {total_kv_heads}")?;
            writeln!(out, "head_size = {head_size}")?;
            if let Some(v) = v_head_size {
                writeln!(out, "v_head_size = {v}")?;
            }
            writeln!(out, "dtype_bytes = {dtype_bytes}")
        }
        None => Ok(()),
    }
}
