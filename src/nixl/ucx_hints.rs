//! What to tell someone whose UCX backend did not start or refused memory,
//! by memory kind. Host memory between agents on one node needs UCX's
//! loopback and shared-memory transports; device memory needs UCX's CUDA
//! transports too, and UCX_TLS is an allow-list: without `cuda_copy` UCX
//! takes VRAM for host memory and NIXL refuses to register it ("VRAM memory
//! is detected as host by UCX").

use super::MemKind;

/// The transports for agents in one process or on one node, host memory.
pub const HOST_TLS: &str = "tcp,sm,self";
/// The same with UCX's CUDA transports, for device memory.
pub const VRAM_TLS: &str = "tcp,sm,self,cuda_copy,cuda_ipc";
/// The UCX transports that device memory needs in the allow-list.
pub const CUDA_TRANSPORTS: [&str; 2] = ["cuda_copy", "cuda_ipc"];

/// Whether a UCX_TLS value lets UCX use `transport`: the value is a
/// comma-separated allow-list, `^` in front makes it a deny-list, `all`
/// (or an empty value) allows everything; `cuda` allows every CUDA one.
pub fn allows(ucx_tls: Option<&str>, transport: &str) -> bool {
    let Some(tls) = ucx_tls.map(str::trim).filter(|t| !t.is_empty()) else {
        return true;
    };
    let (deny, list) = match tls.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, tls),
    };
    let named = list.split(',').map(str::trim).any(|t| {
        t == transport
            || t == "all"
            || (t == "cuda" && transport.starts_with("cuda"))
            || (t == "sm" && ["shm", "cma", "knem", "xpmem", "posix", "sysv"].contains(&transport))
    });
    named != deny
}

/// The CUDA transports a UCX_TLS value leaves out.
pub fn missing_cuda_transports(ucx_tls: Option<&str>) -> Vec<&'static str> {
    CUDA_TRANSPORTS
        .into_iter()
        .filter(|t| !allows(ucx_tls, t))
        .collect()
}

/// The environment file that sets the transports for `mem`.
fn env_file(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Dram => ".nixl-runtime/env.sh",
        MemKind::Vram => ".nixl-runtime/env-gpu.sh",
    }
}

/// Hint for a UCX backend that did not start, for agents that will
/// register memory of kind `mem`.
pub fn backend_hint(mem: MemKind, ucx_tls: Option<&str>) -> String {
    let tls = match mem {
        MemKind::Dram => HOST_TLS,
        MemKind::Vram => VRAM_TLS,
    };
    let now = match ucx_tls {
        Some(t) => format!("UCX_TLS is {t:?}"),
        None => "UCX_TLS is unset".into(),
    };
    format!(
        "for agents in one process or on one node with {} memory set UCX_TLS={tls} and \
         UCX_NET_DEVICES=lo ({} does; {now})",
        mem_name(mem),
        env_file(mem)
    )
}

/// Hint for a registration NIXL refused, by memory kind.
pub fn registration_hint(mem: MemKind, ucx_tls: Option<&str>) -> String {
    match mem {
        MemKind::Dram => backend_hint(mem, ucx_tls),
        MemKind::Vram => {
            let missing = missing_cuda_transports(ucx_tls);
            if !missing.is_empty() {
                format!(
                    "UCX_TLS={:?} leaves out {}: UCX then takes device memory for host memory \
                     and NIXL refuses it; set UCX_TLS={VRAM_TLS} ({} does)",
                    ucx_tls.unwrap_or_default(),
                    missing.join(" and "),
                    env_file(mem)
                )
            } else {
                "UCX_TLS allows the CUDA transports, so UCX's CUDA module (libuct_cuda.so) \
                 probably did not load: it needs libcuda.so.1 and libnvidia-ml.so.1 from the \
                 driver on the library path (`ldd` on it names what is missing; \
                 `scripts/gpu-check.sh run` checks it), and with UCX_LOG_LEVEL=info \
                 UCX_MODULE_LOG_LEVEL=info UCX logs why it did not load"
                    .into()
            }
        }
    }
}

fn mem_name(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Dram => "host",
        MemKind::Vram => "device",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_deny_lists_and_aliases() {
        assert!(allows(None, "cuda_copy"));
        assert!(allows(Some(""), "cuda_copy"));
        assert!(!allows(Some("tcp,sm,self"), "cuda_copy"));
        assert!(allows(Some(VRAM_TLS), "cuda_copy") && allows(Some(VRAM_TLS), "cuda_ipc"));
        assert!(allows(Some("tcp,cuda"), "cuda_ipc"));
        assert!(allows(Some("all"), "cuda_ipc"));
        assert!(!allows(Some("^cuda_ipc"), "cuda_ipc"));
        assert!(allows(Some("^cuda_ipc"), "cuda_copy"));
        assert!(allows(Some("sm"), "cma"));
        assert_eq!(
            missing_cuda_transports(Some("tcp,sm,self,cuda_copy")),
            ["cuda_ipc"]
        );
        assert!(missing_cuda_transports(None).is_empty());
    }

    #[test]
    fn hints_say_what_each_memory_kind_needs() {
        let host = backend_hint(MemKind::Dram, Some("rc"));
        assert!(
            host.contains("UCX_TLS=tcp,sm,self and") && host.contains("env.sh"),
            "{host}"
        );
        let vram = backend_hint(MemKind::Vram, None);
        assert!(
            vram.contains("UCX_TLS=tcp,sm,self,cuda_copy,cuda_ipc") && vram.contains("env-gpu.sh"),
            "{vram}"
        );
        let refused = registration_hint(MemKind::Vram, Some("tcp,sm,self"));
        assert!(
            refused.starts_with("UCX_TLS=\"tcp,sm,self\" leaves out cuda_copy and cuda_ipc"),
            "{refused}"
        );
        let no_module = registration_hint(MemKind::Vram, Some(VRAM_TLS));
        assert!(no_module.contains("libnvidia-ml.so.1"), "{no_module}");
    }
}
