"""``lanceloader check-resume module:factory``: the report printed, exit status 0 when every
resumed run matched, 1 at a divergence, 2 (one line) for bad arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import assert_one_line_error, run_cli
from lanceloader.demo import write_demo_dataset

FACTORIES = """
import lanceloader as ll

URI = {uri!r}


class OffByOne(ll.Loader):
    def load_state_dict(self, state, allow_changes=()):
        if state["sample"] < state["order"]["rows"]:
            state = {{**state, "sample": state["sample"] + 1}}
        super().load_state_dict(state, allow_changes)


def make_loader(rank, world_size, cls=ll.Loader):
    return cls(URI, batch_size=16, columns=["id"], shuffle=True, rank=rank,
               world_size=world_size, num_workers=1)


def make_buggy_loader(rank, world_size):
    return make_loader(rank, world_size, OffByOne)


def make_mix_loader(rank, world_size):
    mix = ll.Mix({{"a": ll.Loader(URI, columns=["id"], shuffle=True),
                  "b": ll.Loader(URI, columns=["id"], seed=1, shuffle=True)}},
                 samples_per_epoch=200)
    return ll.Loader(mix, batch_size=16 // world_size, rank=rank, world_size=world_size,
                     num_workers=1)


def feedback(loader):
    if loader.step == 3:
        loader.set_weights({{"a": 3, "b": 1}})
"""


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``crjob_<n>`` of factories in the current directory (a fresh name per test:
    the module is imported into this process)."""
    uri = write_demo_dataset(tmp_path / "train.lance", rows=300)
    name = f"crjob_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(FACTORIES.format(uri=uri))
    monkeypatch.chdir(tmp_path)
    return name


def test_a_loader_that_resumes_exactly_exits_0(
    job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["check-resume", f"{job}:make_loader", "--runs", "10", "--world-sizes", "1,2,3"]
    code, out, err = run_cli([*args, "--ids", "id", "--seed", "4"], capsys)
    assert (code, err) == (0, ""), err
    assert out.startswith("check_resume: OK: every row as in the uninterrupted run.")
    assert "interrupted runs 10," in out and "world sizes 1, 2, 3;" in out


def test_feedback_from_on_step(job: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check-resume", f"{job}:make_mix_loader", "--runs", "6", "--world-sizes", "2,1"]
    code, out, err = run_cli(
        [*args, "--on-step", f"{job}:feedback", "--allow-changes", "batch_size"], capsys
    )
    assert (code, err) == (0, ""), out + err
    assert out.startswith("check_resume: OK: ")


def test_a_divergence_is_printed_and_exits_1(job: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["check-resume", f"{job}:make_buggy_loader", "--runs", "10"], capsys)
    assert code == 1 and err == "", err
    assert out.startswith("check_resume: FAILED: run 0, load 1: epoch ")
    assert "the rows differ from the uninterrupted run's" in out and "  the run:" in out


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["{job}:nowhere"], ["FACTORY {job}:nowhere: ", "has no attribute 'nowhere'"]),
        (["{job}.make_loader"], ["FACTORY must be module:function, e.g. myjob:make_loader"]),
        (["{job}:make_loader", "--world-sizes", "1,0"], ["world sizes N,M,...", "'1,0'"]),
        (["{job}:make_loader", "--ids", "nope"], ["ids='nope' is not a column", "['id']"]),
    ],
)
def test_bad_arguments_are_one_line(
    job: str, capsys: pytest.CaptureFixture[str], args: list[str], fragments: list[str]
) -> None:
    code, _, err = run_cli(["check-resume", *(a.format(job=job) for a in args)], capsys)
    if "--world-sizes" in args:  # argparse's own error line
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert all(f in err for f in fragments), err
        return
    assert_one_line_error(code, err, "check-resume", *(f.format(job=job) for f in fragments))
