"""What ``submit`` and ``resume`` refuse on the real local SLURM cluster, in one line and before
anything is submitted or changed: bad input (no sbatch, an unknown partition, another spec's
sweep directory, a typo), a spec that names another executor, an output holding another sweep's
records; and a spec that names no executor, which goes to SLURM and stays there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import assert_one_line_error
from tests.slurm_cluster import poll, require_cluster
from tests.slurm_sweeps import FOUR_UNITS, SLURM, cli, jobs, snapshot, status, write_spec

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    require_cluster()


def test_a_spec_naming_no_executor_kind_is_submitted_and_resumed_on_slurm_and_one_naming_local_refused(
    tmp_path: Path,
) -> None:
    """``submit`` of a spec whose executor names no kind (local by default) freezes the sweep with
    the slurm executor: its resume submits, not runs here as the spec's default would say."""
    local = write_spec(tmp_path, "local.json", {"kind": "local"})
    assert_one_line_error(
        cli("submit", str(local), "--sweep-dir", str(tmp_path / "no")), 'executor.kind is "local"', "`tilesweep run "
    )
    assert not (tmp_path / "no").exists()
    spec = write_spec(tmp_path, "default.json", {"merge_job": False}, **FOUR_UNITS)
    data = json.loads(spec.read_text())
    del data["executor"]["kind"]
    spec.write_text(json.dumps(data))
    sweep = tmp_path / "sweep"
    assert cli("submit", str(spec), "--sweep-dir", str(sweep), "--units", "2").returncode == 0
    assert json.loads((sweep / "sweep.json").read_text())["spec"]["executor"]["kind"] == "slurm"
    assert cli("cancel", str(sweep)).returncode == 0
    poll(lambda: all(u["state"] in ("cancelled", "done") for u in status(sweep)["units"]), 30, "the units cancelled")
    r = cli("resume", str(sweep))
    assert r.returncode == 0, r.stderr
    resumed = [e for e in jobs(sweep) if e.get("origin") == "resume"]
    assert resumed and all(e["executor"] == "slurm" for e in resumed), resumed
    assert cli("cancel", str(sweep)).returncode == 0


def test_bad_input_gets_one_line_errors_and_changes_nothing(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "good.json")
    sweep = tmp_path / "sweep"
    # no sbatch on PATH: refused before anything is written
    empty = tmp_path / "bin"
    empty.mkdir()
    assert_one_line_error(
        cli("submit", str(spec), "--sweep-dir", str(sweep), env={"PATH": str(empty)}), "sbatch", "PATH"
    )
    assert not sweep.exists()
    assert cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    before = snapshot(sweep)
    assert_one_line_error(cli("resume", str(sweep), env={"PATH": str(empty)}), "sbatch", "PATH")
    # an unknown partition: named with its spec field and what to do, before sbatch (whose words name
    # neither)
    bad = write_spec(tmp_path, "bad.json", {"slurm_partition": "nosuch"})
    unknown = 'executor.slurm_partition "nosuch" is not a partition of this cluster'
    assert_one_line_error(cli("submit", str(bad), "--sweep-dir", str(sweep)), f"{bad}: {unknown}", "`sinfo -s`")
    r = cli("resume", str(sweep), "--spec", str(bad))
    assert_one_line_error(r, f"{bad}: {unknown}")  # the spec file whose field it is
    assert not r.stdout, r.stdout  # nor a line telling of new units it did not submit
    fresh = tmp_path / "fresh"
    r = cli("submit", str(bad), "--sweep-dir", str(fresh))
    assert_one_line_error(r, unknown)
    assert not fresh.exists() and not r.stdout, r.stdout  # nor a line telling of the sweep it did not make
    # an unknown partition of the final merge job: refused before the arrays, not once they ran
    bad_merge = write_spec(tmp_path, "bad_merge.json", {"merge_partition": "nosuch"})
    r = cli("submit", str(bad_merge), "--sweep-dir", str(fresh))
    assert_one_line_error(r, f'{bad_merge}: executor.merge_partition "nosuch" is not a partition', "sinfo -s")
    assert not fresh.exists()
    # a time limit over the partition's (the cluster's `short` allows 1 minute): named, before sbatch
    long = write_spec(tmp_path, "long.json", {"slurm_partition": "short", "timeout_min": 5})
    r = cli("submit", str(long), "--sweep-dir", str(fresh))
    assert_one_line_error(
        r, f"{long}: executor.timeout_min 5 is over the time limit of partition short (00:01:00, 1 min)"
    )
    assert not fresh.exists() and not r.stdout, r.stdout
    # a task larger than every node of its partition (the cluster's node: 4 GPUs, 8 CPUs, ~21 GB):
    # named, with the most a node has, before sbatch (whose words name neither)
    for field, value, most in (("gpus_per_node", 8, "(4 GPUs at most)"), ("cpus_per_task", 16, "(8 CPUs at most)")):
        big = write_spec(tmp_path, "big.json", {field: value})
        r = cli("submit", str(big), "--sweep-dir", str(fresh))
        assert_one_line_error(r, f"executor.{field} {value} is more than any node of partition gpu has {most}")
        assert not fresh.exists() and not r.stdout, r.stdout
    big = write_spec(tmp_path, "big.json", {"mem_gb": 4096})
    r = cli("submit", str(big), "--sweep-dir", str(fresh))
    assert_one_line_error(r, "executor.mem_gb 4096 is more than any node of partition gpu has", "MB of memory")
    assert not fresh.exists()
    # a sweep directory of another spec
    other = write_spec(tmp_path, "other.json", repeats=3)
    assert_one_line_error(cli("submit", str(other), "--sweep-dir", str(sweep)), "another spec")
    assert_one_line_error(cli("resume", str(sweep), "--spec", str(other)), "not the spec")
    assert snapshot(sweep) == before
    # an unknown executor key names the valid ones
    typo = write_spec(tmp_path, "typo.json", {"partitionn": "gpu"})
    assert_one_line_error(cli("plan", str(typo), "--dry-run"), "executor.partitionn", "slurm_partition")


