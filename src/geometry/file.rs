//! The TOML geometry file format: one geometry per file.
//!
//! [`parse_geometry`] reads a file's text into file structs (serde, unknown
//! fields refused), converts them into a [`Geometry`] and runs
//! [`validate`]. [`to_toml`] writes a geometry back
//! in the same format; the two round-trip. `docs/geometry-format.md`
//! describes the format for users.

use std::fmt::{self, Write as _};
use std::path::Path;

use serde::Deserialize;

use super::engine::EngineGeometry;
use super::error::{mamba_kind_name, GeometryError, Violation};
use super::file_fields::{
    attention_spec, expand_prompts, list, write_attention, write_header, AttentionKind,
    PromptEntry, RejectionFile,
};
use super::handshake_compat::{EngineCompat, HandshakeCompat};
use super::model::{AttentionSpec, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec};
use super::pair::Geometry;
use super::sglang_file::{renamed, write_sglang_toml, SglangGeometryFile};
use super::stack::Stack;
use super::validate::validate;

/// Parse and validate one geometry. `source` is the file path or another name
/// used in messages; its file stem is the default geometry name.
/// Files that name a model config (`[model] hf_config`) are read by
/// `derive::load_geometry_file`, which writes them in this plain format.
pub fn parse_geometry(source: &str, text: &str) -> Result<Geometry, GeometryError> {
    let syntax = |e: toml::de::Error| syntax_error(source, text, &e);
    let stack = toml::from_str::<StackOnly>(text).map_err(syntax)?.stack;
    let geometry = if stack == Some(Stack::Sglang) {
        let file: SglangGeometryFile = toml::from_str(text).map_err(syntax)?;
        let geometry = file
            .into_geometry(&default_name(source))
            .map_err(|v| v.in_file(source))?;
        validate(&geometry).map_err(|v| renamed(v, &geometry).in_file(source))?;
        geometry
    } else {
        let file: GeometryFile = toml::from_str(text).map_err(syntax)?;
        let geometry = file
            .into_geometry(&default_name(source))
            .map_err(|v| v.in_file(source))?;
        validate(&geometry).map_err(|v| v.in_file(source))?;
        geometry
    };
    Ok(geometry)
}

/// The one field that says which stack's format the rest of a file is in.
#[derive(Deserialize)]
struct StackOnly {
    #[serde(default)]
    stack: Option<Stack>,
}

/// Write `geometry` in the file format. `parse_geometry` of the result gives
/// back an equal geometry when `geometry` is valid. The name is always
/// written, defaults are left out, and runs of three or more consecutive
/// prompt lengths become `"START..=END"` ranges.
pub fn to_toml(geometry: &Geometry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = write_toml(&mut out, geometry, true);
    out
}

/// [`to_toml`] without the `name` line, for a file named by its path (an
/// SGLang pair `kvgeom derive` writes).
pub fn to_toml_named_by_path(geometry: &Geometry) -> String {
    let mut out = String::new();
    let _ = write_toml(&mut out, geometry, false);
    out
}

fn default_name(source: &str) -> String {
    Path::new(source)
        .file_stem()
        .map_or_else(|| source.to_string(), |s| s.to_string_lossy().into_owned())
}

