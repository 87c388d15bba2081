//! Geometry files that name a model config instead of stating the geometry:
//!
//! ```toml
//! description = "Qwen3-Next, P TP8 -> D TP2 on FlashInfer"
//! [model]
//! hf_config = "../../tests/fixtures/models/qwen3-next-80b-a3b.json"  # relative to this file
//! layer_slots = 2                                                    # optional
//! vllm_release = "0.33.0"                                            # optional
//! [prefill]
//! tp_size = 8
//! backend = "FLASHINFER"      # and optionally block_size, gpu, cache_dtype
//! [decode]
//! tp_size = 2
//! backend = "FLASHINFER"
//! ```
//!
//! The model tables and both engines' blocks are derived as `kvgeom derive`
//! does; an engine may still state `kernel_block` / `logical_block`, which
//! must then be what vLLM would use, under the rules of `model.vllm_release`
//! (default: the pinned release's, `VllmRules::pinned`). The result is written in the
//! plain format and read by the ordinary parser, so every rule of the format
//! applies.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::backend::{Backend, Gpu};
use super::dtype::{CacheDtype, MambaDtype};
use super::engine::EngineOptions;
use super::load_model;
use super::pair::{derive_pair, PairOptions};
use super::rules::VllmRules;
use crate::geometry::error::{GeometryError, Rule, Violation};
use crate::geometry::{to_toml, Engine, Geometry};

/// Keys an engine table of such a file may hold besides the plain format's.
const ENGINE_DERIVE_KEYS: [&str; 6] = [
    "backend",
    "block_size",
    "gpu",
    "cache_dtype",
    "mamba_cache_dtype",
    "mamba_ssm_cache_dtype",
];

/// Parse a geometry file of either kind: one that names `model.hf_config`
/// is derived and then read as a plain file; any other is a plain file.
pub fn parse_geometry_file(source: &str, text: &str) -> Result<Geometry, GeometryError> {
    parse_if_derived(source, text, crate::geometry::parse_geometry)
        .unwrap_or_else(|| crate::geometry::parse_geometry(source, text))
}

/// Read, parse and validate a geometry file of either kind.
pub fn load_geometry_file(path: impl AsRef<Path>) -> Result<Geometry, GeometryError> {
    crate::geometry::load_geometry_with(path.as_ref(), parse_geometry_file)
}

/// The deployment a file that names `model.hf_config` states: the model
/// config and each engine's options, from which its geometry was derived.
/// vLLM's own derivation is run on the same inputs to compare the blocks
/// (`--connector vllm`).
#[derive(Clone, Debug)]
pub struct ModelSource {
    /// The model's HF config, the file's `hf_config` joined to its folder.
    pub hf_config: PathBuf,
    /// The prefill engine's options (TP, backend, GPU, `block_size`, dtypes).
    pub prefill: EngineOptions,
    /// The decode engine's options.
    pub decode: EngineOptions,
}

/// [`load_geometry_file`], with the deployment the file states when it
/// names `model.hf_config` (`None` for a plain file).
pub fn load_geometry_file_with_source(
    path: impl AsRef<Path>,
) -> Result<(Geometry, Option<ModelSource>), GeometryError> {
    let model = RefCell::new(None);
    let geometry = crate::geometry::load_geometry_with(path.as_ref(), |source, text| {
        let geometry = parse_geometry_file(source, text)?;
        *model.borrow_mut() = model_source(source, text)?;
        Ok(geometry)
    })?;
    Ok((geometry, model.into_inner()))
}

/// The deployment of a file that names `model.hf_config`; `None` for any
/// other file.
fn model_source(source: &str, text: &str) -> Result<Option<ModelSource>, GeometryError> {
    let Ok(mut file) = toml::from_str::<Table>(text) else {
        return Ok(None);
    };
    let Some(hf_config) = file
        .get("model")
        .and_then(Value::as_table)
        .and_then(|m| m.get("hf_config"))
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Ok(None);
    };
    let base = Path::new(source).parent().unwrap_or(Path::new("."));
    let rules = file_rules(source, &file)?;
    Ok(Some(ModelSource {
        hf_config: base.join(hf_config),
        prefill: engine_options(source, &mut file, "prefill", rules)?,
        decode: engine_options(source, &mut file, "decode", rules)?,
    }))
}

