//! The loopback transport: bytes land exactly where the desc ids say, and
//! every NIXL rule is enforced with NIXL's error kind (the same scenarios run
//! against real NIXL in `transport_nixl.rs`).

use crate::support::transport_scenarios::*;
use kvgeom::memory::HostArena;
use kvgeom::nixl::{
    AgentId, Classify, DescList, DescRow, DlistTarget, Loopback, MemKind, MemRegion, Nixl,
    NixlError, Recording, XferOp, XferState,
};

impl<T: HostTransport> HostTransport for Recording<T> {
    fn attach_arena(&mut self, arena: HostArena) {
        self.inner_mut().attach_arena(arena);
    }
}

/// Offset of row `i` of [`TwoArenas::p_list`] in P's arena.
fn p_offset(i: u32) -> usize {
    let i = i as usize;
    if i < 8 {
        128 * i
    } else {
        2048 + 64 * (i - 8)
    }
}

/// Offset of row `j` of [`TwoArenas::d_list`] in D's arena.
fn d_offset(j: u32) -> usize {
    256 + 192 * j as usize
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(seed, i)).collect()
}

fn ok(steps: &[&str]) -> Vec<(String, Result<(), &'static str>)> {
    steps.iter().map(|s| (s.to_string(), Ok(()))).collect()
}

