//! Transfer scenarios shared by the loopback tests and the loopback-vs-real
//! NIXL comparison. Each scenario runs against any transport that can attach
//! host arenas and returns what an observer sees: final arena bytes,
//! notifications received, and the verdict (accepted or error kind) of every
//! step that real NIXL may reject.

#![allow(dead_code)]

use std::ops::Range;

use kvgeom::memory::HostArena;
use kvgeom::nixl::{
    AgentId, DescList, DescRow, DlistHandle, DlistTarget, Loopback, MemKind, MemRegion, Nixl,
    NixlError, NixlResult, StridedRun, XferHandle, XferOp, XferState,
};

/// A transport whose agents can register memory of the given arenas.
pub trait HostTransport: Nixl {
    fn attach_arena(&mut self, arena: HostArena);
}

impl HostTransport for Loopback {
    fn attach_arena(&mut self, arena: HostArena) {
        self.attach(arena);
    }
}

#[cfg(feature = "nixl")]
impl HostTransport for kvgeom::nixl::real::RealNixl {
    fn attach_arena(&mut self, arena: HostArena) {
        self.attach(arena);
    }
}

/// Upper bound on polls while waiting for real NIXL (1 ms apart).
const MAX_POLLS: u32 = 20_000;

/// The error kind, as compared across transports.
pub fn kind(e: &NixlError) -> &'static str {
    match e {
        NixlError::InvalidParam(_) => "InvalidParam",
        NixlError::NotFound(_) => "NotFound",
        NixlError::Backend(_) => "Backend",
        NixlError::RuntimeUnavailable(_) => "RuntimeUnavailable",
        NixlError::Unsupported(_) => "Unsupported",
    }
}

/// Byte `i` of pattern `seed`: never zero, different for nearby seeds.
pub fn pattern_byte(seed: u8, i: usize) -> u8 {
    1 + ((i * 7 + usize::from(seed) * 31) % 251) as u8
}

pub fn filled(len: u64, seed: u8) -> HostArena {
    let arena = HostArena::new(len);
    for (i, b) in arena.write().iter_mut().enumerate() {
        *b = pattern_byte(seed, i);
    }
    arena
}

pub fn dram(arena: &HostArena, offset: u64, len: u64) -> MemRegion {
    MemRegion {
        addr: arena.base() + offset,
        len,
        mem: MemKind::Dram,
        dev: 0,
    }
}

pub fn run(arena: &HostArena, offset: u64, len: u64, stride: u64, count: u64) -> StridedRun {
    StridedRun {
        addr: arena.base() + offset,
        len,
        dev: 0,
        stride,
        count,
    }
}

pub fn row(arena: &HostArena, offset: u64, len: u64) -> DescRow {
    DescRow {
        addr: arena.base() + offset,
        len,
        dev: 0,
    }
}

pub fn ctx(step: &str) -> impl FnOnce(NixlError) -> String + '_ {
    move |e| format!("{step}: {e}")
}

