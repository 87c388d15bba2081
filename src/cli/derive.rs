//! `kvgeom derive`: one engine, or a P/D pair as a geometry file, from a
//! model's HF config as a vLLM release would run it (`--release`, by
//! default the pinned one; or, with `--stack sglang`, as SGLang 0.5.23 would).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::derive::{
    derive_engine, derive_pair, derive_sglang_engine, derive_sglang_pair, load_model,
    load_sglang_model, Backend, CacheDtype, DeriveError, EngineDerivation, EngineOptions, Gpu,
    MambaDtype, ModelArch, PairDerivation, PairOptions, SglangPairOptions, VllmRules,
};
use crate::geometry::{parse_geometry, to_toml, ExpectedRejection};
use crate::limits::MAX_LAYER_SLOTS;
use crate::sweep::prompts::parse_prompt_list;

use super::{EXIT_BAD_INPUT, EXIT_OK};

/// `--format` of a single-engine derivation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeriveFormat {
    Json,
    Toml,
}

/// `--stack`: whose rules the derivation follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeriveStack {
    Vllm,
    Sglang,
}

/// The command line of `kvgeom derive`.
#[derive(Clone, Debug, clap::Args)]
pub struct DeriveArgs {
    /// The model's HF `config.json`.
    pub config: PathBuf,
    /// Whose rules: vllm (default) or sglang (SGLang 0.5.23).
    #[arg(long, value_enum, default_value = "vllm")]
    pub stack: DeriveStack,
    /// The vLLM release whose rules apply: 0.33.0 (default, the pinned release) or 0.34.0.
    #[arg(long)]
    pub release: Option<String>,
    /// One engine: its TP size.
    #[arg(long)]
    pub tp: Option<u64>,
    /// One engine: its attention backend (FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, FLASH_ATTN_MLA).
    #[arg(long)]
    pub backend: Option<String>,
    /// A pair: the prefill engine's TP size.
    #[arg(long)]
    pub prefill_tp: Option<u64>,
    #[arg(long)]
    pub prefill_backend: Option<String>,
    /// A pair: the decode engine's TP size.
    #[arg(long)]
    pub decode_tp: Option<u64>,
    #[arg(long)]
    pub decode_backend: Option<String>,
    /// GPU generation: sm90 (default) or sm100.
    #[arg(long)]
    pub gpu: Option<String>,
    /// A pair: the prefill engine's GPU (default: --gpu).
    #[arg(long)]
    pub prefill_gpu: Option<String>,
    /// A pair: the decode engine's GPU (default: --gpu).
    #[arg(long)]
    pub decode_gpu: Option<String>,
    /// vLLM's --block-size (default: the backend's choice).
    #[arg(long)]
    pub block_size: Option<u64>,
    #[arg(long)]
    pub prefill_block_size: Option<u64>,
    #[arg(long)]
    pub decode_block_size: Option<u64>,
    /// vLLM's --kv-cache-dtype: auto, bf16, fp16 or fp8.
    #[arg(long, default_value = "auto")]
    pub cache_dtype: String,
    /// vLLM's --mamba-cache-dtype: auto, float32, float16 or bfloat16.
    #[arg(long, default_value = "auto")]
    pub mamba_cache_dtype: String,
    /// vLLM's --mamba-ssm-cache-dtype: auto, float32, float16 or bfloat16.
    #[arg(long, default_value = "auto")]
    pub mamba_ssm_cache_dtype: String,
    /// One engine: json (default) or toml (the engine table of a geometry file).
    #[arg(long, value_enum, default_value = "json")]
    pub format: DeriveFormat,
    /// A pair: write the geometry file here (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A pair: layer slots to model (default: vLLM's KV-cache group size).
    #[arg(long)]
    pub layer_slots: Option<u32>,
    /// A pair: prompt lengths for the file, e.g. `1..=40,543,544,545`, or
    /// `boundaries`: lengths around every kernel and logical block boundary
    /// of both engines (a short list even for thousand-token blocks).
    #[arg(long)]
    pub prompts: Option<String>,
    /// A pair: the text the connector's handshake error must contain, for a
    /// pair vLLM refuses (in both modes).
    #[arg(long, conflicts_with_all = ["expect_rejection_pull", "expect_rejection_push"])]
    pub expect_rejection: Option<String>,
    /// A pair: the text the handshake error must contain in pull mode, for
    /// a pair refused in pull only (or differently in each mode).
    #[arg(long)]
    pub expect_rejection_pull: Option<String>,
    /// A pair: the text the handshake error must contain in push mode.
    #[arg(long)]
    pub expect_rejection_push: Option<String>,
    /// A pair: the geometry name (default: the --out file stem).
    #[arg(long)]
    pub name: Option<String>,
    /// A pair: write `enforce_handshake_compat = false`, as a deployer who
    /// sets `kv_connector_extra_config: {"enforce_handshake_compat": false}`
    /// on both engines: a pair whose backends or cache dtypes differ is then
    /// judged on its geometry and bytes instead of refused at the handshake.
    #[arg(long)]
    pub no_enforce_handshake_compat: bool,
    /// --stack sglang, a pair: tokens per page on both engines.
    #[arg(long)]
    pub page_size: Option<u64>,
    /// --stack sglang, a pair: keep the first N attention layers and the first N state layers.
    #[arg(long)]
    pub layers: Option<u64>,
}

