//! The settings of a pair that vLLM's handshake compatibility hash covers
//! and a geometry can state per engine: the attention backend's name and
//! the KV-cache dtype (`--attention-backend`, `--kv-cache-dtype`), and
//! whether the deployer turned the check off
//! (`kv_connector_extra_config: {"enforce_handshake_compat": false}`).
//!
//! vLLM hashes these with the versions, the model, its dtype, KV heads,
//! head size, layers, the hybrid allocator, the speculative-decoding
//! factors and the transfer mode (`compute_nixl_compatibility_hash`); a
//! pair differing in any of them is refused at the handshake, before any
//! geometry rule, while the check is on. The other factors are equal by
//! construction in one geometry (one model, one release, one mode).

use serde::{Deserialize, Serialize};

use super::error::Engine;
use super::model::ModelSpec;

/// One engine's hashed settings as its geometry file states them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCompat {
    /// The attention backend's name (`FLASHINFER`, `FLASH_ATTN`,
    /// `FLASHMLA`, ...); `None`: the default for the attention kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The KV-cache dtype (`auto`, `fp8`, ...); `None`: `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<String>,
}

/// Both engines' hashed settings, and whether the check is on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeCompat {
    /// The prefill engine's.
    #[serde(default)]
    pub prefill: EngineCompat,
    /// The decode engine's.
    #[serde(default)]
    pub decode: EngineCompat,
    /// `enforce_handshake_compat`: the pair is refused when the hashes
    /// differ (vLLM's default).
    pub enforce: bool,
}

impl HandshakeCompat {
    /// Whether nothing is stated and the check is on (what a file without
    /// these keys means; left out of serialised geometries).
    pub fn is_default(&self) -> bool {
        *self == HandshakeCompat::default()
    }

    /// The factors decode finds different in prefill's (decode handshakes
    /// in pull mode), whether or not the check is on.
    pub fn differences(&self, model: &ModelSpec) -> Vec<FactorDifference> {
        self.decode
            .factors(model)
            .differences(Engine::Decode, &self.prefill.factors(model))
    }

    /// Why vLLM refuses the pair at its handshake, before any geometry rule:
    /// the check is on and some factor differs.
    pub fn refusal(&self, model: &ModelSpec) -> Option<String> {
        let differences = self.differences(model);
        (self.enforce && !differences.is_empty()).then(|| mismatch_text(&differences))
    }

    /// The settings of `engine`.
    pub fn of(&self, engine: Engine) -> &EngineCompat {
        match engine {
            Engine::Prefill => &self.prefill,
            Engine::Decode => &self.decode,
        }
    }
}

impl Default for HandshakeCompat {
    /// No backend or cache dtype stated (one backend for both engines), the
    /// check on.
    fn default() -> Self {
        HandshakeCompat {
            prefill: EngineCompat::default(),
            decode: EngineCompat::default(),
            enforce: true,
        }
    }
}

/// The hashed settings one engine resolves to, as its worker advertises
/// them in the handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompatFactors {
    /// vLLM's `attn_backend_name` factor.
    pub attn_backend_name: String,
    /// vLLM's `cache_dtype` factor.
    pub cache_dtype: String,
}

/// A factor whose value differs between the two engines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactorDifference {
    /// vLLM's name of the factor.
    pub factor: &'static str,
    /// The engine that compared (its own value first).
    pub local_engine: Engine,
    /// Its value.
    pub local: String,
    /// The peer's value.
    pub remote: String,
}

impl std::fmt::Display for FactorDifference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (local, remote) = match self.local_engine {
            Engine::Prefill => ("prefill", "decode"),
            Engine::Decode => ("decode", "prefill"),
        };
        write!(
            f,
            "{} {} ({local}) vs {} ({remote})",
            self.factor, self.local, self.remote
        )
    }
}

/// vLLM's refusal of a pair whose hashes differ, naming the factors that do.
pub fn mismatch_text(differences: &[FactorDifference]) -> String {
    let named: Vec<String> = differences.iter().map(ToString::to_string).collect();
    format!("NIXL compatibility hash mismatch: {}", named.join(", "))
}

