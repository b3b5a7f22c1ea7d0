"""What the ``--help`` of ``status``, ``ls`` and ``logs`` says: what each prints and takes, and
``status``'s exit codes as the README gives them."""

from __future__ import annotations

from tests.helpers import REPO, run_cli


def test_status_help_says_what_json_prints_and_each_exit_code_the_readme_gives() -> None:
    r = run_cli("status", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "--json print the status as one JSON object" in text and "the exit code is the same" in text, text
    readme = " ".join((REPO / "README.md").read_text().split("**Status.**")[1].split("**Time limits")[0].split())
    for said in (
        "ended without finishing",
        "never started",
        "a round is still to plan",
        "final merge job refused",
        "complete, not merged",
        "older than records written since",
    ):
        assert said in text, (said, text)
        assert said in readme, (said, readme)
    assert "Exit code 0: nothing waits for a command of yours" in text, text
    assert "2: the sweep directory cannot be read" in text, text


def test_logs_help_says_a_slurm_task_id_is_taken_and_what_each_attempts_first_line_is() -> None:
    r = run_cli("logs", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "or a SLURM task id as `tilesweep status` shows it in its job column (6343_0)" in text, text
    assert "the task's own log where it ran several" in text, text
    assert "Each attempt's output opens with a line naming the unit" in text, text
    assert "The log's first line names the unit" not in text, text