/// Which command-line shape was used.
enum Request {
    Single(EngineOptions),
    Pair(PairOptions),
}

fn usage(message: &str) -> DeriveError {
    DeriveError::Unsupported(format!(
        "{message}; use `--tp N --backend NAME` for one engine, or `--prefill-tp N --prefill-backend A --decode-tp M --decode-backend B` for a pair"
    ))
}

/// The option names of one engine's settings: `--tp` etc. for a single
/// engine, `--prefill-tp` etc. for a side of a pair.
struct EngineOptionNames {
    tp: &'static str,
    backend: &'static str,
    gpu: &'static str,
    block_size: &'static str,
}

const SINGLE: EngineOptionNames = EngineOptionNames {
    tp: "--tp",
    backend: "--backend",
    gpu: "--gpu",
    block_size: "--block-size",
};
const PREFILL: EngineOptionNames = EngineOptionNames {
    tp: "--prefill-tp",
    backend: "--prefill-backend",
    gpu: "--prefill-gpu",
    block_size: "--prefill-block-size",
};
const DECODE: EngineOptionNames = EngineOptionNames {
    tp: "--decode-tp",
    backend: "--decode-backend",
    gpu: "--decode-gpu",
    block_size: "--decode-block-size",
};

/// `error` prefixed with the option that gave the value.
fn from_option(option: &str, error: DeriveError) -> DeriveError {
    DeriveError::Unsupported(format!("{option}: {error}"))
}

fn engine_options(
    args: &DeriveArgs,
    names: &EngineOptionNames,
    tp: u64,
    backend: &str,
    gpu: Option<&str>,
    block: Option<u64>,
) -> Result<EngineOptions, DeriveError> {
    if tp == 0 {
        return Err(DeriveError::ZeroOption { option: names.tp });
    }
    let block_option = if block.is_some() {
        names.block_size
    } else {
        "--block-size"
    };
    let block_size = block.or(args.block_size);
    if block_size == Some(0) {
        return Err(DeriveError::ZeroOption {
            option: block_option,
        });
    }
    let gpu_option = if gpu.is_some() { names.gpu } else { "--gpu" };
    Ok(EngineOptions {
        rules: release_rules(args)?,
        tp,
        backend: Backend::parse(backend).map_err(|e| from_option(names.backend, e))?,
        gpu: Gpu::parse(gpu.or(args.gpu.as_deref()).unwrap_or("sm90"))
            .map_err(|e| from_option(gpu_option, e))?,
        block_size,
        cache_dtype: CacheDtype::parse(&args.cache_dtype)?,
        mamba_cache_dtype: MambaDtype::parse("--mamba-cache-dtype", &args.mamba_cache_dtype)?,
        mamba_ssm_cache_dtype: MambaDtype::parse(
            "--mamba-ssm-cache-dtype",
            &args.mamba_ssm_cache_dtype,
        )?,
    })
}

