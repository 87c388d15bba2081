//! The blocks vLLM chooses for a geometry that names its model config,
//! against the ones kvgeom derived (`kvgeom derive`, the file loader).
//!
//! kvgeom sends the driver each such geometry's deployment (config path, TP,
//! backend, `block_size`, GPU, cache dtypes per engine); the driver runs
//! vLLM's own block-size derivation on it (`vllm-driver/block_sizes.py`)
//! and returns the kernel block, logical block and page bytes vLLM chose.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::derive::{EngineOptions, ModelSource};
use crate::geometry::{EngineGeometry, Geometry};

/// The `format` of the driver's `blocks.json`.
pub const BLOCKS_FORMAT: &str = "kvgeom-vllm-blocks/1";

/// A geometry whose blocks are checked against vLLM's derivation.
#[derive(Clone, Debug)]
pub struct BlockCheck {
    /// The geometry kvgeom derived (its engines hold kvgeom's blocks).
    pub geometry: Arc<Geometry>,
    /// The deployment it was derived from.
    pub source: Arc<ModelSource>,
}

/// One engine's deployment as the driver's derivation takes it (the keys
/// of `scripts/vllm-derive-reference.py`'s cases).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineDeployment {
    /// The model's HF config.
    pub config: String,
    /// Tensor-parallel size.
    pub tp: u64,
    /// vLLM's name of the attention backend.
    pub backend: &'static str,
    /// `sm90` or `sm100`.
    pub gpu: &'static str,
    /// `--block-size`; `None`: vLLM chooses.
    pub block_size: Option<u64>,
    /// `--kv-cache-dtype`.
    pub cache_dtype: &'static str,
    /// `--mamba-cache-dtype`.
    pub mamba_cache_dtype: &'static str,
    /// `--mamba-ssm-cache-dtype`.
    pub mamba_ssm_cache_dtype: &'static str,
}

impl EngineDeployment {
    fn of(config: &Path, options: &EngineOptions) -> Self {
        EngineDeployment {
            config: config.display().to_string(),
            tp: options.tp,
            backend: options.backend.name(),
            gpu: options.gpu.name(),
            block_size: options.block_size,
            cache_dtype: options.cache_dtype.vllm_name(),
            mamba_cache_dtype: options.mamba_cache_dtype.vllm_name(),
            mamba_ssm_cache_dtype: options.mamba_ssm_cache_dtype.vllm_name(),
        }
    }
}

/// One entry of the batch's `block_checks`.
#[derive(Clone, Debug, Serialize)]
pub struct BlockCheckSpec {
    /// The check's name in `blocks.json` (`b0`, `b1`, ...).
    pub id: String,
    /// The prefill engine's deployment.
    pub prefill: EngineDeployment,
    /// The decode engine's deployment.
    pub decode: EngineDeployment,
}

impl BlockCheck {
    /// The check as the driver takes it.
    pub fn spec(&self, id: String) -> BlockCheckSpec {
        let config = &self.source.hf_config;
        BlockCheckSpec {
            id,
            prefill: EngineDeployment::of(config, &self.source.prefill),
            decode: EngineDeployment::of(config, &self.source.decode),
        }
    }
}

/// One engine's blocks: what kvgeom's geometry holds, or what vLLM chose.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct EngineBlocks {
    /// Tokens per kernel block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_block: Option<u64>,
    /// Tokens per logical block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_block: Option<u64>,
    /// One rank's page of one layer slot (one logical block), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_bytes: Option<u64>,
    /// vLLM refused the deployment: its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The driver's derivation failed: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EngineBlocks {
    /// The blocks of one engine of a geometry.
    pub fn of(geometry: &Geometry, engine: &EngineGeometry) -> Self {
        EngineBlocks {
            kernel_block: Some(u64::from(engine.kernel_block)),
            logical_block: Some(u64::from(engine.logical_block)),
            page_bytes: Some(engine.unified_page_bytes(&geometry.model)),
            refused: None,
            error: None,
        }
    }
}

/// Both engines' blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct PairBlocks {
    /// The prefill engine.
    pub prefill: EngineBlocks,
    /// The decode engine.
    pub decode: EngineBlocks,
}

/// One entry of `blocks.json`.
#[derive(Clone, Debug, Deserialize)]
struct BlocksEntry {
    id: String,
    #[serde(flatten)]
    blocks: PairBlocks,
}

/// The driver's `blocks.json`.
#[derive(Clone, Debug, Deserialize)]
struct BlocksFile {
    format: String,
    checks: Vec<BlocksEntry>,
}

/// vLLM's blocks against kvgeom's for one geometry (the `blocks` of each
/// of its cases in the report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlocksComparison {
    /// vLLM chose exactly kvgeom's kernel block, logical block and page on
    /// both engines.
    pub equal: bool,
    /// What vLLM chose (absent when its derivation did not run).
    pub vllm: Option<PairBlocks>,
    /// kvgeom's blocks: the geometry's engines.
    pub kvgeom: PairBlocks,
    /// The first engine and quantity that differ, when not equal.
    pub first_difference: Option<String>,
}