fn verdicts(list: &[(&str, Result<(), &'static str>)]) -> Vec<(String, Result<(), &'static str>)> {
    list.iter().map(|(s, v)| (s.to_string(), *v)).collect()
}

/// D's arena after P row `PERM_A[k]` lands in D row `PERM_B[k]` for every k.
fn d_after_permuted_pairs() -> Vec<u8> {
    let p = pattern(1, 4096);
    let mut d = pattern(2, 4096);
    for (&i, &j) in PERM_A.iter().zip(&PERM_B) {
        d[d_offset(j)..d_offset(j) + 64].copy_from_slice(&p[p_offset(i)..p_offset(i) + 64]);
    }
    d
}

#[test]
fn write_lands_each_local_row_in_its_paired_remote_row() {
    let out = write_permuted(&mut Loopback::new()).unwrap();
    assert_eq!(out.arenas[0], pattern(1, 4096), "the source is untouched");
    assert_eq!(out.arenas[1], d_after_permuted_pairs());
    // Pair 0: P row 3 (offset 384) -> D row 8 (offset 1792).
    assert_eq!(out.arenas[1][1792], pattern_byte(1, 384));
    assert_eq!(out.arenas[1][1792 + 63], pattern_byte(1, 384 + 63));
    // Bytes between D rows keep their value.
    assert_eq!(out.arenas[1][255], pattern_byte(2, 255));
    assert_eq!(out.arenas[1][320], pattern_byte(2, 320));
    assert_eq!(
        out.notifications,
        [(
            "decode".to_string(),
            "prefill".to_string(),
            b"write-done".to_vec()
        )]
    );
}

#[test]
fn read_pulls_each_remote_row_into_its_paired_local_row() {
    let out = read_permuted(&mut Loopback::new()).unwrap();
    assert_eq!(
        out.arenas[0],
        pattern(1, 4096),
        "the remote source is untouched"
    );
    assert_eq!(out.arenas[1], d_after_permuted_pairs());
    assert_eq!(
        out.notifications,
        [(
            "prefill".to_string(),
            "decode".to_string(),
            vec![0, 159, 146, 150, 255]
        )]
    );
}

#[test]
fn read_and_write_move_bytes_in_opposite_directions() {
    for op in [XferOp::Read, XferOp::Write] {
        let mut t = Loopback::new();
        let (m, p, d) = prefill_and_decode(&mut t).unwrap();
        // D initiates: local = D row 0, remote = P row 0.
        transfer(
            &mut t,
            d,
            op,
            &m.d_list(),
            &[0],
            "prefill",
            &m.p_list(),
            &[0],
            None,
        )
        .unwrap();
        let (p_bytes, d_bytes) = (m.pa.snapshot(), m.da.snapshot());
        match op {
            XferOp::Read => {
                assert_eq!(p_bytes, pattern(1, 4096));
                assert_eq!(&d_bytes[256..320], &pattern(1, 64)[..]);
            }
            XferOp::Write => {
                assert_eq!(d_bytes, pattern(2, 4096));
                assert_eq!(&p_bytes[0..64], &pattern(2, 4096)[256..320]);
            }
        }
        assert_eq!(t.take_notifications(p).unwrap(), []);
        assert_eq!(t.take_notifications(d).unwrap(), []);
    }
}

#[test]
fn several_agents_exchange_bytes_and_notifications() {
    let out = several_agents(&mut Loopback::new()).unwrap();
    let a = pattern(10, 1024);
    let mut b = pattern(20, 1024);
    let mut c = pattern(30, 1024);
    // A -> B: A row k (32 k) lands in B row 3 - k (512 + 64 (3 - k)).
    for k in 0..4 {
        let dst = 512 + 64 * (3 - k);
        b[dst..dst + 32].copy_from_slice(&a[32 * k..32 * k + 32]);
    }
    // C <- A: A 300.. -> C 900..; A 700.. -> C 10..
    c[900..1000].copy_from_slice(&a[300..400]);
    c[10..110].copy_from_slice(&a[700..800]);
    // B -> C (after A -> B): B row 1 -> C row 2, B row 3 -> C row 0.
    let b_now = b.clone();
    c[400 + 96..400 + 112].copy_from_slice(&b_now[16..32]);
    c[400..416].copy_from_slice(&b_now[48..64]);
    assert_eq!(out.arenas, [a, b, c]);
    let n = |to: &str, from: &str, m: &[u8]| (to.to_string(), from.to_string(), m.to_vec());
    assert_eq!(
        out.notifications,
        [
            n("a", "c", b"c<-a"),
            n("b", "a", b"a->b"),
            n("c", "a", b"plain"),
            n("c", "b", b"b->c"),
        ]
    );
}

#[test]
fn duplicate_destinations_are_accepted_and_the_last_pair_wins() {
    let out = duplicate_destinations(&mut Loopback::new()).unwrap();
    assert_eq!(
        out.verdicts,
        ok(&[
            "make with duplicate destinations",
            "duplicate destination holds one source"
        ])
    );
    // The scenario blanks the duplicate row; check the order here.
    let mut t = Loopback::new();
    let (m, p, _) = prefill_and_decode(&mut t).unwrap();
    transfer(
        &mut t,
        p,
        XferOp::Write,
        &m.p_list(),
        &[0, 1, 2],
        "decode",
        &m.d_list(),
        &[5, 5, 7],
        None,
    )
    .unwrap();
    let d = m.da.snapshot();
    assert_eq!(
        &d[d_offset(5)..d_offset(5) + 64],
        &pattern(1, 4096)[128..192]
    );
    assert_eq!(
        &d[d_offset(7)..d_offset(7) + 64],
        &pattern(1, 4096)[256..320]
    );
}

#[test]
fn overlapping_destinations_are_accepted() {
    let mut t = Loopback::new();
    let (m, p, _) = prefill_and_decode(&mut t).unwrap();
    // D rows 0 (256..320) and 1 (300..364) overlap by 20 bytes.
    let d_rows = DescList::from_rows([row(&m.da, 256, 64), row(&m.da, 300, 64)]);
    transfer(
        &mut t,
        p,
        XferOp::Write,
        &m.p_list(),
        &[0, 1],
        "decode",
        &d_rows,
        &[0, 1],
        None,
    )
    .unwrap();
    let p = pattern(1, 4096);
    let d = m.da.snapshot();
    assert_eq!(&d[256..300], &p[0..44]);
    assert_eq!(&d[300..364], &p[128..192]);
}

#[test]
fn prepare_refuses_descriptors_outside_one_registered_region() {
    let out = prepare_rejections(&mut Loopback::new()).unwrap();
    assert_eq!(
        out.verdicts,
        verdicts(&[
            ("local rows filling both regions", Ok(())),
            ("local row straddling two adjacent regions", Err("NotFound")),
            ("local row past the last region", Err("NotFound")),
            ("local row on another device id", Err("NotFound")),
            ("local zero-length row", Ok(())),
            ("empty local list", Err("NotFound")),
            (
                "strided run whose last row crosses a region boundary",
                Err("NotFound")
            ),
            ("remote row covering the remote region", Ok(())),
            ("remote row past the remote region", Err("NotFound")),
            ("remote list against an agent never loaded", Err("NotFound")),
            ("remote list against the agent's own name", Ok(())),
            ("register a region after export", Ok(())),
            (
                "remote row in a region registered after export",
                Err("NotFound")
            ),
            ("load the newer metadata", Ok(())),
            ("remote row in that region after reloading", Ok(())),
            ("deregister P's second region", Ok(())),
            ("local row in a deregistered region", Err("NotFound")),
        ])
    );
    assert_eq!(out.arenas[0], pattern(1, 4096));
    assert_eq!(out.arenas[1], pattern(2, 4096));
}

#[test]
fn make_and_post_refuse_what_nixl_refuses() {
    let out = make_rejections(&mut Loopback::new()).unwrap();
    assert_eq!(
        out.verdicts,
        verdicts(&[
            ("local and remote handles swapped", Err("InvalidParam")),
            ("both handles local", Err("InvalidParam")),
            ("both handles remote", Err("InvalidParam")),
            ("index lists of different lengths", Err("InvalidParam")),
            ("empty index lists", Err("InvalidParam")),
            ("local index one past the end", Err("InvalidParam")),
            ("remote index one past the end", Err("InvalidParam")),
            ("pair lengths differ (64 vs 32)", Err("InvalidParam")),
            ("second pair lengths differ on a READ", Err("InvalidParam")),
            ("equal lengths on a mixed list", Ok(())),
            ("remove the remote agent", Ok(())),
            ("make against a removed remote", Err("NotFound")),
            ("post a transfer to a removed remote", Err("NotFound")),
            ("remove it a second time", Err("InvalidParam")),
            ("load it again", Ok(())),
            (
                "make with a list prepared before the removal",
                Err("NotFound")
            ),
            ("make with a list prepared after reloading", Ok(())),
        ])
    );
    assert_eq!(out.arenas[1], pattern(2, 4096), "nothing was posted");
}

#[test]
fn metadata_registration_and_notification_rules() {
    let out = metadata_rejections(&mut Loopback::new()).unwrap();
    assert_eq!(
        out.verdicts,
        verdicts(&[
            ("a second agent with an existing name", Err("InvalidParam")),
            ("register P's regions", Ok(())),
            ("register the same region again", Ok(())),
            ("register D's region", Ok(())),
            (
                "register memory of an arena never attached",
                Err("InvalidParam")
            ),
            (
                "register a region running past its arena",
                Err("InvalidParam")
            ),
            ("deregister a region never registered", Err("NotFound")),
            ("load empty metadata", Err("InvalidParam")),
            ("load garbage metadata", Err("Backend")),
            ("load the agent's own metadata", Err("InvalidParam")),
            ("remove a remote never loaded", Err("InvalidParam")),
            (
                "notify an agent whose metadata is not loaded",
                Err("NotFound")
            ),
            ("load D's metadata", Ok(())),
            ("load D's metadata again", Ok(())),
            ("notify D", Ok(())),
            ("notify oneself", Ok(())),
        ])
    );
    let n = |to: &str, from: &str, m: &[u8]| (to.to_string(), from.to_string(), m.to_vec());
    assert_eq!(
        out.notifications,
        [
            n("decode", "prefill", b"hello"),
            n("prefill", "prefill", b"self")
        ]
    );
}

#[test]
fn metadata_is_a_snapshot_of_name_and_regions() {
    let mut t = Loopback::new();
    let m = TwoArenas::new(&mut t);
    let p = t.create_agent("prefill").unwrap();
    t.register_memory(p, &m.p_regions()).unwrap();
    let md: serde_json::Value = serde_json::from_slice(&t.local_metadata(p).unwrap()).unwrap();
    assert_eq!(md["agent"], "prefill");
    let regions: Vec<MemRegion> = serde_json::from_value(md["regions"].clone()).unwrap();
    assert_eq!(regions, m.p_regions());
}

#[test]
fn vram_is_unsupported() {
    let mut t = Loopback::new();
    let m = TwoArenas::new(&mut t);
    let p = t.create_agent("prefill").unwrap();
    let vram = MemRegion {
        mem: MemKind::Vram,
        ..dram(&m.pa, 0, 64)
    };
    let e = t.register_memory(p, &[vram]).unwrap_err();
    assert!(matches!(e, NixlError::Unsupported(_)), "{e}");
    t.register_memory(p, &m.p_regions()).unwrap();
    let e = t
        .prepare_dlist(p, &DlistTarget::Local, MemKind::Vram, &m.p_list())
        .unwrap_err();
    assert!(matches!(e, NixlError::Unsupported(_)), "{e}");
}

#[test]
fn a_rejected_registration_registers_nothing() {
    let mut t = Loopback::new();
    let m = TwoArenas::new(&mut t);
    let p = t.create_agent("prefill").unwrap();
    let stray = HostArena::new(64);
    let e = t
        .register_memory(p, &[dram(&m.pa, 0, 64), dram(&stray, 0, 64)])
        .unwrap_err();
    assert!(e.to_string().contains("not inside any host arena"), "{e}");
    let e = t
        .prepare_dlist(
            p,
            &DlistTarget::Local,
            MemKind::Dram,
            &DescList::from_rows([row(&m.pa, 0, 64)]),
        )
        .unwrap_err();
    assert!(matches!(e, NixlError::NotFound(_)), "{e}");
}

#[test]
fn copies_within_one_arena_behave_like_memmove() {
    let mut t = Loopback::new();
    let arena = filled(1024, 5);
    t.attach(arena.clone());
    // P and D register overlapping parts of the same arena.
    let ids = mesh(
        &mut t,
        &["prefill", "decode"],
        &[vec![dram(&arena, 0, 512)], vec![dram(&arena, 256, 512)]],
    )
    .unwrap();
    transfer(
        &mut t,
        ids[0],
        XferOp::Write,
        &DescList::from_rows([row(&arena, 0, 300)]),
        &[0],
        "decode",
        &DescList::from_rows([row(&arena, 256, 300)]),
        &[0],
        None,
    )
    .unwrap();
    let before = pattern(5, 1024);
    let after = arena.snapshot();
    assert_eq!(&after[..256], &before[..256]);
    assert_eq!(&after[256..556], &before[0..300]);
    assert_eq!(&after[556..], &before[556..]);
}

#[test]
fn an_agent_can_target_its_own_memory_by_name() {
    let mut t = Loopback::new();
    let arena = filled(512, 6);
    t.attach(arena.clone());
    let p = t.create_agent("prefill").unwrap();
    t.register_memory(p, &[dram(&arena, 0, 512)]).unwrap();
    transfer(
        &mut t,
        p,
        XferOp::Write,
        &DescList::from_rows([row(&arena, 0, 16)]),
        &[0],
        "prefill",
        &DescList::from_rows([row(&arena, 400, 16)]),
        &[0],
        Some(b"to myself"),
    )
    .unwrap();
    assert_eq!(&arena.snapshot()[400..416], &pattern(6, 16)[..]);
    assert_eq!(
        t.take_notifications(p).unwrap(),
        [("prefill".to_string(), b"to myself".to_vec())]
    );
}

#[test]
fn a_held_arena_guard_fails_the_post_instead_of_blocking() {
    let mut t = Loopback::new();
    let (m, p, d) = prefill_and_decode(&mut t).unwrap();
    let (lh, rh) = prepare_lists(&mut t, p, &m.p_list(), "decode", &m.d_list()).unwrap();
    let x = t
        .make_xfer(p, XferOp::Write, lh, &[0], rh, &[0], Some(b"n"))
        .unwrap();
    let guard = m.da.read();
    let e = t.post_xfer(p, x).unwrap_err();
    assert!(matches!(e, NixlError::Backend(_)), "{e}");
    drop(guard);
    assert_eq!(t.xfer_state(p, x).unwrap(), XferState::InProgress);
    assert_eq!(m.da.snapshot(), pattern(2, 4096));
    assert_eq!(t.take_notifications(d).unwrap(), []);
    // A read guard on the source does not block.
    let guard = m.pa.read();
    assert_eq!(t.post_xfer(p, x).unwrap(), XferState::Done);
    drop(guard);
    assert_eq!(&m.da.snapshot()[256..320], &pattern(1, 64)[..]);
}

#[test]
fn handles_have_a_lifecycle() {
    let mut t = Loopback::new();
    let (m, p, d) = prefill_and_decode(&mut t).unwrap();
    let (lh, rh) = prepare_lists(&mut t, p, &m.p_list(), "decode", &m.d_list()).unwrap();
    let x = t
        .make_xfer(p, XferOp::Write, lh, &[0], rh, &[0], None)
        .unwrap();
    assert_eq!(t.xfer_state(p, x).unwrap(), XferState::InProgress);
    assert_eq!(t.post_xfer(p, x).unwrap(), XferState::Done);
    assert_eq!(t.xfer_state(p, x).unwrap(), XferState::Done);
    // Posting again copies the source's current bytes again.
    m.pa.write()[0..64].fill(0xEE);
    assert_eq!(t.post_xfer(p, x).unwrap(), XferState::Done);
    assert_eq!(&m.da.snapshot()[256..320], &[0xEE; 64][..]);
    // Other agents do not know this agent's handles.
    let e = t.post_xfer(d, x).unwrap_err();
    assert!(matches!(e, NixlError::NotFound(_)), "{e}");
    t.release_xfer(p, x).unwrap();
    assert!(matches!(t.post_xfer(p, x), Err(NixlError::NotFound(_))));
    assert!(matches!(t.xfer_state(p, x), Err(NixlError::NotFound(_))));
    assert!(matches!(t.release_xfer(p, x), Err(NixlError::NotFound(_))));
    t.release_dlist(p, lh).unwrap();
    assert!(matches!(
        t.release_dlist(p, lh),
        Err(NixlError::NotFound(_))
    ));
    let e = t
        .make_xfer(p, XferOp::Write, lh, &[0], rh, &[0], None)
        .unwrap_err();
    assert!(matches!(e, NixlError::InvalidParam(_)), "{e}");
    let e = t.agent_name(AgentId(7)).unwrap_err();
    assert!(matches!(e, NixlError::NotFound(_)), "{e}");
    assert_eq!(t.agent_name(p).unwrap(), "prefill");
}

#[test]
fn agent_names_must_be_usable() {
    let mut t = Loopback::new();
    for bad in ["", "a\0b"] {
        let e = t.create_agent(bad).unwrap_err();
        assert!(matches!(e, NixlError::InvalidParam(_)), "{e}");
    }
    assert_eq!(t.create_agent("ok").unwrap(), AgentId(0));
}

/// Locates a descriptor by arena (index into `arenas`) and offset.
struct ArenaMap(Vec<HostArena>);

impl Classify for ArenaMap {
    type Location = Option<(usize, usize)>;

    fn classify(&self, _initiator: AgentId, _agent: &str, row: DescRow) -> Self::Location {
        self.0
            .iter()
            .position(|a| a.contains(row.addr, row.len))
            .map(|i| (i, (row.addr - self.0[i].base()) as usize))
    }
}

#[test]
fn recorded_byte_ranges_are_exactly_the_bytes_that_changed() {
    let mut t = Recording::new(Loopback::new());
    // Sources never hold a zero byte; destinations start all zero, so every
    // byte a transfer writes changes.
    let pa = filled(4096, 1);
    let da = HostArena::new(4096);
    t.attach_arena(pa.clone());
    t.attach_arena(da.clone());
    let ids = mesh(
        &mut t,
        &["prefill", "decode"],
        &[vec![dram(&pa, 0, 4096)], vec![dram(&da, 0, 4096)]],
    )
    .unwrap();
    let (p, d) = (ids[0], ids[1]);
    let p_list = DescList::from_runs([run(&pa, 0, 48, 100, 10), run(&pa, 3000, 16, 16, 6)]);
    let d_list = DescList::from_runs([run(&da, 100, 48, 64, 10), run(&da, 2000, 16, 40, 6)]);
    transfer(
        &mut t,
        p,
        XferOp::Write,
        &p_list,
        &[9, 2, 4, 0, 13],
        "decode",
        &d_list,
        &[1, 8, 3, 6, 10],
        None,
    )
    .unwrap();
    // READ by D into other D rows.
    transfer(
        &mut t,
        d,
        XferOp::Read,
        &d_list,
        &[0, 5, 15, 11],
        "prefill",
        &p_list,
        &[7, 7, 10, 15],
        None,
    )
    .unwrap();
    // Made but never posted: must not count.
    let (lh, rh) = prepare_lists(&mut t, d, &d_list, "prefill", &p_list).unwrap();
    t.make_xfer(d, XferOp::Read, lh, &[2], rh, &[2], None)
        .unwrap();

    let arenas = ArenaMap(vec![pa.clone(), da.clone()]);
    let pairs = t.resolve(&arenas);
    assert_eq!(pairs.len(), 5 + 4 + 1);
    let source = pattern(1, 4096);
    let mut written = [vec![false; 4096], vec![false; 4096]];
    let mut expected = [source.clone(), vec![0u8; 4096]];
    for pair in pairs.iter().filter(|p| p.posted) {
        let (src, dst) = match pair.op {
            XferOp::Write => (pair.local_location, pair.remote_location),
            XferOp::Read => (pair.remote_location, pair.local_location),
        };
        let ((sa, so), (da_, dof)) = (src.unwrap(), dst.unwrap());
        let len = pair.local.len as usize;
        assert_eq!(sa, 0, "every source is in P's arena");
        expected[da_][dof..dof + len].copy_from_slice(&source[so..so + len]);
        written[da_][dof..dof + len].fill(true);
    }
    assert!(written[0].iter().all(|w| !w), "nothing is written into P");
    assert_eq!(pa.snapshot(), source, "P's arena is only read");
    let d_after = da.snapshot();
    assert_eq!(d_after, expected[1], "each range holds its source's bytes");
    let changed: Vec<bool> = d_after.iter().map(|b| *b != 0).collect();
    assert_eq!(changed, written[1], "exactly the recorded ranges changed");
    // 4 x 48 + 16 bytes by the WRITE, 2 x 48 + 2 x 16 by the READ.
    assert_eq!(written[1].iter().filter(|w| **w).count(), 336);
}

#[test]
fn a_transfer_over_memory_never_allocated_is_refused_and_noted() {
    // Prefill's arena is an address without memory (a rank no transfer was
    // expected to touch): registration and lists work, a transfer does not.
    let mut t = Loopback::new();
    let pa = HostArena::unbacked(4096);
    let da = filled(4096, 2);
    t.attach_arena(pa.clone());
    t.attach_arena(da.clone());
    let ids = mesh(
        &mut t,
        &["prefill", "decode"],
        &[vec![dram(&pa, 0, 4096)], vec![dram(&da, 0, 4096)]],
    )
    .unwrap();
    let (p_list, d_list) = (
        DescList::from_runs([run(&pa, 0, 64, 64, 4)]),
        DescList::from_runs([run(&da, 0, 64, 64, 4)]),
    );
    let (lh, rh) = prepare_lists(&mut t, ids[1], &d_list, "prefill", &p_list).unwrap();
    let e = t
        .make_xfer(ids[1], XferOp::Read, lh, &[0], rh, &[1], None)
        .unwrap_err();
    assert!(matches!(e, NixlError::NotFound(_)), "{e}");
    assert!(e.to_string().contains("was not allocated"), "{e}");
    assert!(pa.unbacked_accessed());
    assert_eq!(da.snapshot(), pattern(2, 4096), "nothing moved");
}