/// Poll until the transfer is done.
pub fn wait_done<T: Nixl + ?Sized>(t: &mut T, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
    for _ in 0..MAX_POLLS {
        if t.xfer_state(agent, xfer)? == XferState::Done {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(NixlError::Backend(format!(
        "transfer {} not done after {MAX_POLLS} polls",
        xfer.0
    )))
}

/// Poll until `agent` has received `count` notifications; returns them in
/// arrival order.
pub fn wait_notifications<T: Nixl + ?Sized>(
    t: &mut T,
    agent: AgentId,
    count: usize,
) -> NixlResult<Vec<(String, Vec<u8>)>> {
    let mut got = Vec::new();
    for _ in 0..MAX_POLLS {
        got.extend(t.take_notifications(agent)?);
        if got.len() >= count {
            return Ok(got);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(NixlError::Backend(format!(
        "{} of {count} notifications after {MAX_POLLS} polls",
        got.len()
    )))
}

/// What a scenario observed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Final bytes of every arena, in the scenario's order.
    pub arenas: Vec<Vec<u8>>,
    /// (receiver, sender, message), sorted.
    pub notifications: Vec<(String, String, Vec<u8>)>,
    /// (step, accepted or the error kind), in order.
    pub verdicts: Vec<(String, Result<(), &'static str>)>,
}

impl Outcome {
    pub fn snapshot(&mut self, arenas: &[&HostArena]) {
        self.arenas = arenas.iter().map(|a| a.snapshot()).collect();
    }

    pub fn verdict<T>(&mut self, step: &str, result: NixlResult<T>) -> Option<T> {
        match result {
            Ok(v) => {
                self.verdicts.push((step.to_string(), Ok(())));
                Some(v)
            }
            Err(e) => {
                self.verdicts.push((step.to_string(), Err(kind(&e))));
                None
            }
        }
    }

    pub fn notified(&mut self, receiver: &str, got: Vec<(String, Vec<u8>)>) {
        for (sender, message) in got {
            self.notifications
                .push((receiver.to_string(), sender, message));
        }
        self.notifications.sort();
    }
}

/// Create `names` agents; agent i registers `regions[i]`; every agent loads
/// every other agent's metadata.
pub fn mesh<T: HostTransport>(
    t: &mut T,
    names: &[&str],
    regions: &[Vec<MemRegion>],
) -> Result<Vec<AgentId>, String> {
    let mut ids = Vec::new();
    for (name, regions) in names.iter().zip(regions) {
        let id = t.create_agent(name).map_err(ctx("create agent"))?;
        t.register_memory(id, regions).map_err(ctx("register"))?;
        ids.push(id);
    }
    let mut metadata = Vec::new();
    for &id in &ids {
        metadata.push(t.local_metadata(id).map_err(ctx("export metadata"))?);
    }
    for &id in &ids {
        for (j, md) in metadata.iter().enumerate() {
            if ids[j] != id {
                let name = t.add_remote_agent(id, md).map_err(ctx("load metadata"))?;
                if name != names[j] {
                    return Err(format!("metadata of '{}' loaded as '{name}'", names[j]));
                }
            }
        }
    }
    Ok(ids)
}

/// Prepare two DRAM lists on `agent`: `local` against its own memory,
/// `remote` against `remote_agent`'s.
pub fn prepare_lists<T: Nixl + ?Sized>(
    t: &mut T,
    agent: AgentId,
    local: &DescList,
    remote_agent: &str,
    remote: &DescList,
) -> NixlResult<(DlistHandle, DlistHandle)> {
    let lh = t.prepare_dlist(agent, &DlistTarget::Local, MemKind::Dram, local)?;
    let rh = t.prepare_dlist(
        agent,
        &DlistTarget::Remote(remote_agent.into()),
        MemKind::Dram,
        remote,
    )?;
    Ok((lh, rh))
}

/// Prepare, make, post and wait; returns the transfer handle.
#[allow(clippy::too_many_arguments)]
pub fn transfer<T: HostTransport>(
    t: &mut T,
    initiator: AgentId,
    op: XferOp,
    local: &DescList,
    local_ids: &[u32],
    remote_agent: &str,
    remote: &DescList,
    remote_ids: &[u32],
    notification: Option<&[u8]>,
) -> Result<XferHandle, String> {
    let (lh, rh) =
        prepare_lists(t, initiator, local, remote_agent, remote).map_err(ctx("prepare"))?;
    let x = t
        .make_xfer(initiator, op, lh, local_ids, rh, remote_ids, notification)
        .map_err(ctx("make"))?;
    t.post_xfer(initiator, x).map_err(ctx("post"))?;
    wait_done(t, initiator, x).map_err(ctx("wait"))?;
    Ok(x)
}

/// The layout most scenarios use: P owns `pa` (two regions of 2 KiB), D owns
/// `da` (one region of 4 KiB).
pub struct TwoArenas {
    pub pa: HostArena,
    pub da: HostArena,
}

impl TwoArenas {
    pub fn new<T: HostTransport>(t: &mut T) -> Self {
        let pa = filled(4096, 1);
        let da = filled(4096, 2);
        t.attach_arena(pa.clone());
        t.attach_arena(da.clone());
        Self { pa, da }
    }

    pub fn p_regions(&self) -> Vec<MemRegion> {
        vec![dram(&self.pa, 0, 2048), dram(&self.pa, 2048, 2048)]
    }

    pub fn d_regions(&self) -> Vec<MemRegion> {
        vec![dram(&self.da, 0, 4096)]
    }

    /// 12 rows of 64 bytes in P: 8 rows 128 apart in the first region, then
    /// 4 dense rows in the second.
    pub fn p_list(&self) -> DescList {
        DescList::from_runs([run(&self.pa, 0, 64, 128, 8), run(&self.pa, 2048, 64, 64, 4)])
    }

    /// 12 rows of 64 bytes in D, 192 apart from offset 256.
    pub fn d_list(&self) -> DescList {
        DescList::from_runs([run(&self.da, 256, 64, 192, 12)])
    }
}

/// [`TwoArenas`] with agents "prefill" (owning `pa`) and "decode" (owning
/// `da`), each with the other's metadata loaded; returns the arenas, P and D.
pub fn prefill_and_decode<T: HostTransport>(
    t: &mut T,
) -> Result<(TwoArenas, AgentId, AgentId), String> {
    let m = TwoArenas::new(t);
    let ids = mesh(t, &["prefill", "decode"], &[m.p_regions(), m.d_regions()])?;
    Ok((m, ids[0], ids[1]))
}

/// A permutation of 0..12 with no fixed run of consecutive ids.
pub const PERM_A: [u32; 12] = [3, 11, 0, 7, 5, 9, 1, 10, 4, 8, 2, 6];
pub const PERM_B: [u32; 12] = [8, 2, 10, 0, 6, 4, 11, 1, 9, 3, 7, 5];

/// P writes its 12 rows into D's, permuted, with a notification.
pub fn write_permuted<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let (m, p, d) = prefill_and_decode(t)?;
    transfer(
        t,
        p,
        XferOp::Write,
        &m.p_list(),
        &PERM_A,
        "decode",
        &m.d_list(),
        &PERM_B,
        Some(b"write-done"),
    )?;
    let mut out = Outcome::default();
    out.notified(
        "decode",
        wait_notifications(t, d, 1).map_err(ctx("notification"))?,
    );
    out.notified(
        "prefill",
        t.take_notifications(p).map_err(ctx("notifications"))?,
    );
    out.snapshot(&[&m.pa, &m.da]);
    Ok(out)
}

/// D reads P's 12 rows into its own, permuted, with a notification that
/// lands at P.
pub fn read_permuted<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let (m, p, d) = prefill_and_decode(t)?;
    transfer(
        t,
        d,
        XferOp::Read,
        &m.d_list(),
        &PERM_B,
        "prefill",
        &m.p_list(),
        &PERM_A,
        Some(&[0, 159, 146, 150, 255]),
    )?;
    let mut out = Outcome::default();
    out.notified(
        "prefill",
        wait_notifications(t, p, 1).map_err(ctx("notification"))?,
    );
    out.notified(
        "decode",
        t.take_notifications(d).map_err(ctx("notifications"))?,
    );
    out.snapshot(&[&m.pa, &m.da]);
    Ok(out)
}

/// Three agents: A writes to B, C reads from A, B writes to C (strided, with
/// a partial id subset), plus a plain notification; each transfer notifies.
pub fn several_agents<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let arenas = [filled(1024, 10), filled(1024, 20), filled(1024, 30)];
    for a in &arenas {
        t.attach_arena(a.clone());
    }
    let regions: Vec<Vec<MemRegion>> = arenas.iter().map(|a| vec![dram(a, 0, 1024)]).collect();
    let ids = mesh(t, &["a", "b", "c"], &regions)?;
    let [a, b, c] = [ids[0], ids[1], ids[2]];
    let [aa, ba, ca] = [&arenas[0], &arenas[1], &arenas[2]];
    // A -> B: 4 rows of 32 bytes, reversed.
    transfer(
        t,
        a,
        XferOp::Write,
        &DescList::from_runs([run(aa, 0, 32, 32, 4)]),
        &[0, 1, 2, 3],
        "b",
        &DescList::from_runs([run(ba, 512, 32, 64, 4)]),
        &[3, 2, 1, 0],
        Some(b"a->b"),
    )?;
    // C <- A: 2 rows of 100 bytes.
    transfer(
        t,
        c,
        XferOp::Read,
        &DescList::from_rows([row(ca, 10, 100), row(ca, 900, 100)]),
        &[1, 0],
        "a",
        &DescList::from_rows([row(aa, 300, 100), row(aa, 700, 100)]),
        &[0, 1],
        Some(b"c<-a"),
    )?;
    // B -> C: only ids 1 and 3 of 4.
    transfer(
        t,
        b,
        XferOp::Write,
        &DescList::from_runs([run(ba, 0, 16, 16, 4)]),
        &[1, 3],
        "c",
        &DescList::from_runs([run(ca, 400, 16, 48, 4)]),
        &[2, 0],
        Some(b"b->c"),
    )?;
    t.send_notification(a, "c", b"plain")
        .map_err(ctx("send notification"))?;
    let mut out = Outcome::default();
    out.notified("b", wait_notifications(t, b, 1).map_err(ctx("notify b"))?);
    out.notified("c", wait_notifications(t, c, 2).map_err(ctx("notify c"))?);
    out.notified("a", wait_notifications(t, a, 1).map_err(ctx("notify a"))?);
    out.snapshot(&[aa, ba, ca]);
    Ok(out)
}

/// Duplicate and overlapping destinations are accepted. Which of two sources
/// lands in a duplicate destination is unordered in NIXL, so the scenario
/// checks it holds one of them and then blanks it before comparing.
pub fn duplicate_destinations<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let (m, p, _) = prefill_and_decode(t)?;
    let before = m.pa.snapshot();
    let mut out = Outcome::default();
    // Pairs 0 and 1 both write D row 5; pair 2 writes D row 7.
    let made = prepare_lists(t, p, &m.p_list(), "decode", &m.d_list())
        .and_then(|(lh, rh)| t.make_xfer(p, XferOp::Write, lh, &[0, 1, 2], rh, &[5, 5, 7], None));
    let Some(x) = out.verdict("make with duplicate destinations", made) else {
        out.snapshot(&[&m.pa, &m.da]);
        return Ok(out);
    };
    t.post_xfer(p, x).map_err(ctx("post"))?;
    wait_done(t, p, x).map_err(ctx("wait"))?;
    let dup = dup_range(256 + 5 * 192, 64);
    let got = m.da.snapshot()[dup.clone()].to_vec();
    let holds_a_source = got == before[0..64] || got == before[128..192];
    out.verdicts.push((
        "duplicate destination holds one source".into(),
        if holds_a_source {
            Ok(())
        } else {
            Err("neither")
        },
    ));
    m.da.write()[dup].fill(0);
    out.snapshot(&[&m.pa, &m.da]);
    Ok(out)
}

