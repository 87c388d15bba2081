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
//!
//! The parent waits at most the peer time-out ([`crate::time_limits::peer_timeout`])
//! for each line; a peer that says nothing for that long is killed and the
//! wait reported with what it was waiting for.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::derive::load_geometry_file as load_geometry;
use crate::geometry::GeometryError;
use crate::layout::Side;
use crate::nixl::real::RealNixl;
use crate::nixl::{Nixl, NixlError, XferOp};
use crate::scenario::MemoryKind;
use crate::time_limits::TimeLimitError;

use super::buffers::{BenchMemory, Buffer, BufferError, VerifyError};
use super::replay::{create_agents, Agents, ReplayError};
use super::request_plan::{plan_request, PlanError, RequestPlan};

/// Why the peer process (`kvgeom bench-peer`) failed, as it tells the parent.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The geometry file did not load.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// The request could not be planned.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A prefill buffer could not be allocated, filled or cleared.
    #[error(transparent)]
    Buffer(#[from] BufferError),
    /// `verify write` found a prefill row without decode's bytes.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// Real NIXL refused a call.
    #[error(transparent)]
    Nixl(#[from] NixlError),
    /// The prefill agents could not be created.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A protocol line could not be written to stdout.
    #[error("writing to the parent: {0}")]
    WriteParent(#[source] std::io::Error),
    /// Reading a command from stdin failed.
    #[error("reading from the parent: {0}")]
    ReadParent(#[source] std::io::Error),
    /// A command the protocol does not have.
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    /// `load` with metadata that is not hex.
    #[error("metadata is not hex")]
    NotHex,
}

/// What the parent was waiting for when its peer failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Awaited {
    /// The peer's `plan` line.
    Plan,
    /// The peer's `buffer` and `agent` lines, up to `ready`.
    BuffersAndAgents,
    /// The answer to a command (its verb).
    Answer(String),
}

impl std::fmt::Display for Awaited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Awaited::Plan => write!(f, "its plan"),
            Awaited::BuffersAndAgents => write!(f, "its buffers and agents"),
            Awaited::Answer(verb) => write!(f, "the answer to {verb:?}"),
        }
    }
}

/// Why the parent's peer process failed or could not start.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer time-out's environment variable is unusable.
    #[error(transparent)]
    TimeLimit(#[from] TimeLimitError),
    /// The executable did not start.
    #[error("starting the peer process {}: {source}", exe.display())]
    Start {
        /// The executable.
        exe: PathBuf,
        /// What the system answered.
        #[source]
        source: std::io::Error,
    },
    /// The child came without its stdin or stdout pipe.
    #[error("the peer process has no pipes")]
    NoPipes,
    /// The peer's plan line differs from this process's.
    #[error("the peer planned another request: {peer:?}, here {here:?}")]
    OtherPlan {
        /// The peer's plan line.
        peer: String,
        /// This process's.
        here: String,
    },
    /// A `buffer` or `agent` line that does not parse.
    #[error("bad {kind} line from the peer: {line:?}")]
    BadLine {
        /// `buffer` or `agent`.
        kind: &'static str,
        /// The line.
        line: String,
    },
    /// A line the protocol does not have in the set-up (an `error` included).
    #[error("the peer says {line:?}")]
    Says {
        /// The line.
        line: String,
    },
    /// The peer's stdout ended.
    #[error(
        "the peer process ended ({}) while the parent waited for {awaited}",
        status.map(|s| s.to_string()).unwrap_or_default()
    )]
    Ended {
        /// Its exit status, if it could be collected.
        status: Option<ExitStatus>,
        /// What the parent was waiting for.
        awaited: Awaited,
    },
    /// The peer said nothing for the time-out; it was killed.
    #[error(
        "hung: the peer process said nothing for {} while the parent waited for {awaited} \
         (killed; limit {})",
        crate::time_limits::seconds_text(*timeout),
        crate::time_limits::setting_text(crate::time_limits::PEER_TIMEOUT_VAR, *timeout)
    )]
    Hung {
        /// The time-out per line.
        timeout: Duration,
        /// What the parent was waiting for.
        awaited: Awaited,
    },
    /// A command could not be written to the peer's stdin.
    #[error("writing to the peer: {0}")]
    Write(#[source] std::io::Error),
    /// The peer answered a command with something other than `ok`.
    #[error("the peer answered {answer:?} to {verb:?}")]
    Answered {
        /// The answer line.
        answer: String,
        /// The command's verb.
        verb: String,
    },
}

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

