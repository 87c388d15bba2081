"""api_check.py's shape checks (SIGNATURES, the post-process entry type) on
stand-in classes defined here, so they need no vLLM: a constructor that no
longer takes a field the driver passes, a patched method whose parameters
moved, and a post-process entry of an unknown type are each named.

Run: python -m pytest vllm-driver/test_api_shapes.py.
"""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import api_check  # noqa: E402

HERE = "test_api_shapes"


@dataclasses.dataclass
class Output:
    req_ids: list
    sampled_token_ids: list = dataclasses.field(default_factory=list)


class Base:
    def __init__(self, vllm_config, block_size, hash_block_size=None):
        pass


class Forwarding(Base):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


class Worker:
    def post_process(self, block_size_ratio, block_ids_list, convert=True):
        pass

    def moved(self, block_ids_list, block_size_ratio, convert=True):
        pass


def _changes(monkeypatch, table):
    monkeypatch.setattr(api_check, "SIGNATURES", table)
    return api_check._signature_changes(lambda need: True)


def test_a_constructor_without_a_field_the_driver_passes_is_named(monkeypatch):
    ok = (HERE, "Output", "all", ("req_ids", "sampled_token_ids"), False, "a step's output")
    gone = (HERE, "Output", "all", ("req_ids", "req_id_to_index"), False, "a step's output")
    assert _changes(monkeypatch, [ok]) == []
    [line] = _changes(monkeypatch, [gone])
    assert line.startswith(f"{HERE}.Output: takes no req_id_to_index"), line


def test_a_forwarding_constructor_is_read_from_its_base(monkeypatch):
    ok = (HERE, "Forwarding", "all", ("vllm_config", "hash_block_size"), False, "the scheduler")
    gone = (HERE, "Forwarding", "all", ("vllm_config", "log_stats"), False, "the scheduler")
    assert _changes(monkeypatch, [ok]) == []
    assert "takes no log_stats" in _changes(monkeypatch, [gone])[0]


def test_a_patched_method_whose_parameters_moved_is_named(monkeypatch):
    params = ("block_size_ratio", "block_ids_list", "convert")
    assert _changes(monkeypatch, [(HERE, "Worker.post_process", "all", params, True, "patched")]) == []
    [line] = _changes(monkeypatch, [(HERE, "Worker.moved", "all", params, True, "patched")])
    assert "parameters in another order" in line, line
    # Order does not matter for a keyword call.
    assert _changes(monkeypatch, [(HERE, "Worker.moved", "all", params, False, "keywords")]) == []


def test_an_unknown_post_process_entry_type_is_named(monkeypatch):
    import compat
    import inspect

    def annotated(text):
        return inspect.Parameter("block_ids_list", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=text)

    monkeypatch.setattr(api_check.importlib, "import_module", lambda name: type("M", (), {"NixlConnectorWorker": Worker}))
    reader = compat._post_process_param.__name__  # the annotation reader the check asks
    for known in ("list[tuple[int, list[int], int]]", "list[tuple[int, list[int], range]]",
                  "list[tuple[list[int], int]]"):
        monkeypatch.setattr(compat, reader, lambda cls, t=known: annotated(t))
        assert api_check.post_process_entry_shape() is None, known
    monkeypatch.setattr(compat, reader, lambda cls: annotated("list[tuple[int, list[int], slice]]"))
    line = api_check.post_process_entry_shape()
    assert line is not None and "slice" in line, line