fn dup_range(offset: usize, len: usize) -> Range<usize> {
    offset..offset + len
}

/// Every way `prepare_dlist` can be refused, each step's verdict recorded.
pub fn prepare_rejections<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let (m, p, d) = prefill_and_decode(t)?;
    let mut out = Outcome::default();
    let local = |t: &mut T, rows: &[DescRow]| {
        t.prepare_dlist(
            p,
            &DlistTarget::Local,
            MemKind::Dram,
            &DescList::from_rows(rows.iter().copied()),
        )
        .map(|_| ())
    };
    let remote = |t: &mut T, name: &str, rows: &[DescRow]| {
        t.prepare_dlist(
            p,
            &DlistTarget::Remote(name.into()),
            MemKind::Dram,
            &DescList::from_rows(rows.iter().copied()),
        )
        .map(|_| ())
    };
    let r = local(t, &[row(&m.pa, 0, 2048), row(&m.pa, 2048, 2048)]);
    out.verdict("local rows filling both regions", r);
    let r = local(t, &[row(&m.pa, 2000, 100)]);
    out.verdict("local row straddling two adjacent regions", r);
    let r = local(t, &[row(&m.pa, 4000, 100)]);
    out.verdict("local row past the last region", r);
    let r = local(
        t,
        &[DescRow {
            dev: 1,
            ..row(&m.pa, 0, 64)
        }],
    );
    out.verdict("local row on another device id", r);
    let r = local(t, &[row(&m.pa, 64, 0)]);
    out.verdict("local zero-length row", r);
    let r = local(t, &[]);
    out.verdict("empty local list", r);
    let r = t.prepare_dlist(
        p,
        &DlistTarget::Local,
        MemKind::Dram,
        &DescList::from_runs([run(&m.pa, 0, 64, 100, 21)]),
    );
    out.verdict("strided run whose last row crosses a region boundary", r);
    let r = remote(t, "decode", &[row(&m.da, 0, 4096)]);
    out.verdict("remote row covering the remote region", r);
    let r = remote(t, "decode", &[row(&m.da, 4000, 100)]);
    out.verdict("remote row past the remote region", r);
    let r = remote(t, "nobody", &[row(&m.da, 0, 64)]);
    out.verdict("remote list against an agent never loaded", r);
    let r = remote(t, "prefill", &[row(&m.pa, 0, 64)]);
    out.verdict("remote list against the agent's own name", r);
    // Metadata is a snapshot: a region D registers after export is unknown
    // to P until P loads D's metadata again.
    let extra = filled(512, 3);
    t.attach_arena(extra.clone());
    let r = t.register_memory(d, &[dram(&extra, 0, 512)]);
    out.verdict("register a region after export", r);
    let r = remote(t, "decode", &[row(&extra, 0, 64)]);
    out.verdict("remote row in a region registered after export", r);
    let md = t.local_metadata(d).map_err(ctx("export metadata"))?;
    let r = t.add_remote_agent(p, &md).map(|_| ());
    out.verdict("load the newer metadata", r);
    let r = remote(t, "decode", &[row(&extra, 0, 64)]);
    out.verdict("remote row in that region after reloading", r);
    let r = t.deregister_memory(p, &[dram(&m.pa, 2048, 2048)]);
    out.verdict("deregister P's second region", r);
    let r = local(t, &[row(&m.pa, 2048, 64)]);
    out.verdict("local row in a deregistered region", r);
    out.snapshot(&[&m.pa, &m.da]);
    Ok(out)
}