fn serve_on(
    args: &PeerArgs,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), ServeError> {
    let geometry = load_geometry(&args.geometry)?;
    let plan = plan_request(&geometry, args.prompt_len)?;
    let memory = BenchMemory::allocate(&plan, args.memory, &[Side::Prefill])?;
    memory.fill(&plan, Side::Prefill)?;
    let mut nixl = RealNixl::new()?;
    for (_, b) in memory.owned(&plan, Side::Prefill) {
        attach(&mut nixl, b);
    }
    let agents = create_agents(&mut nixl, &plan, &memory, &[Side::Prefill])?;
    let say = |out: &mut dyn Write, line: String| -> Result<(), ServeError> {
        writeln!(out, "{TAG}{line}")
            .and_then(|()| out.flush())
            .map_err(ServeError::WriteParent)
    };
    say(out, plan_line(&plan))?;
    for (i, b) in memory.owned(&plan, Side::Prefill) {
        say(out, format!("buffer {i} {}", b.base()))?;
    }
    for (&(_, rank), &agent) in &agents {
        let md = nixl.local_metadata(agent)?;
        say(out, format!("agent {rank} {}", hex(&md)))?;
    }
    say(out, "ready".into())?;
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line).map_err(ServeError::ReadParent)? == 0 {
            return Ok(());
        }
        let (command, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        let done = match command {
            "load" => load(&mut nixl, &agents, rest),
            "clear" => memory.clear(&plan, Side::Prefill).map_err(ServeError::from),
            "fill" => memory.fill(&plan, Side::Prefill).map_err(ServeError::from),
            "verify" if rest == "write" => memory
                .verify(&plan, XferOp::Write)
                .map_err(ServeError::from),
            "quit" => return say(out, "bye".into()),
            other => Err(ServeError::UnknownCommand(other.to_string())),
        };
        match done {
            Ok(()) => say(out, "ok".into())?,
            Err(e) => say(out, format!("error {e}"))?,
        }
    }
}

