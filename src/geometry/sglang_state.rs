//! The hybrid linear-attention state of an SGLang geometry
//! (`[model.state]`): Mamba2, GDN or KDA, with the config fields that fix
//! the state tensors' shapes, read, checked and written back.
//! docs/geometry-format.md ("SGLang geometries") describes it for users;
//! `crate::sglang::state` models the tensors per rank.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The linear-attention mixer whose per-request state SGLang keeps in its
/// `MambaPool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// Mamba2 (Nemotron-H, Falcon-H1, Granite-4.0-H): conv rows `x | B | C`.
    Mamba2,
    /// Gated DeltaNet (Qwen3-Next, Qwen3.5): conv rows `q | k | v`.
    Gdn,
    /// Kimi Delta Attention (Kimi-Linear): conv `[K-1, q | k | v]`.
    Kda,
}

impl StateKind {
    /// The name the file and the driver use.
    pub fn name(self) -> &'static str {
        match self {
            StateKind::Mamba2 => "mamba2",
            StateKind::Gdn => "gdn",
            StateKind::Kda => "kda",
        }
    }
}

/// `[model.state]` of an SGLang geometry. Fields are the model config's
/// (Mamba2: `n_groups`, `ssm_state_size`, `num_heads`, `head_dim`; GDN:
/// `num_k_heads`, `head_k_dim`, `num_v_heads`, `head_v_dim`; KDA:
/// `num_heads`, `head_dim`, optional `num_k_heads`, `head_k_dim`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SglangState {
    /// The mixer.
    pub kind: StateKind,
    /// The linear-attention layer ids (the other layers are full attention).
    pub layers: Vec<u32>,
    /// The causal conv's kernel width (the conv state keeps `K - 1` steps).
    pub conv_kernel: u32,
    /// Mamba2: B/C groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_groups: Option<u32>,
    /// Mamba2: SSM state size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssm_state_size: Option<u32>,
    /// Mamba2, KDA: heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_heads: Option<u32>,
    /// Mamba2, KDA: head dim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// GDN (and KDA, optional): key heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_k_heads: Option<u32>,
    /// GDN (and KDA, optional): key head dim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_k_dim: Option<u32>,
    /// GDN: value heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_v_heads: Option<u32>,
    /// GDN: value head dim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_v_dim: Option<u32>,
}

/// Why `[model.state]` does not describe a state SGLang could keep.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// A field is zero.
    #[error("model.state.{field} must be positive")]
    NotPositive {
        /// The field.
        field: &'static str,
    },
    /// A field the kind needs is missing.
    #[error("model.state.{field} is required for kind = \"{}\"", kind.name())]
    Required {
        /// The field.
        field: &'static str,
        /// The mixer.
        kind: StateKind,
    },
    /// A field of another kind is given.
    #[error("model.state.{field} is not a field of kind = \"{}\"", kind.name())]
    Forbidden {
        /// The field.
        field: &'static str,
        /// The mixer.
        kind: StateKind,
    },
    /// Heads (or key/value heads) do not split over an engine's attention TP.
    #[error("model.state: {total} {what} do not split over {engine}'s attention TP {tp}")]
    Split {
        /// The number of heads.
        total: u32,
        /// What they are (`heads`, `key heads`, `value heads`).
        what: &'static str,
        /// The engine (`prefill`, `decode`).
        engine: String,
        /// Its attention TP.
        tp: u32,
    },
    /// `conv_kernel` is below 2.
    #[error("model.state.conv_kernel must be at least 2")]
    ConvKernel,
    /// A layer id is repeated or not below `model.layers`.
    #[error(
        "model.state.layers: {layer} is not a distinct layer id below model.layers ({layers})"
    )]
    Layer {
        /// The layer id.
        layer: u32,
        /// `model.layers`.
        layers: u32,
    },
    /// No linear-attention layer, or no full-attention layer left.
    #[error("model.state.layers must name at least one layer and leave one full-attention layer")]
    LayerCount,
    /// Mamba2 heads are not whole groups.
    #[error("model.state: {heads} heads are not whole groups of n_groups {groups}")]
    Groups {
        /// `num_heads`.
        heads: u32,
        /// `n_groups`.
        groups: u32,
    },
    /// Mamba2 groups and an engine's TP: neither divides the other.
    #[error("model.state: n_groups {groups} and {engine}'s attention TP {tp}: neither divides the other")]
    GroupsTp {
        /// `n_groups`.
        groups: u32,
        /// The engine.
        engine: String,
        /// Its attention TP.
        tp: u32,
    },
    /// The state of one layer is larger than kvgeom runs (the limit of
    /// `src/limits.rs`).
    #[error("{what} is {found}, more than the limit of {limit}; real models stay far below it")]
    TooLarge {
        /// What is measured, and from which fields.
        what: String,
        /// Its value.
        found: u128,
        /// The limit.
        limit: u64,
    },
    /// KDA key heads or key head dim is zero.
    #[error("model.state: key heads and head_k_dim must be positive")]
    KeyHeads,
}

