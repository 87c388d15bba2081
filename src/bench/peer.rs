//! The prefill side of a replay in a second process (cargo feature
//! `nixl`), so that the two NIXL agents of a transfer live in different
//! processes, as they do in a real P/D deployment. UCX only uses CUDA IPC
//! (`cuda_ipc`) between different processes: within one process it treats
//! a peer's device memory as unreachable through IPC and stages it.
//!
//! The peer is the same `kvgeom` binary (`kvgeom bench-peer`, hidden),
//! which plans the same request from the same arguments, allocates and
//! fills the prefill buffers, creates the prefill agents and then obeys a
//! line protocol on stdin/stdout. UCX writes its own logs (`UCX_PROTO_INFO`
//! tables, warnings) to stdout too, so every protocol line the peer writes
//! starts with [`TAG`] (in one `write`); the parent drains the peer's stdout
//! on a thread, keeps what follows a tag and passes everything else on to
//! its own stderr (so the peer never blocks on a full pipe):
//!
//! ```text
//! peer:   plan <buffers> <pairs> <bytes>
//! peer:   buffer <n> <address>          (one per prefill buffer)
//! peer:   agent <rank> <hex metadata>   (one per prefill rank)
//! peer:   ready
//! parent: load <hex metadata>   -> ok    (a decode agent's metadata)
//! parent: clear | fill          -> ok    (zero / re-pattern the prefill buffers)
//! parent: verify write          -> ok    (prefill rows hold decode's bytes)
//! parent: quit                  -> bye
//! ```
//! Any failure answers `error <text>`. The peer's stderr is the parent's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};

use crate::geometry::load_geometry;
use crate::layout::Side;
use crate::nixl::real::RealNixl;
use crate::nixl::{Nixl, XferOp};
use crate::scenario::MemoryKind;

use super::buffers::{BenchMemory, Buffer};
use super::replay::{create_agents, Agents};
use super::request_plan::{plan_request, RequestPlan};

/// The start of every protocol line the peer writes.
pub const TAG: &str = "kvgeom-peer: ";

/// What both processes plan from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerArgs {
    pub geometry: PathBuf,
    pub prompt_len: u32,
    pub memory: MemoryKind,
}

impl PeerArgs {
    fn command_line(&self) -> Vec<String> {
        vec![
            "bench-peer".into(),
            "--geometry".into(),
            self.geometry.display().to_string(),
            "--prompt".into(),
            self.prompt_len.to_string(),
            "--memory".into(),
            match self.memory {
                MemoryKind::Host => "host".into(),
                MemoryKind::Vram => "vram".into(),
            },
        ]
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of a hex string, or `None` when it is not one.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect()
}

/// The plan line both processes must agree on.
fn plan_line(plan: &RequestPlan) -> String {
    format!(
        "plan {} {} {}",
        plan.buffers.len(),
        plan.pairs(),
        plan.bytes()
    )
}

/// `kvgeom bench-peer`: serve the prefill side until told to quit.
/// Returns the process exit status.
pub fn serve(args: &PeerArgs) -> u8 {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    match serve_on(args, &mut stdin.lock(), &mut stdout) {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(stdout, "{TAG}error {e}");
            eprintln!("bench-peer: {e}");
            1
        }
    }
}

fn serve_on(args: &PeerArgs, input: &mut dyn BufRead, out: &mut dyn Write) -> Result<(), String> {
    let geometry = load_geometry(&args.geometry).map_err(|e| e.to_string())?;
    let plan = plan_request(&geometry, args.prompt_len).map_err(|e| e.to_string())?;
    let memory = BenchMemory::allocate(&plan, args.memory, &[Side::Prefill])?;
    memory.fill(&plan, Side::Prefill)?;
    let mut nixl = RealNixl::new().map_err(|e| e.to_string())?;
    for (_, b) in memory.owned(&plan, Side::Prefill) {
        attach(&mut nixl, b);
    }
    let agents =
        create_agents(&mut nixl, &plan, &memory, &[Side::Prefill]).map_err(|e| e.to_string())?;
    let say = |out: &mut dyn Write, line: String| -> Result<(), String> {
        writeln!(out, "{TAG}{line}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing to the parent: {e}"))
    };
    say(out, plan_line(&plan))?;
    for (i, b) in memory.owned(&plan, Side::Prefill) {
        say(out, format!("buffer {i} {}", b.base()))?;
    }
    for (&(_, rank), &agent) in &agents {
        let md = nixl.local_metadata(agent).map_err(|e| e.to_string())?;
        say(out, format!("agent {rank} {}", hex(&md)))?;
    }
    say(out, "ready".into())?;
    let mut line = String::new();
    loop {
        line.clear();
        if input
            .read_line(&mut line)
            .map_err(|e| format!("reading from the parent: {e}"))?
            == 0
        {
            return Ok(());
        }
        let (command, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let done = match command {
            "load" => load(&mut nixl, &agents, rest),
            "clear" => memory.clear(&plan, Side::Prefill),
            "fill" => memory.fill(&plan, Side::Prefill),
            "verify" if rest == "write" => memory.verify(&plan, XferOp::Write),
            "quit" => return say(out, "bye".into()),
            other => Err(format!("unknown command {other:?}")),
        };
        match done {
            Ok(()) => say(out, "ok".into())?,
            Err(e) => say(out, format!("error {e}"))?,
        }
    }
}