/// Compare vLLM's blocks with kvgeom's.
pub fn compare(kvgeom: &PairBlocks, vllm: &PairBlocks) -> BlocksComparison {
    let mut first_difference = None;
    for (side, k, v) in [
        ("prefill", &kvgeom.prefill, &vllm.prefill),
        ("decode", &kvgeom.decode, &vllm.decode),
    ] {
        let why = if let Some(message) = &v.refused {
            Some(format!("{side}: vLLM refuses the deployment: {message}"))
        } else if let Some(message) = &v.error {
            Some(format!("{side}: vLLM's derivation failed: {message}"))
        } else {
            [
                ("kernel_block", k.kernel_block, v.kernel_block),
                ("logical_block", k.logical_block, v.logical_block),
                ("page_bytes", k.page_bytes, v.page_bytes),
            ]
            .into_iter()
            .find(|(_, a, b)| a != b)
            .map(|(what, a, b)| {
                let show = |x: Option<u64>| x.map_or("none".to_string(), |x| x.to_string());
                format!("{side} {what}: kvgeom {}, vLLM {}", show(a), show(b))
            })
        };
        if why.is_some() {
            first_difference = why;
            break;
        }
    }
    BlocksComparison {
        equal: first_difference.is_none(),
        vllm: Some(vllm.clone()),
        kvgeom: kvgeom.clone(),
        first_difference,
    }
}

/// No comparison: the driver left no blocks for the geometry.
pub fn not_derived(kvgeom: &PairBlocks, why: &str) -> BlocksComparison {
    BlocksComparison {
        equal: false,
        vllm: None,
        kvgeom: kvgeom.clone(),
        first_difference: Some(format!("vLLM's block derivation did not run: {why}")),
    }
}

/// Why `blocks.json` is unusable.
#[derive(Debug, thiserror::Error)]
pub enum BlocksFileError {
    /// It could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// It is not the JSON the protocol names.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// Another format.
    #[error("{}: format {found} is not {BLOCKS_FORMAT}", path.display())]
    Format {
        /// The file.
        path: std::path::PathBuf,
        /// Its `format`.
        found: String,
    },
}

/// vLLM's blocks per check id, from the driver's `blocks.json`.
pub fn read_blocks(
    path: &Path,
) -> Result<std::collections::HashMap<String, PairBlocks>, BlocksFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| BlocksFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file: BlocksFile =
        serde_json::from_str(&text).map_err(|source| BlocksFileError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    if file.format != BLOCKS_FORMAT {
        return Err(BlocksFileError::Format {
            path: path.to_path_buf(),
            found: file.format,
        });
    }
    Ok(file.checks.into_iter().map(|e| (e.id, e.blocks)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(kernel: u64, logical: u64, page: u64) -> EngineBlocks {
        EngineBlocks {
            kernel_block: Some(kernel),
            logical_block: Some(logical),
            page_bytes: Some(page),
            ..EngineBlocks::default()
        }
    }

    #[test]
    fn equal_blocks_compare_equal_and_the_first_difference_is_named() {
        let ours = PairBlocks {
            prefill: engine(16, 144, 147456),
            decode: engine(32, 544, 557056),
        };
        let same = compare(&ours, &ours.clone());
        assert!(same.equal);
        assert_eq!(same.first_difference, None);
        let mut theirs = ours.clone();
        theirs.decode.logical_block = Some(1088);
        theirs.decode.page_bytes = Some(1114112);
        let differ = compare(&ours, &theirs);
        assert!(!differ.equal);
        assert_eq!(
            differ.first_difference.as_deref(),
            Some("decode logical_block: kvgeom 544, vLLM 1088")
        );
        theirs.prefill = EngineBlocks {
            refused: Some("TP 3 does not divide the heads".into()),
            ..EngineBlocks::default()
        };
        assert_eq!(
            compare(&ours, &theirs).first_difference.as_deref(),
            Some("prefill: vLLM refuses the deployment: TP 3 does not divide the heads")
        );
        let none = not_derived(&ours, "the driver was stopped");
        assert!(!none.equal && none.vllm.is_none());
    }

    #[test]
    fn blocks_file_reads_per_check_and_refuses_another_format() {
        let dir = std::env::temp_dir().join(format!("kvgeom-blocks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("blocks.json");
        std::fs::write(
            &path,
            r#"{"format": "kvgeom-vllm-blocks/1", "checks": [{"id": "b0",
              "prefill": {"logical_block": 64, "kernel_block": 64, "page_bytes": 73728},
              "decode": {"refused": "no"}}]}"#,
        )
        .unwrap();
        let blocks = read_blocks(&path).unwrap();
        assert_eq!(blocks["b0"].prefill, engine(64, 64, 73728));
        assert_eq!(blocks["b0"].decode.refused.as_deref(), Some("no"));
        std::fs::write(&path, r#"{"format": "x", "checks": []}"#).unwrap();
        assert!(matches!(
            read_blocks(&path),
            Err(BlocksFileError::Format { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
