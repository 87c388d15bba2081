//! The geometry file of an SGLang P/D pair (`stack = "sglang"`): the model's
//! layers and attention, each engine's TP, attention TP and page size. It
//! is read into the same [`Geometry`] as vLLM's files (one layer slot per
//! layer, the page as kernel and logical block, the attention TP as the
//! engine's TP) with an [`SglangSpec`] for what only SGLang has, validated
//! by the same rules with the fields named as the file names them, and
//! written back by [`write_sglang_toml`]. docs/geometry-format.md
//! describes it for users.

use std::fmt::{self, Write as _};

use serde::Deserialize;

use super::engine::EngineGeometry;
use super::error::{Rule, Violation};
use super::file_fields::{attention_spec, AttentionKind};
use super::model::{AttentionSpec, GroupKind, KvLayout, ModelSpec};
use super::pair::Geometry;
use super::stack::{SglangSpec, Stack};

/// An SGLang geometry file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SglangGeometryFile {
    /// Always `"sglang"` here.
    #[allow(dead_code)]
    stack: Stack,
    #[serde(default)]
    name: Option<String>,
    description: String,
    #[serde(default)]
    prompts: Option<Vec<super::file_fields::PromptEntry>>,
    #[serde(default)]
    expect_rejection: Option<super::file_fields::RejectionFile>,
    model: SglangModelFile,
    prefill: SglangEngineFile,
    decode: SglangEngineFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SglangModelFile {
    layers: u32,
    attention: SglangAttentionFile,
    #[serde(default)]
    state: Option<super::sglang_state::SglangState>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SglangAttentionFile {
    kind: AttentionKind,
    #[serde(default)]
    total_kv_heads: Option<u32>,
    head_size: u32,
    #[serde(default)]
    v_head_size: Option<u32>,
    dtype_bytes: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SglangEngineFile {
    tp_size: u32,
    #[serde(default)]
    attn_tp_size: Option<u32>,
    page_size: u32,
    #[serde(default)]
    num_pages: Option<u32>,
}

impl SglangGeometryFile {
    pub(super) fn into_geometry(self, default_name: &str) -> Result<Geometry, Violation> {
        let prompts = self
            .prompts
            .as_deref()
            .map(super::file_fields::expand_prompts)
            .transpose()?;
        let attention = self.model.attention.to_spec()?;
        let v_head_size = self.model.attention.v_head_size;
        if let Some(v) = v_head_size {
            if attention.is_mla() {
                return Err(Violation::new(
                    "model.attention.v_head_size",
                    Rule::VHeadSizeOnMla,
                ));
            }
            if v == 0 {
                return Err(Violation::new(
                    "model.attention.v_head_size",
                    Rule::NotPositive { found: 0 },
                ));
            }
        }
        let prefill = self.prefill.into_engine("prefill")?;
        let decode = self.decode.into_engine("decode")?;
        if let Some(st) = &self.model.state {
            st.check(
                self.model.layers,
                &[("prefill", prefill.0.tp_size), ("decode", decode.0.tp_size)],
            )
            .map_err(|why| Violation::new("model.state", Rule::Derived(why.to_string())))?;
        }
        Ok(Geometry {
            name: self.name.unwrap_or_else(|| default_name.to_string()),
            description: self.description,
            model: ModelSpec {
                attention: Some(attention),
                mamba: None,
                groups: vec![GroupKind::Attention],
                layer_slots: self.model.layers,
                state_slots: None,
            },
            prefill: prefill.0,
            decode: decode.0,
            prompts,
            expect_rejection: self.expect_rejection.map(|r| r.0),
            stack: Stack::Sglang,
            handshake: crate::geometry::HandshakeCompat::default(),
            sglang: Some(SglangSpec {
                v_head_size,
                prefill_tp_size: prefill.1,
                decode_tp_size: decode.1,
                state: self.model.state,
            }),
        })
    }
}

impl SglangAttentionFile {
    fn to_spec(&self) -> Result<AttentionSpec, Violation> {
        attention_spec(
            &self.kind,
            self.total_kv_heads,
            self.head_size,
            self.dtype_bytes,
        )
    }
}

impl SglangEngineFile {
    /// The engine as kvgeom models it (attention TP, page as both blocks)
    /// and its TP size.
    fn into_engine(self, engine: &str) -> Result<(EngineGeometry, u32), Violation> {
        let attn_tp = self.attn_tp_size.unwrap_or(self.tp_size);
        if self.tp_size == 0 {
            return Err(Violation::new(
                format!("{engine}.tp_size"),
                Rule::NotPositive { found: 0 },
            ));
        }
        if attn_tp == 0 || self.tp_size % attn_tp != 0 {
            return Err(Violation::new(
                format!("{engine}.attn_tp_size"),
                Rule::AttnTpVsTp {
                    attn_tp,
                    tp: self.tp_size,
                },
            ));
        }
        Ok((
            EngineGeometry {
                tp_size: attn_tp,
                kernel_block: self.page_size,
                logical_block: self.page_size,
                num_logical_blocks: self.num_pages,
                layout: KvLayout::Nhd,
                host_buffer: false,
                prefix_caching: false,
                block_padding_bytes: 0,
            },
            self.tp_size,
        ))
    }
}

/// A violation of the shared rules named as an SGLang file names the field
/// (`model.layers`, `ENGINE.page_size`, `ENGINE.num_pages`, the attention
/// TP as `ENGINE.attn_tp_size` when the file sets one).
pub(super) fn renamed(mut v: Violation, geometry: &Geometry) -> Violation {
    let spec = geometry.sglang.as_ref();
    let attn_differs = |engine: &str| {
        spec.is_some_and(|s| match engine {
            "prefill" => s.prefill_tp_size != geometry.prefill.tp_size,
            _ => s.decode_tp_size != geometry.decode.tp_size,
        })
    };
    let field = match v.field.as_str() {
        "model.layer_slots" => "model.layers".to_string(),
        other => match other.split_once('.') {
            Some((engine @ ("prefill" | "decode"), rest)) => {
                let rest = match rest {
                    "kernel_block" | "logical_block" => "page_size",
                    "num_logical_blocks" => "num_pages",
                    "tp_size" if attn_differs(engine) => "attn_tp_size",
                    rest => rest,
                };
                format!("{engine}.{rest}")
            }
            _ => other.to_string(),
        },
    };
    v.field = field;
    v
}

/// Write an SGLang geometry in its file format (what `to_toml` writes for
/// `stack = "sglang"`).
pub(super) fn write_sglang_toml(out: &mut String, g: &Geometry, named: bool) -> fmt::Result {
    writeln!(out, "stack = \"sglang\"")?;
    super::file_fields::write_header(out, g, named)?;
    writeln!(out, "\n[model]\nlayers = {}", g.model.layer_slots)?;
    let spec = g.sglang.as_ref();
    super::file_fields::write_attention(
        out,
        g.model.attention.as_ref(),
        spec.and_then(|s| s.v_head_size),
    )?;
    if let Some(st) = spec.and_then(|s| s.state.as_ref()) {
        st.write_toml(out)?;
    }
    let tp = |engine: &EngineGeometry, total: Option<u32>| total.unwrap_or(engine.tp_size);
    write_engine(
        out,
        "prefill",
        &g.prefill,
        tp(&g.prefill, spec.map(|s| s.prefill_tp_size)),
    )?;
    write_engine(
        out,
        "decode",
        &g.decode,
        tp(&g.decode, spec.map(|s| s.decode_tp_size)),
    )
}

fn write_engine(out: &mut String, table: &str, e: &EngineGeometry, tp_size: u32) -> fmt::Result {
    writeln!(out, "\n[{table}]")?;
    writeln!(out, "tp_size = {tp_size}")?;
    if tp_size != e.tp_size {
        writeln!(out, "attn_tp_size = {}", e.tp_size)?;
    }
    writeln!(out, "page_size = {}", e.logical_block)?;
    if let Some(pages) = e.num_logical_blocks {
        writeln!(out, "num_pages = {pages}")?;
    }
    Ok(())
}