fn syntax_error(source: &str, text: &str, error: &toml::de::Error) -> GeometryError {
    let position = error.span().map(|span| line_column(text, span.start));
    GeometryError::Syntax {
        file: source.to_string(),
        line: position.map(|(line, _)| line),
        column: position.map(|(_, column)| column),
        detail: error.to_string().trim_end().to_string(),
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GeometryFile {
    /// `"vllm"` when given (an `"sglang"` file is read by `sglang_file`).
    #[serde(default)]
    #[allow(dead_code)]
    stack: Option<Stack>,
    #[serde(default)]
    name: Option<String>,
    description: String,
    #[serde(default)]
    prompts: Option<Vec<PromptEntry>>,
    #[serde(default)]
    expect_rejection: Option<RejectionFile>,
    #[serde(default)]
    enforce_handshake_compat: Option<bool>,
    model: ModelFile,
    prefill: EngineFile,
    decode: EngineFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    layer_slots: u32,
    #[serde(default)]
    state_slots: Option<u32>,
    groups: Vec<GroupKind>,
    #[serde(default)]
    attention: Option<AttentionFile>,
    #[serde(default)]
    mamba: Option<MambaFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttentionFile {
    kind: AttentionKind,
    #[serde(default)]
    total_kv_heads: Option<u32>,
    head_size: u32,
    dtype_bytes: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MambaFile {
    kind: MambaKind,
    conv_dims: Vec<u32>,
    conv_rows: u32,
    conv_dtype_bytes: u32,
    ssm_state_bytes: u64,
    #[serde(default)]
    n_groups: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineFile {
    tp_size: u32,
    kernel_block: u32,
    logical_block: u32,
    #[serde(default)]
    num_logical_blocks: Option<u32>,
    #[serde(default = "default_layout")]
    layout: KvLayout,
    #[serde(default)]
    host_buffer: bool,
    #[serde(default)]
    prefix_caching: bool,
    #[serde(default)]
    block_padding_bytes: u64,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    kv_cache_dtype: Option<String>,
}

fn default_layout() -> KvLayout {
    KvLayout::Nhd
}

impl GeometryFile {
    fn into_geometry(self, default_name: &str) -> Result<Geometry, Violation> {
        let prompts = self.prompts.as_deref().map(expand_prompts).transpose()?;
        let (prefill, prefill_compat) = self.prefill.into_engine();
        let (decode, decode_compat) = self.decode.into_engine();
        Ok(Geometry {
            name: self.name.unwrap_or_else(|| default_name.to_string()),
            description: self.description,
            model: self.model.into_spec()?,
            prefill,
            decode,
            prompts,
            expect_rejection: self.expect_rejection.map(|r| r.0),
            handshake: HandshakeCompat {
                prefill: prefill_compat,
                decode: decode_compat,
                enforce: self.enforce_handshake_compat.unwrap_or(true),
            },
            stack: Stack::Vllm,
            sglang: None,
        })
    }
}

impl ModelFile {
    fn into_spec(self) -> Result<ModelSpec, Violation> {
        let attention = self.attention.map(AttentionFile::into_spec).transpose()?;
        Ok(ModelSpec {
            attention,
            mamba: self.mamba.map(|m| MambaSpec {
                kind: m.kind,
                conv_dims: m.conv_dims,
                conv_rows: m.conv_rows,
                conv_dtype_bytes: m.conv_dtype_bytes,
                ssm_state_bytes: m.ssm_state_bytes,
                n_groups: m.n_groups,
            }),
            groups: self.groups,
            layer_slots: self.layer_slots,
            state_slots: self.state_slots,
        })
    }
}

impl AttentionFile {
    fn into_spec(self) -> Result<AttentionSpec, Violation> {
        attention_spec(
            &self.kind,
            self.total_kv_heads,
            self.head_size,
            self.dtype_bytes,
        )
    }
}

impl EngineFile {
    /// The engine's geometry and its hashed settings.
    fn into_engine(self) -> (EngineGeometry, EngineCompat) {
        let compat = EngineCompat {
            backend: self.backend,
            kv_cache_dtype: self.kv_cache_dtype,
        };
        let engine = EngineGeometry {
            tp_size: self.tp_size,
            kernel_block: self.kernel_block,
            logical_block: self.logical_block,
            num_logical_blocks: self.num_logical_blocks,
            layout: self.layout,
            host_buffer: self.host_buffer,
            prefix_caching: self.prefix_caching,
            block_padding_bytes: self.block_padding_bytes,
        };
        (engine, compat)
    }
}

fn group_name(kind: GroupKind) -> &'static str {
    match kind {
        GroupKind::Attention => "\"attention\"",
        GroupKind::Mamba => "\"mamba\"",
    }
}

fn write_toml(out: &mut String, g: &Geometry, named: bool) -> fmt::Result {
    if g.stack == Stack::Sglang {
        return write_sglang_toml(out, g, named);
    }
    write_header(out, g, named)?;
    if !g.handshake.enforce {
        writeln!(out, "enforce_handshake_compat = false")?;
    }
    write_model_and_engines(out, g)
}

fn write_model_and_engines(out: &mut String, g: &Geometry) -> fmt::Result {
    let model = &g.model;
    writeln!(out, "\n[model]")?;
    writeln!(out, "layer_slots = {}", model.layer_slots)?;
    if let Some(n) = model.state_slots {
        writeln!(out, "state_slots = {n}")?;
    }
    writeln!(
        out,
        "groups = {}",
        list(model.groups.iter().map(|k| group_name(*k)))
    )?;
    write_attention(out, model.attention.as_ref(), None)?;
    if let Some(m) = &model.mamba {
        writeln!(out, "\n[model.mamba]")?;
        writeln!(out, "kind = \"{}\"", mamba_kind_name(m.kind))?;
        writeln!(out, "conv_dims = {}", list(&m.conv_dims))?;
        writeln!(out, "conv_rows = {}", m.conv_rows)?;
        writeln!(out, "conv_dtype_bytes = {}", m.conv_dtype_bytes)?;
        writeln!(out, "ssm_state_bytes = {}", m.ssm_state_bytes)?;
        if let Some(groups) = m.n_groups {
            writeln!(out, "n_groups = {groups}")?;
        }
    }
    write_engine(out, "prefill", &g.prefill, &g.handshake.prefill)?;
    write_engine(out, "decode", &g.decode, &g.handshake.decode)
}

fn write_engine(
    out: &mut String,
    table: &str,
    e: &EngineGeometry,
    compat: &EngineCompat,
) -> fmt::Result {
    writeln!(out, "\n[{table}]")?;
    writeln!(out, "tp_size = {}", e.tp_size)?;
    writeln!(out, "kernel_block = {}", e.kernel_block)?;
    writeln!(out, "logical_block = {}", e.logical_block)?;
    if let Some(blocks) = e.num_logical_blocks {
        writeln!(out, "num_logical_blocks = {blocks}")?;
    }
    if e.layout != KvLayout::Nhd {
        writeln!(out, "layout = \"HND\"")?;
    }
    if e.host_buffer {
        writeln!(out, "host_buffer = true")?;
    }
    if e.block_padding_bytes != 0 {
        writeln!(out, "block_padding_bytes = {}", e.block_padding_bytes)?;
    }
    if e.prefix_caching {
        writeln!(out, "prefix_caching = true")?;
    }
    // Validated names: letters, digits, '_' and ',' only.
    if let Some(backend) = &compat.backend {
        writeln!(out, "backend = \"{backend}\"")?;
    }
    if let Some(dtype) = &compat.kv_cache_dtype {
        writeln!(out, "kv_cache_dtype = \"{dtype}\"")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::error::Rule;
    use super::super::file_fields::compress_prompts;
    use super::super::validate::MAX_PROMPTS;
    use super::*;

    #[test]
    fn ranges_expand_in_order() {
        let entries = [
            PromptEntry::Length(40),
            PromptEntry::Range("2..=4".into()),
            PromptEntry::Range(" 7 ..= 7 ".into()),
        ];
        assert_eq!(expand_prompts(&entries), Ok(vec![40, 2, 3, 4, 7]));
    }

    #[test]
    fn runs_of_three_or_more_compress() {
        assert_eq!(
            compress_prompts(&[2, 3, 4, 5, 9, 10, 12, 4_294_967_295]),
            ["\"2..=5\"", "9", "10", "12", "4294967295"]
        );
    }

    #[test]
    fn line_column_counts_characters() {
        let text = "a = 1\nbé = x\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        assert_eq!(line_column(text, 12), (2, 6));
        assert_eq!(line_column(text, 4), (1, 5));
    }

    #[test]
    fn huge_range_is_refused_before_expanding() {
        let entries = [PromptEntry::Range("1..=4000000000".into())];
        let err = expand_prompts(&entries).unwrap_err();
        assert_eq!(err.field, "prompts");
        assert_eq!(
            err.rule,
            Rule::TooManyPrompts {
                count: 4_000_000_000,
                limit: MAX_PROMPTS
            }
        );
    }

    #[test]
    fn default_name_is_the_file_stem() {
        assert_eq!(default_name("geometries/g1-mla.toml"), "g1-mla");
        assert_eq!(default_name("inline"), "inline");
    }
}