def test_submit_into_a_document_of_another_sweep_is_refused_before_any_gpu_time(tmp_path: Path) -> None:
    """Its final merge job would refuse the output once the arrays had run: refused up front,
    nothing submitted, nothing left behind."""
    from tests.conftest import SAMPLE

    spec = write_spec(tmp_path, "spec.json")
    output = Path(json.loads(spec.read_text())["output"])
    output.write_bytes(SAMPLE.read_bytes())
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert_one_line_error(r, str(output), "not this sweep's", "append: true", "move it away first")
    assert not sweep.exists() and output.read_bytes() == SAMPLE.read_bytes()


def test_a_merge_partition_whose_time_limit_is_under_the_merge_jobs_is_refused_before_the_arrays(
    tmp_path: Path,
) -> None:
    """sbatch refuses the final merge job on a partition whose time limit is under what that job
    asks for, but only once the arrays it follows were taken: said before, naming the field."""
    spec = write_spec(tmp_path, "spec.json", {"merge_partition": "short"})
    sweep = tmp_path / "sweep"
    r = cli("submit", str(spec), "--sweep-dir", str(sweep))
    assert_one_line_error(
        r, 'executor.merge_partition "short" allows 1 min (00:01:00), and the final merge job asks for 30 min'
    )
    assert not sweep.exists()
    # the same refusal without a merge job, or with the merge job on the units' partition: none
    for executor, name in (
        ({"merge_partition": "short", "merge_job": False}, "none"),
        ({"merge_partition": None}, "gpu"),
    ):
        dry = cli("submit", str(write_spec(tmp_path, f"{name}.json", executor)), "--dry-run")
        assert dry.returncode == 0, dry.stderr


def test_a_dry_run_refuses_what_submit_would_refuse_before_sbatch(tmp_path: Path) -> None:
    """``submit --dry-run`` shows what ``submit`` would do: a spec that submit refuses before sbatch
    gets the same line and exit code 2 from the dry run, not a layout and exit 0."""
    for name, executor, refusal in (
        ("partition", {"slurm_partition": "nosuch"}, 'executor.slurm_partition "nosuch" is not a partition'),
        ("time", {"slurm_partition": "short", "timeout_min": 5}, "executor.timeout_min 5 is over the time limit"),
        ("gpus", {"gpus_per_node": 8}, "executor.gpus_per_node 8 is more than any node of partition gpu has"),
        ("merge", {"merge_partition": "nosuch"}, 'executor.merge_partition "nosuch" is not a partition'),
    ):
        spec = write_spec(tmp_path, f"{name}.json", executor)
        sweep = tmp_path / name
        dry = cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run")
        assert assert_one_line_error(dry, refusal) == assert_one_line_error(
            cli("submit", str(spec), "--sweep-dir", str(sweep)), refusal
        )
        assert not sweep.exists()