/// The backend an engine that names none hashes: what the live driver
/// gives both engines of such a file (an MLA backend for MLA attention).
fn default_backend(model: &ModelSpec) -> &'static str {
    if model.is_mla() {
        "FLASHMLA"
    } else {
        "FLASH_ATTN"
    }
}

impl EngineCompat {
    /// What this engine hashes, with the defaults filled in.
    pub fn factors(&self, model: &ModelSpec) -> CompatFactors {
        CompatFactors {
            attn_backend_name: self
                .backend
                .clone()
                .unwrap_or_else(|| default_backend(model).to_string()),
            cache_dtype: self
                .kv_cache_dtype
                .clone()
                .unwrap_or_else(|| "auto".to_string()),
        }
    }
}

impl CompatFactors {
    /// The factors in which `remote` differs from these, `local_engine`'s.
    pub fn differences(
        &self,
        local_engine: Engine,
        remote: &CompatFactors,
    ) -> Vec<FactorDifference> {
        let mut out = Vec::new();
        for (factor, local, remote) in [
            (
                "attn_backend_name",
                &self.attn_backend_name,
                &remote.attn_backend_name,
            ),
            ("cache_dtype", &self.cache_dtype, &remote.cache_dtype),
        ] {
            if local != remote {
                out.push(FactorDifference {
                    factor,
                    local_engine,
                    local: local.clone(),
                    remote: remote.clone(),
                });
            }
        }
        out
    }
}

/// Whether `name` can be an attention backend's name as vLLM spells them
/// (upper-case letters, digits and `_`; several joined by `,`).
pub(super) fn is_backend_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.split(',').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
}

/// Whether `name` can be a KV-cache dtype as vLLM spells them (lower-case
/// letters, digits and `_`).
pub(super) fn is_cache_dtype_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn factors(backend: &str, dtype: &str) -> CompatFactors {
        CompatFactors {
            attn_backend_name: backend.into(),
            cache_dtype: dtype.into(),
        }
    }

    #[test]
    fn equal_factors_differ_in_nothing_and_each_difference_is_named() {
        let flash_attn = factors("FLASH_ATTN", "auto");
        assert!(flash_attn
            .differences(Engine::Decode, &flash_attn)
            .is_empty());
        let d = flash_attn.differences(Engine::Decode, &factors("FLASHINFER", "auto"));
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].to_string(),
            "attn_backend_name FLASH_ATTN (decode) vs FLASHINFER (prefill)"
        );
        let d = flash_attn.differences(Engine::Prefill, &factors("FLASH_ATTN", "fp8"));
        assert_eq!(
            d[0].to_string(),
            "cache_dtype auto (prefill) vs fp8 (decode)"
        );
    }

    #[test]
    fn an_unstated_engine_hashes_the_defaults() {
        let model = crate::geometry::ModelSpec {
            attention: None,
            mamba: None,
            groups: Vec::new(),
            layer_slots: 1,
            state_slots: None,
        };
        assert_eq!(
            EngineCompat::default().factors(&model),
            factors("FLASH_ATTN", "auto")
        );
        assert!(HandshakeCompat::default().is_default());
        assert!(HandshakeCompat::default().enforce);
    }

    #[test]
    fn names_are_spelled_as_vllm_spells_them() {
        assert!(is_backend_name("FLASH_ATTN_MLA"));
        assert!(is_backend_name("FLASHINFER,FLASH_ATTN"));
        assert!(!is_backend_name("flashinfer"));
        assert!(!is_backend_name("FLASH ATTN"));
        assert!(!is_backend_name(""));
        assert!(!is_backend_name("A,"));
        assert!(is_cache_dtype_name("fp8_e4m3"));
        assert!(!is_cache_dtype_name("FP8"));
        assert!(!is_cache_dtype_name("fp8\n"));
    }
}
