"""The speechpipe command ends cleanly: a closed output pipe and Ctrl-C are one line, not a
traceback (issue 18)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from speechpipe import cli


def test_ctrl_c_ends_a_command_in_one_line_with_exit_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.set_defaults(func=interrupted)
    sub = parser._subparsers._group_actions[0].choices["stats"]  # the stats command's parser
    sub.set_defaults(func=interrupted)
    assert cli.main(["stats", "anything"]) == 130
    assert capsys.readouterr().err == "speechpipe stats: interrupted\n"


def test_a_reader_that_leaves_early_is_not_an_error(tmp_path):
    """``speechpipe ... | head -1``: the command's further output meets a closed pipe."""
    script = (
        "import sys\n"
        "from speechpipe import cli\n"
        "def chatty(args):\n"
        "    for i in range(100000):\n"
        "        print('line', i)\n"
        "    return 0\n"
        "parser = cli.build_parser()\n"
        "parser._subparsers._group_actions[0].choices['stats'].set_defaults(func=chatty)\n"
        "cli.build_parser = lambda: parser\n"
        "sys.exit(cli.main(['stats', 'x']))\n")
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as reader:
        assert reader.stdout.readline() == b"line 0\n"
        reader.stdout.close()  # as head does after its line
        err = reader.stderr.read().decode()
        assert reader.wait(timeout=60) == 0
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("argv", [["--help"], ["stats", "--help"]])
def test_help_still_exits_zero(argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0


def test_warnings_print_as_one_line_without_python_source_lines(tmp_path):
    # Issue 32.5: the CLI's warnings came with Python's source line under them.
    import os
    import shutil
    from pathlib import Path

    from speechpipe.demo import DEMO_CORPUS

    root = tmp_path / "LibriSpeech"
    shutil.copytree(Path(DEMO_CORPUS), root)
    sorted(root.rglob("*.flac"))[0].unlink()  # a transcript without audio, skipped
    env = dict(os.environ, PYTHONPATH=str(Path(cli.__file__).parents[2]))
    done = subprocess.run([sys.executable, "-m", "speechpipe.cli", "prepare", "librispeech",
                           str(root), str(tmp_path / "m"), "--on-mismatch", "skip",
                           "--no-progress"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "SkippedInputWarning: prepare_librispeech dev-clean skipped 1 item(s):"
    assert lines[1].startswith("  transcript without audio: 1 (e.g. ")
    assert len(lines) == 2 and "warnings.warn" not in done.stderr
