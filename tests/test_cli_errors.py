"""The CLI's promise, checked through the real command line on temporary databases: an error a
user can cause prints one line on stderr and exits with code 2 — for every command, for bad
arguments and for the files, folders and databases around them (read-only, foreign, too large)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
import torch
import typer
from conftest import assert_one_line_error
from typer.testing import CliRunner

from omnitune.cli import app
from omnitune.profile.device import current_device_facts

SHAPE = "b=1,h=2,hkv=1,lq=17,lk=23,d=64,causal=1"
ON_GPU = torch.cuda.is_available()
# conftest imports the kernels interpreted without a GPU and compiled with one; --interpret must match.
MODE = [] if ON_GPU else ["--interpret"]
REPO = Path(__file__).resolve().parents[1]


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)


def search_args(db, *extra) -> list:
    return ["search", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--db", db, *extra]


def searched_db(tmp_path: Path, trials: int = 2) -> Path:
    db = tmp_path / "omnitune.db"
    result = invoke(*search_args(db, "--trials", trials))
    assert result.exit_code == 0, result.output
    return db


# --- making a file or folder that even root cannot write ------------------------------------------


def _writable(path: Path) -> bool:
    try:
        if path.is_dir():
            probe = path / ".probe"
            probe.write_text("")
            probe.unlink()
        else:
            with open(path, "a"):
                pass
        return True
    except OSError:
        return False


@pytest.fixture
def read_only():
    """make(path): `path` read-only for this process. Mode bits stop everyone but root; as root
    (how the tests run here) the file or folder is made immutable with chattr +i, which root
    cannot write either. Skipped where neither works (e.g. chattr on a filesystem without it)."""
    made: list[tuple[Path, bool]] = []

    def make(path: Path) -> Path:
        if os.geteuid() == 0:
            chattr = shutil.which("chattr")
            if chattr is None:
                pytest.skip("running as root without chattr: nothing here can make a file root cannot write")
            done = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"running as root and chattr +i failed ({done.stderr.strip()}): cannot make "
                            f"{path} read-only for root")
            made.append((path, True))
        else:
            made.append((path, False))
            path.chmod(0o555 if path.is_dir() else 0o444)
        if _writable(path):
            pytest.skip(f"{path} is still writable after making it read-only")
        return path

    yield make
    for path, immutable in reversed(made):
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=False)
        else:
            path.chmod(0o755 if path.is_dir() else 0o644)


# --- every command: one line and exit 2 ----------------------------------------------------------

# One obviously bad argument per command, and what its one line says. Each fails before any GPU
# work, on a GPU machine or not.
BAD_ARGUMENTS = {
    "kernels": (["kernels", "attention"], "unexpected extra argument"),
    "devices": (["devices", "--gpu", "0"], "No such option: --gpu"),
    "bench": (["bench", "attention", "--shape", "b=1,h=2,zz=3", "--dtype", "fp32", *MODE], "no dimension 'zz'"),
    "search": (["search", "attention", "--shape", "b=1,h=2,hkv=1,lq=inf,lk=23,d=64", *MODE], "lq='inf' is not a valid int"),
    "plan": (["plan", "--model", "llama-9"], "unknown model 'llama-9'"),
    "report": (["report", "--db", "{tmp}/missing.db"], "no results database"),
    "export": (["export", "--db", "{tmp}/missing.db", "--out", "{tmp}/out"], "no results database"),
    "lookup": (["lookup", "attention", "--shape", SHAPE, "--dtype", "fp8"], "unknown dtype 'fp8'"),
    "calibrate": (["calibrate", "--db"], "requires an argument"),
    "profile": (["profile", "attention", "--shape", "b=1,h=2,zz=3"], "no dimension 'zz'"),
    "worker": (["worker", "attention", "--storage", " ", "--shape", SHAPE, *MODE], "--storage needs a URL"),
    "verify": (["verify", "--soak", "5", *MODE], "--soak needs --model"),
}


def test_every_command_has_a_bad_argument_case():
    commands = typer.main.get_command(app).commands
    assert set(BAD_ARGUMENTS) == set(commands)


@pytest.mark.parametrize("command", sorted(BAD_ARGUMENTS))
def test_a_bad_argument_is_one_line_and_exit_2(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, message = BAD_ARGUMENTS[command]
    assert_one_line_error(invoke(*(a.replace("{tmp}", str(tmp_path)) for a in args)), message)
    assert not (tmp_path / "omnitune.db").exists()


@pytest.mark.parametrize("command", sorted(BAD_ARGUMENTS))
def test_an_unknown_option_is_one_line_and_exit_2(command):
    line = assert_one_line_error(invoke(command, "--no-such-option"), "No such option: --no-such-option")
    assert f"{command} --help" in line


def _once_only_option(command: str):
    """A command's first option that may be given once (a flag, or one that takes a value), or None."""
    click_command = typer.main.get_command(app).commands[command]
    return next((p for p in click_command.params
                 if getattr(p, "param_type_name", "") == "option" and not p.multiple and not p.is_eager), None)


