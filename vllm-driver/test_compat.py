"""compat.py's feature tests on stand-in objects (vLLM is imported only for
its MambaSpec).

Run: python -m pytest vllm-driver/test_compat.py, or the file as a script.
"""

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compat  # noqa: E402


class _Results:
    def __init__(self, finished, failed):
        self.finished_recving = set(finished)
        self.failed_recving = set(failed)


def test_version_check_is_switched_only_where_vllm_has_one():
    with_check = types.SimpleNamespace(check_nixl_version=lambda: "real")
    without = types.SimpleNamespace()
    assert compat.nixl_version_check(with_check)() == "real"
    assert compat.nixl_version_check(without) is None
    compat.set_nixl_version_check(with_check, None)
    compat.set_nixl_version_check(without, None)
    assert with_check.check_nixl_version is None
    assert not hasattr(without, "check_nixl_version")


def test_pinned_memory_is_off_in_every_form_found():
    both = types.SimpleNamespace(PIN_MEMORY=True, is_pin_memory_available=lambda: True)
    older = types.SimpleNamespace(is_pin_memory_available=lambda: True)
    assert compat.pin_memory_off(both) == ["PIN_MEMORY", "is_pin_memory_available()"]
    assert both.PIN_MEMORY is False and both.is_pin_memory_available() is False
    assert compat.pin_memory_off(older) == ["is_pin_memory_available()"]
    assert older.is_pin_memory_available() is False and not hasattr(older, "PIN_MEMORY")


def test_an_entry_without_its_group_gets_the_one_attention_group():
    class Attention:
        pass

    worker = types.SimpleNamespace(_group_spec_types=(Attention,))
    assert compat.post_process_entry(worker, (2, [5, 6], 3)) == (2, [5, 6], 3)
    assert compat.post_process_entry(worker, ([5, 6], 3)) == (0, [5, 6], 3)


def test_covered_sub_blocks_are_recorded_as_a_count_or_a_range():
    worker = types.SimpleNamespace()
    assert compat.post_process_entry(worker, (1, [4], 3)) == (1, [4], 3)
    assert compat.post_process_entry(worker, (1, [4, 5], range(2, 7))) == (1, [4, 5], [2, 7])
    for bad in (range(0, 6, 2), "3", 2.0, True):
        try:
            compat.post_process_entry(worker, (0, [1], bad))
        except compat.EntryUnknown:
            continue
        raise AssertionError(f"covered sub-blocks {bad!r} were recorded")


def test_model_runner_output_gets_req_id_to_index_only_where_the_class_has_it():
    import dataclasses

    @dataclasses.dataclass
    class Older:
        req_ids: list
        req_id_to_index: dict
        sampled_token_ids: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass
    class Newer:
        req_ids: list
        sampled_token_ids: list = dataclasses.field(default_factory=list)

    assert compat.model_runner_output(Older, ["a", "b"], sampled_token_ids=[[1], []]).req_id_to_index == {"a": 0, "b": 1}
    newer = compat.model_runner_output(Newer, ["a"], sampled_token_ids=[[1]])
    assert newer == Newer(req_ids=["a"], sampled_token_ids=[[1]])


def test_the_hash_block_size_is_written_only_where_the_config_has_the_field():
    import dataclasses

    @dataclasses.dataclass
    class Newer:
        num_blocks: int
        hash_block_size: int | None = None

    @dataclasses.dataclass
    class Older:
        num_blocks: int

    newer, older = Newer(4), Older(4)
    assert compat.resolved_block_sizes(newer, None, 16, 8) == ["hash_block_size"]
    assert newer.hash_block_size == 8
    assert compat.resolved_block_sizes(older, None, 16, 8) == []
    assert not hasattr(older, "hash_block_size")


def test_an_entry_whose_group_is_ambiguous_is_refused():
    class Attention:
        pass

    for worker in (types.SimpleNamespace(), types.SimpleNamespace(_group_spec_types=(Attention, Attention))):
        try:
            compat.post_process_entry(worker, ([1], 1))
        except compat.EntryUnknown:
            continue
        raise AssertionError("an ambiguous entry was given a group")


def test_the_entry_form_is_read_from_the_annotation():
    class New:
        def post_process_device_kv_on_receive(self, block_size_ratio, block_ids_list: "list[tuple[int, list[int], int]]"):
            pass

    class Old:
        def post_process_device_kv_on_receive(self, block_size_ratio, block_ids_list: "list[tuple[list[int], int]]"):
            pass

    class Bare:
        def post_process_device_kv_on_receive(self, block_size_ratio, block_ids_list):
            pass

    assert compat.post_process_entries_have_group(New) is True
    assert compat.post_process_entries_have_group(Old) is False
    assert compat.post_process_entries_have_group(Bare) is None


def test_a_failed_receive_is_told_apart_where_the_worker_reports_it():
    new = types.SimpleNamespace(get_transfer_results=lambda: _Results({"a", "b"}, {"b"}))
    old = types.SimpleNamespace(get_finished=lambda: (set(), {"a", "b"}))
    assert compat.received(new) == ({"a", "b"}, {"b"})
    assert compat.received(old) == ({"a", "b"}, set())


if __name__ == "__main__":
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
            except Exception as e:  # reported, then the next test
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
