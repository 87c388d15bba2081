//! Element types of the KV cache and the mamba state, and the command-line
//! names vLLM gives them (`--kv-cache-dtype`, `--mamba-cache-dtype`,
//! `--mamba-ssm-cache-dtype`).

use super::error::DeriveError;

/// An element type of the KV cache or of the mamba state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// `float32`: 4 bytes per element.
    F32,
    /// `bfloat16`: 2 bytes per element.
    Bf16,
    /// `float16`: 2 bytes per element.
    Fp16,
    /// An 8-bit float (e4m3 or e5m2): 1 byte per element.
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp8 => 1,
        }
    }

    /// The torch name (`float32`, `bfloat16`, `float16`; `fp8` for fp8).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::Bf16 => "bfloat16",
            Dtype::Fp16 => "float16",
            Dtype::Fp8 => "fp8",
        }
    }

    /// A `MambaDType` name other than `auto`.
    pub fn from_mamba_name(name: &str) -> Option<Dtype> {
        match name {
            "float32" => Some(Dtype::F32),
            "float16" => Some(Dtype::Fp16),
            "bfloat16" => Some(Dtype::Bf16),
            _ => None,
        }
    }
}

/// `--cache-dtype`: the attention KV cache's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheDtype {
    /// The model dtype.
    Auto,
    /// `bfloat16` (`bf16`): 2 bytes per element.
    Bf16,
    /// `float16` (`fp16`): 2 bytes per element.
    Fp16,
    /// fp8 (e4m3 or e5m2): one byte per element.
    Fp8,
}

impl CacheDtype {
    /// The names `--cache-dtype` accepts.
    pub const NAMES: [&'static str; 8] = [
        "auto", "bf16", "bfloat16", "fp16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2",
    ];

    /// Parse a `--cache-dtype` name, one of [`CacheDtype::NAMES`]; anything
    /// else is [`DeriveError::UnknownDtype`].
    pub fn parse(name: &str) -> Result<CacheDtype, DeriveError> {
        match name {
            "auto" => Ok(CacheDtype::Auto),
            "bf16" | "bfloat16" => Ok(CacheDtype::Bf16),
            "fp16" | "float16" => Ok(CacheDtype::Fp16),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" => Ok(CacheDtype::Fp8),
            _ => Err(DeriveError::UnknownDtype {
                option: "--cache-dtype",
                name: name.to_string(),
                supported: CacheDtype::NAMES.to_vec(),
            }),
        }
    }

    /// vLLM's name for `--kv-cache-dtype`.
    pub fn vllm_name(self) -> &'static str {
        match self {
            CacheDtype::Auto => "auto",
            CacheDtype::Bf16 => "bfloat16",
            CacheDtype::Fp16 => "float16",
            CacheDtype::Fp8 => "fp8",
        }
    }

    /// The element type the cache holds for a model whose dtype is `model`.
    pub fn resolve(self, model: Dtype) -> Dtype {
        match self {
            CacheDtype::Auto => model,
            CacheDtype::Bf16 => Dtype::Bf16,
            CacheDtype::Fp16 => Dtype::Fp16,
            CacheDtype::Fp8 => Dtype::Fp8,
        }
    }
}

/// `--mamba-cache-dtype` / `--mamba-ssm-cache-dtype`: `auto` or a dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MambaDtype {
    /// `auto`: the conv state takes the model dtype; the SSM state takes the
    /// conv state's, unless the family fixes another (Nemotron-H, KDA).
    Auto,
    /// This dtype: `float32`, `float16` or `bfloat16`.
    Is(Dtype),
}

impl MambaDtype {
    /// The names both options accept.
    pub const NAMES: [&'static str; 4] = ["auto", "float32", "float16", "bfloat16"];

    /// Parse the value `name` of `option` (one of [`MambaDtype::NAMES`]);
    /// anything else is [`DeriveError::UnknownDtype`] naming `option`.
    pub fn parse(option: &'static str, name: &str) -> Result<MambaDtype, DeriveError> {
        if name == "auto" {
            return Ok(MambaDtype::Auto);
        }
        Dtype::from_mamba_name(name)
            .map(MambaDtype::Is)
            .ok_or_else(|| DeriveError::UnknownDtype {
                option,
                name: name.to_string(),
                supported: MambaDtype::NAMES.to_vec(),
            })
    }

    /// The value vLLM takes for the option: `auto` or the dtype's name.
    pub fn vllm_name(self) -> &'static str {
        match self {
            MambaDtype::Auto => "auto",
            MambaDtype::Is(d) => d.name(),
        }
    }
}