@pytest.mark.parametrize("command", sorted(c for c in BAD_ARGUMENTS if _once_only_option(c) is not None))
def test_an_option_given_twice_is_one_line_not_the_last_one_silently(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    option = _once_only_option(command)
    name = next(o for o in option.opts if o.startswith("--"))
    twice = [name, name] if option.is_flag else [name, "a", f"{name}=b"]
    line = assert_one_line_error(invoke(command, *twice), f"{name} is given twice")
    assert f"omnitune {command} takes it once" in line
    assert list(tmp_path.iterdir()) == []


def test_twice_counts_each_spelling_of_an_option_and_both_sides_of_a_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("lookup", "attention", "-s", SHAPE, "--shape", SHAPE),
                          "--shape is given twice (first as -s)")
    assert_one_line_error(invoke("lookup", "attention", "--shape", SHAPE, "--json", "--json"), "--json is given twice")


def test_an_option_that_takes_several_values_may_repeat_and_values_are_not_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # bench takes --shape more than once; a value that looks like an option is a value (the parser
    # then judges it), and after -- everything is an argument.
    line = assert_one_line_error(
        invoke("bench", "attention", "--shape", "b=1", "--shape", "b=2", "--dtype", "fp32", *MODE))
    assert "given twice" not in line
    line = assert_one_line_error(invoke("lookup", "attention", "--shape", "--shape"), "bad shape '--shape'")
    assert "given twice" not in line
    result = invoke("lookup", "attention", "--shape", SHAPE, "--dtype", "fp32", "--json")
    assert result.exit_code == 0, result.output


def test_the_root_command_too():
    assert_one_line_error(invoke("--no-such-option"), "No such option")
    assert_one_line_error(invoke("nosuch"), "No such command 'nosuch'")


def test_debug_still_shows_the_traceback():
    result = invoke("--debug", "plan", "--model", "llama-9")
    assert result.exit_code != 2 and result.exception is not None and "llama-9" in str(result.exception)