def test_an_sbatch_option_an_executor_setting_sets_is_refused_naming_that_setting(tmp_path: Path) -> None:
    """Given in ``slurm_additional_parameters``, such an option would override the setting in the
    sbatch script behind its checks: a partition whose time limit was never checked, a task given
    2 GPUs that the plan runs one unit on. Refused in one line naming the setting, nothing written."""
    for option, value, field in (("partition", "short", "slurm_partition"), ("gpus-per-node", 2, "gpus_per_node")):
        spec = write_spec(tmp_path, "extra.json", {"slurm_additional_parameters": {option: value}})
        sweep = tmp_path / "sweep"
        said = f"slurm_additional_parameters.{option} sets what executor.{field} sets"
        assert_one_line_error(cli("submit", str(spec), "--sweep-dir", str(sweep), "--dry-run"), said, f"set {field}")
        assert_one_line_error(cli("submit", str(spec), "--sweep-dir", str(sweep)), said)
        assert not sweep.exists()


def test_a_measured_sweep_whose_tasks_ask_for_no_gpu_is_refused_unless_it_asks_for_interpret_mode(
    tmp_path: Path,
) -> None:
    """Tasks that ask SLURM for no GPU (executor.gpus_per_node unset or 0) would time the kernels
    in interpret mode on CPUs, as if measured on the GPU the sweep targets: ``submit`` (and its dry
    run) and ``resume`` refuse it in one line naming the two ways on, and change nothing; the way
    ``resume`` names works. A spec asking for interpret mode on purpose is submitted, said in one
    line before sbatch."""
    for value, said in ((None, "unset"), (0, "0")):
        spec = write_spec(tmp_path, "cpu.json", {"gpus_per_node": value}, kernel={})
        fresh = tmp_path / "fresh"
        for dry in ([], ["--dry-run"]):
            r = cli("submit", str(spec), "--sweep-dir", str(fresh), *dry)
            assert_one_line_error(
                r,
                f"{spec}: executor.gpus_per_node is {said}: the SLURM tasks would get no GPU and time the kernels in "
                "Pallas interpret mode on their CPUs, not on the NVIDIA H100 the sweep targets (kernel.device_kind)",
                "set executor.gpus_per_node to the GPUs of a task, or kernel.interpret: true to time interpret mode",
            )
            assert not fresh.exists() and not r.stdout, r.stdout
    # run with the slurm executor submits as submit does: refused alike, no sweep directory left
    r = cli("run", str(spec), "--sweep-dir", str(fresh))
    assert_one_line_error(r, f"{spec}: executor.gpus_per_node is 0: the SLURM tasks would get no GPU")
    assert not fresh.exists()
    # a sweep planned from it: resume refuses it too, naming the command that takes the fix
    sweep = tmp_path / "sweep"
    assert cli("plan", str(spec), "--sweep-dir", str(sweep)).returncode == 0
    before = snapshot(sweep)
    assert_one_line_error(
        cli("resume", str(sweep)),
        "executor.gpus_per_node is 0",
        f"set executor.gpus_per_node to the GPUs of a task, then `tilesweep resume {sweep} --spec {spec}`",
        f"(another sweep: kernel.interpret is part of its fingerprint; `tilesweep submit {spec}`)",
    )
    assert snapshot(sweep) == before
    spec.write_text(json.dumps({**json.loads(spec.read_text()), "executor": {**SLURM, "merge_job": False}}))
    r = cli("resume", str(sweep), "--spec", str(spec))
    assert r.returncode == 0 and "submitted 1 unit" in r.stdout and "no GPU" not in r.stderr, r.stdout + r.stderr
    assert cli("cancel", str(sweep)).returncode == 0
    # interpret mode on purpose: submitted, and said before sbatch
    interpreted = write_spec(tmp_path, "interpreted.json", {"gpus_per_node": None, "merge_job": False})
    cpu = tmp_path / "cpu"
    r = cli("submit", str(interpreted), "--sweep-dir", str(cpu), "--units", "1")
    assert r.returncode == 0 and "submitted 1 unit" in r.stdout, r.stderr
    assert r.stderr.splitlines() == [
        "tilesweep: note: executor.gpus_per_node is unset: the SLURM tasks get no GPU and time the kernels in Pallas "
        "interpret mode on their CPUs (kernel.interpret: true)"
    ], r.stderr
    assert cli("cancel", str(cpu)).returncode == 0