fn load(nixl: &mut RealNixl, agents: &Agents, hex_md: &str) -> Result<(), ServeError> {
    let md = unhex(hex_md).ok_or(ServeError::NotHex)?;
    for &agent in agents.values() {
        nixl.add_remote_agent(agent, &md)?;
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
    /// How long to wait for each line.
    timeout: Duration,
    /// Address of each prefill buffer in the peer, by plan number.
    pub addresses: Vec<(usize, u64)>,
    /// Metadata of each prefill agent, by rank.
    pub metadata: Vec<(u32, Vec<u8>)>,
}

impl Peer {
    /// Start `exe bench-peer ...` and read its buffers and agents, waiting
    /// at most the peer time-out for each line.
    pub fn spawn(exe: &Path, args: &PeerArgs, plan: &RequestPlan) -> Result<Self, PeerError> {
        let timeout = crate::time_limits::peer_timeout()?;
        Self::spawn_within(exe, args, plan, timeout)
    }

    /// As [`Self::spawn`], with an explicit time-out per line.
    pub fn spawn_within(
        exe: &Path,
        args: &PeerArgs,
        plan: &RequestPlan,
        timeout: Duration,
    ) -> Result<Self, PeerError> {
        let mut child = Command::new(exe)
            .args(args.command_line())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| PeerError::Start {
                exe: exe.to_path_buf(),
                source,
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(PeerError::NoPipes);
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
            timeout,
            addresses: Vec::new(),
            metadata: Vec::new(),
        };
        let expected = plan_line(plan);
        let first = peer.line(Awaited::Plan)?;
        if first != expected {
            peer.stop();
            return Err(PeerError::OtherPlan {
                peer: first,
                here: expected,
            });
        }
        loop {
            let line = peer.line(Awaited::BuffersAndAgents)?;
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["ready"] => return Ok(peer),
                ["buffer", n, addr] => match (n.parse(), addr.parse()) {
                    (Ok(n), Ok(addr)) => peer.addresses.push((n, addr)),
                    _ => {
                        return Err(PeerError::BadLine {
                            kind: "buffer",
                            line,
                        })
                    }
                },
                ["agent", rank, md] => match (rank.parse(), unhex(md)) {
                    (Ok(rank), Some(md)) => peer.metadata.push((rank, md)),
                    _ => {
                        return Err(PeerError::BadLine {
                            kind: "agent",
                            line,
                        })
                    }
                },
                _ => {
                    peer.stop();
                    return Err(PeerError::Says { line });
                }
            }
        }
    }

    /// The next protocol line, waiting at most the time-out; `awaited`
    /// says what the line should bring, for the error.
    fn line(&mut self, awaited: Awaited) -> Result<String, PeerError> {
        match self.lines.recv_timeout(self.timeout) {
            Ok(line) => Ok(line.trim_end().to_string()),
            Err(RecvTimeoutError::Disconnected) => Err(PeerError::Ended {
                status: self.child.wait().ok(),
                awaited,
            }),
            Err(RecvTimeoutError::Timeout) => {
                // A peer stuck in NIXL or UCX would never read `quit`.
                let _ = self.child.kill();
                let _ = self.child.wait();
                Err(PeerError::Hung {
                    timeout: self.timeout,
                    awaited,
                })
            }
        }
    }

    /// Send one command and wait for `ok`.
    pub fn ask(&mut self, command: &str) -> Result<(), PeerError> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(PeerError::Write)?;
        let verb = command.split(' ').next().unwrap_or_default();
        let answer = self.line(Awaited::Answer(verb.to_string()))?;
        match answer.as_str() {
            "ok" => Ok(()),
            _ => Err(PeerError::Answered {
                answer,
                verb: verb.to_string(),
            }),
        }
    }

    /// Tell the peer to quit and wait for its `bye` (at most the time-out),
    /// then for the process; a peer that does not answer is killed.
    pub fn stop(&mut self) {
        let asked = writeln!(self.stdin, "quit").and_then(|()| self.stdin.flush());
        let answered = asked.is_ok()
            && loop {
                match self.lines.recv_timeout(self.timeout) {
                    Ok(line) if line.trim_end() == "bye" => break true,
                    Ok(_) => continue,
                    Err(RecvTimeoutError::Disconnected) => break true,
                    Err(RecvTimeoutError::Timeout) => break false,
                }
            };
        if !answered {
            let _ = self.child.kill();
        }
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

    fn plan() -> RequestPlan {
        let geometry = load_geometry(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/geometries/g6-kimi-linear-scale.toml"
        )))
        .unwrap();
        plan_request(&geometry, 1537).unwrap()
    }

    /// A stand-in peer: a shell script that ignores its arguments.
    fn fake_peer(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kvgeom-peer-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join(name);
        std::fs::write(&exe, format!("#!/bin/sh\n{body}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    fn args() -> PeerArgs {
        PeerArgs {
            geometry: PathBuf::from("unused.toml"),
            prompt_len: 1537,
            memory: MemoryKind::Host,
        }
    }

    #[test]
    fn a_silent_peer_is_killed_and_reported_hung_with_what_was_awaited() {
        let exe = fake_peer("silent", "exec sleep 600");
        let e = Peer::spawn_within(&exe, &args(), &plan(), Duration::from_millis(200))
            .err()
            .expect("a silent peer must not be accepted");
        assert!(
            matches!(
                e,
                PeerError::Hung {
                    awaited: Awaited::Plan,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "hung: the peer process said nothing for 0.200 s while the parent waited for its \
             plan (killed; limit KVGEOM_PEER_TIMEOUT_S=0.2)"
        );
    }

    #[test]
    fn a_peer_that_ends_early_says_what_the_parent_waited_for() {
        let exe = fake_peer("quitter", "exit 3");
        let e = Peer::spawn_within(&exe, &args(), &plan(), Duration::from_secs(60))
            .err()
            .expect("a peer that exits must not be accepted");
        assert_eq!(
            e.to_string(),
            "the peer process ended (exit status: 3) while the parent waited for its plan"
        );
    }

    #[test]
    fn a_peer_that_stops_answering_after_its_plan_is_reported_hung() {
        let expected = plan_line(&plan());
        let exe = fake_peer(
            "stuck",
            &format!("echo '{TAG}{expected}'; echo '{TAG}ready'; exec sleep 600"),
        );
        let mut peer = Peer::spawn_within(&exe, &args(), &plan(), Duration::from_millis(200))
            .expect("the peer sent its plan and ready");
        let e = peer.ask("clear").unwrap_err();
        assert_eq!(
            e.to_string(),
            "hung: the peer process said nothing for 0.200 s while the parent waited for the \
             answer to \"clear\" (killed; limit KVGEOM_PEER_TIMEOUT_S=0.2)"
        );
    }
}
