//! A named P/D geometry: the model plus the prefill and decode engines.

use serde::{Deserialize, Serialize};

use super::engine::{block_size_ratio, tp_ratio, EngineGeometry};
use super::handshake_compat::HandshakeCompat;
use super::model::ModelSpec;
use super::stack::{SglangSpec, Stack};

/// Which engine plays the local side: pull mode reads on D, push mode writes from P.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Mode {
    /// D issues READs from P's memory.
    Pull,
    /// P issues WRITEs into D's memory.
    Push,
}

impl Mode {
    /// `pull` or `push`, as the command line spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Pull => "pull",
            Mode::Push => "push",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One geometry file: a model served by a prefill engine and a decode engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// The geometry's name (default: the file name without `.toml`).
    pub name: String,
    /// The real model or bug this geometry stands for.
    pub description: String,
    /// The model both engines serve.
    pub model: ModelSpec,
    /// The prefill engine (P), which holds the prompt's KV.
    pub prefill: EngineGeometry,
    /// The decode engine (D), which receives it.
    pub decode: EngineGeometry,
    /// Prompt lengths to sweep; `None` means the default residue sweep.
    pub prompts: Option<Vec<u32>>,
    /// Set when the connector must refuse this pair at handshake, in one
    /// mode or both: a substring of the expected rejection message. A sweep
    /// then passes a case of that mode only if the handshake rejects it
    /// loudly with that message.
    pub expect_rejection: Option<ExpectedRejection>,
    /// What each engine's handshake compatibility hash covers that the file
    /// states (backend, KV-cache dtype), and whether the check is on.
    #[serde(default, skip_serializing_if = "HandshakeCompat::is_default")]
    pub handshake: HandshakeCompat,
    /// The stack whose pools this describes: vLLM's unless the file says
    /// `stack = "sglang"`.
    #[serde(default, skip_serializing_if = "Stack::is_vllm")]
    pub stack: Stack,
    /// An SGLang geometry's own fields (`None` for vLLM's stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sglang: Option<SglangSpec>,
}

/// The handshake refusal a geometry expects, per mode: the text the error
/// must contain, or `None` for a mode in which the pair must work.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExpectedRejection {
    /// Expected in pull mode.
    pub pull: Option<String>,
    /// Expected in push mode.
    pub push: Option<String>,
}

impl ExpectedRejection {
    /// The same refusal in both modes (the single-string form of the file).
    pub fn both(text: impl Into<String>) -> Self {
        let text = text.into();
        ExpectedRejection {
            pull: Some(text.clone()),
            push: Some(text),
        }
    }

    /// The text expected in `mode`, if the pair must be refused there.
    pub fn in_mode(&self, mode: Mode) -> Option<&str> {
        match mode {
            Mode::Pull => self.pull.as_deref(),
            Mode::Push => self.push.as_deref(),
        }
    }

    /// The text, when both modes expect the same refusal.
    pub fn in_both(&self) -> Option<&str> {
        match (&self.pull, &self.push) {
            (Some(a), Some(b)) if a == b => Some(a),
            _ => None,
        }
    }
}

/// Ratios derived for a P/D pair, seen from D (pull) and from P (push).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PairRatios {
    /// D kernel / P kernel, if integral.
    pub pull_block_size_ratio: Option<u32>,
    /// P kernel / D kernel, if integral.
    pub push_block_size_ratio: Option<u32>,
    /// tp_ratio computed on D.
    pub pull_tp_ratio: Option<i32>,
    /// tp_ratio computed on P.
    pub push_tp_ratio: Option<i32>,
    /// Logical blocks per kernel block on D (ppl: `logical_block / kernel_block`).
    pub decode_ppl: u32,
    /// Logical blocks per kernel block on P (ppl).
    pub prefill_ppl: u32,
}

impl Geometry {
    /// The block-size and TP ratios both directions derive for this pair.
    pub fn ratios(&self) -> PairRatios {
        let (p, d) = (&self.prefill, &self.decode);
        PairRatios {
            pull_block_size_ratio: block_size_ratio(d.kernel_block, p.kernel_block),
            push_block_size_ratio: block_size_ratio(p.kernel_block, d.kernel_block),
            pull_tp_ratio: tp_ratio(d.tp_size, p.tp_size),
            push_tp_ratio: tp_ratio(p.tp_size, d.tp_size),
            decode_ppl: d.ppl(),
            prefill_ppl: p.ppl(),
        }
    }

    /// The refusal expected in `mode`, if the pair must be refused there.
    pub fn expected_rejection(&self, mode: Mode) -> Option<&str> {
        self.expect_rejection.as_ref()?.in_mode(mode)
    }

    /// Tokens whose KV is transferred for a prompt of `prompt_len` tokens:
    /// hybrid models stop one short (N - 1, for N > 1) so D recomputes the
    /// last token and the SSM state advances from h(N-1).
    pub fn transferred_tokens(&self, prompt_len: u32) -> u32 {
        if self.model.has_mamba() && prompt_len > 1 {
            prompt_len - 1
        } else {
            prompt_len
        }
    }
}