/// The rules of `--release` (the pinned release's when it is not given).
fn release_rules(args: &DeriveArgs) -> Result<&'static VllmRules, DeriveError> {
    match args.release.as_deref() {
        None => Ok(VllmRules::pinned()),
        Some(release) => VllmRules::of(release).ok_or_else(|| {
            DeriveError::Unsupported(format!(
                "--release {release}: kvgeom derive knows the block-size rules of vLLM {} only",
                VllmRules::known()
            ))
        }),
    }
}

/// The options that only shape the geometry file of a pair, checked
/// before anything is derived so that each refusal names its option.
fn check_file_options(args: &DeriveArgs) -> Result<(), DeriveError> {
    if let Some(n) = args.layer_slots {
        if n == 0 {
            return Err(DeriveError::ZeroOption {
                option: "--layer-slots",
            });
        }
        if n > MAX_LAYER_SLOTS {
            return Err(DeriveError::Unsupported(format!(
                "--layer-slots {n}: above the limit of {MAX_LAYER_SLOTS} layer slots"
            )));
        }
    }
    if let Some(list) = args.prompts.as_deref().filter(|l| *l != "boundaries") {
        parse_prompt_list(list)
            .map_err(|e| DeriveError::Unsupported(format!("--prompts {e}, or `boundaries`")))?;
    }
    if let Some(text) = &args.expect_rejection {
        if text.trim().is_empty() {
            return Err(DeriveError::Unsupported(
                "--expect-rejection: must not be empty (give text the refusal contains)".into(),
            ));
        }
        if text.contains(['\n', '\r']) {
            return Err(DeriveError::Unsupported(format!(
                "--expect-rejection {text:?}: must be one line"
            )));
        }
    }
    let bad_name = |name: &str| {
        !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            || name.is_empty()
    };
    let rule = "a geometry name is ASCII letters, digits, '-', '_' and '.'";
    match (&args.name, &args.out) {
        (Some(name), _) if bad_name(name) => {
            Err(DeriveError::Unsupported(format!("--name `{name}`: {rule}")))
        }
        (None, Some(out)) => {
            let stem = out
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if bad_name(&stem) {
                return Err(DeriveError::Unsupported(format!(
                    "--out {}: the geometry's name would be the file stem `{stem}`, but {rule}; \
                     give --name",
                    out.display()
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn request(args: &DeriveArgs) -> Result<Request, DeriveError> {
    let single = args.tp.is_some() || args.backend.is_some();
    let pair = args.prefill_tp.is_some()
        || args.prefill_backend.is_some()
        || args.decode_tp.is_some()
        || args.decode_backend.is_some();
    match (single, pair) {
        (true, true) => Err(usage(
            "--tp/--backend and --prefill-*/--decode-* do not go together",
        )),
        (false, false) => Err(usage("no engine given")),
        (true, false) => {
            let tp = args.tp.ok_or_else(|| usage("--backend needs --tp"))?;
            let backend = args
                .backend
                .as_deref()
                .ok_or_else(|| usage("--tp needs --backend"))?;
            Ok(Request::Single(engine_options(
                args, &SINGLE, tp, backend, None, None,
            )?))
        }
        (false, true) => {
            let missing = |what| usage(&format!("a pair needs {what}"));
            let prefill = engine_options(
                args,
                &PREFILL,
                args.prefill_tp.ok_or_else(|| missing("--prefill-tp"))?,
                args.prefill_backend
                    .as_deref()
                    .ok_or_else(|| missing("--prefill-backend"))?,
                args.prefill_gpu.as_deref(),
                args.prefill_block_size,
            )?;
            let decode = engine_options(
                args,
                &DECODE,
                args.decode_tp.ok_or_else(|| missing("--decode-tp"))?,
                args.decode_backend
                    .as_deref()
                    .ok_or_else(|| missing("--decode-backend"))?,
                args.decode_gpu.as_deref(),
                args.decode_block_size,
            )?;
            check_file_options(args)?;
            Ok(Request::Pair(PairOptions {
                prefill,
                decode,
                layer_slots: args.layer_slots,
                enforce_handshake_compat: !args.no_enforce_handshake_compat,
            }))
        }
    }
}

/// Run `kvgeom derive`.
pub fn derive(args: &DeriveArgs) -> u8 {
    match run(args) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

fn run(args: &DeriveArgs) -> Result<(), DeriveError> {
    if args.stack == DeriveStack::Sglang {
        return run_sglang(args);
    }
    for (given, option) in [
        (args.page_size.is_some(), "--page-size"),
        (args.layers.is_some(), "--layers"),
    ] {
        if given {
            return Err(DeriveError::Unsupported(format!(
                "{option} is an option of --stack sglang; vLLM's derivation takes --block-size and --layer-slots"
            )));
        }
    }
    let request = request(args)?;
    let model = load_model(&args.config)?;
    match request {
        Request::Single(options) => {
            let engine = derive_engine(&model, &options)?;
            match args.format {
                DeriveFormat::Json => outln!(
                    "{}",
                    serde_json::to_string_pretty(&engine).expect("a derivation serializes")
                ),
                DeriveFormat::Toml => out!("{}", engine_table(&model, &engine)),
            }
            Ok(())
        }
        Request::Pair(options) => {
            let pair = derive_pair(&model, &options)?;
            let text = geometry_file(args, &model, &pair)?;
            let handshake = &pair.geometry.handshake;
            if let Some(why) = handshake.refusal(&pair.geometry.model) {
                eprintln!(
                    "note: vLLM refuses this pair at its handshake, before any geometry rule ({why}); \
                     --no-enforce-handshake-compat (enforce_handshake_compat = false on both engines) \
                     looks past it"
                );
            }
            match &args.out {
                Some(path) => {
                    std::fs::write(path, &text).map_err(|e| {
                        DeriveError::Unsupported(format!(
                            "--out {}: cannot write: {e}",
                            path.display()
                        ))
                    })?;
                    eprintln!("wrote {}", path.display());
                    eprintln!("{}", pair_summary(&pair));
                }
                None => out!("{text}"),
            }
            Ok(())
        }
    }
}

/// The options only vLLM's derivation takes, and whether each was given.
fn vllm_only_options(args: &DeriveArgs) -> [(bool, &'static str); 15] {
    [
        (args.release.is_some(), "--release"),
        (args.backend.is_some(), "--backend"),
        (args.prefill_backend.is_some(), "--prefill-backend"),
        (args.decode_backend.is_some(), "--decode-backend"),
        (args.gpu.is_some(), "--gpu"),
        (args.prefill_gpu.is_some(), "--prefill-gpu"),
        (args.decode_gpu.is_some(), "--decode-gpu"),
        (args.block_size.is_some(), "--block-size"),
        (args.prefill_block_size.is_some(), "--prefill-block-size"),
        (args.decode_block_size.is_some(), "--decode-block-size"),
        (args.cache_dtype != "auto", "--cache-dtype"),
        (args.mamba_cache_dtype != "auto", "--mamba-cache-dtype"),
        (
            args.mamba_ssm_cache_dtype != "auto",
            "--mamba-ssm-cache-dtype",
        ),
        (args.layer_slots.is_some(), "--layer-slots"),
        (
            args.expect_rejection_pull.is_some() || args.expect_rejection_push.is_some(),
            "--expect-rejection-pull/--expect-rejection-push",
        ),
    ]
}

fn sglang_usage(message: &str) -> DeriveError {
    DeriveError::Unsupported(format!(
        "{message}; with --stack sglang use `--tp N` for one engine, or `--prefill-tp N --decode-tp M [--page-size P]` for a pair"
    ))
}

/// `kvgeom derive --stack sglang`: one engine as JSON, or a pair as an
/// SGLang geometry file.
fn run_sglang(args: &DeriveArgs) -> Result<(), DeriveError> {
    if let Some((_, option)) = vllm_only_options(args)
        .into_iter()
        .find(|(given, _)| *given)
    {
        return Err(DeriveError::NotAnSglangOption { option });
    }
    let pair = args.prefill_tp.is_some() || args.decode_tp.is_some();
    if args.format == DeriveFormat::Toml {
        return Err(DeriveError::Unsupported(
            "--format toml: with --stack sglang one engine is JSON; a pair is a geometry file"
                .into(),
        ));
    }
    match (args.tp, pair) {
        (Some(_), true) => Err(sglang_usage(
            "--tp and --prefill-tp/--decode-tp do not go together",
        )),
        (None, false) => Err(sglang_usage("no engine given")),
        (Some(tp), false) => {
            for (given, option) in [
                (args.page_size.is_some(), "--page-size"),
                (args.layers.is_some(), "--layers"),
                (args.out.is_some(), "--out"),
                (args.prompts.is_some(), "--prompts"),
                (args.expect_rejection.is_some(), "--expect-rejection"),
                (args.name.is_some(), "--name"),
            ] {
                if given {
                    return Err(sglang_usage(&format!("{option} is for a pair")));
                }
            }
            if tp == 0 {
                return Err(DeriveError::ZeroOption { option: "--tp" });
            }
            let model = load_sglang_model(&args.config)?;
            let engine = derive_sglang_engine(&model, tp)?;
            outln!(
                "{}",
                serde_json::to_string_pretty(&engine).expect("a derivation serializes")
            );
            Ok(())
        }
        (None, true) => {
            let missing = |what| sglang_usage(&format!("a pair needs {what}"));
            let prefill_tp = args.prefill_tp.ok_or_else(|| missing("--prefill-tp"))?;
            let decode_tp = args.decode_tp.ok_or_else(|| missing("--decode-tp"))?;
            for (value, option) in [
                (prefill_tp, "--prefill-tp"),
                (decode_tp, "--decode-tp"),
                (args.page_size.unwrap_or(1), "--page-size"),
                (args.layers.unwrap_or(1), "--layers"),
            ] {
                if value == 0 {
                    return Err(DeriveError::ZeroOption { option });
                }
            }
            if args.name.is_some() {
                return Err(sglang_usage(
                    "--name: an SGLang geometry is named by its file",
                ));
            }
            check_file_options(args)?;
            let prompts = match args.prompts.as_deref() {
                None | Some("boundaries") => None,
                Some(list) => Some(parse_prompt_list(list).map_err(|e| {
                    DeriveError::Unsupported(format!("--prompts {e}, or `boundaries`"))
                })?),
            };
            let model = load_sglang_model(&args.config)?;
            let pair = derive_sglang_pair(
                &model,
                &SglangPairOptions {
                    prefill_tp,
                    decode_tp,
                    page_size: args.page_size.unwrap_or(SGLANG_PAGE_SIZE),
                    layers: args.layers,
                    prompts,
                    expect_rejection: args.expect_rejection.clone(),
                    source: args.config.display().to_string(),
                },
            )?;
            match &args.out {
                Some(path) => {
                    std::fs::write(path, &pair.text).map_err(|e| {
                        DeriveError::Unsupported(format!(
                            "--out {}: cannot write: {e}",
                            path.display()
                        ))
                    })?;
                    eprintln!("wrote {}", path.display());
                }
                None => out!("{}", pair.text),
            }
            Ok(())
        }
    }
}

/// `--page-size` when not given: pages of one token.
const SGLANG_PAGE_SIZE: u64 = 1;

fn engine_line(e: &EngineDerivation) -> String {
    format!(
        "TP{} {} on {}: logical {} / kernel {} (ppl {}), {} attention bytes per token per rank{}, page {} bytes",
        e.tp,
        e.backend,
        e.gpu,
        e.logical_block,
        e.kernel_block,
        e.ppl,
        e.attention_bytes_per_token,
        e.mamba_state_bytes
            .map_or(String::new(), |m| format!(", mamba state {m} bytes per rank")),
        e.page_bytes
    )
}

fn pair_summary(pair: &PairDerivation) -> String {
    format!(
        "prefill {}\ndecode  {}",
        engine_line(&pair.prefill),
        engine_line(&pair.decode)
    )
}

/// `# ...` lines saying how an engine was derived.
fn options_line(e: &EngineDerivation) -> String {
    let mut line = format!("--tp {} --backend {} --gpu {}", e.tp, e.backend, e.gpu);
    if let Some(b) = e.block_size_option {
        let _ = write!(line, " --block-size {b}");
    }
    if e.cache_dtype != "auto" {
        let _ = write!(line, " --cache-dtype {}", e.cache_dtype);
    }
    line
}

fn engine_table(model: &ModelArch, e: &EngineDerivation) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# {}, {}: derived by kvgeom derive {} as vLLM {} runs it",
        e.model_type,
        model.family.models(),
        options_line(e),
        e.vllm_release
    );
    let _ = writeln!(out, "# {}", engine_line(e));
    if let Some(m) = &e.mamba {
        let _ = writeln!(
            out,
            "# mamba ({}) per rank: conv {}x{} {} ({} bytes, split {:?}) + SSM {:?} {} ({} bytes)",
            m.kind,
            m.conv_shape[0],
            m.conv_shape[1],
            m.conv_dtype,
            m.conv_bytes,
            m.conv_split,
            m.ssm_shape,
            m.ssm_dtype,
            m.ssm_bytes
        );
    }
    let _ = writeln!(
        out,
        "# Use it as the [prefill] or [decode] table of a geometry file."
    );
    let _ = writeln!(out, "[prefill]");
    let _ = writeln!(out, "tp_size = {}", e.tp);
    let _ = writeln!(out, "kernel_block = {}", e.kernel_block);
    let _ = writeln!(out, "logical_block = {}", e.logical_block);
    if e.attention.kind != "mla" {
        let _ = writeln!(out, "layout = \"HND\"");
    }
    out
}

fn geometry_file(
    args: &DeriveArgs,
    model: &ModelArch,
    pair: &PairDerivation,
) -> Result<String, DeriveError> {
    let (p, d) = (&pair.prefill, &pair.decode);
    let name = args
        .name
        .clone()
        .or_else(|| {
            args.out
                .as_deref()
                .and_then(Path::file_stem)
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| format!("{}-derived", p.model_type.replace('_', "-")));
    let mut geometry = pair.geometry.clone();
    geometry.name = name;
    geometry.expect_rejection = match (
        &args.expect_rejection,
        &args.expect_rejection_pull,
        &args.expect_rejection_push,
    ) {
        (Some(both), _, _) => Some(ExpectedRejection::both(both)),
        (None, None, None) => None,
        (None, pull, push) => Some(ExpectedRejection {
            pull: pull.clone(),
            push: push.clone(),
        }),
    };
    geometry.description = format!(
        "{} from {}: P TP{} {} {}/{} (ppl {}) -> D TP{} {} {}/{} (ppl {})",
        model.family.models(),
        args.config.display(),
        p.tp,
        p.backend,
        p.logical_block,
        p.kernel_block,
        p.ppl,
        d.tp,
        d.backend,
        d.logical_block,
        d.kernel_block,
        d.ppl
    );
    let body = to_toml(&geometry);
    let boundaries;
    let prompts = match args.prompts.as_deref() {
        Some("boundaries") => {
            boundaries = boundary_prompts(pair);
            Some(boundaries.as_str())
        }
        other => other,
    };
    let mut body = match prompts {
        None => body,
        Some(list) => {
            parse_prompt_list(list)
                .map_err(|e| DeriveError::Unsupported(format!("--prompts {e}, or `boundaries`")))?;
            let entries = prompt_entries(list);
            body.replacen(
                "\n[model]",
                &format!("prompts = [{}]\n\n[model]", entries.join(", ")),
                1,
            )
        }
    };
    if !body.ends_with('\n') {
        body.push('\n');
    }
    let g = &pair.groups;
    let mamba_slots = g.slots_of(crate::geometry::GroupKind::Mamba);
    let partial = if g.mamba_layers > 0 && mamba_slots < g.group_size {
        format!(
            " (a mamba layer in the first {mamba_slots} slots only: vLLM registers no state in the others)"
        )
    } else {
        String::new()
    };
    let mut head = String::new();
    let _ = writeln!(
        head,
        "# Derived by `kvgeom derive {}` from a {} config, as vLLM {} runs it:",
        args.config.display(),
        p.model_type,
        p.vllm_release
    );
    let _ = writeln!(head, "#   prefill {}", options_line(p));
    let _ = writeln!(head, "#   decode  {}", options_line(d));
    let _ = writeln!(head, "# prefill {}", engine_line(p));
    let _ = writeln!(head, "# decode  {}", engine_line(d));
    let _ = writeln!(
        head,
        "# KV-cache groups: {} attention + {} mamba layers in groups of {}{partial}; layer_slots = {}{}",
        g.attention_layers,
        g.mamba_layers,
        g.group_size,
        geometry.model.layer_slots,
        if u64::from(geometry.model.layer_slots) == g.group_size {
            ""
        } else {
            " (the first slots only, to keep the sweep small)"
        }
    );
    let text = format!("{head}{body}");
    // What is written must load as it stands.
    parse_geometry(&name_for_check(args), &text).map_err(|e| {
        DeriveError::Unsupported(format!("the derived geometry does not load: {e}"))
    })?;
    Ok(text)
}

/// A geometry file's `prompts` entries for a list that parses
/// (`parse_prompt_list`): each item as given, a range as `"START..=END"`.
fn prompt_entries(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("..=") {
                format!("\"{e}\"")
            } else if let Some((a, b)) = e.split_once("..") {
                let end = b.trim().parse::<u32>().map_or(0, |b| b.saturating_sub(1));
                format!("\"{}..={end}\"", a.trim())
            } else {
                e.to_string()
            }
        })
        .collect()
}

/// Lengths around each block boundary of both engines: one block of each
/// size, one past it and one short, twice the larger logical block, and the
/// shortest prompts. A hybrid transfers N - 1 tokens, so N = B + 1 fills a
/// block of B exactly.
fn boundary_prompts(pair: &PairDerivation) -> String {
    let (p, d) = (&pair.prefill, &pair.decode);
    let mut lengths = vec![1u64, 2, 3];
    let largest = p.logical_block.max(d.logical_block);
    for b in [
        p.kernel_block,
        d.kernel_block,
        p.logical_block,
        d.logical_block,
        2 * largest,
    ] {
        lengths.extend([b - 1, b, b + 1, b + 2]);
    }
    lengths.sort_unstable();
    lengths.dedup();
    let items: Vec<String> = lengths.iter().map(ToString::to_string).collect();
    items.join(",")
}

fn name_for_check(args: &DeriveArgs) -> String {
    args.out
        .as_ref()
        .map_or_else(|| "derived.toml".to_string(), |p| p.display().to_string())
}