/// `Some` when the file names `model.hf_config`; `None` leaves the file to
/// the plain parser (which also reports syntax errors).
pub(crate) fn parse_if_derived(
    source: &str,
    text: &str,
    plain: impl Fn(&str, &str) -> Result<Geometry, GeometryError>,
) -> Option<Result<Geometry, GeometryError>> {
    let mut file: Table = toml::from_str(text).ok()?;
    let hf_config = file
        .get("model")?
        .as_table()?
        .get("hf_config")?
        .as_str()?
        .to_string();
    Some(derived(source, &mut file, &hf_config).and_then(|text| plain(source, &text)))
}

fn invalid(source: &str, field: &str, detail: impl Into<String>) -> GeometryError {
    Violation::new(field, Rule::Derived(detail.into())).in_file(source)
}

fn take_str(
    source: &str,
    table: &mut Table,
    prefix: &str,
    key: &str,
) -> Result<Option<String>, GeometryError> {
    match table.remove(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(invalid(
            source,
            &format!("{prefix}.{key}"),
            format!("must be a string, found {v}"),
        )),
    }
}

fn take_int(
    source: &str,
    table: &mut Table,
    prefix: &str,
    key: &str,
) -> Result<Option<u64>, GeometryError> {
    match table.remove(key) {
        None => Ok(None),
        Some(Value::Integer(n)) if n > 0 => Ok(Some(n as u64)),
        Some(v) => Err(invalid(
            source,
            &format!("{prefix}.{key}"),
            format!("must be a positive integer, found {v}"),
        )),
    }
}

/// The rules the file's blocks are derived under: `model.vllm_release`
/// when it names one, else the pinned release's.
pub(crate) fn file_rules(source: &str, file: &Table) -> Result<&'static VllmRules, GeometryError> {
    match file
        .get("model")
        .and_then(Value::as_table)
        .and_then(|m| m.get("vllm_release"))
    {
        None => Ok(VllmRules::pinned()),
        Some(Value::String(release)) => VllmRules::of(release).ok_or_else(|| {
            invalid(
                source,
                "model.vllm_release",
                format!(
                    "kvgeom derives for vLLM {}, not {release}",
                    VllmRules::known()
                ),
            )
        }),
        Some(v) => Err(invalid(
            source,
            "model.vllm_release",
            format!("must be a release string such as \"0.33.0\", found {v}"),
        )),
    }
}

fn engine_options(
    source: &str,
    file: &mut Table,
    name: &str,
    rules: &'static VllmRules,
) -> Result<EngineOptions, GeometryError> {
    let table = file
        .get_mut(name)
        .and_then(Value::as_table_mut)
        .ok_or_else(|| invalid(source, name, "missing table"))?;
    let bad =
        |key: &str, e: super::DeriveError| invalid(source, &format!("{name}.{key}"), e.to_string());
    let backend = take_str(source, table, name, "backend")?.ok_or_else(|| {
        invalid(
            source,
            &format!("{name}.backend"),
            "a file with model.hf_config names each engine's attention backend",
        )
    })?;
    let tp = match table.get("tp_size") {
        Some(Value::Integer(n)) if *n > 0 => *n as u64,
        other => {
            let rule = other.map_or_else(
                || "is missing; give a positive integer".to_string(),
                |v| format!("must be a positive integer, found {v}"),
            );
            return Err(invalid(source, &format!("{name}.tp_size"), rule));
        }
    };
    let gpu = take_str(source, table, name, "gpu")?;
    let cache = take_str(source, table, name, "cache_dtype")?;
    let mamba = take_str(source, table, name, "mamba_cache_dtype")?;
    let ssm = take_str(source, table, name, "mamba_ssm_cache_dtype")?;
    Ok(EngineOptions {
        tp,
        backend: Backend::parse(&backend).map_err(|e| bad("backend", e))?,
        gpu: gpu
            .map_or(Ok(Gpu::Sm90), |g| Gpu::parse(&g))
            .map_err(|e| bad("gpu", e))?,
        block_size: take_int(source, table, name, "block_size")?,
        cache_dtype: cache
            .map_or(Ok(CacheDtype::Auto), |c| CacheDtype::parse(&c))
            .map_err(|e| bad("cache_dtype", e))?,
        rules,
        mamba_cache_dtype: mamba
            .map_or(Ok(MambaDtype::Auto), |m| {
                MambaDtype::parse("mamba_cache_dtype", &m)
            })
            .map_err(|e| bad("mamba_cache_dtype", e))?,
        mamba_ssm_cache_dtype: ssm
            .map_or(Ok(MambaDtype::Auto), |m| {
                MambaDtype::parse("mamba_ssm_cache_dtype", &m)
            })
            .map_err(|e| bad("mamba_ssm_cache_dtype", e))?,
    })
}

