"""Spec files: the reference config block loads unchanged; bad specs get one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.errors import SpecError
from orchestrator.spec.files import load_spec, spec_from_data
from orchestrator.spec.identity import REFERENCE_CONFIG_FIELDS
from orchestrator.spec.model import SweepSpec
from orchestrator.spec.reference import COMMAND, sections, spec_reference
from orchestrator.store import synthetic
from tests.helpers import TINY_SPEC, assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_reference_config_block_loads_unchanged(sample_doc: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "reference.json"
    path.write_text(json.dumps(sample_doc["config"]))
    spec = load_spec(path)
    assert spec.reference_config() == sample_doc["config"]
    assert list(spec.reference_config()) == list(sample_doc["config"]) == list(REFERENCE_CONFIG_FIELDS)
    # tilesweep's own sections default sensibly
    assert spec.executor.kind == "local" and spec.timing.target_ms == 50 and spec.timing.max_inner == 200


def test_results_document_is_accepted_as_spec(sample_doc: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(sample_doc))
    assert load_spec(path).reference_config() == sample_doc["config"]


def test_toml_spec(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(
        'dtypes = ["bfloat16"]\nhead_dims = [64]\nseq_lens = [1024]\nmodes = ["fwd"]\n'
        '[executor]\nkind = "slurm"\nslurm_partition = "gpu"\ngpus_per_node = 1\n'
    )
    spec = load_spec(path)
    assert spec.dtypes == ["bfloat16"] and spec.executor.slurm_partition == "gpu"


def test_bwd_fwd_config_null_means_128() -> None:
    assert spec_from_data({}).forward_blocks.block_q == 128
    assert spec_from_data({"bwd_fwd_config": [64, 32]}).forward_blocks.block_k == 32
    assert spec_from_data({"bwd_fwd_config": {"block_q": 64, "block_k": 64}}).forward_blocks.block_q == 64


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"fwd_blockq": [32]}, 'unknown field "fwd_blockq" (did you mean "fwd_block_q"?)'),
        ({"executor": {"slurm_partiton": "gpu"}}, "allowed: kind, slurm_partition"),
        ({"dtypes": ["fp8"]}, '"dtypes.0"'),
        ({"batch": "four"}, '"batch"'),
        ({"fwd_block_q": [48]}, "powers of two"),
        ({"head_dims": []}, '"head_dims"'),
        ({"modes": ["fwd", "fwd"]}, "repeated"),
        ({"executor": {"kind": "pbs"}}, '"local", "slurm" or "debug"'),
        # numbers must be numbers: no string or boolean read as a count
        ({"repeats": "2"}, 'field "repeats": Input should be a valid integer (got "2")'),
        ({"repeats": True}, 'field "repeats": Input should be a valid integer (got true)'),
        ({"seq_lens": [2048, "4096"]}, '"seq_lens.1"'),
        ({"timing": {"max_inner": 2.5}}, '"timing.max_inner"'),
        ({"auto_only": "false"}, '"auto_only": Input should be a valid boolean'),
        ({"fwd_warps": [4, 64]}, "must each be one of 1, 2, 4, 8, 16, 32 (warps per block), got [64]"),
        ({"bwd_warps": [3]}, "must each be one of 1, 2, 4, 8, 16, 32"),
        ({"fwd_stages": [2, 9]}, '"fwd_stages": must each be 1..8 (pipeline stages), got [9]'),
        ({"bwd_stages": [0]}, "must each be 1..8"),
        ({"compile": {"mode": "process"}}, '"threads" or "processes"'),
        # a number past anything a sweep could mean (a typo), refused before it overflows or runs for ever
        ({"timing": {"target_ms": 1e308}}, 'field "timing.target_ms": Input should be less than or equal to 60000'),
        ({"timing": {"screen_ms": 1e9}}, '"timing.screen_ms"'),
        ({"repeats": 10**6}, 'field "repeats": Input should be less than or equal to 10000'),
        ({"timing": {"warmup": 10**18}}, '"timing.warmup"'),
        ({"compile": {"cache_dir": ""}}, 'field "compile.cache_dir": String should have at least 1 character'),
        ({"kv_heads": ["null"]}, '(got "null"); a string is not null: in JSON write null, unquoted; TOML has no null'),
        # an sbatch option the executor sets itself, passed through: it skipped the checks and overrode them
        (
            {"executor": {"kind": "slurm", "slurm_additional_parameters": {"time": "-5"}}},
            "slurm_additional_parameters.time sets what executor.timeout_min sets",
        ),
        # the final merge job is charged to executor.slurm_account too: given this way, it was not
        (
            {"executor": {"kind": "slurm", "slurm_additional_parameters": {"account": "a"}}},
            "slurm_additional_parameters.account sets what executor.slurm_account sets",
        ),
        (
            {"executor": {"kind": "slurm", "slurm_additional_parameters": {"cpus-per-task": 4}}},
            "slurm_additional_parameters.cpus-per-task sets what executor.cpus_per_task sets",
        ),
        # a task warned of its time limit as it starts is requeued until it fails, each time on a GPU
        (
            {"executor": {"kind": "slurm", "timeout_min": 1}},
            "slurm_signal_delay_s=90 (submitit's default) leaves a task no time before its warning",
        ),
        ({"executor": {"kind": "slurm", "timeout_min": 2, "slurm_signal_delay_s": 100}}, "raise timeout_min"),
        (
            {"executor": {"kind": "slurm", "timeout_min": 1, "slurm_signal_delay_s": 30}},
            "slurm_signal_delay_s below 30",
        ),
        ({"executor": {"kind": "slurm", "slurm_signal_delay_s": 70_000}}, "less than or equal to 65535"),
    ],
)
def test_bad_spec_fields_name_the_field(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from_data(data, source="s.json")
    msg = err.value.message
    assert needle in msg and msg.startswith("s.json: ") and "\n" not in msg


@pytest.mark.parametrize(
    ("table", "what"),
    [
        ({"format": "tilesweep-tuned", "version": 2, "device": {}, "entries": []}, "is a tuned table"),
        ({'{"q": "x", "k": "y"}': {"config": {}}}, "is one of tokamax's autotuning tables"),
    ],
)
def test_an_exported_table_given_as_a_spec_is_called_what_it_is(
    tmp_path: Path, table: dict[str, Any], what: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    msg = err.value.message
    assert msg.startswith(f"spec file {path} {what} (`export") and "not a spec; pass the spec the sweep ran" in msg


def test_a_sweep_directory_or_its_plan_given_as_a_spec_names_the_commands_that_take_it(
    write_spec: Any, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweeps" / "a"
    planned = run_cli("plan", str(write_spec()), "--sweep-dir", str(sweep))
    assert planned.returncode == 0, planned.stderr
    said = f"`tilesweep resume {sweep}` runs what it has no record of yet, `tilesweep status {sweep}` says"
    assert_one_line_error(run_cli("run", str(sweep)), f"spec file {sweep} is a sweep directory, not a spec; {said}")
    assert_one_line_error(
        run_cli("plan", str(sweep / "sweep.json"), "--dry-run"),
        f"spec file {sweep / 'sweep.json'} is the plan of the sweep directory {sweep}, not a spec; {said}",
    )
    assert_one_line_error(run_cli("spec", str(tmp_path / "sweeps")), "is a directory; pass the path of a JSON or TOML")


def test_a_results_document_with_an_empty_config_block_names_no_spec(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"device": {}, "config": {}, "results": []}))
    with pytest.raises(SpecError, match="is a results document whose config block is empty, so it names no sweep"):
        load_spec(path)


def test_a_time_limit_warning_that_leaves_the_task_time_is_accepted() -> None:
    assert spec_from_data({"executor": {"kind": "slurm", "timeout_min": 2, "slurm_signal_delay_s": 20}}, source="s")
    assert spec_from_data({"executor": {"kind": "slurm", "timeout_min": 3}}, source="s")
    assert spec_from_data({"executor": {"kind": "local", "timeout_min": 1}}, source="s")


def test_missing_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(SpecError, match=r"bad.json is not valid JSON: .* line 1"):
        load_spec(bad)
    badt = tmp_path / "bad.toml"
    badt.write_text("dtypes = [")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(badt)
    for name in ("sweep.yaml", "sweep.YML"):
        (tmp_path / name).write_text("dtypes: [float32]\n")
        with pytest.raises(SpecError, match=f"{name}: YAML is not supported: use JSON or TOML$"):
            load_spec(tmp_path / name)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(SpecError, match="must hold an object"):
        load_spec(arr)


def test_fingerprint_ignores_where_and_how_it_runs() -> None:
    a = SweepSpec()
    b = SweepSpec.model_validate(
        {"output": "elsewhere.json", "executor": {"kind": "slurm", "slurm_partition": "x"}, "sharding": {"units": 9}}
    )
    c = SweepSpec(repeats=7)
    d = SweepSpec.model_validate({"compile": {"mode": "processes", "workers": 3}})  # resume may change it
    assert a.fingerprint() == b.fingerprint() == d.fingerprint() != c.fingerprint()


def test_schema_lists_every_field() -> None:
    schema = SweepSpec.model_json_schema()
    assert set(REFERENCE_CONFIG_FIELDS) <= set(schema["properties"])
    assert schema.get("additionalProperties") is False


def test_fingerprints_are_pinned(sample_doc: dict[str, Any]) -> None:
    # Sweep directories and documents on disk hold these: a change of the fingerprint's rule
    # (or of a default it covers) makes every existing sweep refuse to resume.
    assert SweepSpec().fingerprint() == "c926b7436d2959d9"
    assert spec_from_data(sample_doc["config"]).fingerprint() == "55395a4456ab9aaf"


def _models() -> list[type[BaseModel]]:
    return [SweepSpec, *(model for _, model in sections(SweepSpec))]


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_every_spec_field_is_described(model: type[BaseModel]) -> None:
    # docs/spec.md is made from these descriptions
    assert model.__doc__
    assert [name for name, field in model.model_fields.items() if not field.description] == []


def test_spec_reference_is_up_to_date() -> None:
    page = ROOT / "docs" / "spec.md"
    assert page.exists() and page.read_text() == spec_reference(), (
        f"docs/spec.md is not what the spec's models say: regenerate it with `{COMMAND}`"
    )


def test_spec_reference_has_every_section_and_field() -> None:
    page = spec_reference()
    every: list[tuple[str, type[BaseModel]]] = [("top level", SweepSpec), *sections(SweepSpec)]
    for name, model in every:
        heading = "## Top level" if model is SweepSpec else f"## `{name}`"
        assert heading in page
        table = page.split(heading, 1)[1].split("\n## ", 1)[0]
        for field in model.model_fields:
            assert f"| `{field}` |" in table, (name, field)
    assert "| `batch` | integer | `4` | >= 1 | batch size of every problem |" in page
    assert (
        "| `fwd_warps` | list of integer | `[4, 8]` | non-empty; each one of 1, 2, 4, 8, 16, 32; each value once |"
        in page
    )
    assert "| `source` | string | required |" in page


@pytest.mark.parametrize(
    ("grid", "needle"),
    [
        ({"fwdd": {"block_q": [64]}}, 'field "grid": its keys are modes, "fwd" or "fwd_bwd", got "fwdd"'),
        ({"fwd": "tokamax"}, 'field "grid": grid.fwd must be an object of tunables and their values'),
        ({"fwd": {"block_q": 64}}, 'field "grid": grid.fwd.block_q must be a list of values'),
        ({"fwd": {"block_q": [64.0]}}, 'field "grid": grid.fwd.block_q[0] is 64.0: a grid\'s values are whole numbers'),
        ({"fwd": {"block_k": [64, None]}}, "grid.fwd.block_k[1] is null"),
        ({"fwd": {"block_q": ["64"]}}, 'block_q="64" is refused: block_q must be a power of two'),
        ({"fwd": {"block_q": ["64"]}}, '("64" is a string: write it without quotes)'),
        # the spec's own lists' limits hold in a grid too: 32 warps (1024 threads) and 8 stages at most
        ({"fwd": {"num_warps": [64]}}, "num_warps=64 is refused: num_warps must be a power of two"),
        ({"fwd": {"num_stages": [99]}}, "num_stages=99 is refused: num_stages must be at least 1 and at most 8"),
        ([1, 2], 'field "grid": [1, 2] is not a grid: give an object by mode'),
        (7, 'field "grid": 7 is not a grid'),
    ],
)
def test_a_grid_of_the_wrong_shape_is_named_in_the_specs_words(grid: Any, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from_data({"grid": grid}, source="s.json")
    assert needle in err.value.message and "dict[" not in err.value.message, err.value.message
    assert "\n" not in err.value.message


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("dup.json", '{"repeats": 3, "repeats": 5}', 'gives the key "repeats" twice in one object'),
        ("nested.json", '{"timing": {"target_ms": 5, "target_ms": 9}}', 'gives the key "target_ms" twice'),
        (
            "inf.json",
            '{"timing": {"target_ms": Infinity}}',
            'field "timing.target_ms": Input should be a finite number',
        ),
        ("nan.json", '{"timing": {"target_ms": NaN}}', 'field "timing.target_ms": Input should be a finite number'),
        ("inf.toml", "[timing]\ntarget_ms = inf\n", 'field "timing.target_ms": Input should be a finite number'),
    ],
)
def test_a_key_given_twice_or_a_number_that_is_not_finite_is_refused(
    tmp_path: Path, name: str, text: str, needle: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert needle in err.value.message, err.value.message


@pytest.mark.parametrize(("content", "needle"), [(b"\x93\x01{}", "byte 0x93 at offset 0"), (b"\x00{}", "NUL bytes")])
def test_a_binary_spec_file_is_called_not_text(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "spec.json"
    path.write_bytes(content)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert f"spec file {path} is not text" in err.value.message and needle in err.value.message
    assert "pass a JSON or TOML spec" in err.value.message


def test_a_problem_no_gpu_could_hold_is_refused_at_once() -> None:
    """A typo in batch (40000 for 4) would have every config compiled and then fail out of
    memory on the GPU: its tensors alone are terabytes."""
    with pytest.raises(SpecError) as err:
        spec_from_data({"batch": 40000, "seq_lens": [8192], "head_dims": [128]}, source="s.json")
    assert "s.json: the largest problem (batch 40000, heads 8, seq 8192, head_dim 128)" in err.value.message
    assert "more than one GPU holds" in err.value.message and "lower batch, heads or seq_lens" in err.value.message
    # a long context the big GPUs hold is taken: 1M tokens, 8 heads of 128, bfloat16, fwd_bwd
    spec_from_data({"batch": 1, "seq_lens": [1 << 20], "head_dims": [128], "dtypes": ["bfloat16"]}, source="s.json")


@pytest.mark.parametrize(
    ("field", "data"),
    [
        ("output", {"output": "out.json\0x"}),
        ("tag", {"tag": "a\0b"}),
        ("reuse.documents", {"reuse": {"documents": ["old.json\0"]}}),
        ("compile.cache_dir", {"compile": {"cache_dir": "\0"}}),
    ],
)
def test_a_nul_character_in_any_text_is_refused_by_the_spec(field: str, data: dict[str, Any]) -> None:
    """A NUL passed ``spec`` and then ended ``run`` and ``plan`` in a traceback (no path may
    hold one); it is refused where the spec is read, naming the field."""
    with pytest.raises(SpecError) as err:
        spec_from_data(data, source="s.json")
    assert f'field "{field}": holds a NUL character' in err.value.message, err.value.message


def test_a_spec_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"batch": 1}).encode())
    assert load_spec(path).batch == 1


@pytest.mark.parametrize(("text", "kind"), [("null", "null"), ("[1]", "array"), ('"x"', "string"), ("3", "number")])
def test_a_spec_file_that_holds_no_object_says_what_it_holds(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "spec.json"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.message == f"spec file {path} must hold an object of spec fields, {{...}}, not a JSON {kind}"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", '{"grid":' + "[" * 100_000 + "]" * 100_000 + "}"),  # past the parser's own recursion
        ("deep.toml", "grid = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("deep_obj.json", '{"executor": {"slurm_additional_parameters": ' + '{"a": ' * 900 + "1" + "}" * 902),
    ],
    ids=["json", "toml", "object"],  # the texts themselves would make the test's id (and its environment) huge
)
def test_a_spec_file_nested_too_deeply_is_one_line_not_a_crash(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    r = run_cli("spec", str(path))
    assert_one_line_error(r, f"spec file {path} nests its values more than 32 levels deep")


def test_an_sbatch_option_tilesweep_does_not_name_points_at_additional_parameters(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"executor": {"kind": "slurm", "slurm_mail_user": "a@b"}}))
    assert_one_line_error(
        run_cli("spec", str(path)),
        'unknown field "executor.slurm_mail_user"',
        "any other sbatch option goes in executor.slurm_additional_parameters",
    )


def test_an_sbatch_option_a_setting_sets_is_refused_in_a_spec_file_and_kept_in_a_frozen_one() -> None:
    """A sweep planned before the option was refused stays readable (status, resume): its frozen
    spec is taken as it was submitted, and `resume --spec` gives it other settings."""
    data = {"executor": {"kind": "slurm", "slurm_additional_parameters": {"partition": "gpu"}}}
    with pytest.raises(SpecError, match="slurm_additional_parameters.partition sets what executor.slurm_partition"):
        spec_from_data(data, source="s.json")
    frozen = spec_from_data(data, source="sweep.json", frozen=True)
    assert frozen.executor.slurm_additional_parameters == {"partition": "gpu"}


def test_spec_refuses_the_documents_it_names_as_plan_would(tmp_path: Path, write_spec: Callable[..., Path]) -> None:
    """``tilesweep spec`` checks the files a spec names that ``plan`` reads: a replay source or
    a reuse document that is missing, or a folder, is refused in one line naming the field and
    the file, before a sweep is planned; a spec whose documents are there passes."""
    missing = tmp_path / "nope.json"
    reuse = write_spec("reuse.json", reuse={"documents": [str(missing)]})
    assert_one_line_error(run_cli("spec", str(reuse)), f"reuse.documents {missing}: no such file")
    folder = write_spec("folder.json", reuse={"documents": [str(tmp_path)]})
    assert_one_line_error(run_cli("spec", str(folder)), f"reuse.documents {tmp_path}: is a directory")
    replay = write_spec("replay.json", kernel={"impl": "replay"}, replay={"source": str(missing)})
    assert_one_line_error(run_cli("spec", str(replay)), f"replay.source {missing}: no such file")
    source = tmp_path / "source.json"
    source.write_text(json.dumps(synthetic.document(TINY_SPEC)))
    good = write_spec("good.json", reuse={"documents": [str(source)]})
    r = run_cli("spec", str(good))
    assert r.returncode == 0, r.stderr
