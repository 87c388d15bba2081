//! What a lifecycle scenario takes from a geometry: each engine's tokens
//! per block, whether requests carry mamba state, the prompt lengths and
//! whether decode has a prefix cache; or why the geometry has no lifecycle
//! to run (an SGLang file, a pair the connector refuses at its handshake).

use crate::geometry::{Geometry, Mode, Stack};

use super::error::LifecycleError;
use super::operation::Engine;

/// Bytes of one token in a block (the lifecycle moves whole token slots;
/// the byte layout inside a token is the single-case sweep's concern).
pub const TOKEN_BYTES: u32 = 4;
/// Bytes of one request's mamba state.
pub const STATE_BYTES: u32 = 16;

/// The longest prompt a scenario draws (a geometry's longer prompts are
/// left to the single-case sweep: the lifecycle's bugs need no long
/// prompt, and its pools stay small).
pub const MAX_PROMPT: u32 = 4096;

/// A geometry as the lifecycle runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleShape {
    /// The geometry's name.
    pub name: String,
    /// Tokens per logical block on prefill.
    pub prefill_block_tokens: u32,
    /// Tokens per logical block on decode.
    pub decode_block_tokens: u32,
    /// Whether each request carries one mamba state, transferred whole.
    pub has_state: bool,
    /// Prompt lengths the scenarios draw from.
    pub prompts: Vec<u32>,
    /// Whether decode's prefix cache may hold a request's first blocks.
    pub prefix_caching: bool,
}

/// Prompt lengths drawn when the geometry lists none: around one and two
/// of the larger logical block.
fn default_prompts(block: u32) -> Vec<u32> {
    let mut p = vec![
        1,
        block.saturating_sub(1).max(1),
        block,
        block + 1,
        2 * block + 1,
    ];
    p.sort_unstable();
    p.dedup();
    p
}

impl LifecycleShape {
    /// The lifecycle shape of `geometry`, or why it has none.
    pub fn of(geometry: &Geometry) -> Result<Self, LifecycleError> {
        if !matches!(geometry.stack, Stack::Vllm) {
            return Err(LifecycleError::NotModelled {
                geometry: geometry.name.clone(),
                reason: "an SGLang geometry: the lifecycle models vLLM's NIXL connector".into(),
            });
        }
        if let Some(why) = geometry.handshake.refusal(&geometry.model) {
            return Err(LifecycleError::NotModelled {
                geometry: geometry.name.clone(),
                reason: format!("vLLM refuses this pair at its handshake ({why})"),
            });
        }
        if let Some(why) = geometry.expected_rejection(Mode::Pull) {
            return Err(LifecycleError::NotModelled {
                geometry: geometry.name.clone(),
                reason: format!("the connector refuses this pair at its handshake ({why})"),
            });
        }
        let p = geometry.prefill.logical_block;
        let d = geometry.decode.logical_block;
        let mut prompts = geometry
            .prompts
            .clone()
            .unwrap_or_else(|| default_prompts(p.max(d)));
        prompts.retain(|&n| n > 0 && n <= MAX_PROMPT);
        if prompts.is_empty() || p == 0 || d == 0 {
            return Err(LifecycleError::NotModelled {
                geometry: geometry.name.clone(),
                reason: format!(
                    "no prompt length of 1 to {MAX_PROMPT} tokens, or an empty logical block"
                ),
            });
        }
        Ok(LifecycleShape {
            name: geometry.name.clone(),
            prefill_block_tokens: p,
            decode_block_tokens: d,
            has_state: geometry.model.has_mamba(),
            prompts,
            prefix_caching: geometry.decode.prefix_caching,
        })
    }

    /// Tokens per block on `engine`.
    pub fn block_tokens(&self, engine: Engine) -> u32 {
        match engine {
            Engine::Prefill => self.prefill_block_tokens,
            Engine::Decode => self.decode_block_tokens,
        }
    }

    /// Bytes of one block on `engine`.
    pub fn block_bytes(&self, engine: Engine) -> u64 {
        u64::from(self.block_tokens(engine)) * u64::from(TOKEN_BYTES)
    }

    /// Blocks a prompt of `prompt` tokens takes on `engine`.
    pub fn blocks_for(&self, engine: Engine, prompt: u32) -> u32 {
        prompt.div_ceil(self.block_tokens(engine))
    }

    /// The longest prompt drawn.
    pub fn max_prompt(&self) -> u32 {
        self.prompts.iter().copied().max().unwrap_or(1)
    }

    /// Blocks each engine's pool holds for `requests` requests: exactly
    /// enough for all of them at the longest prompt, so that a block is
    /// reused as soon as it is freed and allocation never fails.
    pub fn pool_blocks(&self, engine: Engine, requests: u32) -> u32 {
        self.blocks_for(engine, self.max_prompt()) * requests
    }
}