/// The file in the plain format: model tables and engine blocks derived.
fn derived(source: &str, file: &mut Table, hf_config: &str) -> Result<String, GeometryError> {
    let base = Path::new(source).parent().unwrap_or(Path::new("."));
    let config_path = base.join(hf_config);
    let rules = file_rules(source, file)?;
    let model_table = file
        .get_mut("model")
        .and_then(Value::as_table_mut)
        .ok_or_else(|| invalid(source, "model", "missing table"))?;
    for key in ["groups", "state_slots", "attention", "mamba"] {
        if model_table.contains_key(key) {
            return Err(invalid(
                source,
                &format!("model.{key}"),
                "is derived from model.hf_config; leave it out",
            ));
        }
    }
    model_table.remove("hf_config");
    model_table.remove("vllm_release");
    let layer_slots = match model_table.remove("layer_slots") {
        None => None,
        Some(Value::Integer(n)) if n > 0 && n <= i64::from(u32::MAX) => Some(n as u32),
        Some(v) => {
            return Err(invalid(
                source,
                "model.layer_slots",
                format!("must be a positive integer, found {v}"),
            ))
        }
    };
    if let Some(key) = model_table.keys().next() {
        return Err(invalid(
            source,
            &format!("model.{key}"),
            "unknown field next to model.hf_config",
        ));
    }
    let model =
        load_model(&config_path).map_err(|e| invalid(source, "model.hf_config", e.to_string()))?;
    let prefill = engine_options(source, file, "prefill", rules)?;
    let decode = engine_options(source, file, "decode", rules)?;
    let enforce_handshake_compat = match file.get("enforce_handshake_compat") {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(v) => {
            return Err(invalid(
                source,
                "enforce_handshake_compat",
                format!("must be true or false, found {v}"),
            ))
        }
    };
    let pair = derive_pair(
        &model,
        &PairOptions {
            prefill,
            decode,
            layer_slots,
            enforce_handshake_compat,
        },
    )
    .map_err(|e| invalid(source, "model.hf_config", e.to_string()))?;

    // Stated blocks must be the ones vLLM uses.
    for (side, engine, derived) in [
        (Engine::Prefill, &pair.geometry.prefill, &pair.prefill),
        (Engine::Decode, &pair.geometry.decode, &pair.decode),
    ] {
        let name = side.as_str();
        let table = file
            .get_mut(name)
            .and_then(Value::as_table_mut)
            .expect("checked above");
        for (key, value, why) in [
            (
                "logical_block",
                engine.logical_block,
                format!(
                    "vLLM {} aligns the block of a hybrid to hold one rank's mamba state ({}) on {} at TP {}: {} tokens",
                    derived.vllm_release,
                    derived
                        .mamba_state_bytes
                        .map_or("no mamba state".to_string(), |m| format!("{m} bytes")),
                    derived.backend,
                    derived.tp,
                    derived.logical_block
                ),
            ),
            (
                "kernel_block",
                engine.kernel_block,
                format!(
                    "{} selects the kernel block with select_common_block_size: {} for logical block {}",
                    derived.backend, derived.kernel_block, derived.logical_block
                ),
            ),
        ] {
            match table.get(key) {
                None => {
                    table.insert(key.to_string(), Value::Integer(i64::from(value)));
                }
                Some(Value::Integer(n)) if *n == i64::from(value) => {}
                Some(v) => {
                    return Err(invalid(
                        source,
                        &format!("{name}.{key}"),
                        format!(
                            "{v} is not what vLLM {} would use; {why}",
                            derived.vllm_release
                        ),
                    ))
                }
            }
        }
        if !table.contains_key("layout") && engine.layout == crate::geometry::KvLayout::Hnd {
            table.insert("layout".into(), Value::String("HND".into()));
        }
        for key in ENGINE_DERIVE_KEYS {
            table.remove(key);
        }
        // What the engine hashes at the handshake, in the plain format.
        let compat = pair.geometry.handshake.of(side);
        for (key, value) in [
            ("backend", &compat.backend),
            ("kv_cache_dtype", &compat.kv_cache_dtype),
        ] {
            if let Some(value) = value {
                table.insert(key.into(), Value::String(value.clone()));
            }
        }
    }
    // The model tables as the plain format writes them.
    let spec_text = to_toml(&pair.geometry);
    let spec: Table = toml::from_str(&spec_text).expect("to_toml writes TOML");
    file.insert("model".into(), spec["model"].clone());
    Ok(toml::to_string(file).expect("a TOML table serializes"))
}