fn need(v: Option<u32>, field: &'static str, kind: StateKind) -> Result<u32, StateError> {
    match v {
        Some(0) => Err(StateError::NotPositive { field }),
        Some(x) => Ok(x),
        None => Err(StateError::Required { field, kind }),
    }
}

fn forbid(v: Option<u32>, field: &'static str, kind: StateKind) -> Result<(), StateError> {
    match v {
        Some(_) => Err(StateError::Forbidden { field, kind }),
        None => Ok(()),
    }
}

fn split(total: u32, tp: u32, what: &'static str, engine: &str) -> Result<(), StateError> {
    if total % tp != 0 {
        return Err(StateError::Split {
            total,
            what,
            engine: engine.to_string(),
            tp,
        });
    }
    Ok(())
}

impl SglangState {
    /// Check the fields of the kind, the layers against `layers` and the
    /// sharding against each engine's attention TP (`(engine, tp)`).
    pub fn check(&self, layers: u32, tps: &[(&str, u32)]) -> Result<(), StateError> {
        let k = self.kind;
        if self.conv_kernel < 2 {
            return Err(StateError::ConvKernel);
        }
        let mut seen = std::collections::BTreeSet::new();
        for &l in &self.layers {
            if l >= layers || !seen.insert(l) {
                return Err(StateError::Layer { layer: l, layers });
            }
        }
        if self.layers.is_empty() || self.layers.len() as u32 >= layers {
            return Err(StateError::LayerCount);
        }
        match k {
            StateKind::Mamba2 => {
                let ng = need(self.n_groups, "n_groups", k)?;
                need(self.ssm_state_size, "ssm_state_size", k)?;
                let h = need(self.num_heads, "num_heads", k)?;
                need(self.head_dim, "head_dim", k)?;
                for f in [
                    (self.num_k_heads, "num_k_heads"),
                    (self.head_k_dim, "head_k_dim"),
                ] {
                    forbid(f.0, f.1, k)?;
                }
                forbid(self.num_v_heads, "num_v_heads", k)?;
                forbid(self.head_v_dim, "head_v_dim", k)?;
                if h % ng != 0 {
                    return Err(StateError::Groups {
                        heads: h,
                        groups: ng,
                    });
                }
                for &(e, tp) in tps {
                    split(h, tp, "heads", e)?;
                    if ng % tp != 0 && tp % ng != 0 {
                        return Err(StateError::GroupsTp {
                            groups: ng,
                            engine: e.to_string(),
                            tp,
                        });
                    }
                }
            }
            StateKind::Gdn => {
                let nk = need(self.num_k_heads, "num_k_heads", k)?;
                need(self.head_k_dim, "head_k_dim", k)?;
                let nv = need(self.num_v_heads, "num_v_heads", k)?;
                need(self.head_v_dim, "head_v_dim", k)?;
                for f in [
                    (self.n_groups, "n_groups"),
                    (self.ssm_state_size, "ssm_state_size"),
                    (self.num_heads, "num_heads"),
                    (self.head_dim, "head_dim"),
                ] {
                    forbid(f.0, f.1, k)?;
                }
                for &(e, tp) in tps {
                    split(nk, tp, "key heads", e)?;
                    split(nv, tp, "value heads", e)?;
                }
            }
            StateKind::Kda => {
                let h = need(self.num_heads, "num_heads", k)?;
                need(self.head_dim, "head_dim", k)?;
                if let Some(0) = self.num_k_heads.or(self.head_k_dim) {
                    return Err(StateError::KeyHeads);
                }
                for f in [
                    (self.n_groups, "n_groups"),
                    (self.ssm_state_size, "ssm_state_size"),
                    (self.num_v_heads, "num_v_heads"),
                    (self.head_v_dim, "head_v_dim"),
                ] {
                    forbid(f.0, f.1, k)?;
                }
                for &(e, tp) in tps {
                    split(h, tp, "heads", e)?;
                    split(self.num_k_heads.unwrap_or(h), tp, "key heads", e)?;
                }
            }
        }
        self.check_size()
    }