# --- what a command writes -----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["search", "bench"])
def test_a_shape_too_large_to_allocate_is_refused_before_anything_is_written(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    huge = "b=1,h=2,hkv=1,lq=1000000000,lk=23,d=64"
    args = [command, "attention", "--shape", huge, "--dtype", "fp32", *MODE]
    line = assert_one_line_error(invoke(*args), "is too large: its tensors alone need")
    assert "lq=1000000000" in line
    assert list(tmp_path.iterdir()) == []  # no empty omnitune.db, no Optuna storage


@pytest.mark.skipif(not MODE, reason="the interpreter's margin applies under --interpret only")
@pytest.mark.parametrize("command", ["search", "bench"])
def test_an_interpreted_shape_needing_more_than_the_host_has_is_refused_first(command, tmp_path, monkeypatch):
    """Under the interpreter a problem whose tensors fit, but not with the reference and the
    interpreter's copies beside them, is refused before anything runs (the OOM killer ended one)."""
    from omnitune.cli import preflight
    from omnitune.kernels.paged_decode_attention import SPEC

    shape = "b=1,h=4,hkv=2,lq=1,ctx=4000,d=64,block_size=16"
    needed = SPEC.bytes_moved(SPEC.problem_from_mapping(dict(kv.split("=") for kv in shape.split(","))),
                              torch.float32)
    monkeypatch.setattr(preflight, "_memory_bytes", lambda interpret: (3 * needed, "this machine's available memory"))
    monkeypatch.chdir(tmp_path)
    args = [command, "paged_decode_attention", "--shape", shape, "--dtype", "fp32", *MODE]
    line = assert_one_line_error(invoke(*args), "is too large for --interpret")
    assert "ctx=4000" in line
    assert list(tmp_path.iterdir()) == []


def test_an_allocation_that_fails_anyway_is_one_line(tmp_db, monkeypatch):
    from omnitune.measure import runner

    def cannot_allocate(self, *args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(runner.Runner, "__init__", cannot_allocate)
    assert_one_line_error(invoke(*search_args(tmp_db, "--trials", "2")), "does not fit in memory here")


def test_an_existing_database_that_cannot_be_written_is_one_line(tmp_path, read_only):
    db = read_only(searched_db(tmp_path))
    assert_one_line_error(invoke(*search_args(db, "--trials", "3")), "the file is read-only")


def test_a_database_in_a_folder_that_cannot_be_written_is_one_line(tmp_path, read_only):
    folder = tmp_path / "results"
    folder.mkdir()
    db = searched_db(folder)
    read_only(folder)
    assert_one_line_error(invoke(*search_args(db, "--trials", "3")), "is read-only (SQLite writes its journal there)")
    # Reading needs no journal: report still works there.
    result = invoke("report", "--db", db, "--format", "csv")
    assert result.exit_code == 0, result.output


@pytest.fixture
def foreign_db(tmp_path) -> Path:
    """Somebody else's SQLite file that happens to have a trials table."""
    path = tmp_path / "theirs.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE trials (kernel TEXT, runtime REAL)")
    conn.execute("INSERT INTO trials VALUES ('attention', 1.5)")
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("args", [["report"], ["report", "--format", "json"], ["report", "--kernel", "attention"],
                                  ["export", "--out", "{tmp}/out"]], ids=["report", "json", "kernel", "export"])
def test_a_foreign_database_with_a_trials_table_is_one_line(args, foreign_db, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert_one_line_error(invoke(*args, "--db", foreign_db), "is not an omnitune results database")
    assert not (tmp_path / "out").exists()


def test_export_into_a_file_is_one_line(tmp_path):
    db = searched_db(tmp_path)
    target = tmp_path / "tables.json"
    target.write_text("{}")
    assert_one_line_error(invoke("export", "--db", db, "--out", target), "is a file; give a folder")
    assert target.read_text() == "{}"


def test_export_to_an_empty_out_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """--out '' (an unset shell variable) would be the current folder: refused, nothing written there."""
    db = searched_db(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert_one_line_error(invoke("export", "--db", db, "--out", ""), "--out is empty")
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("below", [False, True], ids=["the-folder", "a-folder-inside"])
def test_export_into_a_read_only_folder_is_one_line(below, tmp_path, read_only):
    db = searched_db(tmp_path)
    out = tmp_path / "tables"
    out.mkdir()
    read_only(out)
    assert_one_line_error(invoke("export", "--db", db, "--out", out / "sub" if below else out), "is read-only")


def test_export_into_a_read_only_kernel_folder_is_one_line(tmp_path, read_only):
    db = searched_db(tmp_path)
    out = tmp_path / "tables"
    (out / "attention").mkdir(parents=True)
    read_only(out / "attention")
    assert_one_line_error(invoke("export", "--db", db, "--out", out), "cannot write the tables under --out")


@pytest.fixture
def bench_runs(monkeypatch) -> list:
    """The problems bench ran: none, where it refused first."""
    from omnitune.profile import bench

    ran = []
    monkeypatch.setattr(bench, "run_bench", lambda spec, problem, *a, **k: ran.append(problem) or [])
    return ran


@pytest.mark.parametrize("where", ["under-a-file", "a-folder", "read-only-folder"])
def test_bench_json_that_cannot_be_written_is_refused_before_the_bench_runs(where, tmp_path, bench_runs, read_only):
    if where == "under-a-file":
        (tmp_path / "file").write_text("")
        target, message = tmp_path / "file" / "bench.json", "is a file, not a folder"
    elif where == "a-folder":
        target, message = tmp_path, "is a folder; give the path of a file"
    else:
        (tmp_path / "ro").mkdir()
        target, message = read_only(tmp_path / "ro") / "bench.json", "is read-only"
    result = invoke("bench", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--json", target)
    assert_one_line_error(result, message)
    assert bench_runs == []


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"BLOCK_M": Infinity}', "holds Infinity"),
        ('{"BLOCK_M": -Infinity}', "holds -Infinity"),
        ('{"BLOCK_M": NaN}', "holds NaN"),
        ('{"BLOCK_M": 1e999}', "BLOCK_M=inf: launch parameters are finite numbers"),
        ('{"BLOCK_M": 1' + "0" * 400 + "}", "is not a valid choice"),
        ('{"BLOCK_M": 1' + "0" * 5000 + "}", "not usable JSON"),
        ('{"BLOCK_M": [64]}', "a parameter takes a single value"),
        ('{"BLOCK_M": {"x": 1}}', "a parameter takes a single value"),
        ('{"BLOCK_M": "sixty-four"}', "is not a valid choice"),
        ('{"BLOCK_M": 64.5}', "is not a valid choice"),
        ("[64, 64]", "must be a JSON object"),
        ('{"BLOCK_M": 64', "is not valid JSON"),
        ("nosuchfile.json", "--config nosuchfile.json: no such file"),
    ],
)
def test_bench_config_values_that_are_not_launch_parameters_are_one_line(config, message, bench_runs):
    result = invoke("bench", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--config", config)
    assert_one_line_error(result, message)
    assert bench_runs == []


def test_a_config_file_is_read(tmp_path, bench_runs):
    path = tmp_path / "config.json"
    path.write_text('{"BLOCK_M": 32}')
    result = invoke("bench", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--config", path)
    assert result.exit_code == 0, result.output
    assert len(bench_runs) == 1


@pytest.mark.parametrize("command", ["search", "worker", "report", "export"])
def test_a_storage_that_is_the_database_itself_is_refused(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = searched_db(tmp_path) if command in ("report", "export") else tmp_path / "omnitune.db"
    before = db.read_bytes() if db.exists() else None
    if command == "search":
        args = search_args(db)
    elif command == "worker":
        args = ["worker", "attention", "--shape", SHAPE, "--dtype", "fp32", *MODE, "--db", db]
    else:
        args = [command, "--db", db] + (["--out", tmp_path / "out"] if command == "export" else [])
    # Relative to the folder the command runs in: the same file under another name.
    assert_one_line_error(invoke(*args, "--storage", "sqlite:///omnitune.db"), "names the results database")
    assert (db.read_bytes() if db.exists() else None) == before  # no Optuna tables inside the catalogue
    assert_one_line_error(invoke(*args, "--storage", "journal:///omnitune.db"), "names the results database")
    assert (db.read_bytes() if db.exists() else None) == before  # no journal lines appended to it


# --- tables that a search and a lookup read --------------------------------------------------------


def _poisoned_table(tables_dir: Path, device_name: str) -> Path:
    """The shipped attention table, moved to `device_name`, with one config value infinite."""
    from omnitune.profile.device import device_key

    doc = json.loads((REPO / "tuned_configs" / "attention" / "NVIDIA_H200.json").read_text())
    doc["device"]["key"] = device_key(device_name)
    first = next(iter(doc["entries"].values()))
    first["config"]["BLOCK_M"] = float("inf")
    path = tables_dir / "attention" / f"{device_key(device_name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))  # Python writes the infinity as Infinity
    return path


def test_a_poisoned_table_does_not_stop_a_search(tables_dir, tmp_db):
    device = current_device_facts(interpret=not ON_GPU)
    _poisoned_table(tables_dir, device.name)
    result = invoke(*search_args(tmp_db, "--trials", "2"))
    assert result.exit_code == 0, result.output
    assert "2 measured (2 new)" in result.stdout


@pytest.mark.parametrize("poison", ["infinite", "truncated"])
def test_a_poisoned_table_makes_lookup_answer_or_say_one_line(poison, tables_dir):
    path = _poisoned_table(tables_dir, "NVIDIA H200")
    if poison == "truncated":
        path.write_text(path.read_text()[:500])
    result = invoke("lookup", "attention", "--shape", SHAPE, "--dtype", "fp16", "--device", "NVIDIA H200")
    assert "Traceback" not in result.output and not isinstance(result.exception, (OverflowError, ValueError))
    if result.exit_code == 2:
        assert_one_line_error(result, "could not be read")
    else:
        assert result.exit_code == 0, result.output
        assert "rung: default" in result.stdout


# --- output --------------------------------------------------------------------------------------


def _empty_db(tmp_path: Path) -> Path:
    from omnitune.store import open_db

    path = tmp_path / "empty.db"
    open_db(path).conn.close()
    return path


def test_report_json_of_an_empty_database_is_an_empty_list(tmp_path):
    result = invoke("report", "--db", _empty_db(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert result.stderr.startswith("no results in")


def test_report_csv_of_an_empty_database_is_its_header(tmp_path):
    from omnitune.report import SUMMARY_COLUMNS

    result = invoke("report", "--db", _empty_db(tmp_path), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [",".join(SUMMARY_COLUMNS)]
    assert result.stderr.startswith("no results in")


def test_pruned_configs_are_not_counted_as_trials(tmp_db, monkeypatch):
    # The sampler unwrapped, as where a space is too large to list its valid configs: its
    # proposals are pruned by the constraints (where they can be listed, none are: valid_only).
    from omnitune.search import driver

    monkeypatch.setattr(driver, "ValidOnly", lambda inner, *args, **kwargs: inner)
    result = invoke(*search_args(tmp_db, "--trials", "6"))
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.stdout.splitlines() if line.startswith("attention "))
    assert "6 measured (6 new)" in summary and "failures: none · " in summary and " pruned" in summary
    conn = sqlite3.connect(tmp_db)
    pruned = conn.execute("SELECT COUNT(*) FROM trials WHERE status = 'pruned'").fetchone()[0]
    conn.close()
    assert pruned > 0  # the shape prunes some configs: what this test is about
    (row,) = json.loads(invoke("report", "--db", tmp_db, "--format", "json").stdout)
    assert (row["trials"], row["pruned"], row["failures"]) == (6, pruned, "")
    table = invoke("report", "--db", tmp_db, env={"COLUMNS": "200"}).stdout
    assert f"{pruned} pruned" in table


def test_a_search_prints_progress_lines_when_not_on_a_terminal(tmp_db):
    result = invoke(*search_args(tmp_db, "--trials", "3"))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("searching attention "))
    end = next(i for i, line in enumerate(lines) if line.startswith("attention "))
    progress = lines[start + 1:end]
    assert [line.split(":")[0] for line in progress] == ["  trial 1/3", "  trial 2/3", "  trial 3/3"]
    assert all(" → ok " in line and "best " in line for line in progress)


# --- help ----------------------------------------------------------------------------------------


def _commands():
    group = typer.main.get_command(app)
    return [None] + sorted(group.commands)


@pytest.mark.parametrize("command", _commands())
def test_flags_show_no_value_in_help(command):
    result = invoke(*([command] if command else []), "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout


@pytest.mark.parametrize("command", _commands()[1:])
def test_help_keeps_every_bracket_of_its_text(command):
    """Rich reads [word] as markup and drops it: every bracket in a help text must be escaped."""
    from rich.text import Text

    group = typer.main.get_command(app)
    for param in group.commands[command].params:
        text = getattr(param, "help", None) or ""
        assert Text.from_markup(text).plain == text.replace("\\[", "["), (command, param.name, text)


@pytest.mark.parametrize("command", _commands()[1:])
def test_help_paragraphs_wrap_at_the_terminal_width_not_the_sources(command):
    """Each paragraph of a command's docstring reads as one flowing paragraph: at a terminal wider
    than the source, no line of it ends short of the next word the source had put on a new line."""
    import inspect

    group = typer.main.get_command(app)
    source = inspect.cleandoc(group.commands[command].callback.__doc__ or "")
    shown = [" ".join(line.split()) for line in invoke(command, "--help", env={"COLUMNS": "1000"}).stdout.splitlines()]
    for paragraph in source.split("\n\n"):
        assert " ".join(paragraph.split()) in shown, (command, paragraph)


def test_worker_help_shows_the_postgres_extra():
    result = invoke("worker", "--help", env={"COLUMNS": "200"})
    assert "pip install 'omnitune[postgres]'" in result.stdout


# --- --interpret ---------------------------------------------------------------------------------


def _a_kernel(x):
    pass


@pytest.mark.skipif(ON_GPU, reason="with a GPU, conftest imports the kernels compiled")
def test_interpret_is_judged_by_the_kernels_loaded_not_by_modules_without_any(monkeypatch):
    """omnitune.kernels._dispatch holds no kernel: that it is not interpreted says nothing."""
    import sys
    import types

    import triton

    import omnitune.kernels._dispatch  # noqa: F401
    import omnitune.kernels.attention  # noqa: F401
    from omnitune.cli import enable_interpreter
    from omnitune.errors import OmnituneError

    enable_interpreter()  # interpreted kernels, and a module without kernels: accepted
    compiled = types.ModuleType("omnitune.kernels._compiled")
    compiled.kernel = triton.runtime.jit.JITFunction(_a_kernel)  # as @triton.jit makes it without the interpreter
    monkeypatch.setitem(sys.modules, compiled.__name__, compiled)
    with pytest.raises(OmnituneError, match="imported before --interpret took effect"):
        enable_interpreter()


def test_an_exception_is_reported_by_the_first_line_of_its_message():
    """What one-line errors, warnings and trial records keep of an exception (omnitune.errors)."""
    from omnitune.errors import first_line, one_line

    dump = RuntimeError("  out of resource: shared memory, Required: 232448\nTraceback (most recent call last):\n")
    assert first_line(dump) == "out of resource: shared memory, Required: 232448"
    assert one_line(dump) == "RuntimeError: out of resource: shared memory, Required: 232448"
    assert first_line(ValueError()) == "" and one_line(ValueError("  \n")) == "ValueError"  # no message: the type
    long = RuntimeError("x" * 1000)
    assert len(first_line(long, 200)) == 200 and len(one_line(long)) == 300
    assert one_line(long, 50) == ("RuntimeError: " + "x" * 1000)[:50]


# --- Ctrl-C ----------------------------------------------------------------------------------------


def _raised_while_interrupted(kind):
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            # a half-made import's next use, raised while the interrupt is handled
            raise kind("module 'numpy' has no attribute 'ndarray'")  # noqa: B904
    except kind as exc:
        return exc


@pytest.mark.parametrize("kind", [AttributeError, RecursionError])
def test_ctrl_c_inside_an_import_is_interrupted_not_a_traceback(kind, monkeypatch, capsys):
    import omnitune.cli as cli

    error = _raised_while_interrupted(kind)
    monkeypatch.setattr(cli, "app", lambda: (_ for _ in ()).throw(error))
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 130 and capsys.readouterr().err.strip() == "interrupted"


def test_an_error_without_a_ctrl_c_behind_it_is_not_called_an_interrupt(monkeypatch):
    import omnitune.cli as cli

    monkeypatch.setattr(cli, "app", lambda: (_ for _ in ()).throw(AttributeError("a bug")))
    with pytest.raises(AttributeError, match="a bug"):
        cli.main()
