//! Which serving stack a geometry describes: its memory layout and its
//! rules. vLLM's (the default) pads hybrid pages and splits logical from
//! kernel blocks; SGLang's pools hold one K and one V buffer per layer (one
//! latent buffer per layer for MLA) in pages of `page_size` tokens, with
//! attention TP that may differ from TP (DP attention).

use serde::{Deserialize, Serialize};

/// The stack whose pools a geometry describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stack {
    /// vLLM's KV cache (kvgeom's connector and vLLM's run these).
    #[default]
    Vllm,
    /// SGLang's token pools (its own P/D transfer runs these).
    Sglang,
}

impl Stack {
    /// The stack's name in files and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Stack::Vllm => "vllm",
            Stack::Sglang => "sglang",
        }
    }

    /// Whether this is vLLM's (the default, left out of files and JSON).
    pub fn is_vllm(&self) -> bool {
        *self == Stack::Vllm
    }
}

/// Read from a string only, so that `stack = 5` is refused with the two
/// names a file may give, not with serde's words about enums.
impl<'de> Deserialize<'de> for Stack {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Stack;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"vllm\" or \"sglang\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Stack, E> {
                match v {
                    "vllm" => Ok(Stack::Vllm),
                    "sglang" => Ok(Stack::Sglang),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_str(Name)
    }
}

/// What an SGLang geometry states beyond the fields it shares with
/// vLLM's: each engine's attention TP is the geometry's `tp_size`, and its
/// page size both its kernel and its logical block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SglangSpec {
    /// Elements per head per token of V (MHA/GQA), when it differs from
    /// K's `head_size` (`MHATokenToKVPool`'s `v_head_dim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v_head_size: Option<u32>,
    /// Prefill's TP size; its attention TP is `prefill.tp_size` (equal
    /// without DP attention).
    pub prefill_tp_size: u32,
    /// Decode's TP size, as `prefill_tp_size`.
    pub decode_tp_size: u32,
    /// A hybrid model's linear-attention state (`[model.state]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<super::sglang_state::SglangState>,
}