    /// One layer's conv channels (before TP) and one slot's conv and
    /// temporal bytes of one layer, each within `src/limits.rs`: checked in
    /// 128 bits, so no field, however large, overflows on its way there.
    fn check_size(&self) -> Result<(), StateError> {
        let f = |v: Option<u32>| u128::from(v.unwrap_or(0));
        let (heads, hd) = (f(self.num_heads), f(self.head_dim));
        let (channels, temporal, conv_fields, temporal_fields) = match self.kind {
            StateKind::Mamba2 => {
                let st = f(self.ssm_state_size);
                (
                    heads * hd + 2 * f(self.n_groups) * st,
                    heads * hd * st,
                    "num_heads x head_dim + 2 x n_groups x ssm_state_size",
                    "num_heads x head_dim x ssm_state_size",
                )
            }
            StateKind::Gdn => {
                let (v, hk) = (f(self.num_v_heads) * f(self.head_v_dim), f(self.head_k_dim));
                (
                    2 * f(self.num_k_heads) * hk + v,
                    v * hk,
                    "2 x num_k_heads x head_k_dim + num_v_heads x head_v_dim",
                    "num_v_heads x head_v_dim x head_k_dim",
                )
            }
            StateKind::Kda => {
                let k = self.num_k_heads.map_or(heads, u128::from)
                    * self.head_k_dim.map_or(hd, u128::from);
                (
                    heads * hd + 2 * k,
                    heads * hd * hd,
                    "num_heads x head_dim + 2 x num_k_heads x head_k_dim",
                    "num_heads x head_dim x head_dim",
                )
            }
        };
        let window = u128::from(self.conv_kernel - 1);
        let page = crate::limits::MAX_PAGE_BYTES;
        for (what, found, limit) in [
            (
                format!("one layer's conv channels ({conv_fields})"),
                channels,
                crate::limits::MAX_STATE_CHANNELS,
            ),
            (
                format!("one slot's conv state of one layer in bytes ((conv_kernel - 1) x {conv_fields} x 2)"),
                channels * window * 2,
                page,
            ),
            (
                format!("one slot's temporal state of one layer in bytes ({temporal_fields} x 4)"),
                temporal * 4,
                page,
            ),
        ] {
            if found > u128::from(limit) {
                return Err(StateError::TooLarge {
                    what,
                    found,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// The driver's `model.state` object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Write `[model.state]`: the fields in their declared order, those
    /// of other kinds left out (the same serialisation as [`to_json`](Self::to_json)).
    pub fn write_toml(&self, out: &mut String) -> fmt::Result {
        out.push_str("\n[model.state]\n");
        out.push_str(&toml::to_string(self).map_err(|_| fmt::Error)?);
        Ok(())
    }
}