/// Every way `make_xfer` and `post_xfer` can be refused.
pub fn make_rejections<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let (m, p, d) = prefill_and_decode(t)?;
    let mut out = Outcome::default();
    let prep = |t: &mut T, target: DlistTarget, list: &DescList| -> Result<DlistHandle, String> {
        t.prepare_dlist(p, &target, MemKind::Dram, list)
            .map_err(ctx("prepare"))
    };
    let remote = DlistTarget::Remote("decode".into());
    let lh = prep(t, DlistTarget::Local, &m.p_list())?;
    let rh = prep(t, remote.clone(), &m.d_list())?;
    // A remote list whose row 0 is 32 bytes long.
    let short = DescList::from_rows([row(&m.da, 0, 32), row(&m.da, 64, 64)]);
    let rh_short = prep(t, remote.clone(), &short)?;
    let w = XferOp::Write;
    let r = t.make_xfer(p, w, rh, &[0], lh, &[0], None);
    out.verdict("local and remote handles swapped", r);
    let r = t.make_xfer(p, w, lh, &[0], lh, &[0], None);
    out.verdict("both handles local", r);
    let r = t.make_xfer(p, w, rh, &[0], rh, &[0], None);
    out.verdict("both handles remote", r);
    let r = t.make_xfer(p, w, lh, &[0, 1], rh, &[0], None);
    out.verdict("index lists of different lengths", r);
    let r = t.make_xfer(p, w, lh, &[], rh, &[], None);
    out.verdict("empty index lists", r);
    let r = t.make_xfer(p, w, lh, &[12], rh, &[0], None);
    out.verdict("local index one past the end", r);
    let r = t.make_xfer(p, w, lh, &[0], rh, &[12], None);
    out.verdict("remote index one past the end", r);
    let r = t.make_xfer(p, w, lh, &[0], rh_short, &[0], None);
    out.verdict("pair lengths differ (64 vs 32)", r);
    let r = t.make_xfer(p, XferOp::Read, lh, &[0, 1], rh_short, &[1, 0], None);
    out.verdict("second pair lengths differ on a READ", r);
    let r = t.make_xfer(p, w, lh, &[1], rh_short, &[1], None);
    out.verdict("equal lengths on a mixed list", r);
    // Removing the remote agent stales what was prepared against it.
    let x = t
        .make_xfer(p, w, lh, &[0], rh, &[0], None)
        .map_err(ctx("make"))?;
    let r = t.remove_remote_agent(p, "decode");
    out.verdict("remove the remote agent", r);
    let r = t.make_xfer(p, w, lh, &[0], rh, &[0], None);
    out.verdict("make against a removed remote", r);
    let r = t.post_xfer(p, x);
    out.verdict("post a transfer to a removed remote", r);
    let r = t.remove_remote_agent(p, "decode");
    out.verdict("remove it a second time", r);
    let md = t.local_metadata(d).map_err(ctx("export"))?;
    let r = t.add_remote_agent(p, &md).map(|_| ());
    out.verdict("load it again", r);
    let r = t.make_xfer(p, w, lh, &[0], rh, &[0], None);
    out.verdict("make with a list prepared before the removal", r);
    let fresh = prep(t, remote, &m.d_list())?;
    let r = t.make_xfer(p, w, lh, &[0], fresh, &[0], None);
    out.verdict("make with a list prepared after reloading", r);
    out.snapshot(&[&m.pa, &m.da]);
    Ok(out)
}