def test_a_constraint_no_node_meets_and_an_exclude_of_every_node_are_refused_naming_the_field(tmp_path: Path) -> None:
    """sbatch refuses both in words that name no spec field ("Invalid feature specification",
    "Requested node configuration is not available"): refused before sbatch, naming the field and
    what the partition has, by submit, its dry run and resume alike, and nothing is left behind."""
    nodes = subprocess.run(["sinfo", "-N", "-h", "-o", "%N", "-p", "gpu"], capture_output=True, text=True, check=True)
    every = ",".join(sorted(set(nodes.stdout.split())))
    sweep = tmp_path / "sweep"
    assert cli("plan", str(write_spec(tmp_path, "good.json")), "--sweep-dir", str(sweep)).returncode == 0
    before = snapshot(sweep)
    fresh = tmp_path / "fresh"
    for name, executor, refusal in (
        (
            "feature",
            {"slurm_constraint": "nosuchfeature"},
            'executor.slurm_constraint "nosuchfeature" names a feature no node of partition gpu has (nosuchfeature',
        ),
        (
            "exclude",
            {"slurm_exclude": every},
            f"executor.slurm_exclude {json.dumps(every)} excludes every node of partition gpu "
            f"({every.replace(',', ', ')})",
        ),
    ):
        spec = write_spec(tmp_path, f"{name}.json", executor)
        for command in (["submit", str(spec), "--sweep-dir", str(fresh)], ["submit", str(spec), "--dry-run"]):
            r = cli(*command)
            assert_one_line_error(r, refusal)
            assert not fresh.exists() and not r.stdout, r.stdout
        assert_one_line_error(cli("resume", str(sweep), "--spec", str(spec)), f"{spec}: {refusal}")
        assert snapshot(sweep) == before


def test_what_sbatch_refuses_past_the_checks_names_the_field_not_a_removed_script(tmp_path: Path) -> None:
    """A constraint in a form the check does not read, an sbatch option no node meets: sbatch's own
    words, then the spec field they point at; no command naming submitit's script, which the
    refusal removed."""
    fresh = tmp_path / "fresh"
    for name, executor, field in (
        (
            "feature",
            {"slurm_constraint": "nosuch@feature"},
            'Invalid feature specification; executor.slurm_constraint "nosuch@feature" names a feature the '
            "cluster's nodes lack",
        ),
        (
            "disk",
            {"slurm_additional_parameters": {"tmp": "100000G"}},
            "Requested node configuration is not available; no node of partition gpu takes a task as the spec "
            "asks (gpus_per_node 1, slurm_additional_parameters)",
        ),
    ):
        spec = write_spec(tmp_path, f"{name}.json", executor)
        r = cli("submit", str(spec), "--sweep-dir", str(fresh))
        line = assert_one_line_error(r, "sbatch refused the job: ", field)
        assert "submission_file" not in line and "command:" not in line, line
        assert not fresh.exists()
        # the dry run asks sbatch too (--test-only, nothing submitted): refused alike, naming the spec
        assert_one_line_error(cli("submit", str(spec), "--dry-run"), f"{spec}: sbatch refuses the job: ", field)


def test_a_dry_run_refuses_an_sbatch_option_sbatch_does_not_know_naming_its_key(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "typo.json", {"slurm_additional_parameters": {"gpu_bnd": "closest"}})
    said = assert_one_line_error(
        cli("submit", str(spec), "--sweep-dir", str(tmp_path / "sweep"), "--dry-run"),
        f"{spec}: sbatch refuses the job: sbatch: unrecognized option '--gpu-bnd=closest'",
        "executor.slurm_additional_parameters.gpu_bnd is no option of sbatch",
    )
    assert 'Try "sbatch --help"' not in said  # the message says what to do, not sbatch's hint
    assert not (tmp_path / "sweep").exists()


def test_the_features_of_a_constraint_are_read_from_its_operators() -> None:
    from orchestrator.control.node_choice import constraint_features

    assert constraint_features("h100") == ["h100"]
    assert constraint_features("[h100|h200]*2&nvme") == ["h100", "h200", "nvme"]
    assert constraint_features("(a100,ib)") == ["a100", "ib"]
    assert constraint_features("h100@x") is None  # not read: sbatch judges


def test_resume_with_a_spec_naming_an_unknown_partition_keeps_the_sweeps_settings_though_it_submits_nothing(
    tmp_path: Path,
) -> None:
    """``resume --spec FILE`` makes FILE's executor settings the sweep's from now on. Where it has
    nothing to submit (every item recorded), so that no submission checked them, settings the
    cluster would refuse (an unknown partition) are refused in one line naming FILE, and the
    sweep keeps its own."""
    from orchestrator.store.synthetic import build_sweep

    good = write_spec(tmp_path, "good.json")
    sweep = tmp_path / "sweep"
    build_sweep(sweep, json.loads(good.read_text()), 2)  # every item recorded: nothing to resubmit
    (sweep / "env.json").unlink()  # its records' synthetic environment, which no resume here would match
    before = (sweep / "sweep.json").read_bytes()
    bad = write_spec(tmp_path, "bad.json", {"slurm_partition": "nosuch"})
    r = cli("resume", str(sweep), "--spec", str(bad))
    assert_one_line_error(r, f'{bad}: executor.slurm_partition "nosuch" is not a partition of this cluster')
    assert (sweep / "sweep.json").read_bytes() == before