fn load(nixl: &mut RealNixl, agents: &Agents, hex_md: &str) -> Result<(), String> {
    let md = unhex(hex_md).ok_or("metadata is not hex")?;
    for &agent in agents.values() {
        nixl.add_remote_agent(agent, &md)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Let `nixl` register `buffer` (it keeps the buffer alive).
pub fn attach(nixl: &mut RealNixl, buffer: &Buffer) {
    match buffer {
        Buffer::Host(a) => nixl.attach(a.clone()),
        #[cfg(feature = "cuda")]
        Buffer::Device(a) => nixl.attach_device(a.clone()),
    }
}

/// The parent's handle on a running peer.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    /// The peer's protocol lines, tag removed; closed when its stdout ends.
    lines: Receiver<String>,
    /// Address of each prefill buffer in the peer, by plan number.
    pub addresses: Vec<(usize, u64)>,
    /// Metadata of each prefill agent, by rank.
    pub metadata: Vec<(u32, Vec<u8>)>,
}

impl Peer {
    /// Start `exe bench-peer ...` and read its buffers and agents.
    pub fn spawn(exe: &Path, args: &PeerArgs, plan: &RequestPlan) -> Result<Self, String> {
        let mut child = Command::new(exe)
            .args(args.command_line())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting the peer process {}: {e}", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err("the peer process has no pipes".into());
        };
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // UCX's block-buffered stdio may end a write mid-line, so
                // a protocol line can follow a piece of a log line.
                match line.find(TAG) {
                    Some(at) => {
                        if at > 0 {
                            eprintln!("{}", &line[..at]);
                        }
                        if sender.send(line[at + TAG.len()..].to_string()).is_err() {
                            break;
                        }
                    }
                    None => eprintln!("{line}"),
                }
            }
        });
        let mut peer = Peer {
            child,
            stdin,
            lines,
            addresses: Vec::new(),
            metadata: Vec::new(),
        };
        let expected = plan_line(plan);
        let first = peer.line()?;
        if first != expected {
            peer.stop();
            return Err(format!(
                "the peer planned another request: {first:?}, here {expected:?}"
            ));
        }
        loop {
            let line = peer.line()?;
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["ready"] => return Ok(peer),
                ["buffer", n, addr] => match (n.parse(), addr.parse()) {
                    (Ok(n), Ok(addr)) => peer.addresses.push((n, addr)),
                    _ => return Err(format!("bad buffer line from the peer: {line:?}")),
                },
                ["agent", rank, md] => match (rank.parse(), unhex(md)) {
                    (Ok(rank), Some(md)) => peer.metadata.push((rank, md)),
                    _ => return Err(format!("bad agent line from the peer: {line:?}")),
                },
                _ => {
                    peer.stop();
                    return Err(format!("the peer says {line:?}"));
                }
            }
        }
    }

    fn line(&mut self) -> Result<String, String> {
        match self.lines.recv() {
            Ok(line) => Ok(line.trim_end().to_string()),
            Err(_) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(format!("the peer process ended ({status})"))
            }
        }
    }

    /// Send one command and wait for `ok`.
    pub fn ask(&mut self, command: &str) -> Result<(), String> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to the peer: {e}"))?;
        match self.line()?.as_str() {
            "ok" => Ok(()),
            other => Err(format!(
                "the peer answered {other:?} to {:?}",
                command.split(' ').next().unwrap_or_default()
            )),
        }
    }

    /// Tell the peer to quit and wait for it.
    pub fn stop(&mut self) {
        let _ = writeln!(self.stdin, "quit").and_then(|()| self.stdin.flush());
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_non_hex() {
        let bytes = [0u8, 1, 0xab, 0xff, 0x10];
        assert_eq!(hex(&bytes), "0001abff10");
        assert_eq!(unhex("0001abff10"), Some(bytes.to_vec()));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex(""), Some(Vec::new()));
    }
}