/// Refusals around metadata, registration and notifications.
pub fn metadata_rejections<T: HostTransport>(t: &mut T) -> Result<Outcome, String> {
    let m = TwoArenas::new(t);
    let mut out = Outcome::default();
    let p = t.create_agent("prefill").map_err(ctx("create"))?;
    let d = t.create_agent("decode").map_err(ctx("create"))?;
    let r = t.create_agent("decode");
    out.verdict("a second agent with an existing name", r);
    let r = t.register_memory(p, &m.p_regions());
    out.verdict("register P's regions", r);
    let r = t.register_memory(p, &[dram(&m.pa, 0, 2048)]);
    out.verdict("register the same region again", r);
    let r = t.register_memory(d, &m.d_regions());
    out.verdict("register D's region", r);
    let outside = HostArena::new(256);
    let r = t.register_memory(d, &[dram(&outside, 0, 256)]);
    out.verdict("register memory of an arena never attached", r);
    let r = t.register_memory(d, &[dram(&m.da, 4000, 200)]);
    out.verdict("register a region running past its arena", r);
    let r = t.deregister_memory(d, &[dram(&m.da, 0, 100)]);
    out.verdict("deregister a region never registered", r);
    let r = t.add_remote_agent(p, b"");
    out.verdict("load empty metadata", r);
    let r = t.add_remote_agent(p, b"garbage");
    out.verdict("load garbage metadata", r);
    let own = t.local_metadata(p).map_err(ctx("export"))?;
    let r = t.add_remote_agent(p, &own);
    out.verdict("load the agent's own metadata", r);
    let r = t.remove_remote_agent(p, "decode");
    out.verdict("remove a remote never loaded", r);
    let r = t.send_notification(p, "decode", b"early");
    out.verdict("notify an agent whose metadata is not loaded", r);
    let md = t.local_metadata(d).map_err(ctx("export"))?;
    let r = t.add_remote_agent(p, &md);
    out.verdict("load D's metadata", r);
    let r = t.add_remote_agent(p, &md);
    out.verdict("load D's metadata again", r);
    let r = t.send_notification(p, "decode", b"hello");
    out.verdict("notify D", r);
    let r = t.send_notification(p, "prefill", b"self");
    out.verdict("notify oneself", r);
    out.notified(
        "decode",
        wait_notifications(t, d, 1).map_err(ctx("notify d"))?,
    );
    out.notified(
        "prefill",
        wait_notifications(t, p, 1).map_err(ctx("notify p"))?,
    );
    out.snapshot(&[&m.pa, &m.da]);
    Ok(out)
}
